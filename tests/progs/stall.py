"""A start-up that stops moving, for the stall watchdog tests.

usage: stall.py [--ignore-term] [--children N] [--listen] [--print-every S --prints N] [--silent S]
                [--serving-stall N]

Prints a vLLM-like comm_group milestone, optionally starts N sleeping children (a process tree)
and listens on a loopback port, prints every S seconds N times, then stays silent for --silent
seconds (default: for ever) and exits 0. With --ignore-term it ignores SIGINT and SIGTERM.
With --serving-stall N it then becomes "ready" (`Uvicorn running on`), prints one stats line
with progress and N stats lines 0.3 s apart with a request running at 0 tokens/s (vLLM V1's
wording), and goes silent: a server that stopped serving.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--children", type=int, default=0)
    ap.add_argument("--listen", action="store_true")
    ap.add_argument("--print-every", type=float, default=0.0)
    ap.add_argument("--prints", type=int, default=0)
    ap.add_argument("--silent", type=float, default=3600.0)
    ap.add_argument("--serving-stall", type=int, default=0)
    args = ap.parse_args()
    if args.ignore_term:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: print("signal ignored", flush=True))
    kids = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        for _ in range(args.children)
    ]
    srv = None
    if args.listen:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
    print(
        "INFO 12-01 03:00:00 [parallel_state.py:1] world_size=2 rank=0 local_rank=0 "
        "distributed_init_method=tcp://127.0.0.1:29613 backend=gloo",
        flush=True,
    )
    for i in range(args.prints):
        time.sleep(args.print_every)
        print(f"\rLoading safetensors checkpoint shards: {i + 1}/{args.prints}", end="", flush=True)
    if args.prints:
        print(flush=True)
    if args.serving_stall:
        _serve_then_stall(args.serving_stall)
    time.sleep(args.silent)
    for k in kids:
        k.kill()
        k.wait()
    if srv is not None:
        srv.close()
    return 0


def _serve_then_stall(n: int) -> None:
    print("INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)", flush=True)
    stats = (
        "(APIServer pid=1) INFO 12-01 03:00:{s:02d} [loggers.py:259] Engine 000: Avg prompt "
        "throughput: {p} tokens/s, Avg generation throughput: {g} tokens/s, Running: 1 reqs, "
        "Waiting: 0 reqs, GPU KV cache usage: 0.1%, Prefix cache hit rate: 0.0%"
    )
    print(stats.format(s=10, p="12.0", g="3.5"), flush=True)
    for i in range(n):
        time.sleep(0.3)
        print(stats.format(s=20 + i, p="0.0", g="0.0"), flush=True)


if __name__ == "__main__":
    sys.exit(main())
