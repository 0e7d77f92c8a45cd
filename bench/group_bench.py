"""Benchmark: group analysis of N node bundles totalling SIZE vs the analysis of one bundle of
SIZE (issue 12: 16 node logs totalling 1 GB within 2x one 1 GB log, memory flat).

The logs are built like bench/analyze_bench.py's (real vLLM 0.32 lines from corpus/realrun-*:
one real start-up per 4 MiB chunk, serving-time lines after it, a failing start-up every 64th
chunk), split over N bundles written with BundleWriter (combined.log, lines.tsv with one row
per line, manifest group with a clock sample), plus one bundle holding the whole SIZE. All of
it lives in a temporary folder, removed afterwards. Each analysis runs in a fresh child process
(page cache warm after one untimed run) that reports its own time and peak RSS; --repeat runs,
the fastest counts.

    python bench/group_bench.py [--size-mb 1024] [--nodes 16] [--repeat 2] [--keep]

Prints a table and exits 0 (it measures; it does not judge).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from analyze_bench import CHUNK_BYTES, FAIL_EVERY, _read, _serving_lines  # noqa: E402

from kk3evidence.bundle.archive import BundleWriter  # noqa: E402


def _chunks() -> tuple[list[bytes], list[bytes]]:
    ok = _read("realrun-ok-baseline")
    serving = _serving_lines(ok) + _serving_lines(_read("realrun-ok-prefix-caching"))
    failing = [
        _read(c)
        for c in (
            "realrun-fail-kv-cache-too-small",
            "realrun-fail-weights-missing",
            "realrun-fail-headdim16-first-request",
        )
    ]

    def chunk(startup: list[bytes]) -> bytes:
        parts, size, i = [b"".join(startup)], 0, 0
        size = len(parts[0])
        while size < CHUNK_BYTES:
            ln = serving[i % len(serving)]
            parts.append(ln)
            size += len(ln)
            i += 1
        return b"".join(parts)

    return [chunk(ok)], [chunk(f) for f in failing]


def write_bundle(path: Path, size: int, rank: int, nnodes: int, first_chunk: int) -> int:
    """One node's bundle of about ``size`` bytes of log; returns the chunks written."""
    good, bad = _CHUNKS
    staging = path.with_suffix(".staging")
    w = BundleWriter(staging)
    wall0, mono0 = time.time_ns(), time.monotonic_ns()
    w.set_group({"id": "bench", "node_rank": rank, "nnodes": nnodes, "host": f"h{rank}",
                 "clock": {"samples": [{"at": "start", "wall_ns": wall0, "mono_ns": mono0}]}})
    log = w.open_stream("logs/combined.log")
    index = w.open_stream("logs/lines.tsv")
    index.write(b"offset\tstream\twall_ns\tmono_ns\n")
    written, n, offset, t = 0, 0, 0, 0
    while written < size:
        c = first_chunk + n
        data = bad[(c // FAIL_EVERY) % len(bad)] if c % FAIL_EVERY == 0 else good[0]
        log.write(data)
        rows = []
        for ln in data.splitlines(keepends=True):
            t += 1_000
            rows.append(b"%d\tout\t%d\t%d\n" % (offset, wall0 + t, mono0 + t))
            offset += len(ln)
        index.write(b"".join(rows))
        written += len(data)
        n += 1
    w.finalize(path)
    return n


def _child(code: str, *args: str) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, check=False,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    if proc.returncode != 0:
        sys.exit(f"bench: child failed: {proc.stderr.decode()[-800:]}")
    return dict(json.loads(proc.stdout))


_ONE = (
    "import json,resource,sys,time\n"
    "from kk3evidence.analysis.engine import analyze\n"
    "analyze(b'')\n"
    "t=time.perf_counter();a=analyze(sys.argv[1]);d=time.perf_counter()-t\n"
    "print(json.dumps({'seconds':d,'lines':a.lines_total,"
    "'rss_kib':resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))\n"
)
_GROUP = (
    "import json,resource,sys,time\n"
    "from kk3evidence.analysis.engine import analyze\n"
    "from kk3evidence.analysis.group import analyze_group\n"
    "analyze(b'')\n"
    "t=time.perf_counter();g=analyze_group(sys.argv[1:]);d=time.perf_counter()-t\n"
    "print(json.dumps({'seconds':d,'lines':sum(n.analysis.lines_total for n in g.nodes),"
    "'timeline':len(g.timeline),'pairs':min(n.offset.pairs for n in g.nodes[1:]),"
    "'rss_kib':resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))\n"
)


def best(n: int, code: str, *args: str) -> dict[str, float]:
    runs = [_child(code, *args) for _ in range(n)]
    return min(runs, key=lambda r: r["seconds"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--keep", action="store_true")
    opts = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kk3-group-bench-"))
    try:
        size = opts.size_mb * 1024 * 1024
        t = time.perf_counter()
        one = tmp / "one.tar"
        write_bundle(one, size, 0, 1, 0)
        nodes, first = [], 0
        for r in range(opts.nodes):
            p = tmp / f"node{r}.tar"
            first += write_bundle(p, size // opts.nodes, r, opts.nodes, first)
            nodes.append(str(p))
        built = time.perf_counter() - t
        total = sum(Path(p).stat().st_size for p in nodes)
        best(1, _ONE, str(one))  # warm the page cache
        a = best(opts.repeat, _ONE, str(one))
        g = best(opts.repeat, _GROUP, *nodes)
        print(f"built in {built:.0f} s: one bundle {one.stat().st_size / 2**20:.0f} MiB, "
              f"{opts.nodes} bundles {total / 2**20:.0f} MiB (logs + lines.tsv)")
        print("| | seconds | lines | peak RSS |\n|---|---|---|---|")
        print(f"| analyze one bundle | {a['seconds']:.2f} | {a['lines']:,} | "
              f"{a['rss_kib'] / 1024:.0f} MiB |")
        print(f"| analyze_group {opts.nodes} bundles | {g['seconds']:.2f} | {g['lines']:,} | "
              f"{g['rss_kib'] / 1024:.0f} MiB |")
        print(f"ratio group / one: {g['seconds'] / a['seconds']:.2f}x (target <= 2); "
              f"timeline events {g['timeline']:,}, sync pairs per node >= {g['pairs']}")
    finally:
        if not opts.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")
    return 0


_CHUNKS = _chunks()

if __name__ == "__main__":
    raise SystemExit(main())
