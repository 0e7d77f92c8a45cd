"""Helpers for the capture tests: run ``kk3evidence capture`` as a real subprocess."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
PROGS = Path(__file__).resolve().parent
PY = sys.executable


def prog(name: str) -> str:
    return str(PROGS / name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def capture_argv(bundle: Path, cmd: Sequence[str], opts: Sequence[str] = ()) -> list[str]:
    return [PY, "-m", "kk3evidence", "capture", "-o", str(bundle), *opts, "--", *cmd]


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("KK3_DEBUG", None)
    env.update(extra)
    return env


@dataclass
class Ran:
    returncode: int
    stdout: bytes
    stderr: bytes


def run_capture(
    bundle: Path,
    cmd: Sequence[str],
    opts: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> Ran:
    proc = subprocess.run(
        capture_argv(bundle, cmd, opts),
        capture_output=True,
        env=env or base_env(),
        timeout=timeout,
        cwd=cwd,
        check=False,
    )
    return Ran(proc.returncode, proc.stdout, proc.stderr)


def own_lines(stderr: bytes) -> list[str]:
    """capture's own messages (they start with 'kk3evidence:')."""
    return [
        line.decode("utf-8", "replace")
        for line in stderr.splitlines()
        if line.startswith(b"kk3evidence:")
    ]


def child_stderr(stderr: bytes) -> bytes:
    """stderr without capture's own lines (they are whole lines of their own)."""
    return b"".join(
        line for line in stderr.splitlines(keepends=True) if not line.startswith(b"kk3evidence:")
    )


def all_member_bytes(bundle: Path) -> bytes:
    """Every byte of every member (for "no secret inside" checks)."""
    out = []
    with tarfile.open(bundle) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m)
            if f is not None:
                out.append(m.name.encode() + b"\n" + f.read())
    return b"\n".join(out)


def per_stream(log: bytes, index: bytes) -> dict[str, bytes]:
    """Rebuild each stream's bytes from combined.log and lines.tsv."""
    rows = index.decode().splitlines()
    assert rows[0] == "offset\tstream\twall_ns\tmono_ns"
    spans: list[tuple[int, str]] = []
    for row in rows[1:]:
        off, stream, wall, mono = row.split("\t")
        assert int(wall) > 0 and int(mono) > 0
        spans.append((int(off), stream))
    out = {"out": b"", "err": b""}
    for i, (off, stream) in enumerate(spans):
        end = spans[i + 1][0] if i + 1 < len(spans) else len(log)
        out[stream] += log[off:end]
    return out


def send_signal_when(proc: subprocess.Popen[bytes], marker: bytes, sig: int) -> bytes:
    """Read proc's stdout until ``marker`` shows up (the child is ready), then signal it."""
    assert proc.stdout is not None
    seen = b""
    while marker not in seen:
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        seen += chunk
    proc.send_signal(sig)
    return seen


SIGNALS = signal
