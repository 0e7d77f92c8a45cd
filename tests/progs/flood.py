"""Writes MEGABYTES of log lines to stdout as fast as it can (and a few to stderr).

usage: flood.py MEGABYTES [--line-bytes N] [--stamp] [--print]

Each line is "<n> <padding>\n", written in big preformatted blocks; with --print each line
is formatted and print()ed, like a logging program; with --stamp each line starts with
"<monotonic_ns> <n>" so a reader can measure pass-through latency. Prints the number of lines
written and its own run time to stderr at the end: "flood: wrote N lines in S s".
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("megabytes", type=float)
    ap.add_argument("--line-bytes", type=int, default=120)
    ap.add_argument("--stamp", action="store_true")
    ap.add_argument("--rate", type=float, default=0.0, help="lines per second (0 = no limit)")
    ap.add_argument("--print", action="store_true", help="format and print() each line")
    args = ap.parse_args()
    total = int(args.megabytes * 1024 * 1024)
    out = sys.stdout.buffer
    pad = b"INFO 11-30 01:48:29 [core.py:133] engine step " + b"x" * 200
    written = 0
    n = 0
    start = time.monotonic()
    if args.print:
        # What a logging program does: format every line, print it (block-buffered stdout).
        width = max(0, args.line_bytes - 48)
        while written < total:
            line = f"INFO 11-30 01:48:29 [core.py:133] step {n:09d} {'x' * width}"
            print(line)
            written += len(line) + 1
            n += 1
    elif args.stamp:
        while written < total:
            body = b"%d %d " % (time.monotonic_ns(), n)
            line = body + pad[: max(0, args.line_bytes - len(body) - 1)] + b"\n"
            out.write(line)
            out.flush()
            written += len(line)
            n += 1
            if args.rate:
                time.sleep(1.0 / args.rate)
    else:
        block_lines = []
        for i in range(1000):
            body = b"%06d " % i
            block_lines.append(body + pad[: max(0, args.line_bytes - len(body) - 1)] + b"\n")
        block = b"".join(block_lines)
        fd = out.fileno()
        while written < total:
            chunk = block[: total - written]
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            written += len(chunk)
            n += chunk.count(b"\n")
    out.flush()
    sys.stderr.write(f"flood: wrote {n} lines in {time.monotonic() - start:.3f} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
