"""Ray's own logs of this run into ``logs/extra/ray/`` (SPEC §3, 0.2).

With the Ray executor the workers' output and the raylet's never reach the head's stdout; Ray
writes them into its session folder (``<temp dir>/session_latest/logs``: ``worker-*.out/.err``,
``python-core-worker-*.log``, ``raylet.out/.err``, ``gcs_server.out/.err``; Ray docs "Logging
directory structure"). After the run, the files of that folder written since the capture
started are copied — bounded (the last ``per_file`` bytes of each, ``total`` bytes and
``max_files`` files at most, newest first), and redacted like the main log — and each one is
analysed with the rest (``analysis.json["extra_logs"]``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kk3evidence.bundle.archive import BundleWriter
from kk3evidence.errors import BundleError, Kk3Error
from kk3evidence.model import JSONObject

#: what Ray writes per worker/raylet; other files there (dashboard, events) are left out
_WANTED = re.compile(
    r"^(worker-.*\.(out|err)|python-core-worker-.*\.log|raylet\.(out|err)|"
    r"gcs_server\.(out|err)|runtime_env_setup-.*\.log)$"
)
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
EXTRA_DIR = "logs/extra/ray"


@dataclass(frozen=True, slots=True)
class RayLimits:
    per_file: int = 8 * 1024 * 1024
    total: int = 64 * 1024 * 1024
    max_files: int = 200


def uses_ray(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """The Ray executor was asked for (flag or env), or the process joins a Ray cluster."""
    joined = " ".join(argv)
    return (
        "--distributed-executor-backend ray" in joined
        or "--distributed-executor-backend=ray" in joined
        or env.get("VLLM_DISTRIBUTED_EXECUTOR_BACKEND") == "ray"
        or bool(env.get("RAY_ADDRESS"))
    )


def session_logs(env: Mapping[str, str]) -> Path:
    """``$RAY_TMPDIR`` (else /tmp) ``/ray/session_latest/logs``."""
    root = Path(env.get("RAY_TMPDIR") or "/tmp") / "ray"
    return root / "session_latest" / "logs"


def _candidates(folder: Path, since: float, limits: RayLimits) -> list[tuple[Path, os.stat_result]]:
    found: list[tuple[Path, os.stat_result]] = []
    for entry in os.scandir(folder):
        if not entry.is_file(follow_symlinks=False) or not _WANTED.match(entry.name):
            continue
        st = entry.stat(follow_symlinks=False)
        if st.st_mtime >= since:
            found.append((Path(entry.path), st))
    found.sort(key=lambda item: item[1].st_mtime, reverse=True)
    return found[: limits.max_files]


def collect(
    folder: Path,
    since: float,
    *,
    write: Callable[[str, bytes], None],
    redact: Callable[[bytes], bytes],
    note: Callable[[str, str], None],
    limits: RayLimits = RayLimits(),
) -> list[str]:
    """Copy this run's Ray logs from ``folder`` via ``write(member, data)``; returns members.

    ``since`` is the capture's start (epoch seconds): older files belong to earlier runs.
    Anything cut or skipped is reported through ``note(what, why)``.
    """
    if not folder.is_dir():
        note("logs/extra/ray", f"no Ray session logs at {folder}")
        return []
    members: list[str] = []
    left = limits.total
    for path, st in _candidates(folder, since, limits):
        if left <= 0:
            note(f"{EXTRA_DIR}/{path.name}", f"left out: the {limits.total} byte total was used")
            continue
        keep = min(st.st_size, limits.per_file, left)
        try:
            with open(path, "rb") as fh:
                fh.seek(max(st.st_size - keep, 0))
                data = fh.read(keep)
        except OSError as exc:
            note(f"{EXTRA_DIR}/{path.name}", f"unreadable: {exc.strerror}")
            continue
        if keep < st.st_size:
            cut = data.find(b"\n") + 1  # start on a whole line
            data = data[cut:]
            note(f"{EXTRA_DIR}/{path.name}", f"only the last {len(data)} of {st.st_size} bytes")
        member = f"{EXTRA_DIR}/{_SAFE.sub('_', path.name).lstrip('._-') or 'log'}"
        write(member, redact(data))
        members.append(member)
        left -= len(data)
    return members


def analyse_extra(paths: Mapping[str, Path]) -> list[JSONObject]:
    """Each extra log's analysis summary, for ``analysis.json["extra_logs"]``."""
    from kk3evidence.analysis.engine import analyze

    out: list[JSONObject] = []
    for member, path in paths.items():
        try:
            a = analyze(str(path))
        except Kk3Error as exc:
            out.append({"member": member, "error": str(exc)})
            continue
        out.append(
            {
                "member": member,
                "lines_total": a.lines_total,
                "last_stage_reached": a.last_stage_reached,
                "first_failure": a.to_json()["first_failure"],
                "failures": sum(1 for f in a.findings if f.kind == "failure"),
            }
        )
    return out


def capture_hook(
    writer: BundleWriter,
    redact: Callable[[bytes], bytes | memoryview],
    argv: Sequence[str],
    env: Mapping[str, str],
    since: float,
) -> dict[str, Path]:
    """What ``run_capture`` calls after the run: member -> staging path of each Ray log."""
    if not uses_ray(argv, env):
        return {}
    try:
        members = collect(
            session_logs(env),
            since,
            write=writer.add_bytes,
            redact=lambda data: bytes(redact(data)),
            note=writer.add_not_collected,
        )
    except (OSError, BundleError) as exc:  # a failed probe is data, never a crash
        writer.add_not_collected("logs/extra/ray", f"{type(exc).__name__}: {exc}")
        return {}
    return {m: writer.path_of(m) for m in members}
