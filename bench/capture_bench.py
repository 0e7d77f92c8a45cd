"""Capture overhead: ``kk3evidence capture`` against ``CMD | tee FILE``.

    python bench/capture_bench.py [--megabytes 1024] [--repeat 2] [--producer fast|print|both]
                                  [--latency-seconds 5] [--rate 2000]

Three measurements, each in fresh processes (see bench/README.md for the figures):

1. Throughput: ``tests/progs/flood.py MB`` writes MB of 120-byte log lines, either as fast as
   a pipe takes them (producer ``fast``: preformatted 1 MiB blocks) or formatting and
   ``print()``-ing each line like a logging program (producer ``print``). Runs
   ``flood | tee FILE >/dev/null`` and ``kk3evidence capture --no-probe --no-analyze -o B.tar
   -- flood`` (stdout to /dev/null). Reports the producer's own run time
   (``flood: wrote N lines in S s``: how much the wrapper slowed CMD down) and the whole wall
   time (capture's includes sealing the bundle: hashing and tarring the log). The fastest of
   ``--repeat`` runs counts.
2. Per-line pass-through latency: ``flood.py --stamp --rate 2000`` stamps each line with
   CLOCK_MONOTONIC; this script reads the wrapper's stdout and takes receive minus stamp, for
   ``tee`` and for capture (p50, p99, max).
3. Peak RSS of the capture process itself (``ru_maxrss`` read at its exit) during run 1.

It prints a table and exits 0: it measures, it does not judge.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLOOD = REPO / "tests" / "progs" / "flood.py"
PY = sys.executable

RSS_WRAPPER = (
    "import atexit, resource, sys\n"
    "out = sys.argv.pop(1)\n"
    "atexit.register(lambda: open(out, 'w').write("
    "str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)))\n"
    "from kk3evidence.cli import main\n"
    "sys.argv[0] = 'kk3evidence'\n"
    "main()\n"
)


def _flood_seconds(stderr: str) -> float:
    m = re.search(r"flood: wrote \d+ lines in ([0-9.]+) s", stderr)
    if m is None:
        raise SystemExit(f"flood did not report its time: {stderr[-500:]}")
    return float(m.group(1))


def run_tee(mb: float, work: Path, extra: list[str]) -> tuple[float, float]:
    out = work / "tee.log"
    start = time.monotonic()
    flood = subprocess.Popen(
        [PY, str(FLOOD), str(mb), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=False,
    )
    tee = subprocess.Popen(["tee", str(out)], stdin=flood.stdout, stdout=subprocess.DEVNULL)
    assert flood.stdout is not None and flood.stderr is not None
    flood.stdout.close()
    err = flood.stderr.read().decode()
    flood.wait()
    tee.wait()
    wall = time.monotonic() - start
    out.unlink()
    return _flood_seconds(err), wall


def run_capture(mb: float, work: Path, extra: list[str]) -> tuple[float, float, int, str]:
    bundle = work / "b.tar"
    rss_file = work / "rss"
    start = time.monotonic()
    proc = subprocess.run(
        [
            PY,
            "-c",
            RSS_WRAPPER,
            str(rss_file),
            "capture",
            "--no-probe",
            "--no-analyze",
            "-o",
            str(bundle),
            "--",
            PY,
            str(FLOOD),
            str(mb),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    wall = time.monotonic() - start
    err = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"capture failed ({proc.returncode}): {err[-800:]}")
    lost = ""
    if "cannot record output" in err:
        import tarfile

        with tarfile.open(bundle) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("/manifest.json"))
            f = tar.extractfile(member)
            assert f is not None
            losses = json.load(f)["losses"]
        lost = f"{sum(x['bytes'] or 0 for x in losses) / 2**20:.0f} MiB not recorded"
    rss_kb = int(rss_file.read_text())
    bundle.unlink()
    return _flood_seconds(err), wall, rss_kb * 1024, lost


def latencies(argv: list[str], seconds: float, rate: int) -> list[float]:
    """Receive time minus the line's own stamp, in ms, for every line read from argv's stdout."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    out: list[float] = []
    buf = b""
    while True:
        sel.select()
        chunk = os.read(fd, 1 << 16)
        now = time.monotonic_ns()
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            stamp = line.split(b" ", 1)[0]
            if stamp.isdigit():
                out.append((now - int(stamp)) / 1e6)
    proc.wait()
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--megabytes", type=float, default=1024)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--latency-seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=int, default=2000, help="lines/s for the latency run")
    ap.add_argument("--producer", choices=["fast", "print", "both"], default="both")
    args = ap.parse_args()
    if shutil.which("tee") is None:
        raise SystemExit("tee not found")
    work = Path(tempfile.mkdtemp(prefix="kk3-capture-bench-"))
    try:
        producers = {"fast": [], "print": ["--print"]}
        chosen = list(producers) if args.producer == "both" else [args.producer]
        for name in chosen:
            extra = producers[name]
            tee_runs = [run_tee(args.megabytes, work, extra) for _ in range(args.repeat)]
            cap_runs = [run_capture(args.megabytes, work, extra) for _ in range(args.repeat)]
            tee_cmd, tee_wall = min(r[0] for r in tee_runs), min(r[1] for r in tee_runs)
            cap_cmd, cap_wall = min(r[0] for r in cap_runs), min(r[1] for r in cap_runs)
            rss = max(r[2] for r in cap_runs)
            lost = "; ".join(r[3] for r in cap_runs if r[3]) or "none"
            mb = args.megabytes * 1024 * 1024 / 1e6
            what = (
                "preformatted 120-byte lines written in 1 MiB blocks"
                if name == "fast"
                else "each line formatted and print()ed"
            )
            print(
                f"\nthroughput, producer '{name}' ({what}): {args.megabytes:g} MiB, "
                f"best of {args.repeat}"
            )
            print("| | CMD's own run time | wall time (all) |")
            print("|---|---|---|")
            print(
                f"| `CMD \\| tee FILE` | {tee_cmd:.2f} s ({mb / tee_cmd:.0f} MB/s) "
                f"| {tee_wall:.2f} s |"
            )
            print(
                f"| `kk3evidence capture` | {cap_cmd:.2f} s ({mb / cap_cmd:.0f} MB/s) "
                f"| {cap_wall:.2f} s |"
            )
            print(f"| ratio capture / tee | {cap_cmd / tee_cmd:.3f} | {cap_wall / tee_wall:.3f} |")
            print(
                f"peak RSS of the capture process: {rss / 2**20:.1f} MiB; log data not "
                f"recorded (queue full): {lost}"
            )

        n = int(args.latency_seconds * args.rate)
        mb_lat = n * 120 / 2**20
        flood = [PY, str(FLOOD), f"{mb_lat:.6f}", "--stamp", "--rate", str(args.rate)]
        base = latencies(flood, args.latency_seconds, args.rate)
        teed = latencies(
            ["sh", "-c", f"{shlex.join(flood)} | tee {work / 'lat.log'}"],
            args.latency_seconds,
            args.rate,
        )
        cap = latencies(
            [
                PY,
                "-m",
                "kk3evidence",
                "capture",
                "--no-probe",
                "--no-analyze",
                "-o",
                str(work / "lat.tar"),
                "--",
                *flood,
            ],
            args.latency_seconds,
            args.rate,
        )
        print(
            f"\nper-line latency, {len(cap)} lines at {args.rate}/s (ms, producer stamp to reader)"
        )
        print("| | p50 | p99 | max |")
        print("|---|---|---|---|")
        rows = (("direct pipe", base), ("through tee", teed), ("through capture", cap))
        for name, vals in rows:
            print(
                f"| {name} | {statistics.median(vals):.3f} | {pct(vals, 0.99):.3f} "
                f"| {max(vals):.3f} |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
