"""A stall snapshot: what every process of the server tree is doing right now.

Per process: its Python stacks of all threads (``py-spy dump``; where ptrace is not permitted
the reason is recorded and ``/proc`` is all there is), each thread's state and kernel wait
channel (``/proc/PID/task/TID/{stat,wchan}``), and its TCP sockets with local and remote
addresses (socket inodes of ``/proc/PID/fd`` matched against ``/proc/PID/net/tcp{,6}``), which
shows who waits on which ``master_addr:port``. GPU state comes from NVML when it is there.
Two snapshots a little apart (:func:`compare`) show what did not move.

Every probe is data, never a crash: a failure is recorded where the value would be.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kk3evidence.capture.procscan import process_tree
from kk3evidence.model import JSONObject, JSONValue, json_int, json_objects

__all__ = ["STALL_SCHEMA", "compare", "py_spy_path", "take_snapshot"]

STALL_SCHEMA = "kk3evidence/stall/v1"
_TCP_STATES = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
}
_MAX_THREADS = 256
_MAX_FRAMES = 60
_MAX_SOCKETS = 64


def py_spy_path() -> str | None:
    """The py-spy executable: beside this interpreter (the venv that installed it) or on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _stat_fields(text: str | None) -> tuple[str, list[str]] | None:
    """``(comm, fields after comm)`` of a ``/proc/.../stat`` line (comm may hold spaces)."""
    if not text or ")" not in text:
        return None
    comm = text[text.find("(") + 1 : text.rfind(")")]
    return comm, text[text.rfind(")") + 2 :].split()


def _threads(pid: int, proc: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        tids = sorted(int(t) for t in os.listdir(f"{proc}/{pid}/task") if t.isdigit())
    except OSError:
        return out
    for tid in tids[:_MAX_THREADS]:
        parsed = _stat_fields(_read(f"{proc}/{pid}/task/{tid}/stat"))
        if parsed is None:
            continue
        comm, rest = parsed
        wchan = (_read(f"{proc}/{pid}/task/{tid}/wchan") or "").strip() or None
        out.append(
            {
                "tid": tid,
                "name": comm,
                "state": rest[0] if rest else None,
                "wchan": None if wchan in (None, "0") else wchan,
            }
        )
    return out


def _hex_addr(text: str) -> str:
    """``0100007F:1F90`` -> ``127.0.0.1:8080`` (IPv4 or IPv6, as /proc/net/tcp* writes them)."""
    addr, _, port = text.partition(":")
    raw = bytes.fromhex(addr)
    if len(raw) == 4:
        host = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:
        words = struct.unpack("<4I", raw)
        host = socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))
        # an IPv4 peer on a dual-stack socket is shown as IPv4
        mapped = host.startswith("::ffff:") and "." in host
        host = host[len("::ffff:") :] if mapped else f"[{host}]"
    return f"{host}:{int(port, 16)}"


def parse_net_tcp(text: str, proto: str = "tcp") -> dict[int, dict[str, str]]:
    """``{inode: socket}`` from the text of ``/proc/PID/net/tcp`` or ``tcp6`` (a socket:
    ``proto``, ``local``, ``remote``, ``state``)."""
    out: dict[int, dict[str, str]] = {}
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10 or not f[9].isdigit():
            continue
        try:
            local, remote = _hex_addr(f[1]), _hex_addr(f[2])
            state = _TCP_STATES.get(int(f[3], 16), f[3])
        except (ValueError, OSError):
            continue
        out[int(f[9])] = {"proto": proto, "local": local, "remote": remote, "state": state}
    return out


def _sockets(
    pid: int, proc: str, tables: dict[str, dict[int, dict[str, str]]]
) -> list[dict[str, str]]:
    inodes: list[int] = []
    try:
        fds = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return []
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(f"{proc}/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.append(int(target[8:-1]))
    # /proc/PID/net/* is the process's network namespace; read once per namespace.
    ns = _ns(pid, proc)
    if ns not in tables:
        table: dict[int, dict[str, str]] = {}
        for proto in ("tcp", "tcp6"):
            table.update(parse_net_tcp(_read(f"{proc}/{pid}/net/{proto}") or "", proto))
        tables[ns] = table
    found = [tables[ns][i] for i in inodes if i in tables[ns]]
    return sorted(found, key=lambda s: (s["state"] != "LISTEN", s["local"]))[:_MAX_SOCKETS]


def _ns(pid: int, proc: str) -> str:
    try:
        return os.readlink(f"{proc}/{pid}/ns/net")
    except OSError:
        return "?"


def _py_spy(exe: str | None, pid: int, timeout: float) -> tuple[list[Any] | None, str | None]:
    """``(threads, None)`` or ``(None, why not)``."""
    if exe is None:
        return None, "py-spy is not installed (pip install py-spy)"
    try:
        done = subprocess.run(
            [exe, "dump", "--pid", str(pid), "--json", "--nonblocking"],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, f"py-spy dump did not finish within {timeout:g} s"
    except OSError as exc:
        return None, f"cannot run py-spy: {exc.strerror}"
    err = done.stderr.decode("utf-8", "replace").strip()
    if done.returncode != 0:
        low = err.lower()
        if "permission" in low or "ptrace" in low or "operation not permitted" in low:
            return None, (
                "ptrace not permitted (py-spy needs CAP_SYS_PTRACE or "
                f"kernel.yama.ptrace_scope=0): {err[-300:]}"
            )
        return None, f"py-spy exit {done.returncode}: {err[-300:] or 'no Python found'}"
    try:
        raw = json.loads(done.stdout or b"[]")
    except json.JSONDecodeError:
        return None, "py-spy printed no JSON"
    threads = []
    for t in raw if isinstance(raw, list) else []:
        frames = [
            {"function": f.get("name"), "file": f.get("filename"), "line": f.get("line")}
            for f in (t.get("frames") or [])[:_MAX_FRAMES]
        ]
        threads.append(
            {
                "tid": t.get("os_thread_id"),
                "name": t.get("thread_name"),
                "active": t.get("active"),
                "owns_gil": t.get("owns_gil"),
                "frames": frames,
            }
        )
    return threads, None


def _process(
    pid: int,
    proc: str,
    redact: Callable[[list[str]], list[str]],
    tables: dict[str, dict[int, dict[str, str]]],
) -> dict[str, Any] | None:
    parsed = _stat_fields(_read(f"{proc}/{pid}/stat"))
    if parsed is None:
        return None
    comm, rest = parsed
    cmd = (_read(f"{proc}/{pid}/cmdline") or "").split("\0")
    threads = _threads(pid, proc)
    return {
        "pid": pid,
        "ppid": int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else None,
        "pgid": int(rest[2]) if len(rest) > 2 and rest[2].isdigit() else None,
        "name": comm,
        "cmdline": redact([c for c in cmd if c])[:64],
        "state": rest[0] if rest else None,
        "wchan": threads[0]["wchan"] if threads else None,
        "threads": threads,
        "sockets": _sockets(pid, proc, tables),
        "stacks": None,
        "stacks_source": None,
        "stacks_error": None,
    }


def take_snapshot(
    root_pid: int,
    *,
    seq: int,
    reason: str,
    context: Mapping[str, JSONValue] | None = None,
    redact_argv: Callable[[list[str]], list[str]] = list,
    nvml: object = None,
    proc: str = "/proc",
    stack_timeout: float = 8.0,
    py_spy: str | None = None,
) -> JSONObject:
    """A ``stalls/snapshot-<seq>.json`` document for ``root_pid``'s tree (its group too)."""
    t0 = time.monotonic()
    tables: dict[str, dict[int, dict[str, str]]] = {}
    procs = [
        p
        for pid in process_tree(root_pid, proc)
        if (p := _process(pid, proc, redact_argv, tables)) is not None
    ]
    exe = py_spy if py_spy is not None else py_spy_path()
    # py-spy per process in parallel: a 10-process tree takes about as long as one dump.
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(procs)))) as pool:
        results = list(pool.map(lambda p: _py_spy(exe, p["pid"], stack_timeout), procs))
    for p, (stacks, why) in zip(procs, results, strict=True):
        if stacks is not None:
            p["stacks"], p["stacks_source"] = stacks, "py-spy"
        else:
            p["stacks_source"], p["stacks_error"] = "proc", why
    return {
        "schema": STALL_SCHEMA,
        "seq": seq,
        "taken_at": datetime.now(UTC).isoformat(),
        "reason": reason,
        "context": dict(context or {}),
        "root_pid": root_pid,
        "seconds": round(time.monotonic() - t0, 3),
        "stack_tool": {"name": "py-spy", "path": exe},
        "processes": [*procs],
        "gpu": gpu_state(nvml),
        "unchanged": None,
    }


def gpu_state(nvml: object = None) -> JSONObject:
    """Per-GPU utilisation, memory and processes from NVML, or why not."""
    try:
        if nvml is None:
            import pynvml as nvml_mod

            nvml = nvml_mod
        lib: Any = nvml  # pynvml or a test double with its function names
        lib.nvmlInit()
    except Exception as exc:
        return {"available": False, "reason": f"NVML unavailable: {type(exc).__name__}: {exc}"}
    devices: list[dict[str, Any]] = []
    try:
        for i in range(lib.nvmlDeviceGetCount()):
            h = lib.nvmlDeviceGetHandleByIndex(i)
            dev: dict[str, Any] = {"index": i}
            for key, fn in (
                ("utilization_gpu", lambda h=h: lib.nvmlDeviceGetUtilizationRates(h).gpu),
                ("memory_used_bytes", lambda h=h: lib.nvmlDeviceGetMemoryInfo(h).used),
                (
                    "processes",
                    lambda h=h: [p.pid for p in lib.nvmlDeviceGetComputeRunningProcesses(h)],
                ),
            ):
                try:
                    dev[key] = fn()
                except Exception as exc:
                    dev[key] = None
                    dev.setdefault("errors", []).append(f"{key}: {type(exc).__name__}")
            devices.append(dev)
    except Exception as exc:
        return {"available": False, "reason": f"NVML query failed: {type(exc).__name__}: {exc}"}
    finally:
        with contextlib.suppress(Exception):
            lib.nvmlShutdown()
    return {"available": True, "reason": None, "devices": [*devices]}


def _stack_key(p: Mapping[str, Any]) -> list[Any] | None:
    stacks = p.get("stacks")
    if stacks is None:
        return None
    return sorted(
        [
            [(f.get("function"), f.get("file"), f.get("line")) for f in t.get("frames") or []]
            for t in stacks
        ]
    )


def _by_pid(doc: Mapping[str, JSONValue]) -> dict[int, JSONObject]:
    procs = json_objects(doc.get("processes"))
    return {pid: p for p in procs if (pid := json_int(p.get("pid"))) is not None}


def _thread_states(p: JSONObject) -> list[tuple[JSONValue, JSONValue, JSONValue]]:
    return [(t.get("tid"), t.get("state"), t.get("wchan")) for t in json_objects(p.get("threads"))]


def compare(first: Mapping[str, JSONValue], second: Mapping[str, JSONValue]) -> JSONObject:
    """What did not change between two snapshots (set as ``second["unchanged"]``)."""
    before, after = _by_pid(first), _by_pid(second)
    same_stacks: list[JSONValue] = []
    same_wchan: list[JSONValue] = []
    same_sockets: list[JSONValue] = []
    for pid, p in after.items():
        old = before.get(pid)
        if old is None:
            continue
        k = _stack_key(p)
        if k is not None and k == _stack_key(old):
            same_stacks.append(pid)
        if _thread_states(p) == _thread_states(old):
            same_wchan.append(pid)
        if p.get("sockets") == old.get("sockets"):
            same_sockets.append(pid)
    return {
        "compared_with_seq": first.get("seq"),
        "pids_same_stacks": same_stacks,
        "pids_same_thread_states": same_wchan,
        "pids_same_sockets": same_sockets,
        "pids_gone": [*sorted(set(before) - set(after))],
    }


def dump_text(doc: Mapping[str, JSONValue]) -> Sequence[str]:
    """A few lines for capture's own messages: who waits where."""
    lines = []
    for p in json_objects(doc.get("processes")):
        frames = []
        for t in json_objects(p.get("stacks")):
            top = json_objects(t.get("frames"))[:1]
            if top:
                frames.append(f"{t.get('name')}: {top[0].get('function')}")
        what = "; ".join(frames[:2]) or f"no Python stacks ({p.get('stacks_error')})"
        lines.append(f"pid {p.get('pid')} {p.get('name')} [{p.get('state')}] {what}")
    return lines
