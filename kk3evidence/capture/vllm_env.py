"""The installed vLLM's own argument table, read live by running its interpreter.

``kk3evidence minimize --from-installed`` uses it: ``_vllm_extract.py`` (standard library and vLLM
only) runs inside the interpreter of the environment where vLLM is installed and prints the table.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from kk3evidence.errors import InputError, UsageError
from kk3evidence.vllm_args import ArgTable

__all__ = ["installed_arg_table"]


def installed_arg_table(argv: Sequence[str], python: str | None = None) -> ArgTable:
    """Extract the argument table from the vLLM that ``argv`` would run (live, in a subprocess).

    The interpreter is ``python`` if given, else the one of ``argv``'s ``python -m`` form, else
    the shebang of the ``vllm`` script found on PATH.
    """
    interp = python or _vllm_python(argv)
    if interp is None:
        raise UsageError(
            "cannot find the Python of the installed vLLM; pass --vllm-python PATH "
            "(the interpreter of the environment where vLLM is installed)"
        )
    script = Path(__file__).resolve().parent.parent / "_vllm_extract.py"
    try:
        done = subprocess.run(
            [interp, str(script), "--stdout"],
            capture_output=True,
            timeout=300,
            check=False,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"could not run {interp} to read vLLM's arguments ({exc})") from None
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        raise InputError(
            f"{interp} could not read vLLM's arguments (exit {done.returncode}: {tail[0]}); "
            "use the shipped table (drop --from-installed)"
        )
    try:
        obj = json.loads(done.stdout)
    except ValueError:
        raise InputError(f"{interp} printed no argument table; is vLLM installed there?") from None
    return ArgTable.from_json(obj, source=f"installed vLLM {obj.get('vllm_version', '?')}")


def _vllm_python(argv: Sequence[str]) -> str | None:
    args = list(argv)
    while args and (args[0] == "env" or "=" in args[0]):
        args = args[1:]
    if not args:
        return None
    prog = args[0]
    base = prog.rsplit("/", 1)[-1]
    if base.startswith("python"):
        return shutil.which(prog) or prog
    path = prog if "/" in prog else shutil.which(prog)
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if first.startswith("#!"):
        parts = first[2:].split()
        if parts and parts[0].endswith("/env") and len(parts) > 1:
            return shutil.which(parts[1])
        return parts[0] if parts else None
    return sys.executable
