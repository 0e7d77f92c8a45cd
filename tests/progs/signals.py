"""Waits for signals and reports them; exits the way the options say.

usage: signals.py [--ignore SIGTERM ...] [--exit-on SIGNAME=CODE ...] [--child]

Prints "ready" (stdout, flushed) once its handlers are installed, then waits. With --child it
first starts a grandchild (same process group) that ignores SIGTERM and SIGINT and prints
"grandchild ready"; the grandchild lives until it is killed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ignore", action="append", default=[])
    ap.add_argument("--exit-on", action="append", default=[])
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    for name in args.ignore:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    for spec in args.exit_on:
        name, code = spec.split("=")

        def handler(signum: int, frame: object, code: int = int(code)) -> None:
            print(f"got {signal.Signals(signum).name}", flush=True)
            sys.exit(code)

        signal.signal(getattr(signal, name), handler)
    if args.child:
        code = (
            "import signal,sys,time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "print('grandchild ready', flush=True)\n"
            "while True: time.sleep(3600)\n"
        )
        grandchild = subprocess.Popen([sys.executable, "-c", code])
        print(f"grandchild pid {grandchild.pid}", flush=True)
    print("ready", flush=True)
    while True:
        signal.pause()
    return os.EX_OK


if __name__ == "__main__":
    sys.exit(main())
