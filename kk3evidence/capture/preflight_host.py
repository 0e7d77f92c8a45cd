"""Host probes for ``kk3evidence preflight``: files, the installed vLLM, NVML, the port, limits.

Each probe is cheap (no vLLM or torch import: reading vLLM's files takes milliseconds, importing
it seconds) and a failed probe is a fact (``None`` / a reason), never a crash. The verdicts are
made by :mod:`kk3evidence.handoff.preflight`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import re
import resource
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import BinaryIO

from kk3evidence.capture.fingerprint import collect_gpus, find_interpreter
from kk3evidence.handoff.preflight import (
    FileFact,
    GpuDevice,
    GpuFacts,
    HostFacts,
    ModelFacts,
    PortFacts,
    PreflightResult,
    VllmFacts,
    judge,
)
from kk3evidence.handoff.records import Gpus
from kk3evidence.vllm_args import parse_serve_argv

__all__ = ["collect_facts", "run_preflight"]

_LFS_HEAD = b"version https://git-lfs.github.com/spec/v1"
_MAX_HEADER = 100 << 20  # safetensors refuses bigger headers too
_ARCH_RE = re.compile(r'^\s*"([A-Za-z0-9_]+)"\s*:\s*\(', re.M)


def run_preflight(argv: Sequence[str], *, recipe: str | None = None,
                  env: Mapping[str, str] | None = None, nvml: object = None) -> PreflightResult:
    """Probe the host for ``argv`` and judge it (the ``preflight`` command's library form)."""
    t0 = time.monotonic()
    facts = collect_facts(argv, env=env, nvml=nvml)
    return judge(argv, facts, recipe=recipe, started=t0)


def collect_facts(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  nvml: object = None) -> HostFacts:
    env = dict(os.environ if env is None else env)
    cmd = parse_serve_argv(argv)  # raises InputError for a non-vllm command
    env = {**env, **cmd.env}  # `env A=B vllm serve ...` assignments apply to the server
    cache = env.get("VLLM_CACHE_ROOT") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm")
    return HostFacts(
        collected_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        env=MappingProxyType(env),
        vllm=probe_vllm(argv, env),
        model=probe_model(cmd.model, env, cmd.flags.get("download-dir"),
                          cmd.flags.get("revision")),
        gpus=probe_gpus(nvml),
        port=probe_port(cmd.bind_host or "0.0.0.0", cmd.port),
        numa_nodes=_numa_nodes(),
        mem_available_bytes=_meminfo("MemAvailable"),
        shm_bytes=_free_total("/dev/shm")[1],
        nofile=resource.getrlimit(resource.RLIMIT_NOFILE),
        cache_dir=cache,
        cache_free_bytes=_free_total(_existing_parent(cache))[0],
        in_container=os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"),
    )


# --- the installed vLLM ------------------------------------------------------------------------


def probe_vllm(argv: Sequence[str], env: Mapping[str, str]) -> VllmFacts:
    interp, how = find_interpreter(argv, env)
    if interp is None:
        return VllmFacts(None, how)
    try:
        done = subprocess.run(
            [interp, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, timeout=20, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return VllmFacts(interp, how, error=f"cannot run {interp}: {exc}")
    site = done.stdout.decode("utf-8", "replace").strip()
    if done.returncode != 0 or not os.path.isdir(site):
        return VllmFacts(interp, how, error=f"{interp} did not name its site-packages")
    dists = _dists(site)
    registry = Path(site, "vllm", "model_executor", "models", "registry.py")
    archs: frozenset[str] | None = None
    try:
        archs = frozenset(_ARCH_RE.findall(registry.read_text(encoding="utf-8")))
    except OSError:
        archs = None
    return VllmFacts(interp, how, version=dists.get("vllm"), dists=MappingProxyType(dists),
                     site_packages=site, registry_archs=archs or None)


def _dists(site: str) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        names = os.listdir(site)
    except OSError:
        return out
    for n in names:
        if n.endswith((".dist-info", ".egg-info")):
            stem = n.rsplit(".", 1)[0]
            name, _, ver = stem.partition("-")
            out[name.lower().replace("_", "-")] = ver
    return out


# --- the model ---------------------------------------------------------------------------------


def _hf_cache(env: Mapping[str, str]) -> Path:
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return Path(home, "hub")


def _snapshot(model: str, roots: list[Path], revision: object) -> tuple[Path | None, str]:
    folder = "models--" + model.replace("/", "--")
    tried = []
    for root in roots:
        repo = root / folder
        tried.append(str(repo))
        rev = str(revision) if isinstance(revision, str) else "main"
        ref = repo / "refs" / rev
        commit = ref.read_text().strip() if ref.is_file() else rev
        snap = repo / "snapshots" / commit
        if snap.is_dir():
            return snap, f"HF cache snapshot {commit} in {root}"
    return None, f"no local folder and no HF cache snapshot (looked in {', '.join(tried)})"


def probe_model(model: str | None, env: Mapping[str, str], download_dir: object,
                revision: object) -> ModelFacts:
    if model is None:
        return ModelFacts(None, None, "no model in the command")
    p = Path(os.path.expanduser(model))
    if p.is_dir():
        return _model_files(model, p, "local directory")
    if p.exists():
        return ModelFacts(model, None, f"{model} exists but is not a directory")
    roots = ([Path(str(download_dir))] if isinstance(download_dir, str) else []) + [_hf_cache(env)]
    snap, how = _snapshot(model, roots, revision) if model.count("/") == 1 and not \
        model.startswith(("/", ".")) else (None, f"{model} is not a directory")
    if snap is None:
        offline = any(env.get(k, "").lower() in ("1", "true", "yes", "on")
                      for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
        remote = model.count("/") == 1 and not model.startswith(("/", ".")) and not offline
        return ModelFacts(model, None, how, remote=remote)
    return _model_files(model, snap, how)


def _model_files(given: str, folder: Path, how: str) -> ModelFacts:
    files: list[FileFact] = []
    for entry in sorted(folder.rglob("*")):
        if entry.is_file() and ".git" not in entry.parts:
            files.append(_file_fact(folder, entry))
    config, config_error = _read_config(folder / "config.json")
    shards, index_error = _index_shards(folder)
    return ModelFacts(given, str(folder), how, config=config, config_error=config_error,
                      files=tuple(files), index_shards=shards, index_error=index_error)


def _file_fact(folder: Path, entry: Path) -> FileFact:
    name = entry.relative_to(folder).as_posix()
    try:
        size = entry.stat().st_size  # follows HF cache symlinks to the blobs
        with entry.open("rb") as fh:
            head = fh.read(8)
            if size < 1024 and (head + fh.read(64)).startswith(_LFS_HEAD):
                return FileFact(name, size, lfs_pointer=True)
            if name.endswith(".safetensors"):
                problem, expected = _safetensors_problem(fh, head, size)
                return FileFact(name, size, header_problem=problem, expected_size=expected)
    except OSError as exc:
        return FileFact(name, 0, header_problem=f"unreadable ({exc.strerror})")
    return FileFact(name, size)


def _safetensors_problem(fh: BinaryIO, head: bytes, size: int) -> tuple[str | None, int | None]:
    """Compare a safetensors file's length with what its header declares."""
    if len(head) < 8:
        return f"only {size} bytes: no safetensors header", None
    (n,) = struct.unpack("<Q", head)
    if n > _MAX_HEADER or 8 + n > size:
        return f"header length {n} runs past the end of the {size}-byte file (truncated)", None
    try:
        header = json.loads(fh.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items()
                   if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError):
        return "the header is not valid safetensors JSON", None
    expected = 8 + n + end
    if expected != size:
        return (f"is {size} bytes, its header says {expected} "
                f"({'truncated' if size < expected else 'trailing bytes'})"), expected
    return None, expected


def _read_config(path: Path) -> tuple[Mapping[str, object] | None, str | None]:
    if not path.is_file():
        return None, f"no config.json in {path.parent}"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{path} unreadable ({exc})"
    except ValueError as exc:
        return None, f"{path} is not valid JSON ({exc})"
    if not isinstance(data, dict):
        return None, f"{path} is not a JSON object"
    return MappingProxyType(data), None


def _index_shards(folder: Path) -> tuple[tuple[str, ...] | None, str | None]:
    idx = sorted(folder.glob("*.safetensors.index.json"))
    if not idx:
        return None, None
    try:
        weight_map = json.loads(idx[0].read_text(encoding="utf-8"))["weight_map"]
        return tuple(sorted({str(v) for v in weight_map.values()})), None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"{idx[0].name} is not a valid safetensors index ({exc})"


# --- GPUs, port, limits ------------------------------------------------------------------------


def probe_gpus(nvml: object = None) -> GpuFacts:
    gpus = Gpus.from_json(collect_gpus(nvml))
    devices = [
        GpuDevice(d.index or 0, d.name or "?", d.memory_total_bytes, d.memory_used_bytes,
                  tuple((p.pid or 0, p.name or "?", p.used_memory_bytes) for p in d.processes))
        for d in gpus.devices
    ]
    return GpuFacts(gpus.source or "none", gpus.error, gpus.driver_version,
                    gpus.cuda_driver_version, tuple(devices))


def probe_port(host: str, port: int) -> PortFacts:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bind_host = "" if host in ("0.0.0.0", "::") else host
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # uvicorn sets SO_REUSEADDR too, so TIME_WAIT leftovers do not count as taken
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind_host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return PortFacts(host, port, False, "address already in use", _holders(port))
            return PortFacts(host, port, None, f"bind failed: {exc.strerror}")
    return PortFacts(host, port, True, "bind succeeded (released at once)")


def _holders(port: int) -> tuple[str, ...]:
    """Processes listening on ``port`` (from /proc/net/tcp* inodes and /proc/*/fd)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    found: list[str] = []
    for pid in (d for d in os.listdir("/proc") if d.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        links = set()
        for fd in fds:  # one fd closing while we look must not hide the others
            with contextlib.suppress(OSError):
                links.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        if any(f"socket:[{i}]" in links for i in inodes):
            found.append(f"pid {pid} ({_cmdline(pid)})")
    return tuple(found)


def _cmdline(pid: str) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(raw.decode("utf-8", "replace").split("\0")).strip()[:120] or "?"


def _numa_nodes() -> tuple[int, ...] | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Mems_allowed_list:"):
                return tuple(_ranges(line.split(":", 1)[1].strip()))
    except OSError:
        return None
    return None


def _ranges(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        if a.strip().isdigit():
            out += list(range(int(a), int(b or a) + 1))
    return out


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _free_total(path: str | None) -> tuple[int | None, int | None]:
    if path is None:
        return None, None
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None, None
    return usage.free, usage.total


def _existing_parent(path: str) -> str | None:
    p = Path(path)
    for cand in (p, *p.parents):
        if cand.exists():
            return str(cand)
    return None


def preflight_member(argv: Sequence[str], env: Mapping[str, str], shown_argv: Sequence[str],
                     redact: Callable[..., str],
                     recipe: str | None = None) -> tuple[dict[str, object], str]:
    """``preflight.json`` for ``capture --preflight`` and a one-line summary for the operator.

    ``shown_argv`` is the redacted argv; every evidence string passes through ``redact`` (the
    bundle's redactor ``.text``) so a secret the probes echo never reaches the bundle.
    """
    result = run_preflight(argv, recipe=recipe, env=env)
    doc = result.to_json()
    doc["argv"] = list(shown_argv)
    for check in doc["checks"]:  # type: ignore[attr-defined]
        check["summary"] = redact(check["summary"], where="preflight.json")
        check["evidence"] = [redact(e, where="preflight.json") for e in check["evidence"]]
    n = result.counts()
    failed = ", ".join(c.id for c in result.failed)
    line = (f"preflight: {n['fail']} fail, {n['warn']} warn, {n['unknown']} unknown, "
            f"{n['pass']} pass in {result.seconds:.2f} s" + (f" - FAILED: {failed}" if failed
                                                            else ""))
    return doc, line
