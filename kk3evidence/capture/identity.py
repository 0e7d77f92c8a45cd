"""Is the server answering on the port the one CMD started? (from ``/proc``, not from HTTP)

A stale ``vllm serve`` still listening on the port answers ``/health`` and ``/v1/models`` as
well as the new one would. Capture must not take it for CMD: readiness counts only when the
listening socket belongs to CMD's process tree (``/proc/net/tcp*`` gives the socket inode of the
listener, ``/proc/PID/fd`` links name the process holding it) and the served model is the one
the command asks for. A port already held before launch is recorded as the outcome
("port 8800 held by pid N: <cmdline>"); CMD is left to fail on its own (Address already in
use) and tell its own story.

``proc_root`` is injectable so tests can use a fake ``/proc`` tree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kk3evidence.capture.procscan import process_tree

_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0", "::", "")


@dataclass(frozen=True, slots=True)
class PortHolder:
    port: int
    pid: int
    cmdline: str

    def describe(self) -> str:
        return f"port {self.port} held by pid {self.pid}: {self.cmdline}"

    def to_json(self) -> dict[str, object]:
        return {"port": self.port, "pid": self.pid, "cmdline": self.cmdline}


def listening_inodes(port: int, proc_root: str = "/proc") -> set[int]:
    """Socket inodes of TCP listeners on ``port`` (any address, IPv4 and IPv6)."""
    out: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{proc_root}/net/{name}", encoding="ascii", errors="replace") as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10 or parts[3] != _LISTEN:
                continue
            try:
                local_port = int(parts[1].rsplit(":", 1)[1], 16)
                inode = int(parts[9])
            except (IndexError, ValueError):
                continue
            if local_port == port and inode:
                out.add(inode)
    return out


def socket_owners(inodes: Iterable[int], proc_root: str = "/proc") -> list[int]:
    """Pids whose open files include one of the socket ``inodes`` (readable ones only)."""
    wanted = {f"socket:[{i}]" for i in inodes}
    if not wanted:
        return []
    pids: list[int] = []
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        fd_dir = f"{proc_root}/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") in wanted:
                    pids.append(int(entry))
                    break
            except OSError:
                continue
    return sorted(pids)


def cmdline(pid: int, proc_root: str = "/proc") -> str:
    try:
        with open(f"{proc_root}/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return "?"
    return " ".join(p.decode("utf-8", "replace") for p in raw.split(b"\0") if p) or "?"


def port_holder(port: int, proc_root: str = "/proc",
                exclude: Iterable[int] = ()) -> PortHolder | None:
    """Who listens on ``port`` now (other than the pids in ``exclude``), or None.

    A listener whose owner cannot be read (another user's process) is still reported, with
    pid 0 and an unknown command line: the port is taken either way.
    """
    inodes = listening_inodes(port, proc_root)
    if not inodes:
        return None
    skip = set(exclude)
    owners = [p for p in socket_owners(inodes, proc_root) if p not in skip]
    if not owners:
        if socket_owners(inodes, proc_root):
            return None  # only excluded (our own) processes hold it
        return PortHolder(port, 0, "(owner not readable: another user's process)")
    return PortHolder(port, owners[0], cmdline(owners[0], proc_root))


def is_local(host: str) -> bool:
    """Only a server on this machine can be checked in ``/proc``."""
    return host in _LOOPBACK_NAMES or host.startswith("127.")


def check_listener(port: int, root_pid: int | None, proc_root: str = "/proc") -> str | None:
    """None when the listener on ``port`` belongs to ``root_pid``'s process tree (or cannot be
    told apart); else why the answering server is not CMD's."""
    inodes = listening_inodes(port, proc_root)
    if root_pid is None:
        # launched but its pid not known yet: an answering server cannot be ours yet
        return "the launched command's pid is not known yet" if inodes else None
    if not inodes:
        return None  # /proc/net unreadable or a listener not visible here: cannot tell
    owners = socket_owners(inodes, proc_root)
    if not owners:
        return None
    tree = set(process_tree(root_pid, proc_root))
    if any(p in tree for p in owners):
        return None
    return PortHolder(port, owners[0], cmdline(owners[0], proc_root)).describe() + (
        " (not the launched command: its answers are not used)")


def check_model(served: str | None, expected: Sequence[str]) -> str | None:
    """None when the server's model id is one the command serves (or nothing to compare)."""
    if not served or not expected:
        return None
    if served in expected or any(served.rstrip("/") == e.rstrip("/") for e in expected):
        return None
    return (f"the server answers with model {served!r}, but the command serves "
            f"{', '.join(repr(e) for e in expected)}: another server holds the port")


def expected_models(serve: object) -> list[str]:
    """The model ids a parsed ``vllm serve`` command serves: ``--served-model-name`` values,
    else the model path or name."""
    names = [str(n) for n in getattr(serve, "served_model_names", ()) or ()]
    model = getattr(serve, "model", None)
    return names or ([str(model)] if model else [])


def verifier(host: str, port: int, root_pid: Callable[[], int | None],
             expected: Sequence[str]) -> Callable[[str | None], str | None]:
    """The readiness check capture passes to the prober: listener ownership (local servers
    only), then the served model."""

    def verify(served: str | None) -> str | None:
        if is_local(host):
            why = check_listener(port, root_pid())
            if why is not None:
                return why
        return check_model(served, expected)

    return verify


def record_port_holder(target: object, launch: dict[str, object],
                       say: Callable[[str], None]) -> PortHolder | None:
    """Before launch: if another process already listens on CMD's port, say so and record it
    in ``launch.json`` (``port_holder``). CMD still runs and fails on its own."""
    host = getattr(target, "host", None)
    port = getattr(target, "port", None)
    if not isinstance(host, str) or not isinstance(port, int) or not is_local(host):
        return None
    holder = port_holder(port)
    if holder is not None:
        launch["port_holder"] = holder.to_json()
        say(holder.describe() + " - no request will go to it; the command runs and tells "
            "its own story")
    return holder

