"""Typed records of a bundle's JSON members, built once when the bundle is read.

diff, check, report and compare read fields, never dotted strings. Building is tolerant: a 0.1
bundle or a member with missing or mistyped fields gives records whose unknown values are
None (never 0, False or ""), so "unknown" survives to every judgement. ``raw`` keeps the member
as read, for writing it back or showing it whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kk3evidence.model import JSONValue


def _obj(v: object) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _list(v: object) -> list[Any]:
    return list(v) if isinstance(v, list | tuple) else []


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _float(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _text(v: object) -> str | None:
    """A string or a number shown as a string (e.g. a CUDA driver version stored as 12090)."""
    if isinstance(v, bool) or v is None:
        return None
    return str(v) if isinstance(v, str | int | float) else None


# --- fingerprint.json ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Host:
    hostname: str | None = None
    kernel: str | None = None
    os: str | None = None
    arch: str | None = None
    cpu_count: int | None = None
    mem_total_bytes: int | None = None

    @classmethod
    def from_json(cls, data: object) -> Host:
        d = _obj(data)
        return cls(_str(d.get("hostname")), _str(d.get("kernel")), _str(d.get("os")),
                   _str(d.get("arch")), _int(d.get("cpu_count")), _int(d.get("mem_total_bytes")))


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int | None = None
    name: str | None = None
    used_memory_bytes: int | None = None
    gpu_index: int | None = None  # set in notes.cluster.gpu_processes

    @classmethod
    def from_json(cls, data: object, gpu_index: int | None = None) -> GpuProcess:
        d = _obj(data)
        idx = _int(d.get("gpu_index"))
        return cls(_int(d.get("pid")), _str(d.get("name")), _int(d.get("used_memory_bytes")),
                   idx if idx is not None else gpu_index)

    def describe(self) -> str:
        mem = (f", {self.used_memory_bytes / 2**30:.1f} GiB"
               if self.used_memory_bytes is not None else "")
        gpu = "?" if self.gpu_index is None else self.gpu_index
        return " ".join(f"GPU{gpu}: pid {self.pid} {self.name or ''}".split()) + mem


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    compute_capability: str | None = None
    processes: tuple[GpuProcess, ...] = ()
    mig_mode: str | bool | None = None
    ecc_mode: str | bool | None = None

    @classmethod
    def from_json(cls, data: object) -> Gpu:
        d = _obj(data)
        idx = _int(d.get("index"))
        return cls(idx, _str(d.get("name")), _str(d.get("uuid")), _str(d.get("pci_bus_id")),
                   _int(d.get("memory_total_bytes")), _int(d.get("memory_used_bytes")),
                   _text(d.get("compute_capability")),
                   tuple(GpuProcess.from_json(p, idx) for p in _list(d.get("processes"))
                         if isinstance(p, Mapping)),
                   _mode(d.get("mig_mode")), _mode(d.get("ecc_mode")))


def _mode(v: object) -> str | bool | None:
    return v if isinstance(v, str | bool) else None


@dataclass(frozen=True, slots=True)
class Gpus:
    source: str | None = None  # "nvml" when NVML answered; anything else: count unknown
    error: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_version: str | None = None
    devices: tuple[Gpu, ...] = ()

    @property
    def nvml(self) -> bool:
        return self.source == "nvml"

    @property
    def count(self) -> int | None:
        """GPUs NVML saw; None (unknown) when NVML did not answer."""
        return len(self.devices) if self.nvml else None

    @classmethod
    def from_json(cls, data: object) -> Gpus:
        d = _obj(data)
        return cls(_str(d.get("source")), _str(d.get("error")), _text(d.get("driver_version")),
                   _text(d.get("cuda_driver_version")), _text(d.get("nvml_version")),
                   tuple(Gpu.from_json(x) for x in _list(d.get("devices"))
                         if isinstance(x, Mapping)))


@dataclass(frozen=True, slots=True)
class Container:
    runtime: str | None = None
    runtime_source: str | None = None
    image_ref: str | None = None
    image_ref_source: str | None = None
    image_id: str | None = None
    image_id_source: str | None = None

    @classmethod
    def from_json(cls, data: object) -> Container:
        d = _obj(data)
        return cls(*(_str(d.get(k)) for k in (
            "runtime", "runtime_source", "image_ref", "image_ref_source", "image_id",
            "image_id_source")))


@dataclass(frozen=True, slots=True)
class PythonSide:
    interpreter: str | None = None
    python_version: str | None = None
    vllm_version: str | None = None
    torch_version: str | None = None
    torch_cuda: str | None = None
    cuda_device_count: int | None = None
    nccl_version: str | None = None
    source: str | None = None

    @property
    def cpu_build(self) -> bool:
        """Proof of a CPU build: a ``+cpu`` torch or vLLM version string."""
        return any(v is not None and v.endswith("+cpu")
                   for v in (self.torch_version, self.vllm_version))

    @classmethod
    def from_json(cls, data: object) -> PythonSide:
        d = _obj(data)
        return cls(_str(d.get("interpreter")), _text(d.get("python_version")),
                   _text(d.get("vllm_version")), _text(d.get("torch_version")),
                   _text(d.get("torch_cuda")), _int(d.get("cuda_device_count")),
                   _text(d.get("nccl_version")), _str(d.get("source")))


@dataclass(frozen=True, slots=True)
class Library:
    name: str
    path: str | None = None
    version: str | None = None


@dataclass(frozen=True, slots=True)
class Fingerprint:
    host: Host = field(default_factory=Host)
    gpus: Gpus = field(default_factory=Gpus)
    container: Container = field(default_factory=Container)
    python: PythonSide = field(default_factory=PythonSide)
    env: Mapping[str, str] = field(default_factory=dict)
    libraries: tuple[Library, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: object) -> Fingerprint:
        d = _obj(data)
        libs = tuple(Library(str(x.get("name")), _str(x.get("path")), _text(x.get("version")))
                     for x in _list(d.get("libraries")) if isinstance(x, Mapping))
        env = {str(k): str(v) for k, v in _obj(d.get("env")).items() if v is not None}
        return cls(Host.from_json(d.get("host")), Gpus.from_json(d.get("gpus")),
                   Container.from_json(d.get("container")),
                   PythonSide.from_json(d.get("python")), env, libs, dict(d))


# --- launch.json ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Launch:
    argv: tuple[str, ...] = ()
    cwd: str | None = None
    pid: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    exit_status: int | None = None
    ready_seconds: float | None = None
    api_host: str | None = None
    api_port: int | None = None
    base_url: str | None = None
    served_model: str | None = None
    stages_reached: tuple[str, ...] = ()
    interrupted_by: str | None = None
    #: another process that listened on the API port before launch ("port P held by pid N: …")
    port_holder: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: object) -> Launch:
        d = _obj(data)
        api = _obj(d.get("api"))
        ph = _obj(d.get("port_holder"))
        holder = (f"port {ph.get('port')} held by pid {ph.get('pid')}: {ph.get('cmdline')}"
                  if ph else None)
        return cls(
            argv=tuple(str(a) for a in _list(d.get("argv"))),
            cwd=_str(d.get("cwd")), pid=_int(d.get("pid")),
            started_at=_str(d.get("started_at")), ended_at=_str(d.get("ended_at")),
            exit_code=_int(d.get("exit_code")), signal=_int(d.get("signal")),
            exit_status=_int(d.get("exit_status")), ready_seconds=_float(d.get("ready_seconds")),
            api_host=_str(api.get("host")), api_port=_int(api.get("port")),
            base_url=_str(api.get("base_url")), served_model=_str(d.get("served_model")),
            stages_reached=tuple(str(s) for s in _list(d.get("stages_reached"))),
            interrupted_by=_str(d.get("interrupted_by")), port_holder=holder, raw=dict(d),
        )


# --- notes.json ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    variable: str
    before: str | int | float | bool | None = None  # "from" in the JSON
    after: str | int | float | bool | None = None  # "to" in the JSON
    at: str | None = None


@dataclass(frozen=True, slots=True)
class Cluster:
    text: str | None = None
    gpu_processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True, slots=True)
class Notes:
    notes: tuple[str, ...] = ()
    changes: tuple[Change, ...] = ()
    cluster: Cluster | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def texts(self) -> tuple[str, ...]:
        """Free notes and the cluster text: what the operator wrote down."""
        extra = (self.cluster.text,) if self.cluster and self.cluster.text else ()
        return self.notes + extra

    @classmethod
    def from_json(cls, data: object) -> Notes:
        d = _obj(data)
        changes = tuple(
            Change(str(c.get("variable")), _scalar(c.get("from")), _scalar(c.get("to")),
                   _str(c.get("at")))
            for c in _list(d.get("changes")) if isinstance(c, Mapping) and c.get("variable"))
        cl = d.get("cluster")
        cluster = None
        if isinstance(cl, Mapping):
            cluster = Cluster(_str(cl.get("text")), tuple(
                GpuProcess.from_json(p) for p in _list(cl.get("gpu_processes"))
                if isinstance(p, Mapping)))
        return cls(tuple(str(n) for n in _list(d.get("notes"))), changes, cluster, dict(d))


def _scalar(v: object) -> str | int | float | bool | None:
    return v if isinstance(v, str | int | float | bool) else None


# --- requests/*.json -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    name: str | None = None
    kind: str | None = None
    method: str | None = None
    url: str | None = None
    request_body: Any = None  # JSON as sent (object, or None)
    sent_at: str | None = None
    status: int | None = None
    error: str | None = None
    latency_s: float | None = None
    response_body: Any = None
    usage: Mapping[str, Any] = field(default_factory=dict)
    cached_tokens: int | None = None
    concurrency: int | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def body(self) -> Mapping[str, JSONValue]:
        return _obj(self.request_body)

    @classmethod
    def from_json(cls, data: object) -> Request:
        d = _obj(data)
        return cls(
            name=_text(d.get("name")), kind=_str(d.get("kind")), method=_str(d.get("method")),
            url=_str(d.get("url")), request_body=d.get("request_body"),
            sent_at=_str(d.get("sent_at")), status=_int(d.get("status")),
            error=_str(d.get("error")), latency_s=_float(d.get("latency_s")),
            response_body=d.get("response_body"), usage=dict(_obj(d.get("usage"))),
            cached_tokens=_int(d.get("cached_tokens")), concurrency=_int(d.get("concurrency")),
            raw=dict(d),
        )

    def get(self, key: str, default: JSONValue = None) -> JSONValue:
        """The raw member's value (fields that have no record field, e.g. a probe's extras)."""
        value: JSONValue = self.raw.get(key, default)
        return value


# --- probes/prefix_probe.json --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrefixCheck:
    id: str
    status: str  # pass | fail | unknown
    evidence: str | None = None


@dataclass(frozen=True, slots=True)
class PrefixProbe:
    """Capture's prefix-cache probe: the same long prompt twice and the four checks."""

    enabled: bool | None = None  # what the server reported (cache_config_info), else argv
    checks: tuple[PrefixCheck, ...] = ()

    def status(self, check_id: str) -> str | None:
        return next((c.status for c in self.checks if c.id == check_id), None)

    @classmethod
    def from_json(cls, data: object) -> PrefixProbe | None:
        d = _obj(data)
        if not d:
            return None
        enabled = d.get("prefix_caching_enabled")
        checks = tuple(PrefixCheck(str(c.get("id")), str(c.get("status")),
                                   _text(c.get("evidence")))
                       for c in _list(d.get("checks")) if isinstance(c, Mapping))
        return cls(enabled if isinstance(enabled, bool) else None, checks)
