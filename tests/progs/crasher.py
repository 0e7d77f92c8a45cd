"""Prints a Python traceback, then dies the chosen way.

usage: crasher.py {raise,kill SIGNAME,abort}
"""

from __future__ import annotations

import os
import signal
import sys

print("starting", flush=True)
how = sys.argv[1] if len(sys.argv) > 1 else "raise"
if how == "raise":
    raise RuntimeError("Cannot find any model weights with /nonexistent")
if how == "kill":
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
if how == "abort":
    os.abort()
