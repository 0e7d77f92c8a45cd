"""Benchmark: time and peak RSS of `report`, `diff`, `compare` and `validate` on a bundle whose
log is several GB, and of `validate` on a gzip bomb that expands to 40 GiB (issue 16).

The big log is `analyze_bench.build_log` (real vLLM 0.32 lines from corpus/realrun-*, one real
start-up every 4 MiB, a real failing one every 64 chunks). It goes into a bundle through the
real BundleWriter (no analysis.json: the consumers analyse the log themselves, the expensive
case). The bomb is one tar member whose data is a 1 MiB block compressed once and repeated as
gzip members (a legal multi-member gzip), so it is built in seconds; its ratio is kept under
the reader's 600:1 bomb limit, so only the expanded-size limit can stop it early.

Every command runs as a child process; its wall time and peak RSS (ru_maxrss of the child,
via wait4) are printed. Extra arguments after `--` are appended to report/diff/compare (e.g.
`-- --full`). Files go to a temporary folder, removed unless --keep. Usage:

    python bench/bounds_bench.py [--size-mb 2048] [--gz] [--skip-bomb] [--keep] [-- --full]
    python bench/bounds_bench.py --bundle KEPT.tar.gz --skip-bomb   # re-measure a kept one

Prints a table and exits 0 (it measures; it does not judge).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import random
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench"), str(REPO / "tests")]

from analyze_bench import build_log  # noqa: E402
from bundle_factory import (  # noqa: E402
    dumps,
    fingerprint_doc,
    launch_doc,
    manifest_doc,
    notes_doc,
)

from kk3evidence.bundle.archive import BundleWriter  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB


def build_bundle(out: Path, log: Path) -> None:
    staging = out.with_name(out.name + ".staging")
    writer = BundleWriter(staging, bundle_id="bench-big-log")
    writer.write_json("fingerprint.json", fingerprint_doc())
    writer.write_json("launch.json", launch_doc())
    writer.write_json("notes.json", notes_doc())
    with writer.open_stream("logs/combined.log") as fp, log.open("rb") as src:
        shutil.copyfileobj(src, fp, 4 * MiB)
    writer.finalize(out)


def _block() -> bytes:
    """1 MiB that deflate shrinks about 400:1 (under the 600:1 bomb ratio)."""
    rnd = random.Random(7)
    line = b"(EngineCore_DP0 pid=1) INFO 12-01 00:00:00 [core.py:1] tick\n" * 1024
    noise = bytes(rnd.getrandbits(8) for _ in range(1500))
    return (noise + line * 16)[:MiB]


def build_bomb(out: Path, expand: int = 40 * GiB) -> dict[str, int]:
    """A .tar.gz whose one log member declares and holds ``expand`` bytes."""
    block = _block()
    body = gzip.compress(block, compresslevel=9, mtime=0)
    info = tarfile.TarInfo("kk3-bomb/logs/combined.log")
    info.size = expand
    manifest = manifest_doc({"fingerprint.json": dumps(fingerprint_doc())})
    files = {"kk3-bomb/manifest.json": dumps(manifest)}
    head = io.BytesIO()
    for name, data in files.items():
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        head.write(ti.tobuf(tarfile.PAX_FORMAT) + data + b"\0" * (-len(data) % 512))
    head.write(info.tobuf(tarfile.PAX_FORMAT))
    with out.open("wb") as fp:
        fp.write(gzip.compress(head.getvalue(), mtime=0))
        for _ in range(expand // MiB):
            fp.write(body)
        fp.write(gzip.compress(b"\0" * 1024, mtime=0))
    return {"bytes": out.stat().st_size, "expands_to": expand}


def run(cmd: list[str], timeout: float) -> dict[str, object]:
    """Wall seconds, peak RSS (MiB) and exit status of one child; killed after ``timeout``."""
    t0 = time.perf_counter()
    pid = os.posix_spawn(cmd[0], cmd, os.environ, file_actions=[
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
    deadline = t0 + timeout
    while True:
        wpid, status, usage = os.wait4(pid, os.WNOHANG)
        if wpid:
            break
        if time.perf_counter() > deadline:
            os.kill(pid, 9)
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.05)  # polling a child for the bench's own timeout, not synchronisation
    return {"seconds": round(time.perf_counter() - t0, 1),
            "rss_mib": round(usage.ru_maxrss / 1024),
            "rc": os.waitstatus_to_exitcode(status)}


def _build(tmp: Path, size_mb: int, *, gz: bool) -> Path:
    log = tmp / "big.log"
    t = time.perf_counter()
    info = build_log(log, size_mb)
    bundle = tmp / ("big.tar.gz" if gz else "big.tar")
    build_bundle(bundle, log)
    log.unlink()
    print(f"built {bundle.name}: log {info['bytes']} bytes, bundle "
          f"{bundle.stat().st_size} bytes, {time.perf_counter() - t:.0f} s", flush=True)
    return bundle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=2048)
    ap.add_argument("--gz", action="store_true", help="a .tar.gz bundle (default .tar)")
    ap.add_argument("--skip-bomb", action="store_true")
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--bundle", type=Path, help="measure this bundle instead of building one")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("extra", nargs="*", help="arguments for report/diff/compare")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kk3-bounds-"))
    py = [sys.executable, "-m", "kk3evidence"]
    rows: list[tuple[str, dict[str, object]]] = []
    try:
        if args.bundle or not args.skip_big:
            bundle = args.bundle or _build(tmp, args.size_mb, gz=args.gz)
            b = str(bundle)
            for name, cmd in (("validate", ["validate", b]),
                              ("report", ["report", b, *args.extra]),
                              ("diff", ["diff", b, b, *args.extra]),
                              ("compare", ["compare", b, b, *args.extra])):
                rows.append((name, run([*py, *cmd], args.timeout)))
                print(name, rows[-1][1], flush=True)
        if not args.skip_bomb:
            bomb = tmp / "bomb.tar.gz"
            info = build_bomb(bomb)
            print(f"built bomb: {info['bytes']} bytes expanding to {info['expands_to']}",
                  flush=True)
            rows.append(("validate bomb", run([*py, "validate", str(bomb)], args.timeout)))
            print("validate bomb", rows[-1][1], flush=True)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(dict(rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
