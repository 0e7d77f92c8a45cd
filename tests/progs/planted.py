"""Prints the planted secret set in every way that once leaked: split writes, a secret across
the 64 KiB cut of a long line, repeats on one line and in one write batch, PEM keys printed
line by line, and one sample of every text pattern. Secrets come from the environment (the
test sets them) and from argv (``--api-key``).

usage: planted.py [--api-key KEY]
"""

from __future__ import annotations

import argparse
import os
import sys


class _Fd:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--api-key", default="")
    args = ap.parse_args()
    out = _Fd(1)  # each write() below is one write(2)
    err = _Fd(2)
    hf = os.environ["HF_TOKEN"].encode()
    pem = os.environ["TLS_PRIVATE_KEY"].encode()
    learned = os.environ["PLANTED_LEARNED"].encode()  # known only from the log text
    samples = os.environ["PLANTED_SAMPLES"].encode()  # one line per text pattern
    # split writes: the secret's halves reach the pipe in two writes
    out.write(b"token is " + hf[:10])
    out.write(hf[10:] + b" (split)\n")
    # a secret across the 64 KiB cut of a long line, then at many cut points
    for pad in (64 * 1024 - 12, 64 * 1024 - 1, 100_000, 200_003):
        out.write(b"L" * pad + hf + b" " + args.api_key.encode() + b"\n")
    # a secret learned from a line, repeated on it and in the same write batch
    batch = b"password=" + learned + b" again " + learned + b"\n"
    batch += b"later in the batch: " + learned + b"\n" * 1
    err.write(batch)
    # a PEM key from the environment printed as it is, and a new one nobody declared
    err.write(b"loaded key:\n" + pem + b"\n")
    err.write(samples + b"\n")
    # a flood of long lines that all carry the secret
    line = b"F" * 3000 + hf + b"\n"
    for _ in range(int(os.environ.get("PLANTED_FLOOD_BATCHES", "40"))):
        out.write(line * 100)
    out.write(b"done\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
