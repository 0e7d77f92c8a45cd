"""The two grammar layers: the line envelope and the rule-pattern mini-language.

**Envelope.** Every log line is parsed once into a :class:`LogLine` by :func:`parse_line`
(defined in :mod:`kk3evidence.analysis.envelope`, a table of envelope formats, and re-exported
here): wrappers, process tags, level/timestamp/source prefixes are peeled off; rules only ever
see the remaining ``body``.

**Tracebacks.** :class:`TracebackTracker` follows multi-line Python tracebacks per process and
labels each line's role (header, frame, exception, detail, chain separator) and the chain it
belongs to, so a chained exception ("The above exception was the direct cause…", "During
handling of the above exception…") can be told apart from its cause.

**Pattern mini-language.** :func:`compile_pattern` turns a rule pattern such as
``"NCCL error{*}unhandled system error"`` or ``"Available KV cache memory: {size:kv}"`` into a
pyparsing expression built from the shared named :data:`BLOCKS` (defined once, here).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pyparsing as pp

from kk3evidence.analysis.envelope import LEVELS, LogLine, decode_line, normalize_level, parse_line
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
    # Python's base class itself counts (`Exception: Capture cuda graph failed: …`); a bare
    # `Error: …` does not (CLIs and wrappers print it for messages of every level).
    # a dotted exception class whose name has no Error/Exception suffix, as the last line of a
    # traceback prints it (`anyio.WouldBlock`, `trio.Cancelled`): only with scope "exception"
    "pyclass": r"(?:[a-z_][A-Za-z0-9_]*\.)+[A-Z][A-Za-z0-9_]*(?=$|: )",
    "pyerr": (
        r"(?:[A-Za-z_][A-Za-z0-9_]*\.)*"
        r"(?:[A-Za-z_][A-Za-z0-9_]*(?:Error|Exception|Failure|Fault)|Exception)(?![A-Za-z0-9_])"
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


def _flatten(v: object) -> list[object]:
    if isinstance(v, list | tuple):
        res: list[object] = []
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
# Traceback tracking
# --------------------------------------------------------------------------------------------

TB_HEADER = "Traceback (most recent call last):"
#: what every traceback header holds (Python's, rich's and IPython's)
TB_MARK = "Traceback (most recent call last)"
# rich's (and typer's) boxed traceback: `╭──── Traceback (most recent call last) ────╮`, frames in
# `│ … │` rows, `╰───╯`, then the exception line outside the box.
RICH_TB_HEADER = "Traceback (most recent call last) ─"
_RICH_BOX = ("│", "╰")
TB_DIRECT_CAUSE = "The above exception was the direct cause of the following exception:"
TB_DURING_HANDLING = "During handling of the above exception, another exception occurred:"


def is_tb_header(stripped: str) -> bool:
    """A traceback's header: Python's own, rich's boxed one, or IPython's."""
    return (
        stripped.endswith(TB_HEADER)
        or (stripped.startswith("╭") and RICH_TB_HEADER in stripped)
        or (stripped.endswith(TB_MARK) and _IPY_HEADER_RE.match(stripped) is not None)
    )


# IPython / Jupyter tracebacks (vLLM's offline `LLM(...)` run in a notebook): a header that names
# the exception class (`RayActorError      Traceback (most recent call last)`, no colon), frames
# as `File /path/x.py:89, in LLM.__init__(self, …)` (JupyterLab renders the path as a link:
# `File [/path/x.py:195](…), in …`), the cell as `Cell In[3], line 1` (IPython 8.0-8.3:
# `Input In [3], in <cell line: 1>()`; IPython 7: `<ipython-input-3-…> in <module>`; Databricks:
# `File <command-2469377940857761>, line 10`), numbered
# source lines with the current one marked `--> 195` at column 0, the exception line last.
_IPY_HEADER_RE = re.compile(r"^[A-Za-z_][\w.]*\s+Traceback \(most recent call last\)$")
_IPY_FRAME_RE = re.compile(
    r"^(?:File \[?(?:/|~|\.|[A-Za-z]:[\\/]).*?:\d+(?:\]\([^)\s]*\))?, in \S"
    r"|File <command-\d+>, line \d+"  # Databricks' notebook cell: `File <command-246…>, line 10`
    r"|Cell In ?\[\d+\], line \d+"
    r"|Input In ?\[\d+\], in \S"
    r"|<ipython-input-[\w-]+> in \S)"
)
_IPY_FRAME_HEADS = frozenset("FCI<")
_IPY_SOURCE_RE = re.compile(r"^-+> ?\s*\d+\b")
#: literal marks of a frame line at column 0 in IPython's format (the engine looks for them
#: where no anchor makes it look at a line: an excerpt that begins in an IPython traceback)
IPY_FRAME_MARKS = (
    "File /",
    "File [",
    "File ~",
    "File <command-",
    "Cell In[",
    "Input In [",
    "<ipython-input-",
)
# A paste's elision marker inside the frames ("...", "[ ...... ]", "<snip>", "[truncated]"):
# frames may follow it, and it is no exception line.
_ELISION_RE = re.compile(
    r"^\s*[\[(<]?\s*(?:(?:\.\s*){2,}|…+|snip(?:ped)?|truncated|omitted|elided)\s*[\])>]?\s*$",
    re.I,
)


_FRAME_RE = re.compile(r"^\s+File \"[^\"]*\", line \d+")
# Inside an open traceback a frame line may have lost its indentation (a re-indented paste).
_ANY_FRAME_RE = re.compile(r"^[ \t]*File \"[^\"]*\", line [0-9]+")
# ... and such a paste may start with one: a whole frame line at column 0 (function name
# included) opens a headerless traceback too (blind sets 10 and 11 had two such excerpts).
_BARE_FRAME_RE = re.compile(r"^File \"[^\"]*\", line [0-9]+, in [^\s]")
# An exception line as a paste may re-indent it: a dotted class name whose last part is
# capitalised, alone or followed by ": " (source lines are lowercase or carry code after it).
INDENTED_EXC_RE = re.compile(r"^[ \t]+(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?::(?:[ \t]|$)|$)")
# ... and when the frames are at column 0 (a paste that lost all indentation), the line after a
# frame is its source line unless it is shaped like an exception line (`Name: …`, `Name`,
# `pkg.Name(Cause): …`, `_Private`), or a dotted lowercase one with its message
# (`socket.gaierror: [Errno -2] …`); a line of carets under it marks the failing expression.
_BARE_EXC_RE = re.compile(
    r"^(?:(?:[A-Za-z_]\w*\.)*_*[A-Z]\w*(?:\([\w.]+\))?(?::(?:[ \t]|$)|$)"
    r"|(?:[A-Za-z_]\w*\.)+[a-z_]\w*:[ \t])"
)
# a level word starting a line the envelope did not peel (`INFO ready`): a log record
_LEVEL_WORDS = (*(f"{lv} " for lv in LEVELS), "WARN ", "FATAL ")
_STATEMENTS = ("raise ", "return ", "await ", "yield ", "assert ")
_CARETS_RE = re.compile(r"^[ \t]*[~^]+[ \t~^]*$")
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
    # Indentation of the latest `File "..."` line: an exception-shaped line indented no deeper
    # ends the frames even when a paste indented it (source lines sit deeper than frames).
    frame_indent: int | None = None
    # Column-0 frames: 2 right after a frame line (its source line may follow), 1 after that
    # source line (a caret line may follow), else 0.
    bare_source: int = 0
    header: LogLine | None = None  # the chain's first header line, as labelled (cut_tracebacks)
    # The traceback began without a header in the log (an excerpt starting inside its frames):
    # ``header`` is then its earliest line (the first frame, or source lines just above it).
    headerless: bool = False


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
    # No open traceback can go stale before this line: _expire looks at them only after it
    # (every change of a state sets last_seen to the current line or later).
    _check_at: int = 0

    @property
    def busy(self) -> bool:
        return bool(self._open)

    def _expire(self, line_no: int) -> None:
        if not self._open or line_no <= self._check_at:
            return
        stale = []
        soonest = None
        for k, st in self._open.items():
            due = st.last_seen + (_STALE_LINES if st.phase == "frames" else _LINGER_GLOBAL)
            if line_no > due:
                stale.append(k)
            elif soonest is None or due < soonest:
                soonest = due
        for k in stale:
            del self._open[k]
        self._check_at = line_no if soonest is None else soonest

    def feed(self, line: LogLine) -> LogLine:
        out = self._feed(line)
        if out.tb_role in ("header", "lead") and out.tb_index == 0:
            self._open[line.key].header = out
        # Whatever state the line touched now lasts at least _LINGER_GLOBAL more lines.
        self._check_at = min(self._check_at, line.line_no + min(_LINGER_GLOBAL, _STALE_LINES))
        return out

    def _feed(self, line: LogLine) -> LogLine:
        self._expire(line.line_no)
        key = line.key
        body = line.body
        stripped = body.strip()
        st = self._open.get(key)

        if is_tb_header(stripped):
            if st is not None and st.phase == "await_tb":
                st.index += 1
                st.phase = "frames"
                st.frame_indent = None  # the chained traceback sets its own
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
            role = "lead"
            if stripped == TB_HEADER or stripped.startswith("╭") or stripped.endswith(TB_MARK):
                role = "header"
            return _with_tb(line, role, st.chain, st.index)

        if (st is None or st.phase != "frames") and _opens_frames(body):
            return self._frame_without_header(st, line)
        if st is None:
            return line
        st.last_seen = line.line_no

        if st.phase == "frames":
            if stripped.startswith(_RICH_BOX):  # a row or the bottom of rich's box
                return _with_tb(line, "frame", st.chain, st.index)
            if _ANY_FRAME_RE.match(body):
                st.frame_indent = indent_of(body)
                st.bare_source = 2 if st.frame_indent == 0 else 0
                return _with_tb(line, "frame", st.chain, st.index)
            if st.bare_source and _bare_source_line(st, line):
                return _with_tb(line, "frame", st.chain, st.index)
            if (not body or body[0] in " \t") and not ends_frames(st, body):
                return _with_tb(line, "frame", st.chain, st.index)
            if _ipython_frame_line(body) or _ELISION_RE.match(body):
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

    def _frame_without_header(self, st: TracebackState | None, line: LogLine) -> LogLine:
        """A frame line while no traceback of its process reads frames (an excerpt that begins
        inside one, or a header we did not see): track it, opening a headerless traceback
        unless a chained one awaits its frames."""
        if st is None or st.phase == "after_exc":
            chain = self._next_chain
            self._next_chain += 1
            st = TracebackState(
                chain=chain, index=0, phase="frames", last_seen=line.line_no, headerless=True
            )
            self._open[line.key] = st
            self.chain_links[chain] = [None]
        st.phase = "frames"
        st.last_seen = line.line_no
        st.frame_indent = indent_of(line.body)
        st.bare_source = 2 if st.frame_indent == 0 else 0
        out = _with_tb(line, "frame", st.chain, st.index)
        if st.headerless and st.header is None:
            st.header = out  # its first frame, until source lines above it are found
        return out

    def headerless_start(self, line: LogLine) -> bool:
        """``line`` is the first frame of a traceback whose header the log does not show."""
        st = self._open.get(line.key)
        return st is not None and st.headerless and st.header is line

    def start_earlier(self, line: LogLine) -> None:
        """The headerless traceback of ``line.key`` begins at ``line`` (source lines the
        excerpt kept above its first frame)."""
        st = self._open.get(line.key)
        if st is not None and st.headerless:
            st.header = _with_tb(line, "frame", st.chain, 0)

    def cut_tracebacks(self, last_line: int) -> list[LogLine]:
        """Header lines of tracebacks the log ends in: still reading frames at ``last_line``
        (within two lines), their exception line never came (a cut log or excerpt). For a
        traceback the excerpt began inside, its earliest line stands for the header."""
        return [
            st.header
            for st in self._open.values()
            if st.header is not None and st.phase == "frames" and st.last_seen >= last_line - 2
        ]

    def frames_open(self, key: str | None) -> TracebackState | None:
        """The open traceback of ``key`` while it is reading frames (else ``None``): every
        following indented line of that process is a frame line (the engine's fast path)."""
        st = self._open.get(key)
        return st if st is not None and st.phase == "frames" else None

    def tick(self, line_no: int) -> None:
        """Tell the tracker that lines up to ``line_no`` passed without being fed."""
        self._expire(line_no)


def _opens_frames(body: str) -> bool:
    """A frame line that may begin a traceback whose header the log does not show."""
    return (
        _FRAME_RE.match(body) is not None
        or _BARE_FRAME_RE.match(body) is not None
        or (body[:1] in _IPY_FRAME_HEADS and _IPY_FRAME_RE.match(body) is not None)
    )


def is_interleaved_frames(body: str) -> bool:
    """Frame text of several stack dumps written at once into one stream (faulthandler dumps
    of many crashing processes, or tracebacks escaped into one line), mixed within a line: two
    or more ``File `` and ``, line`` pieces in a line that is not itself a frame line."""
    if body.count("File ") < 2 or body.count(", line") < 2:
        return False
    return not body.lstrip().startswith('File "')


def is_filler(text: str) -> bool:
    """A blank line or a paste's elision marker: says nothing of its own."""
    return not text.strip() or _ELISION_RE.match(text) is not None


def _ipython_frame_line(body: str) -> bool:
    """An IPython frame or marked source line (``--> 195 …``) at column 0."""
    head = body[:1]
    if head == "-":
        return _IPY_SOURCE_RE.match(body) is not None
    return head in _IPY_FRAME_HEADS and _IPY_FRAME_RE.match(body) is not None


def _bare_source_line(st: TracebackState, line: LogLine) -> bool:
    """Whether ``line``, right after a column-0 frame, is its source or caret line."""
    body = line.body
    if body[:1] in ("", " ", "\t") or line.level is not None or body.startswith(_LEVEL_WORDS):
        # an indented line (the usual frame rules decide) or a log record
        st.bare_source = 0
        return False
    if st.bare_source == 2 and _BARE_EXC_RE.match(body) is None:
        st.bare_source = 1
        return True
    if body.startswith(_STATEMENTS):  # a source line still (a frame glued to the one above)
        return True
    st.bare_source = 0
    return _CARETS_RE.match(body) is not None


def indent_of(body: str) -> int:
    """Leading spaces and tabs of ``body``."""
    return len(body) - len(body.lstrip(" \t"))


def ends_frames(st: TracebackState, body: str) -> bool:
    """Whether the indented ``body`` is the exception line that ends ``st``'s frames: shaped
    like one and indented no deeper than the latest frame line (one blank deeper under
    flush-left frames: a paste that lost the indentation of its frames but put a blank before
    every later line)."""
    fi = st.frame_indent
    if fi is None:
        return False
    return indent_of(body) <= (fi or 1) and INDENTED_EXC_RE.match(body) is not None


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
