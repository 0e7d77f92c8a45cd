"""The configuration vLLM itself reports at start (SPEC §4 ``engine_config``), never argv.

vLLM prints what the engine actually runs with: the V1 engine config line
(``enable_prefix_caching=True`` even when no flag asked for it), the API server's
``non-default args`` dict, and the KV-cache sizing lines (available KV memory, KV tokens,
maximum concurrency, the estimated maximum model length when the context does not fit).
Judgements about prefix caching, context length or concurrency must use these values.

The collector is fed the same blocks as the analysis engine and looks for a handful of literal
markers in one literal pass per block (:mod:`kk3evidence._literals`, each marker reported once);
each value keeps the first line that stated it, with its line number, so a reader can check it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kk3evidence._literals import LiteralScanner
from kk3evidence.model import JSONObject

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


# Keys read from the engine config line; `(?<![\w.])` keeps `dtype=` off `kv_cache_dtype=`.
_CONFIG_KEYS: dict[str, tuple[str, str]] = {
    # json key: (config key, value kind)
    "enable_prefix_caching": ("enable_prefix_caching", "bool"),
    "enable_chunked_prefill": ("enable_chunked_prefill", "bool"),
    "enforce_eager": ("enforce_eager", "bool"),
    "max_model_len": ("max_seq_len", "int"),
    "tensor_parallel_size": ("tensor_parallel_size", "int"),
    "pipeline_parallel_size": ("pipeline_parallel_size", "int"),
    "data_parallel_size": ("data_parallel_size", "int"),
    "dtype": ("dtype", "str"),
    "kv_cache_dtype": ("kv_cache_dtype", "str"),
    "quantization": ("quantization", "str"),
    "device": ("device_config", "str"),
    "served_model_name": ("served_model_name", "str"),
    "model": ("model", "str"),
}
_VERSION = re.compile(r"Initializing a V\d+ LLM engine \(v?([^)\s]+)\)")


def _config_line(body: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    m = _VERSION.search(body)
    if m:
        out["vllm_version"] = m.group(1)
    for key, (name, kind) in _CONFIG_KEYS.items():
        km = re.search(rf"(?<![\w.]){name}=('[^']*'|[^,\s]+)", body)
        if km is None:
            continue
        raw = km.group(1).strip("'")
        if kind == "bool":
            if raw in ("True", "False"):
                out[key] = raw == "True"
        elif kind == "int":
            if raw.isdigit():
                out[key] = int(raw)
        elif raw != "None":
            out[key] = raw
    return out


def _non_default(body: str) -> dict[str, Any]:
    i = body.find("non-default args:")
    if i < 0:
        return {}
    text = body[i + len("non-default args:"):].strip()
    try:
        # A Python dict repr of plain literals; literal_eval never executes anything.
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {"non_default_args": {str(k): _jsonable(v) for k, v in value.items()}}


def _jsonable(v: object) -> Any:
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    if isinstance(v, list | tuple | set):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


_AVAILABLE = re.compile(r"Available KV cache memory:\s*([\d.,]+)\s*GiB")
_CPU_SET = re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache")
_TOKENS = re.compile(r"(?:(\w+) )?KV cache size:\s*([\d,]+)\s*tokens")
_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request:\s*([\d.,]+)x")
_ESTIMATED = re.compile(r"estimated maximum model length is (\d+)")


def _kv_memory(body: str) -> dict[str, Any]:
    m = _AVAILABLE.search(body) or _CPU_SET.search(body)
    # Kept as stated (GiB, vLLM rounds to 2 places on GPU, 1 on CPU): "0.0" is not 0 bytes.
    return {"kv_cache_memory_gib": _num(m.group(1))} if m else {}


def _kv_tokens(body: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    m = _TOKENS.search(body)
    if m:
        out["kv_cache_tokens"] = int(_num(m.group(2)))
    c = _CONC.search(body)
    if c:
        out["max_concurrency"] = _num(c.group(2))
        out["max_concurrency_tokens_per_request"] = int(_num(c.group(1)))
    return out


def _estimated(body: str) -> dict[str, Any]:
    m = _ESTIMATED.search(body)
    return {"estimated_max_model_len": int(m.group(1))} if m else {}


#: literal marker -> parser of the line that carries it
_MARKERS: tuple[tuple[bytes, Callable[[str], dict[str, Any]]], ...] = (
    (b"LLM engine (", _config_line),
    (b"non-default args:", _non_default),
    (b"Available KV cache memory", _kv_memory),
    (b"GiB for KV cache", _kv_memory),
    (b"KV cache size:", _kv_tokens),
    (b"Maximum concurrency for", _kv_tokens),
    (b"estimated maximum model length", _estimated),
)


_SCANNER: list[LiteralScanner] = []  # the markers compiled once; each collector clones it


def _marker_scanner() -> LiteralScanner:
    if not _SCANNER:
        markers = [m for m, _ in _MARKERS]
        _SCANNER.append(LiteralScanner(markers, single=[True] * len(markers)).prepare())
    return _SCANNER[0].clone()


@dataclass(slots=True)
class EngineConfigCollector:
    """Streaming collector: :meth:`scan` every block, then :meth:`result`."""

    values: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)  # value key -> 1-based line number
    _done: set[bytes] = field(default_factory=set)
    _scanner: LiteralScanner | None = field(default=None, repr=False, compare=False)

    def scan(self, block: bytes, lo: int, hi: int, base: int) -> None:
        """Look for the markers in ``block[lo:hi]``; ``base`` lines precede ``lo``. Lines are
        taken in log order, so the first statement of a value wins however the log was cut
        into blocks."""
        found: list[tuple[int, bytes, Callable[[str], dict[str, Any]]]] = []
        firsts = self._first_offsets(block, lo, hi)
        for i, (marker, parse) in enumerate(_MARKERS):
            if marker in self._done:
                continue
            pos = block.find(marker, lo, hi) if firsts is None else firsts.get(i, -1)
            if pos >= 0:
                found.append((pos, marker, parse))
        for pos, marker, parse in sorted(found, key=lambda f: f[0]):
            start = max(block.rfind(b"\n", lo, pos) + 1 or lo, lo)
            end = block.find(b"\n", pos, hi)
            raw = block[start : hi if end < 0 else end]
            line_no = base + block.count(b"\n", lo, start) + 1
            self.add_line(raw.decode("utf-8", errors="replace"), line_no, parse)
            self._done.add(marker)

    def _first_offsets(self, block: bytes, lo: int, hi: int) -> dict[int, int] | None:
        """Where each marker first occurs in ``block[lo:hi]``, from one literal pass (each
        marker reported once), or ``None`` where the scanner may miss overlapping markers
        (re2): then each is looked for with ``bytes.find``."""
        if len(self._done) == len(_MARKERS):
            return {}
        if self._scanner is None:
            self._scanner = _marker_scanner()
        if not self._scanner.exact_ids:
            return None
        firsts: dict[int, int] = {}
        for end, i in self._scanner.hits(block, lo, hi):
            firsts.setdefault(i, end - len(_MARKERS[i][0]))
        return firsts

    def add_line(
        self, text: str, line_no: int, parse: Callable[[str], JSONObject] | None = None
    ) -> None:
        """Record the values one line states (the first statement of each value wins)."""
        body = _ANSI.sub("", text).rsplit("\r", 1)[-1]
        found: dict[str, Any] = {}
        for marker, fn in _MARKERS:
            if parse is None and marker.decode() not in body:
                continue
            if parse is not None and fn is not parse:
                continue
            found.update(fn(body))
        for key, value in found.items():
            if key not in self.values:
                self.values[key] = value
                self.lines[key] = line_no

    def result(self) -> JSONObject | None:
        if not self.values:
            return None
        return {**self.values, "lines": dict(self.lines)}


def engine_config_of_lines(lines: list[str]) -> JSONObject | None:
    """The engine config stated by ``lines`` (tests and tools that hold a log in memory)."""
    col = EngineConfigCollector()
    for no, text in enumerate(lines, start=1):
        col.add_line(text, no)
    return col.result()


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Typed view of an analysis' ``engine_config`` (unknown stays None, never 0/False)."""

    vllm_version: str | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None
    device: str | None = None
    served_model_name: str | None = None
    kv_cache_memory_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens_per_request: int | None = None
    estimated_max_model_len: int | None = None
    non_default_args: Mapping[str, Any] = field(default_factory=dict)
    lines: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: object) -> EngineConfig | None:
        if not isinstance(data, Mapping) or not data:
            return None

        def typed(key: str, kind: type) -> Any:
            v = data.get(key)
            if kind is int and isinstance(v, bool):
                return None
            if kind is float and isinstance(v, int | float) and not isinstance(v, bool):
                return float(v)
            return v if isinstance(v, kind) else None

        nda = data.get("non_default_args")
        lines = data.get("lines")
        return cls(
            vllm_version=typed("vllm_version", str),
            enable_prefix_caching=typed("enable_prefix_caching", bool),
            enable_chunked_prefill=typed("enable_chunked_prefill", bool),
            max_model_len=typed("max_model_len", int),
            tensor_parallel_size=typed("tensor_parallel_size", int),
            device=typed("device", str),
            served_model_name=typed("served_model_name", str),
            kv_cache_memory_gib=typed("kv_cache_memory_gib", float),
            kv_cache_tokens=typed("kv_cache_tokens", int),
            max_concurrency=typed("max_concurrency", float),
            max_concurrency_tokens_per_request=typed("max_concurrency_tokens_per_request", int),
            estimated_max_model_len=typed("estimated_max_model_len", int),
            non_default_args=dict(nda) if isinstance(nda, Mapping) else {},
            lines={str(k): v for k, v in lines.items() if isinstance(v, int)}
            if isinstance(lines, Mapping) else {},
        )


def engine_numbers(analysis: object) -> list[str]:
    """What vLLM reported that the next step asks for, in full (a cut failure line hides it),
    from an analysis JSON object."""
    cfg = analysis.get("engine_config") if isinstance(analysis, Mapping) else None
    est = cfg.get("estimated_max_model_len") if isinstance(cfg, Mapping) else None
    if isinstance(est, int) and not isinstance(est, bool):
        return [f"vLLM estimates the maximum model length that fits at {est} (next: "
                f"--max-model-len {est})"]
    return []
