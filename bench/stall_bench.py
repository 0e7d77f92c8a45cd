"""The stall watchdog's cost, and how long a stall snapshot takes.

    python bench/stall_bench.py [--megabytes 256] [--repeat 2] [--tree 10] [--snapshots 3]

1. Pass-through with and without the watchdog: ``tests/progs/flood.py MB`` (120-byte lines,
   as fast as a pipe takes them) under ``CMD | tee FILE``, under ``kk3evidence capture
   --stall-after 0 --quiet`` (watchdog off) and under ``kk3evidence capture`` with the default
   watchdog and the progress line (``--stall-after 600``, stderr not a terminal). Reports the
   producer's own run time (how much the wrapper slowed CMD down) and the ratios. The fastest
   of ``--repeat`` runs counts.
2. A snapshot of a ``--tree``-process tree (``tests/progs/stall.py --children N-1``: Python
   processes asleep, one listening socket): wall time of ``take_snapshot`` with py-spy stacks of
   every process, best and worst of ``--snapshots`` runs.

It prints a table and exits 0: it measures, it does not judge.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from capture_bench import _flood_seconds, run_tee  # noqa: E402

from kk3evidence.capture.snapshot import take_snapshot  # noqa: E402

FLOOD = REPO / "tests" / "progs" / "flood.py"
STALL = REPO / "tests" / "progs" / "stall.py"
PY = sys.executable


def run_capture(mb: float, work: Path, opts: list[str]) -> tuple[float, float]:
    bundle = work / "b.tar"
    start = time.monotonic()
    proc = subprocess.run(
        [
            PY,
            "-m",
            "kk3evidence",
            "capture",
            "--no-probe",
            "--no-analyze",
            "-o",
            str(bundle),
            *opts,
            "--",
            PY,
            str(FLOOD),
            str(mb),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    wall = time.monotonic() - start
    err = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"capture failed ({proc.returncode}): {err[-800:]}")
    bundle.unlink()
    return _flood_seconds(err), wall


def snapshot_times(tree: int, runs: int) -> tuple[list[float], int, str]:
    proc = subprocess.Popen(
        [PY, str(STALL), "--children", str(tree - 1), "--listen"],
        stdout=subprocess.PIPE,
        process_group=0,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        times = []
        n, source = 0, ""
        for i in range(runs):
            t0 = time.monotonic()
            doc = take_snapshot(proc.pid, seq=i + 1, reason="bench")
            times.append(time.monotonic() - t0)
            n = len(doc["processes"])
            source = ", ".join(sorted({str(p["stacks_source"]) for p in doc["processes"]}))
        return times, n, source
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--megabytes", type=float, default=256)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--tree", type=int, default=10)
    ap.add_argument("--snapshots", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kk3-stall-bench-") as tmp:
        work = Path(tmp)
        tee = min(run_tee(args.megabytes, work, [])[0] for _ in range(args.repeat))
        off = min(
            run_capture(args.megabytes, work, ["--stall-after", "0", "--quiet"])
            for _ in range(args.repeat)
        )
        on = min(
            run_capture(args.megabytes, work, ["--stall-after", "600"]) for _ in range(args.repeat)
        )
    mb = args.megabytes
    print(f"pass-through of {mb:g} MB (producer's own run time, best of {args.repeat}):")
    print(f"  tee                          {tee:7.2f} s  {mb / tee:7.0f} MB/s")
    print(f"  capture, watchdog off        {off[0]:7.2f} s  {mb / off[0]:7.0f} MB/s")
    print(f"  capture, watchdog + progress {on[0]:7.2f} s  {mb / on[0]:7.0f} MB/s")
    print(f"  ratio watchdog on / off      {on[0] / off[0]:7.2f}")
    print(f"  ratio watchdog on / tee      {on[0] / tee:7.2f}")
    times, n, source = snapshot_times(args.tree, args.snapshots)
    print(
        f"snapshot of a {n}-process tree (stacks: {source}): best {min(times):.2f} s, "
        f"worst {max(times):.2f} s over {len(times)} runs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
