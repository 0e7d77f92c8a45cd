"""The line envelope: what a log line carries in front of its message, peeled off once.

Every log line is parsed once into a :class:`LogLine`: wrappers added by whatever collected the
log (docker-compose ``svc-1  | ``, syslog ``Nov 30 01:02:03 host vllm[12]: ``, ISO timestamps,
``kubectl --prefix``, mpirun/srun tags, quoted pastes; ANSI colour and ``\\r`` progress bars are
dropped first), then the producer's own prefixes: process tags (vLLM ``(EngineCore_DP0 pid=1)``,
Ray ``(pid=1)``, torchrun ``[rank1]:``) and one level prefix (vLLM ``INFO 05-10 12:00:00
[file.py:12]``, PyTorch C++ ``[W1130 01:47:52.1 x.cpp:1]``, NCCL ``host:pid:tid [dev] NCCL
WARN``, uvicorn ``INFO:     ...``, ROCm HIP, TensorFlow/XLA, Ascend CANN and torch_npu logs).
Rules only ever see the remaining ``body``.

Each prefix is one entry of :data:`FORMATS` (lnav style): its name, the layer it belongs to, a
cheap :class:`Guard` on the first characters (most lines are plain: a guard that fails skips
the expression), its compiled expression, what it yields (the :class:`LogLine` fields it sets)
and sample lines (real ones where the corpus or an issue has one) with the body, process and
level :func:`parse_line` gives them (``tests/analysis/test_envelope_formats.py`` runs every
sample, and every format on the other formats' samples to find overlaps). A new format is one
entry here (and, when its yield is new, one small ``_y_*`` function). Layers, in order:

* ``wrapper``: up to three rounds; in each, the first format (table order) that matches.
* ``process``: each format at most once, in table order (``[rank1]:(pid=3) (Worker pid=4)``).
* ``level``: the first format (table order) that matches, once.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "FORMATS",
    "LEVELS",
    "EnvelopeFormat",
    "Guard",
    "LogLine",
    "Sample",
    "decode_line",
    "normalize_level",
    "parse_line",
]

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
# A sidecar or log relay that names its source, stamps the time and the stream:
# "[VllmSidecar kooEr8Ccal1cqylW5f5cz]: 2024-11-13T03:15:08.672Z 1 stdout: CRITICAL …".
_RELAY_RE = re.compile(
    r"^\[[A-Za-z][\w.\-]{0,40}(?: [\w.\-]{1,40})?\]: "
    r"(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z) (?:\d+ )?(?:stdout|stderr):? "
)
_K8S_ISO_RE = re.compile(
    r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"(?:\s+(?:stdout|stderr)\s+[FP])?\s+"
)
# after the month: day, time, host, unit[pid]
_SYSLOG_REST = (
    r"\s+\d{1,2}\s+\d{2}:\d{2}:\d{2})\s+(?P<host>\S+)\s+"
    r"(?P<unit>[A-Za-z0-9_.@/-]+)(?:\[(?P<pid>\d+)\])?:\s?"
)
_SYSLOG_RE = re.compile(r"^(?P<ts>[A-Z][a-z]{2}" + _SYSLOG_REST)
# journalctl under a CJK locale writes the month as a number: "6月 10 16:45:05 host bash[1]: "
_SYSLOG_CJK_RE = re.compile(r"^(?P<ts>\d{1,2}月" + _SYSLOG_REST)
# Python logging's "asctime | LEVEL | name | msg" (FastChat's workers, whose stderr logger
# re-logs every line vLLM prints at ERROR) and loguru's "time | LEVEL    | mod:func:line - msg"
_PIPE_LOG_RE = re.compile(
    r"^(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?) \| "
    r"(?P<level>TRACE|DEBUG|INFO|SUCCESS|WARNING|ERROR|CRITICAL) *\| "
    r"(?:(?P<name>[^|\s][^|]{0,80}?) \| |(?P<src>[\w.<>-]+:[\w.<>-]+:\d+) - )"
)
# docker compose "svc-1  | ", Buildkite "  | " (no name)
_COMPOSE_RE = re.compile(r"^(?:(?P<svc>[A-Za-z0-9][A-Za-z0-9_.-]*)\s+|[>\"\s]*)\|\s?")
# `kubectl logs --prefix`: "[pod/<name>/<container>] ".
_KUBECTL_RE = re.compile(
    r"^\[(?:pod|deployment|statefulset|job|daemonset|replicaset)/[^\]\s]+\]\s+"
)
# vLLM-Omni's multi-stage pipelines tag each stage's lines: "[Stage-0] ERROR 01-30 …".
_OMNI_STAGE_RE = re.compile(r"^\[Stage-\d{1,3}\]\s+")
# A process tag's name: vLLM's `EngineCore_DP0`, Ray's actor classes, Ray Serve's replicas
# `ServeReplica:app:Deployment` (colon-separated segments).
_TAG_NAME = r"[A-Za-z][A-Za-z0-9_\-]*(?::[A-Za-z0-9_\-.]+)*"
# A pasted/quoted log: markdown block quotes ("> ", "> > ") in front of the real line. One
# blank after each `>` belongs to the quote; further blanks are the line's own (a quoted
# traceback's frames keep their indentation).
_QUOTE_RE = re.compile(r"^(?:>[ \t]?)+(?=[ \t]*\S)")
# A terminal UI's box around a pane (k9s, `kubectl` viewers): a box-drawing border in front
# of a log line that starts with a level or a process tag (the border after it is left in the
# body: patterns do not anchor at the end). Rich's traceback panels use the same border around
# frames: those lines start with a path, and stay as they are for the traceback grammar.
_TUI_BORDER_RE = re.compile(
    r"^[│┃║][ \t]?(?=(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)[: ]|\(" + _TAG_NAME + r"\s)"
)
# A paste indented as a whole (a markdown list item, a code block nested in a quote): leading
# blanks before a vLLM process tag. Only before the tag: a bare indented line may be a frame.
_INDENTED_RE = re.compile(
    r"^[ \t]{1,24}(?=\(" + _TAG_NAME + r"(?:\s+(?!pid=)[A-Za-z0-9_\-=]+){0,3}\s+pid=\d)"
)
# A markdown list item around a pasted line ("- 2024-06-22T20:16:34Z ERROR …") or the backtick
# that opens an inline-code paste: the marker is peeled only before an ISO timestamp or a vLLM
# process tag (YAML and diff lines stay as they are).
_MD_LIST_RE = re.compile(
    r"^(?:[-*+][ \t]+|`)(?=\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}"
    r"|\(" + _TAG_NAME + r"(?:\s+(?!pid=)[A-Za-z0-9_\-=]+){0,3}\s+pid=\d)"
)
# Google Cloud Logging's text export (`gcloud logging read`, the Logs Explorer's download):
# the entry's severity and receive time, on GKE the container label, then the line as written.
# The severity is the agent's (stdout INFO, stderr ERROR), not the program's: only the time is
# kept, and the line's own level prefix decides.
_CLOUD_LOGGING_RE = re.compile(
    r"^(?:DEFAULT|DEBUG|INFO|NOTICE|WARNING|ERROR|CRITICAL|ALERT|EMERGENCY) "
    r"(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z) "
    r"(?:\[resource\.labels\.[\w.]+: [^\]\n]*\] )?"
)
# A date and time followed by a colon before a vLLM process tag (a launcher that stamps each
# line it relays: `2026-07-29 11:18:04: (EngineCore pid=7) ERROR …`; a paste may have lost the
# year's first digit).
_COLON_TS_RE = re.compile(
    r"^(?P<ts>\d{2,4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)?): (?=\(" + _TAG_NAME + r"\s)"
)
_BRACKET_TS_RE = re.compile(
    r"^\[(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\]\s+"
)
# Colour codes as rsyslog writes them (control characters escaped as `#` and octal: `#033[33m`)
_SYSLOG_ESC_RE = re.compile(r"#033\[[0-9;]*[A-Za-z]")
# Colour codes whose ESC byte was lost (pasted logs): " [36m(RayWorkerVllm pid=1) [0m ...",
# Ray's "RayTaskError(ValueError): [36mray::Worker.run()[39m (pid=…)". Only looked for in a
# line that also holds a reset code (`[0m`, vLLM's `[0;0m`, the default colour `[39m`).
_ANSI_REMNANT_RE = re.compile(
    r"(?<![\w\]])\[(?:(?:\d{1,3}(?:;\d{1,3})*)?m(?!\w)|(?:[01];)?(?:3\d|9[0-7])m)"
)

# Producer prefixes.
_VLLM_PROC_RE = re.compile(
    r"^\((?P<name>" + _TAG_NAME + r"(?:\s+(?!pid=)[A-Za-z0-9_\-=]+){0,3})\s+pid=(?P<pid>\d+)"
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
# What a vLLM line starts with: a process tag, vLLM's level and date, torchrun's rank tag. A
# label in front of one is a wrapper's (a host, a pod and container, a worker name).
_VLLM_AHEAD = (
    r"(?=\(" + _TAG_NAME + r"(?:\s+[\w\-=]+){0,3}\s+pid=\d"
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d{2}-\d{2}\s|\[[Rr]ank\d+\]:)"
)
# pdsh / clush / parallel-ssh "host: …", stern "pod container …", "[Worker 0] …"
_HOST_LABEL_RE = re.compile(
    r"^(?!\w*(?:Error|Exception|Warning|Exit):)[A-Za-z0-9][\w.\-]{0,62}: " + _VLLM_AHEAD
)
_STERN_RE = re.compile(r"^[a-z0-9][\w.\-]{0,62} [a-z0-9][\w.\-]{0,62} " + _VLLM_AHEAD)
_BRACKET_LABEL_RE = re.compile(r"^\[[A-Za-z][\w .:/\-]{0,60}\] " + _VLLM_AHEAD)
# Go's log package and nginx: "2009/11/10 23:00:00 msg"
_SLASH_TS_RE = re.compile(r"^(?P<ts>\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)\s+")
_NAME_RANK_RE = re.compile(r"(?:rank=|_TP|\bTP|[Rr]ank)(\d+)(?!.*(?:rank=|TP)\d)|-(\d+)$")
_VLLM_LEVEL_RE = re.compile(
    r"^\s*(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"(?P<ts>\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}(?:\.\d+)?)\s+"
    r"\[?(?P<src>[A-Za-z0-9_.\-/]+:\d+)\]\s?"
)
_RANK_TAG_RE = re.compile(r"^\[[Rr]ank\s*(?P<rank>\d+)\]:?\s?")
_TORCHRUN_RE = re.compile(r"^\[(?:[Rr]ank|default)(?P<rank>\d+)\]:\s?")
# c10d writes the month without a leading zero (MMDD in three digits):
# `[E421 04:13:43.457389636 ProcessGroupGloo.cpp:143]`
_TORCH_CPP_RE = re.compile(
    r"^\s*\[(?P<level>[DIWEF])(?:(?P<date>\d{3,4})\s+(?P<time>\d{2}:\d{2}:\d{2}(?:\.\d+)?))?"
    r"(?:\s+(?P<tid>\d+))?\s+(?P<src>[A-Za-z0-9_.\-/]+:\d+)\]\s?"
)
_NCCL_RE = re.compile(
    r"^(?P<host>[A-Za-z0-9_.\-]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>[^\]]*)\]\s+"
    r"(?:(?P<src>[A-Za-z0-9_./\-]+\.(?:cc|cpp|h|c):\d+)\s+)?(?=NCCL\s+(?P<level>INFO|WARN|ERROR|TRACE)\b)"
)
# An application's own logging format: "[ERROR] [MainThread] [asyncio] >>> msg"
_BRACKET_LEVEL_RE = re.compile(
    r"^\[(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]\s*"
    r"(?:\[[^\]\s]{1,40}\]\s*)*(?:>>>\s?|[-:|]\s)?"
)
# spdlog's default pattern after its timestamp (the bracket_ts wrapper peels that):
# "[logger] [error] [file.cpp:910] msg" (C++ services beside vLLM: KV-cache stores, transfer
# engines); the level is lower case, the source location optional.
_SPDLOG_RE = re.compile(
    r"^\[(?P<logger>[^\]\s]{1,40})\] "
    r"\[(?P<level>trace|debug|info|warning|warn|error|critical)\]\s+"
    r"(?:\[(?P<src>[\w.+-]{1,80}:\d{1,6})\]\s*)?"
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
# glog-style level letters (XLA, bare glog, Ray's C++ log)
_GLOG_LEVELS = {
    "I": "INFO",
    "W": "WARNING",
    "E": "ERROR",
    "F": "CRITICAL",
    "D": "DEBUG",
    "C": "CRITICAL",
}
# glog's own format without PyTorch's brackets (Triton, TensorFlow/XLA since 2.16, gRPC, abseil):
# "E1115 02:58:51.162611 1 backend_model.cc:634] msg"; abseil before its clock is set writes
# "E0000 00:00:1736201234.123456  12345 cuda_dnn.cc:8310] msg".
_GLOG_RE = re.compile(
    r"^(?P<level>[IWEF])(?P<date>\d{4}) (?P<time>\d{2}:\d{2}:\d{2}(?:\.\d+)?|00:00:\d+\.\d+)\s+"
    r"(?P<tid>\d+) (?P<src>[A-Za-z0-9_.\-/]+:\d+)\]\s?"
)
# Ray's C++ components (raylet, GCS, core worker):
# "[2021-02-15 19:27:20,308 I 41335 11188325] gcs_placement_group_scheduler.cc:150: msg".
_RAY_CORE_RE = re.compile(
    r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3}) (?P<level>[DIWEFC]) (?P<pid>\d+) "
    r"\d+\] (?P<src>[A-Za-z0-9_.\-/]+:\d+):\s?"
)
# A bare level word after a timestamp the wrapper layer peeled (Python logging's "%(asctime)s
# %(levelname)s %(message)s"; Ray's "%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s --
# %(message)s"; "asctime - LEVEL - msg"; Xinference's "asctime dotted.logger pid LEVEL msg"):
# the level, then an optional source location.
_TS_LEVEL_RE = re.compile(
    r"^\s*(?:-\s+|[A-Za-z_]\w*(?:\.\w+)+\s+(?:\d+\s+)?)?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)(?:\s+-\s|\s+)(?!\d)"
    r"(?:(?P<src>[A-Za-z0-9_.\-/]+\.py:\d+) -- |\[(?P<src2>[A-Za-z0-9_.\-/]+:\d+)\]\s"
    r"|\[address=[^\]\s]{1,80}, pid=(?P<pid>\d+)\]\s)?"
)
# Python logging's "%(levelname)s %(asctime)s %(message)s" (the level first, then a full date):
# "ERROR 2025-01-01 00:00:00,123 worker.py:12 -- msg"
_LEVEL_ISO_RE = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)\s+"
    r"(?:(?P<src>[A-Za-z0-9_.\-/]+\.py:\d+)(?: -- |\] ?|: ))?"
)
_UVICORN_RE = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+")
_PYLOG_RE = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<name>[\w.]+):")
# Python logging's "%(asctime)s - %(name)s - %(levelname)s - %(message)s" (vllm-ascend and
# other embedders): the timestamp is peeled as a wrapper, "- name - LEVEL - " is left.
_PYLOG_DASH_RE = re.compile(
    r"^-\s+(?P<name>[A-Za-z_][\w.]*)\s+-\s+(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+-\s"
)


_LEVEL_INITIALS = frozenset("DIWEC")
#: Characters of logs copied from web pages and what they stand for: no-break and other
#: typographic spaces for blanks (indentation included), zero-width characters and byte-order
#: marks between characters, curly quotes a blog's editor put in for ASCII ones
#: (`File “/x.py”, line 3`). The engine rewrites a block holding any before it scans it.
WEB_CHARS: dict[str, str] = {
    **dict.fromkeys("\u00a0\u2007\u202f\u3000", " "),
    **dict.fromkeys("\u200b\u200c\u200d\u2060\ufeff", ""),
    "\u201c": '"',
    "\u201d": '"',
    "\u2018": "'",
    "\u2019": "'",
}
_WEB_BLANKS = str.maketrans(WEB_CHARS)


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
    if not text.isascii():
        text = text.translate(_WEB_BLANKS)  # logs copied from web pages (WEB_CHARS)
    if "#0" in text:  # rsyslog escapes control characters: ESC as `#033`, CR as `#015`
        if "#033[" in text:
            text = _SYSLOG_ESC_RE.sub("", text)
        if "#015" in text:  # a CR: the last non-empty segment, as for a real one
            segs = [s for s in text.split("#015") if s.strip()]
            text = segs[-1] if segs else ""
    if "[0m" in text or "[0;0m" in text or "[39m" in text:  # resets: vLLM's is `[0;0m`
        text = _ANSI_REMNANT_RE.sub("", text).lstrip()
    return text


def _docker_json_log(text: str) -> str:
    """Docker's json-file driver: ``{"log":"...\\n","stream":"stderr","time":"..."}``."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return text
    log = obj.get("log") if isinstance(obj, dict) else None
    return decode_line(log) if isinstance(log, str) else text


# --------------------------------------------------------------------------------------------
# The table of envelope formats
# --------------------------------------------------------------------------------------------

Layer = Literal["wrapper", "process", "level"]


class _Acc:
    """The envelope being peeled: the text left and the fields found so far (one per line)."""

    __slots__ = ("level", "pid", "process", "rank", "rest", "source", "timestamp", "wrapper")

    def __init__(self, rest: str) -> None:
        self.rest = rest
        self.wrapper: str | None = None
        self.timestamp: str | None = None
        self.pid: int | None = None
        self.process: str | None = None
        self.rank: int | None = None
        self.level: str | None = None
        self.source: str | None = None


#: What a format does with its match: sets fields of the envelope being peeled (the matched
#: prefix is already cut from ``acc.rest``; ``m.string`` is the text it matched).
Yield = Callable[[re.Match[str], _Acc], None]


@dataclass(frozen=True, slots=True)
class Guard:
    """A cheap test that must pass before a format's expression runs on a line.

    ``first``: the allowed first characters (a set, or a ``str`` predicate such as
    ``str.isdigit``) of the text (for the ``level`` layer: of the text without leading
    whitespace); ``second``: a predicate on the second character; ``literal``: text that must
    occur in ``text[within[0]:within[1]]``; ``peek``: ``text[a:b]`` must be one of the given
    strings. A guard may reject a line its expression would match: it is part of the format.
    """

    first: frozenset[str] | Callable[[str], bool] | None = None
    second: Callable[[str], bool] | None = None
    literal: str | None = None
    within: tuple[int, int] = (0, 64)
    peek: tuple[int, int, frozenset[str]] | None = None

    def head_ok(self, head: str) -> bool:
        first = self.first
        if first is None:
            return True
        if isinstance(first, frozenset):
            return head in first
        return first(head)

    def text_ok(self, text: str) -> bool:
        if self.second is not None and not self.second(text[1:2]):
            return False
        if self.literal is not None and self.literal not in text[self.within[0] : self.within[1]]:
            return False
        peek = self.peek
        return peek is None or text[peek[0] : peek[1]] in peek[2]


@dataclass(frozen=True, slots=True)
class Sample:
    """A line of a format (real where the corpus or an issue has one; else in the shape the
    producer documents) and the body, process and level :func:`parse_line` yields for it."""

    line: str
    body: str
    process: str | None = None
    level: str | None = None


@dataclass(frozen=True, slots=True)
class EnvelopeFormat:
    """One envelope format: a prefix some producer or collector writes in front of a line."""

    name: str
    layer: Layer
    guard: Guard
    regex: re.Pattern[str]
    apply: Yield = field(repr=False)
    yields: tuple[str, ...]  # the LogLine fields it sets (documentation; tests check samples)
    samples: tuple[Sample, ...]
    note: str = ""


# -- what each format yields -----------------------------------------------------------------


def _y_nothing(m: re.Match[str], acc: _Acc) -> None:
    return None


def _y_pipe_log(m: re.Match[str], acc: _Acc) -> None:
    acc.timestamp = m.group("ts")
    # A logger that re-logs a stream (FastChat's `stderr` at ERROR) says nothing of the line's
    # own level: a vLLM line inside keeps its own, a traceback line has none.
    if m.group("name") not in ("stderr", "stdout"):
        acc.level = normalize_level(m.group("level"))
    if m.group("src"):
        acc.source = m.group("src")


def _y_compose(m: re.Match[str], acc: _Acc) -> None:
    acc.wrapper = m.group("svc") or "|"


def _y_cloud_logging(m: re.Match[str], acc: _Acc) -> None:
    acc.timestamp = m.group("ts")


def _y_iso(m: re.Match[str], acc: _Acc) -> None:
    acc.timestamp = m.group(0).split()[0]


def _y_kubectl(m: re.Match[str], acc: _Acc) -> None:
    acc.wrapper = m.string[1 : m.end()].rstrip().rstrip("]")


def _y_omni_stage(m: re.Match[str], acc: _Acc) -> None:
    acc.wrapper = m.group(0).strip()[1:-1]


def _y_bracket_ts(m: re.Match[str], acc: _Acc) -> None:
    acc.timestamp = m.group("ts")


def _y_syslog(m: re.Match[str], acc: _Acc) -> None:
    acc.wrapper = m.group("unit")
    acc.timestamp = m.group("ts")
    acc.pid = int(m.group("pid")) if m.group("pid") else None


def _y_torchrun(m: re.Match[str], acc: _Acc) -> None:
    rank = int(m.group("rank"))
    acc.rank = rank
    acc.process = f"rank{rank}"


def _y_ray_bare(m: re.Match[str], acc: _Acc) -> None:
    if m.group("pid"):
        pid = int(m.group("pid"))
        acc.pid = pid
        acc.process = f"pid={pid}" + (f", ip={m.group('ip')}" if m.group("ip") else "")
    else:
        acc.process = m.string[1 : m.string.index(")")]


def _y_vllm_proc(m: re.Match[str], acc: _Acc) -> None:
    if acc.rest[:1] == "(":
        # a tag nested in another ("(vLLMHttpServer pid=1) (Worker pid=2) ...", verl): the
        # inner one is the process that logged the line
        inner = _VLLM_PROC_RE.match(acc.rest)
        if inner:
            acc.rest = acc.rest[inner.end() :]
            m = inner
    name = " ".join(m.group("name").split())
    pid = int(m.group("pid"))
    acc.pid = pid
    acc.process = f"{name} pid={pid}"
    if m.group("ip"):
        acc.process += f", ip={m.group('ip')}"
    if acc.rank is None and "Worker" in name:
        rm = _NAME_RANK_RE.search(name)
        if rm:
            acc.rank = int(rm.group(1) or rm.group(2))


def _rank_tag(acc: _Acc) -> None:
    """``[Rank 1]`` right after a level prefix (PyTorch's c10d and NCCL watchdog lines)."""
    rm = _RANK_TAG_RE.match(acc.rest)
    if rm:
        acc.rank = int(rm.group("rank"))
        acc.rest = acc.rest[rm.end() :]


def _y_vllm_level(m: re.Match[str], acc: _Acc) -> None:
    acc.level = normalize_level(m.group("level"))
    acc.timestamp = m.group("ts")
    acc.source = m.group("src")
    if acc.rest[:1] == "[":
        _rank_tag(acc)


def _y_torch_cpp(m: re.Match[str], acc: _Acc) -> None:
    acc.level = normalize_level(m.group("level"))
    if m.group("date"):
        acc.timestamp = f"{m.group('date')} {m.group('time')}"
    acc.source = m.group("src")
    if acc.rest[:1] == "[":
        _rank_tag(acc)


def _y_nccl(m: re.Match[str], acc: _Acc) -> None:
    acc.level = normalize_level(m.group("level"))
    pid = int(m.group("pid"))
    acc.pid = pid
    if m.group("src"):
        acc.source = m.group("src")  # NCCL's file.cc:line (rules' `sources`)
    if acc.process is None:
        acc.process = f"{m.group('host')}:{pid}"


def _y_level(m: re.Match[str], acc: _Acc) -> None:
    acc.level = normalize_level(m.group("level"))


def _y_spdlog(m: re.Match[str], acc: _Acc) -> None:
    acc.level = normalize_level(m.group("level"))
    if m.group("src"):
        acc.source = m.group("src")


def _y_hip(m: re.Match[str], acc: _Acc) -> None:
    acc.level = _HIP_LEVELS[m.group("lvl")]
    acc.timestamp = None  # the HIP runtime prints microseconds since start, not a time
    acc.source = f"{m.group('src')}:{m.group('line')}"
    pid_s = m.group("pid") or m.group("pid2")
    if pid_s:
        acc.pid = int(pid_s)


def _y_xla(m: re.Match[str], acc: _Acc) -> None:
    acc.level = _GLOG_LEVELS[m.group("level")]
    acc.timestamp = m.group("ts")
    acc.source = m.group("src")


def _y_glog(m: re.Match[str], acc: _Acc) -> None:
    acc.level = _GLOG_LEVELS[m.group("level")]
    if m.group("date") != "0000":
        acc.timestamp = f"{m.group('date')} {m.group('time')}"
    acc.source = m.group("src")


def _y_ray_core(m: re.Match[str], acc: _Acc) -> None:
    acc.level = _GLOG_LEVELS[m.group("level")]
    acc.timestamp = m.group("ts")
    acc.source = m.group("src")
    acc.pid = int(m.group("pid"))


def _y_level_iso(m: re.Match[str], acc: _Acc) -> None:
    acc.level = normalize_level(m.group("level"))
    acc.timestamp = m.group("ts")
    if m.group("src"):
        acc.source = m.group("src")


def _y_ts_level(m: re.Match[str], acc: _Acc) -> None:
    acc.level = normalize_level(m.group("level"))
    src = m.group("src") or m.group("src2")
    if src:
        acc.source = src
    if m.group("pid"):  # Xinference's actor pool (xoscar): "[address=0.0.0.0:43266, pid=897]"
        acc.pid = int(m.group("pid"))


def _y_cann(m: re.Match[str], acc: _Acc) -> None:
    acc.level = "INFO" if m.group("level") == "EVENT" else m.group("level")
    acc.timestamp = m.group("ts")
    acc.source = m.group("src")
    acc.pid = int(m.group("pid"))


def _y_torch_npu(m: re.Match[str], acc: _Acc) -> None:
    acc.level = m.group("level")
    acc.timestamp = m.group("ts")
    acc.pid = int(m.group("pid"))
    rank = int(m.group("rank"))
    if rank >= 0:  # RankID:-1: not a distributed run
        acc.rank = rank


# -- the table (order matters within a layer: the first match wins) --------------------------

FORMATS: tuple[EnvelopeFormat, ...] = (
    EnvelopeFormat(
        name="tui_border",
        layer="wrapper",
        guard=Guard(first=frozenset("│┃║")),
        regex=_TUI_BORDER_RE,
        apply=_y_nothing,
        yields=(),
        samples=(
            Sample(
                line=(
                    "│ CRITICAL 08-30 19:24:28 launcher.py:82] AsyncLLMEngine has failed, "
                    "terminating server process          │"
                ),
                body="AsyncLLMEngine has failed, terminating server process          │",
                level="CRITICAL",
            ),
        ),
        note="a line inside a terminal UI's box (k9s): the border in front",
    ),
    EnvelopeFormat(
        name="quote",
        layer="wrapper",
        guard=Guard(first=frozenset(">")),
        regex=_QUOTE_RE,
        apply=_y_nothing,
        yields=(),
        samples=(
            Sample(
                line="> [2024-09-05T00:38:34Z] INFO:     Started server process [60858]",
                body="Started server process [60858]",
                level="INFO",
            ),
            Sample(
                line='>   File "/v/vllm/worker/worker.py", line 241, in load_model',
                body='  File "/v/vllm/worker/worker.py", line 241, in load_model',
            ),
            Sample(
                line="> > (APIServer pid=1) ERROR 05-10 12:00:00 [a.py:1] quoted twice",
                body="quoted twice",
                process="APIServer pid=1",
                level="ERROR",
            ),
        ),
        note="a pasted log: markdown block quotes",
    ),
    EnvelopeFormat(
        name="indented",
        layer="wrapper",
        guard=Guard(first=frozenset(" \t"), literal="pid=", within=(1, 96)),
        regex=_INDENTED_RE,
        apply=_y_nothing,
        yields=(),
        samples=(
            Sample(
                line=(
                    "        (Worker_DP0_TP0_EP0 pid=5609) ERROR 06-04 12:45:50 "
                    "[v1/executor/multiproc_executor.py:932]     return func(*args, **kwargs)"
                ),
                body="    return func(*args, **kwargs)",
                process="Worker_DP0_TP0_EP0 pid=5609",
                level="ERROR",
            ),
        ),
        note="a paste indented as a whole: blanks before a vLLM process tag",
    ),
    EnvelopeFormat(
        name="md_list",
        layer="wrapper",
        guard=Guard(first=frozenset("-*+`")),
        regex=_MD_LIST_RE,
        apply=_y_nothing,
        yields=(),
        samples=(
            Sample(
                line=(
                    "- 2024-06-22T20:16:34.700+00:00 ERROR 06-22 20:16:34 "
                    "async_llm_engine.py:52]   File \"/v/async_llm_engine.py\", line 532, "
                    "in run_engine_loop"
                ),
                body='  File "/v/async_llm_engine.py", line 532, in run_engine_loop',
                level="ERROR",
            ),
            Sample(
                line="* (APIServer pid=1) ERROR 05-10 12:00:00 [a.py:1] listed",
                body="listed",
                process="APIServer pid=1",
                level="ERROR",
            ),
            Sample(
                line=(
                    "`(ServeReplica:default:VLLMDeployment pid=1328933)     return any(model.name "
                    "== model_name for model in self.base_model_paths)"
                ),
                body="    return any(model.name == model_name for model in self.base_model_paths)",
                process="ServeReplica:default:VLLMDeployment pid=1328933",
            ),
        ),
        note=(
            "a pasted line in a markdown list item or after an inline-code backtick, before a "
            "timestamp or a vLLM process tag"
        ),
    ),
    EnvelopeFormat(
        name="cloud_logging",
        layer="wrapper",
        guard=Guard(first=frozenset("DINWECA"), literal="Z ", within=(20, 50)),
        regex=_CLOUD_LOGGING_RE,
        apply=_y_cloud_logging,
        yields=("timestamp",),
        samples=(
            Sample(
                line=(
                    "INFO 2025-11-19T20:16:36.096638074Z [resource.labels.containerName: vllm] "
                    "(EngineCore_DP0 pid=270) ERROR 11-19 12:16:36 [v1/engine/core.py:842] "
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.47 GiB."
                ),
                body="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.47 GiB.",
                process="EngineCore_DP0 pid=270",
                level="ERROR",
            ),
            Sample(
                line=(
                    "ERROR 2025-03-30T23:51:21.303592681Z [rank0]: "
                    "Traceback (most recent call last):"
                ),
                body="Traceback (most recent call last):",
                process="rank0",
            ),
        ),
        note="Google Cloud Logging's text export: severity, receive time, GKE container label",
    ),
    EnvelopeFormat(
        name="pipe_log",
        layer="wrapper",
        guard=Guard(first=str.isdigit, literal=" | ", within=(18, 32)),
        regex=_PIPE_LOG_RE,
        apply=_y_pipe_log,
        yields=("timestamp",),
        samples=(
            Sample(
                # FastChat's vllm_worker (corpus b19-fastchat3704)
                line=(
                    "2025-03-24 22:04:27 | ERROR | stderr | AttributeError: 'AsyncLLM' object "
                    "has no attribute 'engine'"
                ),
                body="AttributeError: 'AsyncLLM' object has no attribute 'engine'",
            ),
            Sample(
                line="2023-11-10 17:45:27 | ERROR | asyncio | Future exception was never retrieved",
                body="Future exception was never retrieved",
                level="ERROR",
            ),
        ),
        note="Python logging's 'asctime | LEVEL | name | msg' (FastChat) and loguru's format",
    ),
    EnvelopeFormat(
        name="compose",
        layer="wrapper",
        guard=Guard(literal="|", within=(0, 64)),
        regex=_COMPOSE_RE,
        apply=_y_compose,
        yields=("wrapper",),
        samples=(
            Sample(
                line=(
                    "vllm-qwen-72b-instruct  | (VllmWorker rank=2 pid=262) DEBUG 04-11 13:45:00 "
                    "[config.py:3773] enabled custom ops: Counter()"
                ),
                body="enabled custom ops: Counter()",
                process="VllmWorker rank=2 pid=262",
                level="DEBUG",
            ),
            Sample(
                line="vllm-1  | (APIServer pid=1) INFO 05-10 12:00:00 [a.py:1] hello",
                body="hello",
                process="APIServer pid=1",
                level="INFO",
            ),
            Sample(
                line=(
                    "  | ERROR 07-01 13:54:43 multiproc_worker_utils.py:120] Worker pid 1159 died"
                ),
                body="Worker pid 1159 died",
                level="ERROR",
            ),
            Sample(
                line='"  | [2024-09-05T00:38:34Z] ERROR:    [Errno 98] bind failed',
                body="[Errno 98] bind failed",
                level="ERROR",
            ),
        ),
        note='docker compose "svc-1  | ", Buildkite "  | " (no name)',
    ),
    EnvelopeFormat(
        name="k8s_iso",
        layer="wrapper",
        guard=Guard(first=str.isdigit),
        regex=_K8S_ISO_RE,
        apply=_y_iso,
        yields=("timestamp",),
        samples=(
            Sample(
                line=(
                    "2026-04-16T12:49:28.262466172Z (EngineCore_DP0 pid=568) ERROR 04-16 "
                    "12:49:28 [core.py:936] RuntimeError: level_zero backend failed with error: "
                    "40 (UR_RESULT_ERROR_OUT_OF_RESOURCES)"
                ),
                body=(
                    "RuntimeError: level_zero backend failed with error: 40 "
                    "(UR_RESULT_ERROR_OUT_OF_RESOURCES)"
                ),
                process="EngineCore_DP0 pid=568",
                level="ERROR",
            ),
            Sample(
                line=(
                    "2026-11-30T01:02:03.123456789Z stderr F (APIServer pid=1) INFO 05-10 "
                    "12:00:00 [a.py:1] k8s"
                ),
                body="k8s",
                process="APIServer pid=1",
                level="INFO",
            ),
        ),
        note="an ISO timestamp (kubectl --timestamps, CRI log files with stream and tag)",
    ),
    EnvelopeFormat(
        name="mpi_tag",
        layer="wrapper",
        guard=Guard(first=frozenset("["), literal="]<", within=(0, 16)),
        regex=_MPI_TAG_RE,
        apply=_y_nothing,
        yields=(),
        samples=(
            Sample(
                line="[1,0]<stderr>:ERROR 01-01 00:00:00 [x.py:1] boom",
                body="boom",
                level="ERROR",
            ),
        ),
        note='mpirun --tag-output "[1,0]<stderr>:"',
    ),
    EnvelopeFormat(
        name="srun_label",
        layer="wrapper",
        guard=Guard(first=str.isdigit, literal=": ", within=(1, 6)),
        regex=_SRUN_LABEL_RE,
        apply=_y_nothing,
        yields=(),
        samples=(
            Sample(
                line="3: (EngineCore pid=1) ERROR 01-01 00:00:00 [x.py:1] boom",
                body="boom",
                process="EngineCore pid=1",
                level="ERROR",
            ),
        ),
        note='srun --label "0: " in front of a vLLM line (a numbered plain line keeps its number)',
    ),
    EnvelopeFormat(
        name="kubectl",
        layer="wrapper",
        guard=Guard(first=frozenset("["), second=str.islower),
        regex=_KUBECTL_RE,
        apply=_y_kubectl,
        yields=("wrapper",),
        samples=(
            Sample(
                line="[pod/vllm-0/vllm] ERROR 01-01 00:00:00 [x.py:1] boom",
                body="boom",
                level="ERROR",
            ),
        ),
        note="kubectl logs --prefix",
    ),
    EnvelopeFormat(
        name="omni_stage",
        layer="wrapper",
        guard=Guard(first=frozenset("["), second=lambda c: c == "S"),
        regex=_OMNI_STAGE_RE,
        apply=_y_omni_stage,
        yields=("wrapper",),
        samples=(
            Sample(
                line=(
                    "[Stage-0] ERROR 01-30 18:03:36 [omni_stage.py:1400] RuntimeError: "
                    "Diffusion generation failed"
                ),
                body="RuntimeError: Diffusion generation failed",
                level="ERROR",
            ),
        ),
        note="vLLM-Omni's stage tag (multi-stage pipelines)",
    ),
    EnvelopeFormat(
        name="host_label",
        layer="wrapper",
        guard=Guard(first=frozenset(string.ascii_letters + string.digits), literal=": "),
        regex=_HOST_LABEL_RE,
        apply=_y_nothing,
        yields=(),
        samples=(
            Sample(
                line="worker-0: (EngineCore pid=1) ERROR 01-01 00:00:00 [x.py:1] boom",
                body="boom",
                process="EngineCore pid=1",
                level="ERROR",
            ),
            Sample(
                line="10.0.0.1: ERROR 05-10 12:00:00 [core.py:1] RuntimeError: boom",
                body="RuntimeError: boom",
                level="ERROR",
            ),
        ),
        note="pdsh / clush / parallel-ssh's 'host: ' in front of a vLLM line",
    ),
    EnvelopeFormat(
        name="stern",
        layer="wrapper",
        guard=Guard(first=frozenset(string.ascii_lowercase + string.digits), literal=" "),
        regex=_STERN_RE,
        apply=_y_nothing,
        yields=(),
        samples=(
            Sample(
                line="vllm-0 vllm ERROR 05-10 12:00:00 [core.py:1] RuntimeError: boom",
                body="RuntimeError: boom",
                level="ERROR",
            ),
        ),
        note="stern's (and kubetail's) 'pod container ' in front of a vLLM line",
    ),
    EnvelopeFormat(
        name="bracket_label",
        layer="wrapper",
        guard=Guard(first=frozenset("["), second=str.isalpha, literal="] "),
        regex=_BRACKET_LABEL_RE,
        apply=_y_nothing,
        yields=(),
        samples=(
            Sample(
                line="[Worker 0] ERROR 05-10 12:00:00 [core.py:1] RuntimeError: boom",
                body="RuntimeError: boom",
                level="ERROR",
            ),
        ),
        note="a bracketed label in front of a vLLM line ('[Worker 0] ', a launcher's name)",
    ),
    EnvelopeFormat(
        name="slash_ts",
        layer="wrapper",
        guard=Guard(first=str.isdigit, literal="/", within=(4, 5)),
        regex=_SLASH_TS_RE,
        apply=_y_bracket_ts,
        yields=("timestamp",),
        samples=(
            Sample(
                line="2024/01/01 00:00:00 ERROR 05-10 12:00:00 [core.py:1] RuntimeError: boom",
                body="RuntimeError: boom",
                level="ERROR",
            ),
        ),
        note="Go's log package and nginx: a date with slashes and a time",
    ),
    EnvelopeFormat(
        name="colon_ts",
        layer="wrapper",
        guard=Guard(first=frozenset("0123456789"), literal=": (", within=(12, 30)),
        regex=_COLON_TS_RE,
        apply=_y_bracket_ts,
        yields=("timestamp",),
        samples=(
            Sample(
                line=(
                    "026-07-29 11:18:04: (StageEngineCoreProc_stage0_replica0 pid=707) ERROR "
                    "07-29 11:18:04 [stage_engine_core_proc.py:185] TimeoutError"
                ),
                body="TimeoutError",
                process="StageEngineCoreProc_stage0_replica0 pid=707",
                level="ERROR",
            ),
        ),
        note="a relayed line stamped with a date, a time and a colon, before a vLLM process tag",
    ),
    EnvelopeFormat(
        name="bracket_ts",
        layer="wrapper",
        guard=Guard(first=frozenset("["), second=str.isdigit),
        regex=_BRACKET_TS_RE,
        apply=_y_bracket_ts,
        yields=("timestamp",),
        samples=(
            Sample(
                line=(
                    "[2026-11-30 02:37:07] vm:1635:1635 [1] graph/tuning.cc:104 NCCL WARN "
                    "Unrecognized token"
                ),
                body="NCCL WARN Unrecognized token",
                process="vm:1635",
                level="WARNING",
            ),
            Sample(
                line=(
                    "[2024-04-17 20:07:13,727] [ERROR] [MainThread] [asyncio] >>>   File "
                    '"/x.py", line 1'
                ),
                body='  File "/x.py", line 1',
                level="ERROR",
            ),
        ),
        note="a bracketed ISO timestamp",
    ),
    EnvelopeFormat(
        name="relay",
        layer="wrapper",
        guard=Guard(first=frozenset("["), literal="]: ", within=(2, 90)),
        regex=_RELAY_RE,
        apply=_y_bracket_ts,
        yields=("timestamp",),
        samples=(
            Sample(
                line=(
                    "[VllmSidecar kooEr8Ccal1cqylW5f5cz]: 2024-11-13T03:15:08.672Z 1 stdout: "
                    "CRITICAL 11-12 19:15:08 launcher.py:99] MQLLMEngine is already dead, "
                    "terminating server process"
                ),
                body="MQLLMEngine is already dead, terminating server process",
                level="CRITICAL",
            ),
        ),
        note="a sidecar or log relay: [source id]: ISO time, an optional number, the stream",
    ),
    EnvelopeFormat(
        name="syslog",
        layer="wrapper",
        guard=Guard(first=str.isupper),
        regex=_SYSLOG_RE,
        apply=_y_syslog,
        yields=("wrapper", "timestamp"),
        samples=(
            Sample(
                line="Nov 30 01:02:03 gpu-host vllm[123]: ERROR 05-10 12:00:00 [a.py:1] bad",
                body="bad",
                level="ERROR",
            ),
        ),
        note="syslog / journalctl: date, host, unit[pid]",
    ),
    EnvelopeFormat(
        name="syslog_cjk",
        layer="wrapper",
        guard=Guard(first=str.isdigit, literal="月", within=(1, 3)),
        regex=_SYSLOG_CJK_RE,
        apply=_y_syslog,
        yields=("wrapper", "timestamp"),
        samples=(
            Sample(
                line=(
                    "6月 10 16:45:05 ma-MS-TZZ-Z690M bash[107468]:     return await "
                    "self.chat_completion_full_generator("
                ),
                body="    return await self.chat_completion_full_generator(",
            ),
        ),
        note="journalctl under a Chinese or Japanese locale (month as a number and 月)",
    ),
    EnvelopeFormat(
        name="torchrun",
        layer="process",
        guard=Guard(first=frozenset("[")),
        regex=_TORCHRUN_RE,
        apply=_y_torchrun,
        yields=("process", "rank"),
        samples=(
            Sample(
                line="[rank1]: RuntimeError: NCCL error",
                body="RuntimeError: NCCL error",
                process="rank1",
            ),
            Sample(
                line=(
                    "[rank6]:[W806 22:23:09.971726955 socket.cpp:487] [c10d] waitForInput: "
                    "socket SocketImpl(fd=109) timed out after 1800000ms"
                ),
                body="[c10d] waitForInput: socket SocketImpl(fd=109) timed out after 1800000ms",
                process="rank6",
                level="WARNING",
            ),
        ),
        note="torchrun's per-rank prefix",
    ),
    EnvelopeFormat(
        name="ray_bare",
        layer="process",
        guard=Guard(first=frozenset("("), peek=(1, 4, frozenset({"pid", "ray", "gcs", "aut"}))),
        regex=_RAY_BARE_RE,
        apply=_y_ray_bare,
        yields=("process", "pid"),
        samples=(
            Sample(
                line=(
                    "(pid=1058) INFO 02-09 02:31:08 __init__.py:190] Automatically detected "
                    "platform cuda."
                ),
                body="Automatically detected platform cuda.",
                process="pid=1058",
                level="INFO",
            ),
            Sample(
                line="(raylet) ERROR 01-01 00:00:00 [x.py:1] boom",
                body="boom",
                process="raylet",
                level="ERROR",
            ),
            Sample(
                line=(
                    "(pid=1, ip=10.0.0.1) ERROR 01-01 00:00:00 [x.py:1] boom [repeated 3x across "
                    "cluster]"
                ),
                body="boom",
                process="pid=1, ip=10.0.0.1",
                level="ERROR",
            ),
        ),
        note="Ray prefixes without a process name",
    ),
    EnvelopeFormat(
        name="vllm_proc",
        layer="process",
        guard=Guard(first=frozenset("(")),
        regex=_VLLM_PROC_RE,
        apply=_y_vllm_proc,
        yields=("process", "pid", "rank"),
        samples=(
            Sample(
                line=(
                    "(APIServer pid=15538) INFO 11-30 01:47:53 [api_utils.py:286] non-default "
                    "args: {}"
                ),
                body="non-default args: {}",
                process="APIServer pid=15538",
                level="INFO",
            ),
            Sample(
                line="(VllmWorker rank=1 pid=77) WARNING 05-10 12:00:00 [x.py:3] careful",
                body="careful",
                process="VllmWorker rank=1 pid=77",
                level="WARNING",
            ),
            Sample(
                line="(RayWorkerWrapper pid=9, ip=10.0.0.2) INFO 05-10 12:00:00 [w.py:1] up",
                body="up",
                process="RayWorkerWrapper pid=9, ip=10.0.0.2",
                level="INFO",
            ),
            Sample(
                line=(
                    "(vLLMHttpServer pid=6840) (Worker pid=7181) ERROR 06-09 17:58:55 "
                    "[multiproc_executor.py:852] WorkerProc failed to start."
                ),
                body="WorkerProc failed to start.",
                process="Worker pid=7181",
                level="ERROR",
            ),
            Sample(
                line="(EngineCore_DP0 pid=6880) ValueError: boom",
                body="ValueError: boom",
                process="EngineCore_DP0 pid=6880",
            ),
        ),
        note="vLLM's process tag (and Ray's with a name); a worker's rank from its name",
    ),
    EnvelopeFormat(
        name="vllm_level",
        layer="level",
        guard=Guard(first=_LEVEL_INITIALS),
        regex=_VLLM_LEVEL_RE,
        apply=_y_vllm_level,
        yields=("level", "timestamp", "source_file"),
        samples=(
            Sample(
                line="INFO 05-10 12:00:00 llm_engine.py:176] Initializing an LLM engine",
                body="Initializing an LLM engine",
                level="INFO",
            ),
            Sample(
                line="ERROR 04-16 12:49:28 [core.py:936] RuntimeError: boom",
                body="RuntimeError: boom",
                level="ERROR",
            ),
        ),
        note=(
            "vLLM's logger: level, date and time, [file.py:line]; an optional [Rank N] right after"
            " it sets the rank (no real sample yet)"
        ),
    ),
    EnvelopeFormat(
        name="torch_cpp",
        layer="level",
        guard=Guard(first=frozenset("[")),
        regex=_TORCH_CPP_RE,
        apply=_y_torch_cpp,
        yields=("level", "timestamp", "source_file", "rank"),
        samples=(
            Sample(
                line=(
                    "[W1130 02:37:08.020361212 ProcessGroupNCCL.cpp:1575] Warning: WARNING: "
                    "destroy_process_group() was not called before program exit"
                ),
                body=(
                    "Warning: WARNING: destroy_process_group() was not called before program exit"
                ),
                level="WARNING",
            ),
            Sample(
                line=(
                    "[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation "
                    "timeout"
                ),
                body="Watchdog caught collective operation timeout",
                level="ERROR",
            ),
            Sample(
                line=(
                    "[E socket.cpp:957] [c10d] The client socket has timed out after 60s while "
                    "trying to connect to (10.1.16.222, 29400)."
                ),
                body=(
                    "[c10d] The client socket has timed out after 60s while trying to connect to "
                    "(10.1.16.222, 29400)."
                ),
                level="ERROR",
            ),
        ),
        note="PyTorch C++ (glog style) logging; then an optional [Rank N]",
    ),
    EnvelopeFormat(
        name="nccl",
        layer="level",
        guard=Guard(literal="NCCL", within=(0, 200)),
        regex=_NCCL_RE,
        apply=_y_nccl,
        yields=("level", "pid", "process"),
        samples=(
            Sample(
                line="node1:412:530 [0] NCCL WARN Call to connect returned Connection refused",
                body="NCCL WARN Call to connect returned Connection refused",
                process="node1:412",
                level="WARNING",
            ),
            Sample(
                line="vm:656:656 [0] NCCL INFO ENV/Plugin: Could not find: libnccl-env.so",
                body="NCCL INFO ENV/Plugin: Could not find: libnccl-env.so",
                process="vm:656",
                level="INFO",
            ),
        ),
        note="NCCL's (and RCCL's) host:pid:tid [dev]",
    ),
    EnvelopeFormat(
        name="uvicorn",
        layer="level",
        guard=Guard(first=_LEVEL_INITIALS),
        regex=_UVICORN_RE,
        apply=_y_level,
        yields=("level",),
        samples=(
            Sample(
                line='INFO:     10.224.0.5:36338 - "GET /health HTTP/1.1" 200 OK',
                body='10.224.0.5:36338 - "GET /health HTTP/1.1" 200 OK',
                level="INFO",
            ),
        ),
        note="uvicorn's access and error log",
    ),
    EnvelopeFormat(
        name="cann",
        layer="level",
        guard=Guard(first=frozenset("[")),
        regex=_CANN_RE,
        apply=_y_cann,
        yields=("level", "timestamp", "source_file", "pid"),
        samples=(
            Sample(
                line=(
                    "[ERROR] HCCL(2717288,python3):2025-07-23-03:47:57.070.466 "
                    "[hccl_socket_manager.cc:54] [2717288][ServerInit]call trace: hcclRet -> 19"
                ),
                body="[2717288][ServerInit]call trace: hcclRet -> 19",
                level="ERROR",
            ),
        ),
        note="Ascend CANN plog",
    ),
    EnvelopeFormat(
        name="torch_npu",
        layer="level",
        guard=Guard(first=frozenset("[")),
        regex=_TORCH_NPU_RE,
        apply=_y_torch_npu,
        yields=("level", "timestamp", "pid", "rank"),
        samples=(
            Sample(
                line=(
                    "[ERROR] 2025-09-03-03:02:37 (PID:7226, Device:1, RankID:3) ERR02200 DIST "
                    "call hccl api failed."
                ),
                body="ERR02200 DIST call hccl api failed.",
                level="ERROR",
            ),
            Sample(
                line=(
                    "[ERROR] 2025-09-03-03:02:37 (PID:7226, Device:1, RankID:-1) ERR02200 DIST "
                    "call hccl api failed."
                ),
                body="ERR02200 DIST call hccl api failed.",
                level="ERROR",
            ),
        ),
        note="torch_npu (RankID:-1: no rank)",
    ),
    EnvelopeFormat(
        name="bracket_level",
        layer="level",
        guard=Guard(first=frozenset("[")),
        regex=_BRACKET_LEVEL_RE,
        apply=_y_level,
        yields=("level",),
        samples=(
            Sample(
                line="[ERROR] [MainThread] [asyncio] >>> Exception in callback",
                body="Exception in callback",
                level="ERROR",
            ),
            Sample(
                line="[WARNING] something odd",
                body="something odd",
                level="WARNING",
            ),
        ),
        note='an application\'s own logging format: "[ERROR] [MainThread] [asyncio] >>> msg"',
    ),
    EnvelopeFormat(
        name="spdlog",
        layer="level",
        guard=Guard(first=frozenset("[")),
        regex=_SPDLOG_RE,
        apply=_y_spdlog,
        yields=("level", "source_file"),
        samples=(
            # after the bracket_ts wrapper: the real line begins `[2025-05-15 15:48:41.233] `
            Sample(
                line="[infini] [error] [libinfinistore.cpp:910] Please register memory first",
                body="Please register memory first",
                level="ERROR",
            ),
            Sample(
                line="[infini] [info] connected to 10.0.0.5:12345",
                body="connected to 10.0.0.5:12345",
                level="INFO",
            ),
        ),
        note="spdlog's default pattern (C++ services: InfiniStore, transfer engines)",
    ),
    EnvelopeFormat(
        name="hip",
        layer="level",
        guard=Guard(first=frozenset(":")),
        regex=_HIP_LOG_RE,
        apply=_y_hip,
        yields=("level", "source_file", "pid"),
        samples=(
            Sample(
                line=(
                    ":1:hip_fatbin.cpp           :117 : 8802962845 us: [pid:19349 "
                    "tid:0x14dec9d33080] Missing CO for these ISAs - "
                ),
                body="Missing CO for these ISAs - ",
                level="ERROR",
            ),
            Sample(
                line=(
                    ":1:hip_code_object.cpp      :505 : 99442499995 us: 350457: "
                    "[tid:0x7f02e57efc00] hipErrorNoBinaryForGpu: Unable to find code object for "
                    "all current devices!"
                ),
                body="hipErrorNoBinaryForGpu: Unable to find code object for all current devices!",
                level="ERROR",
            ),
            Sample(
                line=(
                    ":3:hip_memory.cpp           :777 : 3852921767 us: [pid:9     "
                    "tid:0x7fcd5fa0c4c0] hipMemGetInfo: Returned hipErrorInvalidValue :"
                ),
                body="hipMemGetInfo: Returned hipErrorInvalidValue :",
                level="INFO",
            ),
        ),
        note="ROCm HIP runtime log (AMD_LOG_LEVEL); the digit is the level, 1 error .. 4 debug",
    ),
    EnvelopeFormat(
        name="xla",
        layer="level",
        guard=Guard(first=str.isdigit),
        regex=_XLA_LOG_RE,
        apply=_y_xla,
        yields=("level", "timestamp", "source_file"),
        samples=(
            Sample(
                line=(
                    "2023-03-23 02:02:25.057202: E "
                    "tensorflow/compiler/xla/xla_client/xla_util.cc:90]   OP_REQUIRES failed at "
                    "tpu_execute_op.cc:266 : RESOURCE_EXHAUSTED: Attempting to reserve"
                ),
                body=(
                    "  OP_REQUIRES failed at tpu_execute_op.cc:266 : RESOURCE_EXHAUSTED: "
                    "Attempting to reserve"
                ),
                level="ERROR",
            ),
        ),
        note="TensorFlow/XLA C++ logging (TPU and JAX stacks)",
    ),
    EnvelopeFormat(
        name="glog",
        layer="level",
        guard=Guard(first=frozenset("IWEF"), second=str.isdigit),
        regex=_GLOG_RE,
        apply=_y_glog,
        yields=("level", "timestamp", "source_file"),
        samples=(
            Sample(
                line=(
                    "E1115 02:58:51.162611 1 backend_model.cc:634] ERROR: Failed to create "
                    "instance: TypeError: 'NoneType' object is not subscriptable"
                ),
                body=(
                    "ERROR: Failed to create instance: TypeError: 'NoneType' object is not "
                    "subscriptable"
                ),
                level="ERROR",
            ),
            Sample(
                line=(
                    "W0816 16:43:33.649654 127 pinned_memory_manager.cc:236] Unable to allocate "
                    "pinned system memory, pinned memory pool will not be available: CUDA driver "
                    "version is insufficient for CUDA runtime version"
                ),
                body=(
                    "Unable to allocate pinned system memory, pinned memory pool will not be "
                    "available: CUDA driver version is insufficient for CUDA runtime version"
                ),
                level="WARNING",
            ),
        ),
        note="glog without brackets (Triton, TensorFlow/XLA, gRPC, abseil): LMMDD time tid src]",
    ),
    EnvelopeFormat(
        name="ray_core",
        layer="level",
        guard=Guard(first=frozenset("["), second=str.isdigit),
        regex=_RAY_CORE_RE,
        apply=_y_ray_core,
        yields=("level", "timestamp", "pid", "source_file"),
        samples=(
            Sample(
                line=(
                    "[2021-02-15 19:27:20,308 I 41335 11188325] "
                    "gcs_placement_group_scheduler.cc:150: Failed to schedule placement group "
                    "_tune__a2e7e1c2, id: c95dc4e5a4a62c4bee274eab28250a3f, because no nodes are "
                    "available."
                ),
                body=(
                    "Failed to schedule placement group _tune__a2e7e1c2, id: "
                    "c95dc4e5a4a62c4bee274eab28250a3f, because no nodes are available."
                ),
                level="INFO",
            ),
        ),
        note="Ray's C++ components (raylet, GCS, core worker): [date time,ms L pid tid] file:line:",
    ),
    EnvelopeFormat(
        name="pylog",
        layer="level",
        guard=Guard(first=_LEVEL_INITIALS),
        regex=_PYLOG_RE,
        apply=_y_level,
        yields=("level",),
        samples=(
            Sample(
                line="ERROR:root:Something failed",
                body="Something failed",
                level="ERROR",
            ),
            Sample(
                line="WARNING:vllm.engine:slow",
                body="slow",
                level="WARNING",
            ),
        ),
        note="Python logging's default format LEVEL:name:msg",
    ),
    EnvelopeFormat(
        name="pylog_dash",
        layer="level",
        guard=Guard(first=frozenset("-")),
        regex=_PYLOG_DASH_RE,
        apply=_y_level,
        yields=("level",),
        samples=(
            Sample(
                # real lines start with "2026-03-10 17:22:52,463 " (peeled by k8s_iso)
                line="- vllm.v1.executor.multiproc_executor - ERROR - WorkerProc failed to start.",
                body="WorkerProc failed to start.",
                level="ERROR",
            ),
        ),
        note="Python logging's 'asctime - name - LEVEL - msg' (after the timestamp wrapper)",
    ),
    EnvelopeFormat(
        name="level_iso",
        layer="level",
        guard=Guard(first=_LEVEL_INITIALS, literal="-", within=(8, 15)),
        regex=_LEVEL_ISO_RE,
        apply=_y_level_iso,
        yields=("level", "timestamp", "source_file"),
        samples=(
            Sample(
                line="ERROR 2025-01-01 00:00:00,123 worker.py:409 -- Unhandled error",
                body="Unhandled error",
                level="ERROR",
            ),
        ),
        note="Python logging with the level first, then a full date and time",
    ),
    EnvelopeFormat(
        name="ts_level",
        layer="level",
        # (a level's initial, a dotted logger name's lower-case start, a dash)
        guard=Guard(first=frozenset("DIWECF-_" + string.ascii_lowercase)),
        regex=_TS_LEVEL_RE,
        apply=_y_ts_level,
        yields=("level", "source_file", "pid"),
        samples=(
            Sample(
                # real lines start with "2024-03-29 18:28:51,875 " (peeled by k8s_iso)
                line="INFO worker.py:1786 -- Started a local Ray instance.",
                body="Started a local Ray instance.",
                level="INFO",
            ),
            Sample(
                # "2026-03-18T06:21:30.893722Z  WARN …": Rust tracing (dynamo), ISO stamp peeled
                line=(
                    "WARN handle_payload: dynamo_runtime::pipeline::network::ingress::"
                    "push_handler: Failed to publish response for stream"
                ),
                body=(
                    "handle_payload: dynamo_runtime::pipeline::network::ingress::push_handler: "
                    "Failed to publish response for stream"
                ),
                level="WARNING",
            ),
            Sample(
                # "2024-03-29 18:28:51,875 " peeled by k8s_iso
                line=(
                    "xinference.api.restful_api 8 ERROR    [address=0.0.0.0:43266, pid=897] CUDA "
                    "error: invalid argument"
                ),
                body="CUDA error: invalid argument",
                level="ERROR",
            ),
            Sample(
                line="- ERROR - Failed to load model",
                body="Failed to load model",
                level="ERROR",
            ),
        ),
        note=(
            "a bare level word (after a timestamp the wrapper layer peeled: Python logging's "
            "'asctime LEVEL msg', Ray's 'LEVEL file.py:N -- msg', Rust tracing), an optional "
            "source location"
        ),
    ),
)


# --------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------

# The parser runs on every line that reaches it, so the table is compiled into plain tuples:
# (ASCII first characters the guard accepts, guard, bound match, apply, then the rest of the
# guard spelled out: literal, its window start and end, second-character test, peek window
# start and end, peek strings).
_Entry = tuple[
    frozenset[str],
    Guard,
    Callable[[str], "re.Match[str] | None"],
    Yield,
    str | None,
    int,
    int,
    Callable[[str], bool] | None,
    int,
    int,
    frozenset[str] | None,
]
_ASCII_HEADS = ("", *map(chr, range(128)))


def _entry(fmt: EnvelopeFormat) -> _Entry:
    g = fmt.guard
    heads = frozenset(h for h in _ASCII_HEADS if g.head_ok(h))
    lo, hi = g.within
    plo, phi, peek = g.peek if g.peek is not None else (0, 0, None)
    return (heads, g, fmt.regex.match, fmt.apply, g.literal, lo, hi, g.second, plo, phi, peek)


@dataclass(frozen=True, slots=True)
class _LayerTable:
    """One layer's formats compiled to entries, pre-sorted by the first character their guards
    accept (non-ASCII first characters are rare: their candidates are found on the fly)."""

    entries: tuple[tuple[int, _Entry], ...]
    by_head: dict[str, tuple[tuple[int, _Entry], ...]]
    never: frozenset[str]  # ASCII first characters no format of the layer accepts

    @classmethod
    def build(cls, formats: tuple[EnvelopeFormat, ...]) -> _LayerTable:
        entries = tuple(enumerate(_entry(f) for f in formats))
        by_head = {h: tuple(e for e in entries if h in e[1][0]) for h in _ASCII_HEADS}
        return cls(entries, by_head, frozenset(h for h, c in by_head.items() if not c))

    def candidates(self, head: str) -> tuple[tuple[int, _Entry], ...]:
        return tuple(e for e in self.entries if e[1][1].head_ok(head))


@dataclass(frozen=True, slots=True)
class _Tables:
    wrapper: _LayerTable
    process: _LayerTable
    level: _LayerTable


def _build_tables(formats: tuple[EnvelopeFormat, ...]) -> _Tables:
    def layer(name: Layer) -> _LayerTable:
        return _LayerTable.build(tuple(f for f in formats if f.layer == name))

    return _Tables(layer("wrapper"), layer("process"), layer("level"))


_TABLES = _build_tables(FORMATS)


def _first_match(acc: _Acc, table: _LayerTable, head: str, after: int = -1) -> int:
    """Apply the first candidate (for ``head``, table order, past index ``after``) that matches
    ``acc.rest``, cutting its prefix; its index, or -1 when none matched."""
    rest = acc.rest
    cands = table.by_head.get(head)
    if cands is None:
        cands = table.candidates(head)
    for idx, (_heads, _g, match, apply, lit, lo, hi, second, plo, phi, peek) in cands:
        if idx <= after or (lit is not None and lit not in rest[lo:hi]):
            continue
        if (second is not None and not second(rest[1:2])) or (
            peek is not None and rest[plo:phi] not in peek
        ):
            continue
        m = match(rest)
        if m:
            acc.rest = rest[m.end() :]
            apply(m, acc)
            return idx
    return -1


#: an accelerator runtime's own level prefix inside a vLLM line (torch_npu's report relayed by
#: a worker's logger: `(VllmWorker rank=10 pid=5568) ERROR 07-30 10:15:05 [multiproc_executor.py:
#: 487] [ERROR] 2025-07-30-10:15:05 (PID:5568, Device:10, RankID:-1) ERR01100 OPS call acl api
#: failed`)
_NESTED_LEVELS = ("[ERROR] ", "[WARNING] ")


def _nested_runtime_level(acc: _Acc) -> None:
    """Peel torch_npu's or CANN's prefix after the outer level (whose level is kept)."""
    m = _TORCH_NPU_RE.match(acc.rest)
    apply: Yield = _y_torch_npu
    if m is None:
        m, apply = _CANN_RE.match(acc.rest), _y_cann
    if m is None:
        return
    level, ts, source = acc.level, acc.timestamp, acc.source
    acc.rest = acc.rest[m.end() :]
    apply(m, acc)
    acc.level, acc.timestamp = level, ts
    acc.source = acc.source or source


def parse_line(line_no: int, raw: bytes | str) -> LogLine:
    """Parse one raw line into its envelope (the formats of :data:`FORMATS`). Never raises."""
    text = decode_line(raw)
    if text.startswith('{"log":'):
        text = _docker_json_log(text)
    acc = _Acc(text)
    tables = _TABLES
    for _ in range(3):  # collector wrappers, possibly nested (compose around ISO timestamps)
        if _first_match(acc, tables.wrapper, acc.rest[:1]) < 0:
            break
    # Process tags: each at most once, in table order, each on what the one before left (the
    # formats skipped before a match did not match that same text).
    process, done = tables.process, -1
    while acc.rest[:1] not in process.never:
        done = _first_match(acc, process, acc.rest[:1], done)
        if done < 0:
            break
    _first_match(acc, tables.level, acc.rest.lstrip()[:1])  # one level prefix
    if acc.level is not None and acc.rest.startswith(_NESTED_LEVELS):
        _nested_runtime_level(acc)
    rest = acc.rest
    if rest.endswith("across cluster]"):
        rest = _RAY_REPEAT_RE.sub("", rest)
    # Positional: LogLine's field order (line_no, text, body, process, pid, rank, level,
    # timestamp, source_file, wrapper); keywords cost a measurable share of a parse.
    return LogLine(
        line_no,
        text,
        rest,
        acc.process,
        acc.pid,
        acc.rank,
        acc.level,
        acc.timestamp,
        acc.source,
        acc.wrapper,
    )
