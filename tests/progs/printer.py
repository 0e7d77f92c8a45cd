"""Prints a known byte sequence on stdout and stderr, then exits with a chosen code.

usage: printer.py [--exit N] [--lines N] [--partial] [--binary] [--secret-env NAME]
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--exit", type=int, default=0)
    ap.add_argument("--lines", type=int, default=5)
    ap.add_argument("--partial", action="store_true", help="end stdout without a newline")
    ap.add_argument("--binary", action="store_true", help="include invalid UTF-8 and \\r")
    ap.add_argument("--secret-env", action="append", default=[], help="print this env var")
    ap.add_argument("--api-key", help="ignored (a secret in argv)")
    args = ap.parse_args()
    out = sys.stdout.buffer
    err = sys.stderr.buffer
    for i in range(args.lines):
        out.write(f"out line {i}\n".encode())
        out.flush()
        err.write(f"err line {i}\n".encode())
        err.flush()
    if args.binary:
        out.write(b"bytes \xff\xfe\x00 raw\n")
        out.write(b"progress 10%\rprogress 50%\rprogress 100%\n")
        out.write("유니코드 줄\n".encode())
        out.flush()
    for name in args.secret_env:
        err.write(f"the value of {name} is {os.environ.get(name, '')}\n".encode())
        err.flush()
    if args.partial:
        out.write(b"no newline at the end")
        out.flush()
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
