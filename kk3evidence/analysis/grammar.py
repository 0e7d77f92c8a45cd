"""The two grammar layers: the line envelope and the rule-pattern mini-language.

**Envelope.** Every log line is parsed once into a :class:`LogLine`: wrappers (docker-compose
``svc-1  | ``, syslog ``Nov 30 01:02:03 host vllm[12]: ``, ISO timestamps, ANSI colour, ``\\r``
progress bars) are peeled off, then the producer's own prefix: vLLM ``(EngineCore_DP0 pid=1)``
process tags and ``INFO 05-10 12:00:00 [file.py:12]`` level/timestamp/source, torchrun
``[rank1]:``, NCCL ``host:pid:tid [dev] NCCL WARN``, PyTorch C++ ``[W1130 01:47:52.1 x.cpp:1]``
and uvicorn ``INFO:     ...``. Rules only ever see the remaining ``body``.

**Tracebacks.** :class:`TracebackTracker` follows multi-line Python tracebacks per process and
labels each line's role (header, frame, exception, detail, chain separator) and the chain it
belongs to, so a chained exception ("The above exception was the direct cause…", "During
handling of the above exception…") can be told apart from its cause.

**Pattern mini-language.** :func:`compile_pattern` turns a rule pattern such as
``"NCCL error{*}unhandled system error"`` or ``"Available KV cache memory: {size:kv}"`` into a
pyparsing expression built from the shared named :data:`BLOCKS` (defined once, here).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyparsing as pp

from kk3evidence.errors import RuleError

__all__ = [
    "BLOCKS",
    "LEVELS",
    "CompiledPattern",
    "Envelope",
    "LogLine",
    "TracebackTracker",
    "compile_pattern",
    "decode_line",
    "normalize_level",
    "parse_line",
    "pattern_regex",
]

# --------------------------------------------------------------------------------------------
# Shared building blocks (named once; rule patterns refer to them as {name} / {name:capture}).
# --------------------------------------------------------------------------------------------

_NUM_RE = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+"
_SIZE_UNITS = r"(?:bytes|byte|[KMGTP]iB|[KMGTP]B|kB|B|[KMGTP]i?b?)(?![A-Za-z])"

_BLOCK_REGEX: dict[str, str] = {
    # "20.00 MiB", "1.5GiB", "512 bytes", "-2.77 GiB"
    "size": rf"(?:{_NUM_RE})\s?{_SIZE_UNITS}",
    "int": r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?![\d.])",
    "float": r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?",
    "num": _NUM_RE,
    # "rank 3", "rank=3", "rank3", "Rank 3", "3"
    "rank": r"(?:[Rr]ank\s*[=:]?\s*)?\d+",
    # "cuda:0", "GPU 0", "device 3", "device=3"
    "device": r"(?:cuda:\d+|[Cc][Uu][Dd][Aa]\s+device\s+\d+|GPU\s*\d+|[Dd]evice\s*[=:]?\s*\d+)",
    # "host:port", "[::]:29500", "0.0.0.0:8000", "[fe80::1]:80"
    "addr": r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?):\d{1,5}(?!\d)",
    "port": r"\d{1,5}(?!\d)",
    # a non-zero integer: an exit status that is a failure
    "nzint": r"-?0*[1-9]\d*(?![\d.])",
    "path": r"(?:~|\.{1,2})?/[^\s'\"`,;()\[\]{}<>]*[^\s'\"`,;()\[\]{}<>.:]|(?:~|\.{1,2})?/",
    "word": r"[A-Za-z0-9_][A-Za-z0-9_.\-]*",
    "hex": r"0[xX][0-9A-Fa-f]+|[0-9A-Fa-f]{6,}(?![0-9A-Za-z])",
    "version": r"v?\d+(?:\.\d+)+(?:[+\-][A-Za-z0-9_.]+|[a-z]+\d*)?",
    "quoted": r"'[^'\n]*'|\"[^\"\n]*\"|`[^`\n]*`",
    "pyexc": (
        r"(?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*"
        r"(?:Error|Exception|Exit|Interrupt|Failure|Fault|Timeout|Warning)(?![A-Za-z0-9_])"
    ),
    # An exception that is an error (no warnings, exits or interrupts): bare-line fallbacks.
    "pyerr": (
        r"(?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*"
        r"(?:Error|Exception|Failure|Fault)(?![A-Za-z0-9_])"
    ),
}


def _block(name: str) -> pp.ParserElement:
    el = pp.Regex(_BLOCK_REGEX[name]).set_name(name)
    el.leave_whitespace()
    return el


#: name -> pyparsing element; the only definition of each shared block.
BLOCKS: dict[str, pp.ParserElement] = {name: _block(name) for name in _BLOCK_REGEX}


# --------------------------------------------------------------------------------------------
# Pattern mini-language
# --------------------------------------------------------------------------------------------

# A pattern is tried at no more than this many start positions of one body (pathological lines
# repeat their first literal thousands of times).
_MAX_TRIES = 64
# Only this much of a body is matched: longer lines are data dumps, not statements.
MAX_MATCH_CHARS = 16384

_PIECE_RE = re.compile(r"\{(\*|[a-z]+)(?::([A-Za-z_][A-Za-z0-9_]*))?\}")


@dataclass(frozen=True, slots=True)
class CompiledPattern:
    """One compiled rule pattern. :meth:`search` returns the captures dict, or ``None``."""

    source: str
    expr: pp.ParserElement
    anchored: bool
    first_literal: str | None  # a literal the match must start with (fast search), if any
    # The later literal pieces, in order: a start after which they do not all occur cannot
    # match, nor can any later start (one C-speed search instead of a SkipTo scan per try).
    later_literals: tuple[re.Pattern[str], ...] = ()

    def _possible(self, body: str, start: int) -> bool:
        pos = start
        for rx in self.later_literals:
            m = rx.search(body, pos)
            if m is None:
                return False
            pos = m.end()
        return True

    def search(self, body: str) -> dict[str, str] | None:
        if not self._possible(body, 0):
            return None
        try:
            if self.anchored:
                return _captures(self.expr.parse_string(body.lstrip(), parse_all=False))
            if self.first_literal is not None:
                start = body.find(self.first_literal)
                tries = 0
                while start >= 0 and tries < _MAX_TRIES and self._possible(body, start):
                    try:
                        return _captures(self.expr.parse_string(body[start:], parse_all=False))
                    except pp.ParseBaseException:
                        start = body.find(self.first_literal, start + 1)
                        tries += 1
                return None
            for toks, _s, _e in self.expr.scan_string(body, max_matches=1):
                return _captures(toks)
        except pp.ParseBaseException:
            return None
        except RecursionError:  # pathological input: treat as no match, never crash
            return None
        return None


def _captures(toks: pp.ParseResults) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in toks.as_dict().items():
        out[k] = v if isinstance(v, str) else " ".join(str(x) for x in _flatten(v))
    return out


def _flatten(v: Any) -> list[Any]:
    if isinstance(v, list | tuple):
        res: list[Any] = []
        for x in v:
            res.extend(_flatten(x))
        return res
    return [v]


def _literal_regex(text: str) -> str:
    parts = re.split(r"(\s+)", text)
    return "".join(r"\s+" if p.isspace() else re.escape(p) for p in parts if p)


def _literal(text: str) -> tuple[pp.ParserElement, str]:
    """A literal segment: whitespace runs in the pattern match any run of whitespace."""
    el = pp.Regex(_literal_regex(text)).set_name(repr(text))
    el.leave_whitespace()
    stripped = text.strip()
    head = stripped.split()[0] if stripped else ""
    return el, head


_Token = tuple[str, str, str | None]


def _tokenize(pattern: str) -> tuple[bool, list[_Token]]:
    """``(anchored, tokens)``: ("lit", text, None) | ("any", "*", capture) |
    ("block", name, capture). Raises RuleError with the pattern and what to fix."""
    src = pattern
    anchored = pattern.startswith("^")
    if anchored:
        pattern = pattern[1:]
    if not pattern.strip():
        raise RuleError(f"pattern {src!r} is empty; give at least one literal word")
    tokens: list[_Token] = []
    pos = 0
    buf = ""
    while pos < len(pattern):
        if pattern.startswith("{{", pos):
            buf += "{"
            pos += 2
            continue
        if pattern.startswith("}}", pos):
            buf += "}"
            pos += 2
            continue
        m = _PIECE_RE.match(pattern, pos)
        if m:
            if buf:
                tokens.append(("lit", buf, None))
                buf = ""
            name, cap = m.group(1), m.group(2)
            if name == "*":
                tokens.append(("any", "*", cap))
            else:
                if name not in BLOCKS:
                    known = ", ".join(sorted(BLOCKS))
                    raise RuleError(
                        f"pattern {src!r} uses unknown block {{{name}}}; known blocks: {known}"
                    )
                tokens.append(("block", name, cap))
            pos = m.end()
            continue
        ch = pattern[pos]
        if ch in "{}":
            raise RuleError(
                f"pattern {src!r} has a stray {ch!r} at offset {pos}; write {ch}{ch} for a "
                "literal brace"
            )
        buf += ch
        pos += 1
    if buf:
        tokens.append(("lit", buf, None))
    if all(t[0] == "any" for t in tokens):
        raise RuleError(f"pattern {src!r} has no literal or block to match")
    return anchored, tokens


def pattern_regex(pattern: str) -> tuple[str, tuple[str, ...]]:
    """The pattern as a portable regular expression over the line body, and its capture names
    in group order (numbered groups only; no named-group syntax, which differs between
    engines). Uses ``(?:…)``, ``(?!…)``, ``\\s``, ``\\d``, classes and lazy ``.*?``: the
    common subset of Python ``re``, PCRE, Java and ECMAScript (not RE2: lookahead).
    ``{*}`` becomes a lazy ``.*?`` (pyparsing's SkipTo does not backtrack, so the regex may
    accept a little more than the engine)."""
    anchored, tokens = _tokenize(pattern)
    parts: list[str] = [r"^\s*"] if anchored else []
    caps: list[str] = []
    for i, (kind, val, cap) in enumerate(tokens):
        if kind == "lit":
            rx = "".join(
                r"\s+" if p.isspace() else _portable_escape(p) for p in re.split(r"(\s+)", val) if p
            )
        elif kind == "block":
            rx = f"(?:{_BLOCK_REGEX[val]})"
        else:
            rx = ".*?" if i < len(tokens) - 1 else ".*"
        if cap:
            caps.append(cap)
            rx = f"({rx})"
        parts.append(rx)
    return "".join(parts), tuple(caps)


def _portable_escape(text: str) -> str:
    """Escape regex metacharacters only (Python's re.escape is fine for Python but the
    result must also read the same in PCRE/ECMAScript: escape exactly the specials)."""
    return "".join("\\" + c if c in r".^$*+?()[]{}|\/" else c for c in text)


def compile_pattern(pattern: str) -> CompiledPattern:
    """Compile one pattern of the rule mini-language (see docs/rules-format.md).

    ``{*}`` any text (shortest) up to the next piece, ``{block}`` / ``{block:name}`` a shared
    block from :data:`BLOCKS`, ``{{``/``}}`` literal braces, leading ``^`` anchors the match at
    the start of the body; everything else is literal text with flexible whitespace.
    """
    src = pattern
    anchored, tokens = _tokenize(pattern)

    # Build elements right-to-left so {*} can SkipTo the next piece.
    elements: list[pp.ParserElement] = []
    first_literal: str | None = None
    later_literals = tuple(
        re.compile(_literal_regex(t[1]))
        for i, t in enumerate(tokens)
        if i > 0 and t[0] == "lit" and t[1].strip()
    )
    nxt: pp.ParserElement | None = None
    for i in range(len(tokens) - 1, -1, -1):
        kind, val, cap = tokens[i]
        el: pp.ParserElement
        if kind == "lit":
            el, head = _literal(val)
            if i == 0 and head and not val[0].isspace():
                first_literal = head
        elif kind == "block":
            el = BLOCKS[val].copy()
        else:  # {*}
            el = pp.Regex(r".*") if nxt is None else pp.SkipTo(nxt)
            el.leave_whitespace()
        if cap:
            el = el.set_results_name(cap)
        elements.insert(0, el)
        nxt = el if kind != "any" else nxt
    expr = pp.And(elements)
    expr.leave_whitespace()
    expr.streamline()
    return CompiledPattern(
        source=src,
        expr=expr,
        anchored=anchored,
        first_literal=first_literal,
        later_literals=later_literals,
    )


# --------------------------------------------------------------------------------------------
# Envelope
# --------------------------------------------------------------------------------------------

LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_LEVEL_ALIASES = {
    "D": "DEBUG",
    "DEBUG": "DEBUG",
    "I": "INFO",
    "INFO": "INFO",
    "W": "WARNING",
    "WARN": "WARNING",
    "WARNING": "WARNING",
    "E": "ERROR",
    "ERROR": "ERROR",
    "ERR": "ERROR",
    "F": "CRITICAL",
    "FATAL": "CRITICAL",
    "C": "CRITICAL",
    "CRITICAL": "CRITICAL",
}


def normalize_level(level: str | None) -> str | None:
    """``"WARN"``/``"W"`` -> ``"WARNING"``, ``"FATAL"``/``"F"`` -> ``"CRITICAL"``, etc."""
    if level is None:
        return None
    return _LEVEL_ALIASES.get(level.upper(), level.upper())


@dataclass(frozen=True, slots=True)
class LogLine:
    """One parsed log line (the envelope); rules match ``body``.

    ``line_no`` is 1-based and counts ``\\n``-terminated lines of the raw log. ``text`` is the
    visible line (decoded, without trailing newline, last ``\\r`` segment, no ANSI codes).
    ``process`` is the producer as shown in reports (``"EngineCore_DP0 pid=123"``, ``"rank1"``,
    ``"host:123"`` for NCCL), ``key`` groups lines of one process for traceback tracking.
    """

    line_no: int
    text: str
    body: str
    process: str | None = None
    pid: int | None = None
    rank: int | None = None
    level: str | None = None
    timestamp: str | None = None
    source_file: str | None = None
    wrapper: str | None = None  # docker-compose service / syslog unit, when present
    # Filled by TracebackTracker: "header", "frame", "exception", "detail", "separator" or None
    tb_role: str | None = None
    tb_chain: int | None = None  # id of the chained-traceback group
    tb_index: int = 0  # position in the chain: 0 = the first (innermost cause)

    @property
    def in_traceback(self) -> bool:
        return self.tb_role is not None

    @property
    def raw(self) -> str:
        """The visible line (decoded; the raw bytes are never kept)."""
        return self.text

    @property
    def key(self) -> str | None:
        return self.process


_CARET_ANSI_RE = re.compile(r"\^\[\[[0-9;?]*[ -/]*[@-~]")
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")

# Wrappers added by whatever collected the log (peeled first, in this order, repeatedly).
_K8S_ISO_RE = re.compile(
    r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"(?:\s+(?:stdout|stderr)\s+[FP])?\s+"
)
_SYSLOG_RE = re.compile(
    r"^(?P<ts>[A-Z][a-z]{2}\s+\d{1,2}\s+\d{2}:\d{2}:\d{2})\s+(?P<host>\S+)\s+"
    r"(?P<unit>[A-Za-z0-9_.@/-]+)(?:\[(?P<pid>\d+)\])?:\s?"
)
# docker compose "svc-1  | ", Buildkite "  | " (no name)
_COMPOSE_RE = re.compile(r"^(?:(?P<svc>[A-Za-z0-9][A-Za-z0-9_.-]*)\s+|[>\"\s]*)\|\s?")
# `kubectl logs --prefix`: "[pod/<name>/<container>] ".
_KUBECTL_RE = re.compile(
    r"^\[(?:pod|deployment|statefulset|job|daemonset|replicaset)/[^\]\s]+\]\s+"
)
# A pasted/quoted log: markdown block quotes ("> ", "> > ") in front of the real line.
_QUOTE_RE = re.compile(r"^(?:>[ \t]?)+(?=\S)")
_BRACKET_TS_RE = re.compile(
    r"^\[(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\]\s+"
)
# Colour codes whose ESC byte was lost (pasted logs): " [36m(RayWorkerVllm pid=1) [0m ..."
_ANSI_REMNANT_RE = re.compile(r"(?<![\w\]])\[(?:\d{1,3}(?:;\d{1,3})*)?m(?![\w])")

# Producer prefixes.
_VLLM_PROC_RE = re.compile(
    r"^\((?P<name>[A-Za-z][A-Za-z0-9_\-]*(?:\s+(?!pid=)[A-Za-z0-9_\-=]+){0,3})\s+pid=(?P<pid>\d+)"
    r"(?:,\s*ip=(?P<ip>[^)\s]+))?\)\s?"
)
# Ray prefixes without a process name: "(pid=123) ", "(pid=123, ip=10.0.0.1) ", "(raylet) ".
_RAY_BARE_RE = re.compile(
    r"^\((?:pid=(?P<pid>\d+)(?:,\s*ip=(?P<ip>[^)\s]+))?|raylet|gcs_server|autoscaler)\)\s?"
)
# Ray's de-duplication suffix: "... [repeated 8x across cluster]".
_RAY_REPEAT_RE = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
# mpirun --tag-output "[1,0]<stderr>:" and srun --label "0: " in front of a vLLM line.
_MPI_TAG_RE = re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr|stddiag)>:\s?")
_SRUN_LABEL_RE = re.compile(r"^\d{1,4}: (?=\(|\[|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) )")
_NAME_RANK_RE = re.compile(r"(?:rank=|_TP|\bTP|[Rr]ank)(\d+)(?!.*(?:rank=|TP)\d)|-(\d+)$")
_VLLM_LEVEL_RE = re.compile(
    r"^\s*(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"(?P<ts>\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}(?:\.\d+)?)\s+"
    r"\[?(?P<src>[A-Za-z0-9_.\-/]+:\d+)\]\s?"
)
_RANK_TAG_RE = re.compile(r"^\[[Rr]ank\s*(?P<rank>\d+)\]:?\s?")
_TORCHRUN_RE = re.compile(r"^\[(?:[Rr]ank|default)(?P<rank>\d+)\]:\s?")
_TORCH_CPP_RE = re.compile(
    r"^\s*\[(?P<level>[DIWEF])(?:(?P<date>\d{4})\s+(?P<time>\d{2}:\d{2}:\d{2}(?:\.\d+)?))?"
    r"(?:\s+(?P<tid>\d+))?\s+(?P<src>[A-Za-z0-9_.\-/]+:\d+)\]\s?"
)
_NCCL_RE = re.compile(
    r"^(?P<host>[A-Za-z0-9_.\-]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>[^\]]*)\]\s+"
    r"(?:[A-Za-z0-9_./\-]+\.(?:cc|cpp|h|c):\d+\s+)?(?=NCCL\s+(?P<level>INFO|WARN|ERROR|TRACE)\b)"
)
# An application's own logging format: "[ERROR] [MainThread] [asyncio] >>> msg"
_BRACKET_LEVEL_RE = re.compile(
    r"^\[(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]\s*"
    r"(?:\[[^\]\s]{1,40}\]\s*)*(?:>>>\s?|[-:|]\s)?"
)
# Accelerators beyond CUDA (docs/rules-format.md, "Envelopes"). ROCm's HIP runtime log
# (AMD_LOG_LEVEL): ":1:hip_code_object.cpp :505 : 99442499995 us: 350457: [tid:0x7f..] msg"
# (older: "[pid:9 tid:0x..]"); the digit is the level (1 error .. 4 debug).
_HIP_LOG_RE = re.compile(
    r"^:(?P<lvl>[0-4]):(?P<src>[A-Za-z0-9_.\-]+)\s*:\s*(?P<line>\d+)\s*:\s*\d+ us:\s*"
    r"(?:(?P<pid2>\d+):\s*)?\[(?:pid:(?P<pid>\d+)\s+)?tid:0x[0-9A-Fa-f]+\]\s?"
)
_HIP_LEVELS = {"0": "CRITICAL", "1": "ERROR", "2": "WARNING", "3": "INFO", "4": "DEBUG"}
# Ascend CANN plog: "[ERROR] HCCL(36035,proc):2025-05-13-02:25:58.068.817 [op_base.cc:974][36818]"
# and torch_npu: "[ERROR] 2025-09-03-03:02:37 (PID:7226, Device:1, RankID:-1) ERR02200 ...".
_CANN_RE = re.compile(
    r"^\[(?P<level>ERROR|WARNING|INFO|DEBUG|EVENT)\]\s+(?P<mod>[A-Z][A-Z0-9_]*)\((?P<pid>\d+),"
    r"(?P<proc>[^)]*)\):(?P<ts>\d{4}-\d{2}-\d{2}-\d{2}:\d{2}:\d{2}(?:\.\d+)*)\s+"
    r"\[(?P<src>[A-Za-z0-9_.\-]+:\d+)\](?:\[\d+\])?\s?"
)
_TORCH_NPU_RE = re.compile(
    r"^\[(?P<level>ERROR|WARNING|INFO|DEBUG)\]\s+(?P<ts>\d{4}-\d{2}-\d{2}-\d{2}:\d{2}:\d{2})"
    r"\s+\(PID:(?P<pid>\d+), Device:(?P<dev>-?\d+), RankID:(?P<rank>-?\d+)\)\s+"
)
# TensorFlow/XLA C++ logging (TPU and JAX stacks): "2023-03-23 02:02:25.057202: E
# tensorflow/compiler/xla/xla_client/xla_util.cc:90] msg".
_XLA_LOG_RE = re.compile(
    r"^(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d+): (?P<level>[IWEF]) "
    r"(?P<src>[A-Za-z0-9_.\-/]+:\d+)\]\s?"
)
_XLA_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
_UVICORN_RE = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+")
_PYLOG_RE = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<name>[\w.]+):")


_LEVEL_INITIALS = frozenset("DIWEC")


def decode_line(raw: bytes | str) -> str:
    """The visible text of one raw line: decoded (invalid UTF-8 replaced), newline/CR stripped,
    the last non-empty ``\\r`` segment (tqdm redraws), no ANSI escapes, no NULs."""
    text = raw if isinstance(raw, str) else raw.decode("utf-8", errors="replace")
    text = text.rstrip("\n").rstrip("\r")
    if "\r" in text:
        segs = [s for s in text.split("\r") if s.strip()]
        text = segs[-1] if segs else ""
    if "\x1b" in text:
        text = _ANSI_RE.sub("", text)
    if "^[[" in text:
        # Escapes written out literally (less/terminal copies): "^[[36m".
        text = _CARET_ANSI_RE.sub("", text)
    if "\x00" in text:
        text = text.replace("\x00", "")
    if "[0m" in text:
        text = _ANSI_REMNANT_RE.sub("", text).lstrip()
    return text


_AccEnvelope = tuple[str | None, str | None, str | None, int | None, int | None, str]


def _accelerator_envelope(rest: str) -> _AccEnvelope | None:
    """(level, timestamp, source, pid, rank, body) of a ROCm HIP-runtime, TensorFlow/XLA,
    Ascend CANN or torch_npu line, else None."""
    m = _HIP_LOG_RE.match(rest)
    if m:
        pid_s = m.group("pid") or m.group("pid2")
        src = f"{m.group('src')}:{m.group('line')}"
        return (
            _HIP_LEVELS[m.group("lvl")],
            None,
            src,
            int(pid_s) if pid_s else None,
            None,
            rest[m.end() :],
        )
    m = _XLA_LOG_RE.match(rest)
    if m:
        lvl = _XLA_LEVELS[m.group("level")]
        return lvl, m.group("ts"), m.group("src"), None, None, rest[m.end() :]
    m = _CANN_RE.match(rest)
    if m:
        lvl = "INFO" if m.group("level") == "EVENT" else m.group("level")
        return lvl, m.group("ts"), m.group("src"), int(m.group("pid")), None, rest[m.end() :]
    m = _TORCH_NPU_RE.match(rest)
    if m:
        return (
            m.group("level"),
            m.group("ts"),
            None,
            int(m.group("pid")),
            int(m.group("rank")),
            rest[m.end() :],
        )
    return None


def _docker_json_log(text: str) -> str:
    """Docker's json-file driver: ``{"log":"...\\n","stream":"stderr","time":"..."}``."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return text
    log = obj.get("log") if isinstance(obj, dict) else None
    return decode_line(log) if isinstance(log, str) else text


def parse_line(line_no: int, raw: bytes | str) -> LogLine:
    """Parse one raw line into its envelope. Never raises."""
    text = decode_line(raw)
    if text.startswith('{"log":'):
        text = _docker_json_log(text)
    rest = text
    wrapper: str | None = None
    timestamp: str | None = None
    pid: int | None = None
    # Collector wrappers, possibly nested (compose around ISO timestamps, etc.)
    # (Cheap first-character guards skip regexes that cannot match: most lines are plain.)
    for _ in range(3):
        head = rest[:1]
        m = _QUOTE_RE.match(rest) if head == ">" else None
        if m:
            rest = rest[m.end() :]
            continue
        m = _COMPOSE_RE.match(rest) if "|" in rest[:64] else None
        if m:
            wrapper = m.group("svc") or "|"
            rest = rest[m.end() :]
            continue
        m = _K8S_ISO_RE.match(rest) if head.isdigit() else None
        if m:
            timestamp = m.group(0).split()[0]
            rest = rest[m.end() :]
            continue
        m = _MPI_TAG_RE.match(rest) if head == "[" and "]<" in rest[:16] else None
        if m is None and head.isdigit() and ": " in rest[1:6]:
            m = _SRUN_LABEL_RE.match(rest)
        if m:
            rest = rest[m.end() :]
            continue
        m = _KUBECTL_RE.match(rest) if head == "[" and rest[1:2].islower() else None
        if m:
            wrapper = rest[1 : m.end()].rstrip().rstrip("]")
            rest = rest[m.end() :]
            continue
        m = _BRACKET_TS_RE.match(rest) if head == "[" and rest[1:2].isdigit() else None
        if m:
            timestamp = m.group("ts")
            rest = rest[m.end() :]
            continue
        m = _SYSLOG_RE.match(rest) if head.isupper() else None
        if m and (m.group("pid") or m.group("unit")):
            wrapper = m.group("unit")
            timestamp = m.group("ts")
            pid = int(m.group("pid")) if m.group("pid") else None
            rest = rest[m.end() :]
            continue
        break

    process: str | None = None
    rank: int | None = None
    level: str | None = None
    source: str | None = None

    m = _TORCHRUN_RE.match(rest) if rest[:1] == "[" else None
    if m:
        rank = int(m.group("rank"))
        process = f"rank{rank}"
        rest = rest[m.end() :]

    if rest[:1] == "(" and rest[1:4] in ("pid", "ray", "gcs", "aut"):
        m = _RAY_BARE_RE.match(rest)
        if m:
            if m.group("pid"):
                pid = int(m.group("pid"))
                process = f"pid={pid}" + (f", ip={m.group('ip')}" if m.group("ip") else "")
            else:
                process = rest[1 : rest.index(")")]
            rest = rest[m.end() :]
    m = _VLLM_PROC_RE.match(rest) if rest[:1] == "(" else None
    if m:
        name = " ".join(m.group("name").split())
        pid = int(m.group("pid"))
        process = f"{name} pid={pid}"
        if m.group("ip"):
            process += f", ip={m.group('ip')}"
        if rank is None and "Worker" in name:
            rm = _NAME_RANK_RE.search(name)
            if rm:
                rank = int(rm.group(1) or rm.group(2))
        rest = rest[m.end() :]

    lead = rest.lstrip()[:1]
    m = _VLLM_LEVEL_RE.match(rest) if lead in _LEVEL_INITIALS else None
    if m:
        level = normalize_level(m.group("level"))
        timestamp = m.group("ts")
        source = m.group("src")
        rest = rest[m.end() :]
        rm = _RANK_TAG_RE.match(rest)
        if rm:
            rank = int(rm.group("rank"))
            rest = rest[rm.end() :]
    else:
        m = _TORCH_CPP_RE.match(rest) if lead == "[" else None
        if m:
            level = normalize_level(m.group("level"))
            if m.group("date"):
                timestamp = f"{m.group('date')} {m.group('time')}"
            source = m.group("src")
            rest = rest[m.end() :]
            rm = _RANK_TAG_RE.match(rest)
            if rm:
                rank = int(rm.group("rank"))
                rest = rest[rm.end() :]
        else:
            m = _NCCL_RE.match(rest) if "NCCL" in rest[:200] else None
            if m:
                level = normalize_level(m.group("level"))
                pid = int(m.group("pid"))
                if process is None:
                    process = f"{m.group('host')}:{pid}"
                rest = rest[m.end() :]
            else:
                m = None
                if lead in _LEVEL_INITIALS:
                    m = _UVICORN_RE.match(rest)
                elif lead == "[":
                    acc = _accelerator_envelope(rest)
                    if acc is not None:
                        level, timestamp, src, apid, arank, rest = acc
                        source = source or src
                        pid = pid if apid is None else apid
                        rank = rank if arank is None or arank < 0 else arank
                        lead = ""
                    else:
                        m = _BRACKET_LEVEL_RE.match(rest)
                elif lead == ":" or lead.isdigit():
                    acc = _accelerator_envelope(rest)
                    if acc is not None:
                        level, timestamp, src, apid, arank, rest = acc
                        source = source or src
                        pid = pid if apid is None else apid
                        lead = ""
                if m:
                    level = normalize_level(m.group("level"))
                    rest = rest[m.end() :]
                elif lead in _LEVEL_INITIALS:
                    m = _PYLOG_RE.match(rest)
                    if m:
                        level = normalize_level(m.group("level"))
                        rest = rest[m.end() :]
    if rest.endswith("across cluster]"):
        rest = _RAY_REPEAT_RE.sub("", rest)
    return LogLine(
        line_no=line_no,
        text=text,
        body=rest,
        process=process,
        pid=pid,
        rank=rank,
        level=level,
        timestamp=timestamp,
        source_file=source,
        wrapper=wrapper,
    )


# --------------------------------------------------------------------------------------------
# Traceback tracking
# --------------------------------------------------------------------------------------------

TB_HEADER = "Traceback (most recent call last):"
TB_DIRECT_CAUSE = "The above exception was the direct cause of the following exception:"
TB_DURING_HANDLING = "During handling of the above exception, another exception occurred:"

_FRAME_RE = re.compile(r"^\s+File \"[^\"]*\", line \d+")
# A traceback left open this many lines without a line from its process is closed.
_STALE_LINES = 400
# After an exception line, a chain separator may follow within this many lines of the process.
_LINGER_LINES = 4
# ... and other processes' lines in between stop counting after this many log lines.
_LINGER_GLOBAL = 50


@dataclass(slots=True)
class TracebackState:
    chain: int
    index: int
    phase: str  # "frames" | "after_exc" | "await_tb" (after a separator)
    last_seen: int
    link: str | None = None  # "cause" | "context" for index > 0
    after_count: int = 0


@dataclass(slots=True)
class TracebackTracker:
    """Labels lines of multi-line Python tracebacks, per process key.

    Feed every line (in log order) to :meth:`feed`; it returns the line with ``tb_role``,
    ``tb_chain`` and ``tb_index`` filled in. :attr:`busy` is true while some traceback still
    needs the following lines (the fast path must then look at every line).
    """

    _open: dict[str | None, TracebackState] = field(default_factory=dict)
    _next_chain: int = 0
    chain_links: dict[int, list[str | None]] = field(default_factory=dict)

    @property
    def busy(self) -> bool:
        return bool(self._open)

    def _expire(self, line_no: int) -> None:
        if not self._open:
            return
        stale = [
            k
            for k, st in self._open.items()
            if line_no - st.last_seen > (_STALE_LINES if st.phase == "frames" else _LINGER_GLOBAL)
        ]
        for k in stale:
            del self._open[k]

    def feed(self, line: LogLine) -> LogLine:
        self._expire(line.line_no)
        key = line.key
        body = line.body
        stripped = body.strip()
        st = self._open.get(key)

        if stripped.endswith(TB_HEADER):
            if st is not None and st.phase == "await_tb":
                st.index += 1
                st.phase = "frames"
                st.last_seen = line.line_no
                self.chain_links.setdefault(st.chain, [None]).append(st.link)
            else:
                chain = self._next_chain
                self._next_chain += 1
                st = TracebackState(chain=chain, index=0, phase="frames", last_seen=line.line_no)
                self._open[key] = st
                self.chain_links[chain] = [None]
                if len(self.chain_links) > 4096:  # keep memory flat on huge logs
                    for old in list(self.chain_links)[:2048]:
                        del self.chain_links[old]
            # "Exception in worker ...: <error>, Traceback (most recent call last):" (old vLLM)
            # opens a traceback but is itself a message line: role "lead" stays classifiable.
            role = "header" if stripped == TB_HEADER else "lead"
            return _with_tb(line, role, st.chain, st.index)

        if (st is None or st.phase != "frames") and _FRAME_RE.match(body):
            # A frame without a header (an excerpt, or a header we did not see): track it.
            if st is None or st.phase == "after_exc":
                chain = self._next_chain
                self._next_chain += 1
                st = TracebackState(chain=chain, index=0, phase="frames", last_seen=line.line_no)
                self._open[key] = st
                self.chain_links[chain] = [None]
            st.phase = "frames"
            st.last_seen = line.line_no
            return _with_tb(line, "frame", st.chain, st.index)
        if st is None:
            return line
        st.last_seen = line.line_no

        if st.phase == "frames":
            if not body or body[0] in " \t":
                return _with_tb(line, "frame", st.chain, st.index)
            st.phase = "after_exc"
            st.after_count = 0
            return _with_tb(line, "exception", st.chain, st.index)

        if stripped in (TB_DIRECT_CAUSE, TB_DURING_HANDLING):
            st.phase = "await_tb"
            st.link = "cause" if stripped == TB_DIRECT_CAUSE else "context"
            return _with_tb(line, "separator", st.chain, st.index)

        if st.phase == "await_tb":
            if not stripped:
                return _with_tb(line, "separator", st.chain, st.index)
            # Something else came instead of the chained traceback: give up on this chain.
            del self._open[key]
            return line

        # after_exc: indented continuation lines belong to the exception message
        # (pydantic "  Value error, ...", exception notes); blank lines may precede a separator.
        st.after_count += 1
        if stripped and body[0] in " \t":
            return _with_tb(line, "detail", st.chain, st.index)
        if not stripped and st.after_count <= _LINGER_LINES:
            return line
        del self._open[key]
        return line

    def frames_open(self, key: str | None) -> TracebackState | None:
        """The open traceback of ``key`` while it is reading frames (else ``None``): every
        following indented line of that process is a frame line (the engine's fast path)."""
        st = self._open.get(key)
        return st if st is not None and st.phase == "frames" else None

    def tick(self, line_no: int) -> None:
        """Tell the tracker that lines up to ``line_no`` passed without being fed."""
        self._expire(line_no)


def _with_tb(line: LogLine, role: str, chain: int, index: int) -> LogLine:
    return LogLine(
        line_no=line.line_no,
        text=line.text,
        body=line.body,
        process=line.process,
        pid=line.pid,
        rank=line.rank,
        level=line.level,
        timestamp=line.timestamp,
        source_file=line.source_file,
        wrapper=line.wrapper,
        tb_role=role,
        tb_chain=chain,
        tb_index=index,
    )


ParseFn = Callable[[int, bytes | str], LogLine]

#: The envelope of one line; the same record as :class:`LogLine`.
Envelope = LogLine
