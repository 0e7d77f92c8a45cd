"""Parse and normalize a ``vllm serve`` command line, flag by flag. Pure: no subprocess.

vLLM's own argument list (names, aliases, types, defaults, groups) comes from a table generated
from vLLM's parser by ``scripts/gen-vllm-args`` and shipped as ``data/vllm_args/vllm-X.Y.json``;
:class:`ArgTable` also accepts a table extracted live from an installed vLLM (same shape).

Normalization follows vLLM's ``FlexibleArgumentParser``: ``--x=1`` and ``--x 1`` are the same,
underscores in names become dashes, aliases (``-tp``) map to the canonical long name
(``tensor-parallel-size``), ``--no-X`` sets boolean ``X`` to False, ``--model M`` is the
positional model, dotted JSON keys (``--compilation-config.mode 3``) merge into one JSON value,
``-O3`` is ``--optimization-level 3``, and a repeated flag keeps its last value (append flags
accumulate). JSON values are stored as canonical JSON text (sorted keys, compact separators),
so ``'{"a": 1, "b": 2}'`` and ``'{"b":2,"a":1}'`` compare equal.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any, TypeAlias, TypeVar, overload

from kk3evidence import _resources
from kk3evidence.errors import InputError
from kk3evidence.model import FORMAT_IDS, JSONObject, JSONValue, json_list

__all__ = [
    "DEFAULT",
    "ArgTable",
    "FlagChange",
    "FlagSpec",
    "FlagValue",
    "ServeCommand",
    "flag_diff",
    "format_value",
    "is_vllm_serve",
    "load_arg_table",
    "parse_serve_argv",
    "parse_serve_command",
    "render_argv",
    "render_shell",
]

Scalar: TypeAlias = str | bool | int | float
FlagValue: TypeAlias = str | bool | int | float | tuple[str | int | float, ...] | None
_D = TypeVar("_D")

TABLE_SCHEMA = FORMAT_IDS["vllm-args"]
# vLLM's host default (None) binds every interface; a client connects through loopback.
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
DEFAULT_PORT = 8000
_API_SERVER_MODULES = frozenset(
    {"vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"}
)


class _DefaultMarker:
    """Marks a value in a :class:`FlagChange` that was not given and is vLLM's default."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _DefaultMarker()


# --------------------------------------------------------------------------------------------
# The argument table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FlagSpec:
    """One ``vllm serve`` option as vLLM's parser defines it."""

    name: str  # canonical long name without dashes, e.g. "tensor-parallel-size"
    dest: str
    aliases: tuple[str, ...]  # other option strings, e.g. ("-tp",)
    kind: str  # store | bool | store_true | store_false | append
    type: str  # int | float | str | json | human_int | bool
    nargs: str | None  # None, "?", "+", "*", "0"
    default: Any  # parser default (JSON-able) or None
    default_known: bool
    effective_default: Any = None  # what vLLM decides when argparse says None (see note)
    default_note: str | None = None
    choices: tuple[Any, ...] | None = None
    group: str = ""
    help: str = ""
    negatable: bool = False

    @property
    def takes_value(self) -> bool:
        return self.kind in ("store", "append") and self.nargs != "0"

    @property
    def is_bool(self) -> bool:
        return self.kind in ("bool", "store_true", "store_false")

    @property
    def is_list(self) -> bool:
        return self.nargs in ("+", "*") or self.kind == "append"

    def default_value(self) -> FlagValue:
        """The default normalized like a parsed value (None when unknown or absent)."""
        raw = self.default if self.default is not None else self.effective_default
        if raw is None or (not self.default_known and self.effective_default is None):
            return None
        return _normalize_default(self, raw)


@dataclass(frozen=True, slots=True)
class ArgTable:
    """vLLM's ``vllm serve`` arguments: canonical names, aliases and defaults."""

    vllm_version: str
    specs: Mapping[str, FlagSpec]
    option_map: Mapping[str, tuple[str, bool]]  # "--no-x"/"-tp"/"--x" -> (name, negated)
    tool_call_parsers: tuple[str, ...] = ()
    reasoning_parsers: tuple[str, ...] = ()
    source: str = ""

    @classmethod
    def from_json(cls, obj: Mapping[str, JSONValue], source: str = "") -> ArgTable:
        flags = obj.get("flags")
        if obj.get("schema") != TABLE_SCHEMA or not isinstance(flags, list):
            raise InputError(
                f"{source or 'vLLM argument table'}: not a {TABLE_SCHEMA} table; "
                "regenerate it with scripts/gen-vllm-args"
            )
        specs: dict[str, FlagSpec] = {}
        option_map: dict[str, tuple[str, bool]] = {}
        raw: Any  # an entry of the table; a malformed one is caught below
        for i, raw in enumerate(flags):
            try:
                spec = FlagSpec(
                    name=str(raw["name"]),
                    dest=str(raw.get("dest") or raw["name"].replace("-", "_")),
                    aliases=tuple(str(a) for a in raw.get("aliases") or ()),
                    kind=str(raw.get("kind", "store")),
                    type=str(raw.get("type", "str")),
                    nargs=None if raw.get("nargs") is None else str(raw["nargs"]),
                    default=raw.get("default"),
                    default_known=bool(raw.get("default_known", True)),
                    effective_default=raw.get("effective_default"),
                    default_note=raw.get("default_note"),
                    choices=None if raw.get("choices") is None else tuple(raw["choices"]),
                    group=str(raw.get("group", "")),
                    help=str(raw.get("help", "")),
                    negatable=bool(raw.get("negatable", False)),
                )
            except (KeyError, TypeError, AttributeError) as exc:
                raise InputError(
                    f"{source or 'vLLM argument table'}: $.flags[{i}] is malformed ({exc})"
                ) from None
            specs[spec.name] = spec
            option_map[f"--{spec.name}"] = (spec.name, False)
            for alias in spec.aliases:
                negated = alias.startswith("--no-") and spec.negatable
                option_map[alias] = (spec.name, negated)
            if spec.negatable:
                option_map[f"--no-{spec.name}"] = (spec.name, True)
        return cls(
            vllm_version=str(obj.get("vllm_version", "unknown")),
            specs=MappingProxyType(specs),
            option_map=MappingProxyType(option_map),
            tool_call_parsers=tuple(str(p) for p in json_list(obj.get("tool_call_parsers"))),
            reasoning_parsers=tuple(str(p) for p in json_list(obj.get("reasoning_parsers"))),
            source=source or str(obj.get("source", "")),
        )

    def spec(self, name: str) -> FlagSpec | None:
        return self.specs.get(name)

    def resolve(self, option: str) -> tuple[str, bool] | None:
        """Map an option string (``--x``, ``--x_y``, ``-tp``, ``--no-x``) to (name, negated).

        Unique prefixes of long options are accepted, as argparse does (``allow_abbrev``).
        """
        opt = _dash_name(option)
        hit = self.option_map.get(opt)
        if hit is not None:
            return hit
        if opt.startswith("--") and len(opt) > 3:
            matches = {v for k, v in self.option_map.items() if k.startswith(opt)}
            if len(matches) == 1:
                return matches.pop()
        return None


def _version_key(name: str) -> tuple[int, ...]:
    nums = re.findall(r"\d+", name)
    return tuple(int(n) for n in nums)


@lru_cache(maxsize=8)
def load_arg_table(version: str | None = None) -> ArgTable:
    """The shipped table for vLLM ``version`` (``"0.32"``, ``"0.32.0"``), else the newest."""
    files = [f for f in _resources.iter_files("data", ".json") if f.name.startswith("vllm-")]
    if not files:
        raise InputError("no vLLM argument table under data/vllm_args; reinstall kk3evidence")
    chosen = max(files, key=lambda f: _version_key(f.name))
    if version:
        want = ".".join(version.split(".")[:2])
        for f in files:
            if f.name == f"vllm-{want}.json":
                chosen = f
                break
    try:
        obj = json.loads(chosen.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"data/vllm_args/{chosen.name}: unreadable ({exc})") from None
    return ArgTable.from_json(obj, source=f"data/vllm_args/{chosen.name}")


# --------------------------------------------------------------------------------------------
# The parsed command
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServeCommand:
    """A ``vllm serve`` invocation, normalized flag by flag."""

    program: tuple[str, ...]
    model: str | None
    flags: Mapping[str, FlagValue]
    unknown: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    table: ArgTable | None = field(default=None, compare=False, repr=False)

    @property
    def bind_host(self) -> str | None:
        v = self.flags.get("host")
        return None if v is None else str(v)

    @property
    def host(self) -> str:
        """Where a client on this machine connects (wildcard binds -> 127.0.0.1)."""
        h = self.bind_host
        if h is None or h in _WILDCARD_HOSTS:
            return "127.0.0.1"
        return h

    @property
    def port(self) -> int:
        v = self.flags.get("port")
        try:
            return int(v) if v is not None and not isinstance(v, (bool, tuple)) else DEFAULT_PORT
        except ValueError:
            return DEFAULT_PORT

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def served_model_names(self) -> tuple[str, ...]:
        v = self.flags.get("served-model-name")
        if isinstance(v, tuple):
            return tuple(str(x) for x in v)
        if isinstance(v, str):
            return (v,)
        return (self.model,) if self.model else ()

    @property
    def served_model_name(self) -> str | None:
        """The name clients put in ``"model"``: the first served name, else the model."""
        names = self.served_model_names
        return names[0] if names else None

    @property
    def block_size(self) -> int | None:
        v = self.flags.get("block-size")
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def tensor_parallel_size(self) -> int:
        return _int_or(self.flags.get("tensor-parallel-size"), 1)

    @property
    def pipeline_parallel_size(self) -> int:
        return _int_or(self.flags.get("pipeline-parallel-size"), 1)

    @property
    def data_parallel_size(self) -> int:
        return _int_or(self.flags.get("data-parallel-size"), 1)

    @property
    def trust_remote_code(self) -> bool:
        return self.flags.get("trust-remote-code") is True

    @property
    def gpu_memory_utilization(self) -> float | None:
        v = self.flags.get("gpu-memory-utilization")
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    @overload
    def get(self, name: str) -> FlagValue: ...
    @overload
    def get(self, name: str, default: _D) -> FlagValue | _D: ...
    def get(self, name: str, default: object = None) -> object:
        """A flag's value by canonical name, alias or any spelling (``-tp``, ``--max_num_seqs``)."""
        key = self._canonical(name)
        if key == "model":
            return self.model if self.model is not None else default
        return self.flags.get(key, default)

    def has(self, name: str) -> bool:
        return self._canonical(name) in self.flags

    def _canonical(self, name: str) -> str:
        table = self.table
        opt = name if name.startswith("-") else f"--{name}"
        if table is not None:
            hit = table.resolve(opt)
            if hit is not None:
                return hit[0]
        return _dash_name(opt).lstrip("-")

    def with_defaults(self) -> dict[str, FlagValue]:
        """Every known flag: vLLM's default (where known) overridden by the given value."""
        table = self.table or load_arg_table()
        merged: dict[str, FlagValue] = {}
        for name, spec in table.specs.items():
            merged[name] = spec.default_value()
        merged.update(self.flags)
        if self.model is not None:
            merged["model"] = self.model
        return merged

    def replace(
        self,
        *,
        set_flags: Mapping[str, FlagValue] | None = None,
        drop: Iterable[str] = (),
        model: str | None = None,
    ) -> ServeCommand:
        """A copy with flags set (canonical names) and/or dropped; the order of others kept."""
        flags = dict(self.flags)
        for name in drop:
            flags.pop(self._canonical(name), None)
        for name, value in (set_flags or {}).items():
            flags[self._canonical(name)] = value
        return ServeCommand(
            program=self.program,
            model=self.model if model is None else model,
            flags=MappingProxyType(flags),
            unknown=self.unknown,
            env=self.env,
            table=self.table,
        )

    def to_json(self) -> JSONObject:
        return {
            "program": list(self.program),
            "model": self.model,
            "flags": {k: list(v) if isinstance(v, tuple) else v for k, v in self.flags.items()},
            "unknown": list(self.unknown),
            "env": dict(self.env),
            "host": self.host,
            "port": self.port,
            "served_model_name": self.served_model_name,
        }


def _int_or(v: Any, default: int) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    return default


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------

_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PY = re.compile(r"^python(\d+(\.\d+)*)?$")


def _basename(token: str) -> str:
    return token.rsplit("/", 1)[-1]


def _split_program(argv: Sequence[str]) -> tuple[dict[str, str], tuple[str, ...], int] | None:
    """Find the program part: (env assignments, program tokens, index of the first argument)."""
    env: dict[str, str] = {}
    i = 0
    n = len(argv)
    if i < n and _basename(argv[i]) == "env":
        i += 1
        while i < n and argv[i].startswith("-"):
            i += 1
    while i < n and _ENV_ASSIGN.match(argv[i]):
        k, v = argv[i].split("=", 1)
        env[k] = v
        i += 1
    start = i
    if i < n and _basename(argv[i]) == "vllm":
        if i + 1 < n and argv[i + 1] == "serve":
            return env, tuple(argv[start : i + 2]), i + 2
        return None
    if i < n and _PY.match(_basename(argv[i])):
        j = i + 1
        while j < n and argv[j].startswith("-") and argv[j] != "-m":
            j += 1
        if j + 1 < n and argv[j] == "-m":
            mod = argv[j + 1]
            if mod in _API_SERVER_MODULES:
                return env, tuple(argv[start : j + 2]), j + 2
            if (
                mod in ("vllm.entrypoints.cli.main", "vllm")
                and j + 2 < n
                and argv[j + 2] == "serve"
            ):
                return env, tuple(argv[start : j + 3]), j + 3
        return None
    return None


def is_vllm_serve(argv: Sequence[str]) -> bool:
    """True for ``vllm serve ...``, ``python -m vllm.entrypoints.openai.api_server ...`` (and
    the same behind ``env VAR=x``)."""
    return _split_program(list(argv)) is not None


def _dash_name(option: str) -> str:
    """``--max_num_seqs`` -> ``--max-num-seqs`` (only the name part before a ``.``)."""
    if not option.startswith("--"):
        return option
    body = option[2:]
    head, dot, rest = body.partition(".")
    return "--" + head.replace("_", "-") + dot + rest


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DEC = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BIN = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _human_int(text: str) -> int:
    text = text.strip()
    if text.lower() == "auto":
        return -1
    m = _HUMAN_INT.fullmatch(text)
    if m:
        number, suffix = m.groups()
        if suffix in _DEC:
            return int(float(number) * _DEC[suffix])
        return int(float(number)) * _BIN[suffix]
    return int(text)


def _convert(spec_type: str, raw: str) -> Scalar:
    """Convert one value token like vLLM would; on failure keep the text (vLLM will reject it)."""
    try:
        if spec_type == "int":
            return int(raw)
        if spec_type == "human_int":
            return _human_int(raw)
        if spec_type == "float":
            return float(raw)
        if spec_type == "json":
            return _canonical_json(json.loads(raw))
    except (ValueError, TypeError):
        return raw
    return raw


def _normalize_default(spec: FlagSpec, raw: Any) -> FlagValue:
    if spec.is_bool:
        return bool(raw)
    if spec.type == "json":
        return _canonical_json(raw)
    if isinstance(raw, list):
        if spec.is_list:
            return tuple(x if isinstance(x, (str, int, float)) else str(x) for x in raw)
        return _canonical_json(raw)
    if isinstance(raw, dict):
        return _canonical_json(raw)
    if isinstance(raw, (str, int, float, bool)):
        return raw
    return str(raw)


def _looks_like_option(token: str) -> bool:
    if not token.startswith("-") or token == "-":
        return False
    # Negative numbers are values, as in argparse.
    return not re.fullmatch(r"-\d+(\.\d+)?([eE][-+]?\d+)?", token)


def _split_command_text(text: str) -> list[str]:
    # Backslash-newline continuations as in shell scripts.
    return shlex.split(text.replace("\\\n", " "), comments=True)


def parse_serve_command(text: str, table: ArgTable | None = None) -> ServeCommand:
    """Parse a shell command line (as in ``command.txt``) with :func:`parse_serve_argv`."""
    try:
        argv = _split_command_text(text)
    except ValueError as exc:
        raise InputError(f"cannot split the command line ({exc}); check its quoting") from None
    return parse_serve_argv(argv, table)


def parse_serve_argv(argv: Sequence[str], table: ArgTable | None = None) -> ServeCommand:
    """Normalize a ``vllm serve`` argv into a :class:`ServeCommand`.

    Raises :class:`InputError` when ``argv`` is not a vLLM serve command. Tokens that cannot be
    interpreted with the table (unknown options, extra positionals) are kept, raw, in
    ``unknown``; unknown options are also kept in ``flags`` under their dashed name with the
    value that follows them (or True) so that diffs still see them.
    """
    argv = [str(a) for a in argv]
    found = _split_program(argv)
    if found is None:
        shown = " ".join(argv[:3]) or "(empty)"
        raise InputError(
            f"not a vLLM serve command: {shown!s}; expected 'vllm serve MODEL ...' or "
            "'python -m vllm.entrypoints.openai.api_server --model MODEL ...'"
        )
    env, program, start = found
    parser = _ArgvParser(argv, table or load_arg_table())
    parser.run(start)
    return ServeCommand(
        program=program,
        model=parser.model,
        flags=MappingProxyType(parser.merged_flags()),
        unknown=tuple(parser.unknown),
        env=MappingProxyType(env),
        table=parser.table,
    )


class _ArgvParser:
    """One pass over the tokens after the program, the way vLLM's argparse reads them."""

    def __init__(self, argv: list[str], table: ArgTable) -> None:
        self.argv = argv
        self.table = table
        self.flags: dict[str, FlagValue] = {}
        self.unknown: list[str] = []
        self.model: str | None = None
        self.dotted: dict[str, dict[str, Any]] = {}
        self.i = 0

    def run(self, start: int) -> None:
        self.i = start
        argv, n = self.argv, len(self.argv)
        while self.i < n:
            tok = argv[self.i]
            self.i += 1
            if tok == "--":
                self.unknown.extend(argv[self.i :])
                return
            if not _looks_like_option(tok):
                if self.model is None:
                    self.model = tok
                else:
                    self.unknown.append(tok)
            elif not self._optimization_level(tok):
                self._option(tok)

    def _next(self) -> str | None:
        """The next token as a value (consumed), or None at the end."""
        if self.i < len(self.argv):
            self.i += 1
            return self.argv[self.i - 1]
        return None

    def _take_values(self, nargs: str | None) -> list[str]:
        argv, n = self.argv, len(self.argv)
        vals: list[str] = []
        if nargs in ("+", "*"):
            while self.i < n and not _looks_like_option(argv[self.i]):
                vals.append(argv[self.i])
                self.i += 1
            return vals
        if nargs == "?":
            if self.i < n and not _looks_like_option(argv[self.i]):
                return [self._next() or ""]
            return []
        value = self._next()
        return [] if value is None else [value]

    def _optimization_level(self, tok: str) -> bool:
        """-O3 / -O=3 / -O 3 -> --optimization-level; True when the token was one."""
        if not tok.startswith("-O") or tok.startswith("--"):
            return False
        if tok == "-O" and self.i < len(self.argv) and self.argv[self.i] in {"0", "1", "2", "3"}:
            self.flags["optimization-level"] = self.argv[self.i]
            self.i += 1
            return True
        if tok != "-O":
            self.flags["optimization-level"] = tok[3:] if tok[2:3] == "=" else tok[2:]
            return True
        return False

    def _option(self, tok: str) -> None:
        opt, eq, inline = tok.partition("=")
        opt = _dash_name(opt)
        if opt.startswith("--") and "." in opt:
            self._dotted(tok, opt, inline if eq else None)
        elif opt in {"--model", "--model-tag"}:
            model = inline if eq else self._next()
            if model is not None:
                self.model = model
        elif (hit := self.table.resolve(opt)) is None:
            self._unknown_option(tok, opt, inline if eq else None)
        else:
            self._known_option(tok, hit, inline if eq else None)

    def _dotted(self, tok: str, opt: str, inline: str | None) -> None:
        """Dotted JSON keys: --compilation-config.mode 3, --x.list+ a,b."""
        value_str = inline if inline is not None else self._next()
        if value_str is None:
            self.unknown.append(tok)
            return
        path = opt[2:]
        append = path.endswith("+")
        if append:
            path = path[:-1]
        key, *keys = path.split(".")
        hit = self.table.resolve(f"--{key}")
        canon = hit[0] if hit else key
        value: Any = value_str.split(",") if append else _json_or_scalar(value_str)
        _merge_nested(self.dotted.setdefault(canon, {}), keys, value, append)

    def _unknown_option(self, tok: str, opt: str, inline: str | None) -> None:
        self.unknown.append(tok)
        name = opt.lstrip("-")
        if inline is not None:
            self.flags[name] = inline
        elif (
            self.i < len(self.argv)
            and not _looks_like_option(self.argv[self.i])
            and self.model is not None
        ):
            self.unknown.append(self.argv[self.i])
            self.flags[name] = self.argv[self.i]
            self.i += 1
        else:
            self.flags[name] = True

    def _known_option(self, tok: str, hit: tuple[str, bool], inline: str | None) -> None:
        name, negated = hit
        spec = self.table.specs[name]
        if spec.is_bool:
            if inline is not None:
                self.unknown.append(tok)  # argparse rejects a value on a boolean switch
            else:
                self.flags[name] = negated if spec.kind == "store_false" else not negated
            return
        raw_vals = [inline] if inline is not None else self._take_values(spec.nargs)
        if not raw_vals and spec.nargs not in ("?", "*"):
            self.unknown.append(tok)
            return
        converted = [_convert(spec.type, v) for v in raw_vals]
        if spec.kind == "append":
            prev = self.flags.get(name)
            prev_t = prev if isinstance(prev, tuple) else ()
            self.flags[name] = (*prev_t, *converted)
        elif spec.is_list:
            self.flags[name] = tuple(converted)
        elif not converted:
            self.flags[name] = True  # nargs="?" without a value: argparse stores const
        else:
            self.flags[name] = converted[0]

    def merged_flags(self) -> dict[str, FlagValue]:
        """``flags`` with the dotted keys merged into their JSON options."""
        flags = dict(self.flags)
        for name, obj in self.dotted.items():
            base = flags.get(name)
            merged: dict[str, Any] = {}
            if isinstance(base, str):
                try:
                    loaded = json.loads(base)
                    if isinstance(loaded, dict):
                        merged = loaded
                except ValueError:
                    pass
            _deep_update(merged, obj)
            flags[name] = _canonical_json(merged)
        return flags


def _json_or_scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        try:
            return _human_int(text)
        except ValueError:
            return text


def _merge_nested(target: dict[str, Any], keys: list[str], value: Any, append: bool) -> None:
    node = target
    for k in keys[:-1]:
        nxt = node.get(k)
        if not isinstance(nxt, dict):
            nxt = {}
            node[k] = nxt
        node = nxt
    last = keys[-1] if keys else ""
    if append and isinstance(node.get(last), list):
        node[last] = [*node[last], *value]
    else:
        node[last] = value


def _deep_update(base: dict[str, Any], upd: Mapping[str, Any]) -> None:
    for k, v in upd.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def _render_value(v: str | int | float | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return repr(v)
    return str(v)


def render_argv(cmd: ServeCommand, *, program: Sequence[str] | None = None) -> list[str]:
    """The canonical argv: program, model (positional for ``vllm serve``), then the flags in
    their given order, each as ``--name value`` (booleans as ``--x`` / ``--no-x``).

    Parsing the result gives back an equal :class:`ServeCommand` (unknown tokens excepted).
    """
    prog = list(program if program is not None else cmd.program)
    out = list(prog)
    positional_model = bool(prog) and prog[-1] == "serve"
    table = cmd.table
    if cmd.model is not None:
        out += [cmd.model] if positional_model else ["--model", cmd.model]
    for name, value in cmd.flags.items():
        spec = table.specs.get(name) if table is not None else None
        if spec is not None and spec.is_bool:
            truthy = bool(value)
            if spec.kind == "store_false":
                truthy = not truthy
            if truthy:
                out.append(f"--{name}")
            elif spec.negatable:
                out.append(f"--no-{name}")
            continue
        if value is True and (spec is None or spec.nargs in ("?", "*")):
            out.append(f"--{name}")  # given without a value
            continue
        if value is None:
            continue
        if isinstance(value, tuple):
            if spec is not None and spec.kind == "append":
                for v in value:
                    out += [f"--{name}", _render_value(v)]
            else:
                out += [f"--{name}", *(_render_value(v) for v in value)]
            continue
        if isinstance(value, str) and value.startswith("-"):
            out.append(f"--{name}={value}")
            continue
        out += [f"--{name}", _render_value(value)]
    return out


def render_shell(cmd: ServeCommand | Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """One shell-quoted line (with ``VAR=value`` prefixes for ``env``)."""
    argv = render_argv(cmd) if isinstance(cmd, ServeCommand) else list(cmd)
    env_items = dict(cmd.env) if isinstance(cmd, ServeCommand) else {}
    env_items.update(env or {})
    prefix = [f"{k}={shlex.quote(v)}" for k, v in env_items.items()]
    return " ".join([*prefix, *(shlex.quote(a) for a in argv)])


# --------------------------------------------------------------------------------------------
# Diff
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FlagChange:
    """One flag whose effective value differs between two commands.

    ``a``/``b`` are the given values; when a side did not give the flag it holds vLLM's default
    (or None when vLLM decides at start-up) and ``a_default``/``b_default`` is True.
    """

    name: str
    a: FlagValue
    b: FlagValue
    a_default: bool = False
    b_default: bool = False
    group: str = ""
    note: str | None = None

    @property
    def a_value(self) -> FlagValue:
        return self.a

    @property
    def b_value(self) -> FlagValue:
        return self.b

    def describe(self) -> str:
        return f"{self.name}: {_show(self.a, self.a_default)} -> {_show(self.b, self.b_default)}"

    def to_json(self) -> JSONObject:
        return {
            "name": self.name,
            "a": list(self.a) if isinstance(self.a, tuple) else self.a,
            "b": list(self.b) if isinstance(self.b, tuple) else self.b,
            "a_default": self.a_default,
            "b_default": self.b_default,
            "group": self.group,
            "note": self.note,
        }


def _show(v: FlagValue, is_default: bool) -> str:
    if is_default:
        return "(default)" if v is None else f"{_fmt(v)} (default)"
    return _fmt(v)


def _fmt(v: FlagValue) -> str:
    if isinstance(v, tuple):
        return " ".join(str(x) for x in v) if v else "[]"
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


def format_value(v: FlagValue) -> str:
    """A flag value for people: booleans as on/off, lists space-separated, [] when empty."""
    return _fmt(v)


def _same(a: FlagValue, b: FlagValue) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (a is None and b is None)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, (str, int, float)) and isinstance(b, (str, int, float)):
        # "-O 2" is stored as text, its default as a number.
        return str(a) == str(b)
    return a == b


def flag_diff(a: ServeCommand, b: ServeCommand) -> list[FlagChange]:
    """Flags (and the model) whose effective values differ, defaults applied: a flag given with
    vLLM's default value equals an absent one. Sorted by name, ``model`` first."""
    table = a.table or b.table or load_arg_table()
    changes: list[FlagChange] = []
    if a.model != b.model:
        changes.append(FlagChange("model", a.model, b.model, group="ModelConfig"))
    names = list(dict.fromkeys([*a.flags, *b.flags]))
    for name in sorted(names):
        spec = table.specs.get(name)
        default = spec.default_value() if spec is not None else None
        a_def = name not in a.flags
        b_def = name not in b.flags
        va = default if a_def else a.flags[name]
        vb = default if b_def else b.flags[name]
        if _same(va, vb):
            continue
        changes.append(
            FlagChange(
                name,
                va,
                vb,
                a_default=a_def,
                b_default=b_def,
                group=spec.group if spec is not None else "",
                note=spec.default_note if spec is not None and (a_def or b_def) else None,
            )
        )
    return changes
