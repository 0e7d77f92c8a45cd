"""Which multi-node launch (group) a capture belongs to, and this node's clock evidence.

SPEC §3 (0.2): a bundle of a multi-node launch names its group id, its node rank, the number of
nodes and its host in ``manifest.json["group"]``, so that the bundles of one launch can be
analysed together. Every node derives the *same* group id without talking to the others: from
``--group ID``, or from what the launcher already shares with every node (vLLM's master or
data-parallel address, the Slurm job id, the LeaderWorkerSet leader address, the Ray address).

Clock evidence lets the group analysis put the nodes' lines on one timeline: wall/monotonic
pairs taken at start and end (every log line also carries both in ``logs/lines.tsv``), and the
NTP offset that chrony or systemd-timesyncd reports where it is readable.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kk3evidence.errors import UsageError
from kk3evidence.model import JSONObject
from kk3evidence.vllm_args import is_vllm_serve, parse_serve_argv

#: group ids follow the bundle id grammar so they are safe in file names and JSON
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SYNC_TIMEOUT_S = 3.0

#: ``--group auto``: derive the id; anything else is the id itself
AUTO = "auto"


@dataclass(frozen=True, slots=True)
class Derived:
    """What one source (vLLM flags, Slurm, LWS, Ray) says about the group."""

    source: str
    group_id: str | None
    node_rank: int | None = None
    nnodes: int | None = None
    role: str | None = None  # "head" (serves the API) or "worker" (headless)
    detail: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GroupInfo:
    group_id: str
    source: str
    node_rank: int | None
    nnodes: int | None
    host: str
    role: str | None
    detail: Mapping[str, str]
    clock: Mapping[str, Any]

    def to_json(self) -> JSONObject:
        return {
            "id": self.group_id,
            "source": self.source,
            "node_rank": self.node_rank,
            "nnodes": self.nnodes,
            "host": self.host,
            "role": self.role,
            "detail": dict(self.detail),
            "clock": dict(self.clock),
        }


def sanitize_id(raw: str) -> str:
    """Map any text onto the id grammar (same input -> same id on every node)."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", raw.strip()).strip("-._")
    return text[:128] or "group"


def _int(text: object) -> int | None:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


# ----------------------------------------------------------------------------- derivation
def from_vllm(argv: Sequence[str]) -> Derived | None:
    """vLLM's own multi-node flags: ``--nnodes/--node-rank/--headless`` with the master
    address, or the data-parallel layout (``--data-parallel-size[-local]``, ``-start-rank``,
    ``-address``, ``-rpc-port``)."""
    if not is_vllm_serve(argv):
        return None
    try:
        flags = parse_serve_argv(argv).flags
    except Exception:  # an argv we cannot read just derives nothing
        return None
    headless = flags.get("headless") is True
    nnodes = _int(flags.get("nnodes"))
    if nnodes is not None and nnodes > 1:
        addr = str(flags.get("master-addr") or "127.0.0.1")
        port = str(flags.get("master-port") or "29501")
        rank = _int(flags.get("node-rank")) or 0
        return Derived(
            "vllm",
            sanitize_id(f"vllm-{addr}-{port}"),
            rank,
            nnodes,
            "worker" if headless or rank > 0 else "head",
            {"master_addr": addr, "master_port": port},
        )
    size = _int(flags.get("data-parallel-size"))
    local = _int(flags.get("data-parallel-size-local"))
    if size and local and size > local:
        addr = str(flags.get("data-parallel-address") or "127.0.0.1")
        port = str(flags.get("data-parallel-rpc-port") or "13345")
        start = _int(flags.get("data-parallel-start-rank")) or 0
        return Derived(
            "vllm-dp",
            sanitize_id(f"vllm-dp-{addr}-{port}"),
            start // local,
            -(-size // local),
            "worker" if headless or start > 0 else "head",
            {"data_parallel_address": addr, "data_parallel_rpc_port": port},
        )
    return None


def from_slurm(env: Mapping[str, str]) -> Derived | None:
    """Slurm sets these in every task of a job step (sbatch/srun man pages)."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job:
        return None
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    nnodes = _int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES"))
    rank = _int(env.get("SLURM_NODEID"))
    keys = ("SLURM_JOB_NAME", "SLURMD_NODENAME", "SLURM_PROCID", "SLURM_STEP_ID")
    detail = {k: env[k] for k in keys if k in env}
    if step and "SLURM_STEP_ID" not in detail:
        detail["SLURM_STEP_ID"] = step
    # the job, not the step: a batch script and its srun tasks see different step ids
    return Derived("slurm", sanitize_id(f"slurm-{job}"), rank, nnodes, None, detail)


def from_lws(env: Mapping[str, str]) -> Derived | None:
    """A Kubernetes LeaderWorkerSet pod: the leader's address (same in every pod of the group),
    the group size and this pod's worker index (0 = the leader)."""
    leader = env.get("LWS_LEADER_ADDRESS")
    if not leader:
        return None
    index = _int(env.get("LWS_WORKER_INDEX"))
    # "<lws>-<group index>.<lws>.<namespace>" -> the first label names the group
    gid = sanitize_id("lws-" + leader.split(".", 1)[0])
    detail = {"leader_address": leader}
    pod = env.get("POD_NAME") or env.get("HOSTNAME")
    if pod:
        detail["pod"] = pod
    role = None if index is None else ("head" if index == 0 else "worker")
    return Derived("lws", gid, index, _int(env.get("LWS_GROUP_SIZE")), role, detail)


def from_ray(env: Mapping[str, str]) -> Derived | None:
    """A node joined to a Ray cluster: every node knows the head's address (``RAY_ADDRESS``)."""
    addr = env.get("RAY_ADDRESS")
    if not addr or addr == "local":
        return None
    return Derived(
        "ray",
        sanitize_id("ray-" + addr.removeprefix("ray://")),
        None,
        None,
        None,
        {"ray_address": addr},
    )


_SOURCES: tuple[Callable[[Sequence[str], Mapping[str, str]], Derived | None], ...] = (
    lambda argv, env: from_vllm(argv),
    lambda argv, env: from_slurm(env),
    lambda argv, env: from_lws(env),
    lambda argv, env: from_ray(env),
)


def derive(argv: Sequence[str], env: Mapping[str, str]) -> list[Derived]:
    """Every source that says something, most specific first (vLLM's flags know the rank
    inside the launch; the scheduler knows the job)."""
    return [d for d in (src(argv, env) for src in _SOURCES) if d is not None]


def _is_multi_node(d: Derived) -> bool:
    return d.nnodes is not None and d.nnodes > 1


def resolve(
    requested: str | None,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    host: str | None = None,
    clock: Mapping[str, object] | None = None,
) -> GroupInfo | None:
    """The group of this capture, or None.

    ``requested`` is ``--group``: an id, ``"auto"`` (derive; a usage error if nothing can be
    derived), or None (derive only when a source shows several nodes, so a single-node Slurm
    job does not become a group of one).
    """
    found = derive(argv, env)
    if requested is None:
        found = [d for d in found if _is_multi_node(d)]
        if not found:
            return None
    if requested not in (None, AUTO) and not _ID_RE.match(requested):
        raise UsageError(
            f"--group {requested!r}: use letters, digits, '.', '_' or '-' (at most 128), "
            "or 'auto' to derive it from the launcher"
        )
    if not found and requested == AUTO:
        raise UsageError(
            "--group auto: nothing to derive a group from (no --nnodes/--node-rank, "
            "data-parallel flags, SLURM_JOB_ID, LWS_LEADER_ADDRESS or RAY_ADDRESS); "
            "give the id: --group ID"
        )
    best = found[0] if found else Derived("flag", None)
    # fill rank/size from the next source that knows them (e.g. Ray + Slurm)
    for d in found[1:]:
        if best.node_rank is None and d.node_rank is not None:
            best = replace(best, node_rank=d.node_rank)
        if best.nnodes is None and d.nnodes is not None:
            best = replace(best, nnodes=d.nnodes)
    detail = {f"{d.source}.{k}": v for d in found for k, v in d.detail.items()}
    if requested not in (None, AUTO):
        gid, source = requested, "flag"
        if found:
            detail["derived_id"] = str(best.group_id)
            detail["derived_from"] = best.source
    else:
        gid, source = str(best.group_id), best.source
    return GroupInfo(
        group_id=gid,
        source=source,
        node_rank=best.node_rank,
        nnodes=best.nnodes,
        host=host or socket.gethostname(),
        role=best.role,
        detail=detail,
        clock=dict(clock) if clock is not None else clock_evidence(),
    )


# ---------------------------------------------------------------------------------- clocks
def clock_sample(label: str) -> JSONObject:
    """One wall/monotonic pair read back to back (the pair's own error is their gap)."""
    m0 = time.monotonic_ns()
    wall = time.time_ns()
    m1 = time.monotonic_ns()
    return {"at": label, "wall_ns": wall, "mono_ns": (m0 + m1) // 2, "read_ns": m1 - m0}


_CHRONY_RE = re.compile(r"System time\s*:\s*([0-9.]+) seconds (fast|slow) of NTP time")
_TIMESYNC_RE = re.compile(r"Offset:\s*([+-]?[0-9.]+)\s*(ns|us|µs|ms|s)\b")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_chrony(text: str) -> float | None:
    """``chronyc tracking``: "System time : 0.000012 seconds fast of NTP time" -> +1.2e-05
    (positive: this clock is ahead of true time)."""
    m = _CHRONY_RE.search(text)
    if not m:
        return None
    value = float(m.group(1))
    return value if m.group(2) == "fast" else -value


def parse_timesyncd(text: str) -> float | None:
    """``timedatectl timesync-status``: "Offset: -1.234ms" -> -0.001234 (server minus local
    in timesyncd's sign; recorded as reported)."""
    m = _TIMESYNC_RE.search(text)
    return None if not m else float(m.group(1)) * _UNIT[m.group(2)]


def _run(cmd: list[str]) -> tuple[str | None, str | None]:
    exe = shutil.which(cmd[0])
    if exe is None:
        return None, f"{cmd[0]} not installed"
    try:
        done = subprocess.run(
            [exe, *cmd[1:]],
            capture_output=True,
            timeout=_SYNC_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{cmd[0]}: {type(exc).__name__}"
    text = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, f"{' '.join(cmd)} exited {done.returncode}" + (f": {err[-1]}" if err else "")
    return text, None


def ntp_offset() -> JSONObject:
    """The NTP offset chrony or timesyncd reports, or why none was readable."""
    errors: list[str] = []
    for source, cmd, parse in (
        ("chrony", ["chronyc", "-n", "tracking"], parse_chrony),
        ("timesyncd", ["timedatectl", "timesync-status"], parse_timesyncd),
    ):
        text, err = _run(cmd)
        if text is not None:
            offset = parse(text)
            if offset is not None:
                return {"source": source, "offset_s": offset, "error": None}
            err = f"{' '.join(cmd)}: no offset in its output"
        errors.append(str(err))
    return {"source": None, "offset_s": None, "error": "; ".join(errors)}


def clock_evidence() -> JSONObject:
    return {"samples": [clock_sample("start")], "ntp": ntp_offset()}


def with_end_sample(info: GroupInfo) -> GroupInfo:
    samples = [*info.clock.get("samples", []), clock_sample("end")]
    return replace(info, clock={**info.clock, "samples": samples})
