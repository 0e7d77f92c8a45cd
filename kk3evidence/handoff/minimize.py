"""``minimize``: the minimal start command and a ladder plan that restores one variable a step.

The guide (seed: 최소 시작 명령 / 단일 요청 기준선 / 기능 변수의 단계적 복구): strip agent
wrappers, tool-call parsers, stress scripts and long-input generators; keep only what starts the
engine; send one fixed request; then restore features one at a time — prefix caching, longer
input, larger output cap, concurrency, multi-node, tool calls — keeping both logs each round and
going back to the last stable baseline when the failure changes.

Every flag of the given command is classified (``data/flag-classes.toml``) as ``needed`` /
``feature`` / ``load`` / ``multi-node`` / ``observability`` / ``business-wrapper`` using vLLM's own
argument list (the shipped table, or one extracted live from the installed vLLM with
:func:`installed_arg_table`). :func:`build_plan` turns the result into a ladder plan: step 0 is
the minimal command with the guide's fixed request; each later step changes exactly one variable
(a flag group or one property of the request) and carries the full command and its request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from kk3evidence import _resources
from kk3evidence._version import __version__
from kk3evidence.bundle.schema import load_toml
from kk3evidence.errors import InputError
from kk3evidence.handoff import prompts
from kk3evidence.model import FORMAT_IDS, JSONObject
from kk3evidence.vllm_args import (
    ArgTable,
    FlagValue,
    ServeCommand,
    flag_diff,
    load_arg_table,
    parse_serve_argv,
    render_argv,
    render_shell,
)

__all__ = [
    "FIXED_PROMPT",
    "FLAG_CLASSES",
    "PLAN_SCHEMA",
    "ClassifiedFlag",
    "Minimized",
    "PlanOptions",
    "PlanStep",
    "RequestSpec",
    "build_plan",
    "classify_flags",
    "load_flag_classes",
    "minimize",
    "plan_to_toml",
]

PLAN_SCHEMA = FORMAT_IDS["ladder-plan"]
FLAG_CLASSES: tuple[str, ...] = (
    "needed",
    "feature",
    "load",
    "multi-node",
    "observability",
    "business-wrapper",
    "unknown",
)
#: SPEC §5: the guide's own fixed request text
FIXED_PROMPT = "고정된 짧은 테스트 문장에 답하세요."
FIXED_MAX_TOKENS = 128
#: flags whose value is a secret: written to the plan as an environment reference
_SECRET_FLAGS = {"api-key": "VLLM_API_KEY", "hf-token": "HF_TOKEN"}


# --------------------------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FlagRule:
    cls: str
    why: str
    step: str | None = None


@dataclass(frozen=True, slots=True)
class FlagClasses:
    flags: Mapping[str, FlagRule]
    groups: Mapping[str, FlagRule]

    def rule_for(self, name: str, group: str | None) -> FlagRule:
        if name in self.flags:
            return self.flags[name]
        if group is not None and group in self.groups:
            return self.groups[group]
        return FlagRule("feature", "a vLLM option not needed to start the engine")


def load_flag_classes(text: str | None = None) -> FlagClasses:
    """The shipped ``data/flag-classes.toml`` (or ``text``), validated."""
    source = "data/flag-classes.toml"
    if text is None:
        text = _resources.read_text("data", "flag-classes.toml")
    doc: dict[str, Any] = load_toml(text, source, error=InputError)

    def rules(key: str) -> dict[str, FlagRule]:
        out: dict[str, FlagRule] = {}
        for name, raw in (doc.get(key) or {}).items():
            cls = raw.get("class") if isinstance(raw, dict) else None
            if cls not in FLAG_CLASSES:
                raise InputError(
                    f"{source}: {key}.{name}: class must be one of {', '.join(FLAG_CLASSES)}"
                )
            out[name] = FlagRule(str(cls), str(raw.get("why", "")), raw.get("step"))
        return out

    return FlagClasses(flags=rules("flag"), groups=rules("group"))


@dataclass(frozen=True, slots=True)
class ClassifiedFlag:
    """One flag of the source command, its class, why, and the ladder variable that restores it."""

    name: str
    value: FlagValue
    cls: str
    why: str
    variable: str  # ladder step variable (flags with the same variable are restored together)
    group: str = ""

    def to_json(self) -> JSONObject:
        return {
            "flag": self.name,
            "value": list(self.value) if isinstance(self.value, tuple) else self.value,
            "class": self.cls,
            "why": self.why,
            "variable": self.variable,
            "group": self.group,
        }


def classify_flags(
    cmd: ServeCommand, table: ArgTable, classes: FlagClasses | None = None
) -> list[ClassifiedFlag]:
    """Classify every flag of ``cmd`` (in its order)."""
    classes = classes or load_flag_classes()
    out: list[ClassifiedFlag] = []
    for name, value in cmd.flags.items():
        spec = table.spec(name)
        if spec is None:
            out.append(
                ClassifiedFlag(
                    name,
                    value,
                    "unknown",
                    f"not an option of vLLM {table.vllm_version}: vLLM would refuse to start "
                    "with it; it is left out (if your vLLM accepts it, rerun with "
                    "--from-installed)",
                    name,
                )
            )
            continue
        rule = classes.rule_for(name, spec.group)
        why = rule.why
        if name in ("tensor-parallel-size", "pipeline-parallel-size") and _as_int(value) > 1:
            why += "; kept at the production value"
        out.append(ClassifiedFlag(name, value, rule.cls, why, rule.step or name, spec.group))
    return out


def _as_int(v: FlagValue) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


# --------------------------------------------------------------------------------------------
# Minimize
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Minimized:
    source: ServeCommand
    minimal: ServeCommand
    kept: tuple[ClassifiedFlag, ...]
    removed: tuple[ClassifiedFlag, ...]
    table_source: str

    @property
    def minimal_argv(self) -> list[str]:
        return render_argv(self.minimal)

    def to_json(self) -> dict[str, object]:
        return {
            "source_argv": render_argv(self.source),
            "minimal_argv": self.minimal_argv,
            "kept": [k.to_json() for k in self.kept],
            "removed": [r.to_json() for r in self.removed],
            "unknown_tokens": list(self.source.unknown),
            "vllm_args_table": self.table_source,
        }


def minimize(
    argv: Sequence[str], *, table: ArgTable | None = None, classes: FlagClasses | None = None
) -> Minimized:
    """Keep the model and the ``needed`` flags; list every removed flag with its class and why."""
    table = table or load_arg_table()
    cmd = parse_serve_argv(argv, table)
    if cmd.model is None:
        raise InputError(
            "the command names no model; give it as 'vllm serve MODEL ...' (a --config file "
            "is not expanded: put its options on the command line)"
        )
    classified = classify_flags(cmd, table, classes)
    kept = tuple(c for c in classified if c.cls == "needed")
    removed = tuple(c for c in classified if c.cls != "needed")
    minimal = cmd.replace(drop=[c.name for c in removed])
    spec = table.spec(PREFIX_FLAG)
    if spec is not None and spec.negatable:
        # vLLM's V1 engine turns prefix caching on by default: a baseline without the cache
        # must say so, or its "without cache" requests run with the cache on.
        minimal = minimal.replace(set_flags={PREFIX_FLAG: False})
    minimal = ServeCommand(
        program=minimal.program,
        model=minimal.model,
        flags=minimal.flags,
        unknown=(),
        env=minimal.env,
        table=table,
    )
    return Minimized(cmd, minimal, kept, removed, table.source or "shipped table")


# --------------------------------------------------------------------------------------------
# The ladder plan
# --------------------------------------------------------------------------------------------


class RequestJSON(TypedDict):
    """``RequestSpec.to_json()``: a ladder step's request (schemas/ladder-plan.schema.json)."""

    prompt: str
    input_tokens: int
    max_tokens: int
    temperature: float
    concurrency: int
    repeat: int
    tools: bool
    model: NotRequired[str]


#: ``PlanStep.to_json()`` ("from" is a Python keyword: the functional form)
StepJSON = TypedDict("StepJSON", {
    "id": int, "variable": str, "kind": str, "from": str, "to": str, "why": str,
    "argv": list[str], "env": NotRequired[dict[str, str]], "request": RequestJSON,
})


class PlanHeaderJSON(TypedDict):
    created: str
    tool: str
    vllm_args_table: str
    source_command: str
    minimal_command: str
    request: RequestJSON
    env_required: NotRequired[list[str]]


class LadderPlanJSON(TypedDict):
    """``build_plan()``: the ladder plan document."""

    schema: str
    plan: PlanHeaderJSON
    removed: list[JSONObject]
    step: list[StepJSON]



@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What a step sends once the server is ready.

    ``input_tokens`` > 0 replaces the fixed prompt by a deterministic prompt of about that many
    tokens (one common English word each); ``repeat`` sends it again sequentially (the same
    prompt: a prefix-cache probe); ``concurrency`` sends that many at once; ``tools`` attaches a
    small function-tool definition with ``tool_choice: "auto"``.
    """

    prompt: str = FIXED_PROMPT
    input_tokens: int = 0
    max_tokens: int = FIXED_MAX_TOKENS
    temperature: float = 0.0
    concurrency: int = 1
    repeat: int = 1
    tools: bool = False
    model: str | None = None  # None: the served name from /v1/models

    def describe(self) -> str:
        parts = [
            f"input {'~' + str(self.input_tokens) + ' tokens' if self.input_tokens else 'fixed'}",
            f"max_tokens {self.max_tokens}",
        ]
        if self.concurrency > 1:
            parts.append(f"concurrency {self.concurrency}")
        if self.repeat > 1:
            parts.append(f"sent {self.repeat}x")
        if self.tools:
            parts.append("with tools")
        return ", ".join(parts)

    def to_json(self) -> RequestJSON:
        out: RequestJSON = {
            "prompt": self.prompt,
            "input_tokens": self.input_tokens,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "concurrency": self.concurrency,
            "repeat": self.repeat,
            "tools": self.tools,
        }
        if self.model is not None:
            out["model"] = self.model
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, object], base: RequestSpec | None = None
                  ) -> RequestSpec:
        # int()/float() accept what a hand-written plan gives (strings too); bad values raise
        o: Mapping[str, Any] = obj
        b = base or cls()
        return cls(
            prompt=str(o.get("prompt", b.prompt)),
            input_tokens=int(o.get("input_tokens", b.input_tokens)),
            max_tokens=int(o.get("max_tokens", b.max_tokens)),
            temperature=float(o.get("temperature", b.temperature)),
            concurrency=int(o.get("concurrency", b.concurrency)),
            repeat=int(o.get("repeat", b.repeat)),
            tools=bool(o.get("tools", b.tools)),
            model=o.get("model", b.model),
        )


@dataclass(frozen=True, slots=True)
class PlanStep:
    id: int
    variable: str
    from_: str
    to: str
    argv: tuple[str, ...]
    request: RequestSpec
    why: str
    env: Mapping[str, str] = field(default_factory=dict)
    kind: str = "argv"  # argv | request | baseline

    def to_json(self) -> StepJSON:
        out: dict[str, object] = {
            "id": self.id,
            "variable": self.variable,
            "kind": self.kind,
            "from": self.from_,
            "to": self.to,
            "why": self.why,
            "argv": list(self.argv),
        }
        if self.env:
            out["env"] = dict(self.env)
        out["request"] = self.request.to_json()  # last, after env: the plan file's key order
        return cast(StepJSON, out)


@dataclass(frozen=True, slots=True)
class PlanOptions:
    long_input_tokens: int | None = None  # default: sized from the context (8192 if unknown)
    large_max_tokens: int = 4096
    concurrency: int | None = None  # default: the command's --max-num-seqs, else 32
    prefix_probe_tokens: int = 256
    #: the model's own context (config.json max_position_embeddings) when the command gives no
    #: --max-model-len; None: unknown
    model_context: int | None = None


#: tokens the chat template and the prompt's closing instruction add around the words
PROMPT_MARGIN = 32
#: tokens of the fixed prompt (the guide's sentence, with the chat template)
FIXED_PROMPT_TOKENS = 48


def _context(src: ServeCommand, opts: PlanOptions) -> tuple[int | None, str]:
    """The context length requests must fit in, and where it came from."""
    flag = src.get("max-model-len")
    if isinstance(flag, int) and not isinstance(flag, bool) and flag > 0:
        return flag, "--max-model-len"
    if opts.model_context:
        return opts.model_context, "the model's config.json"
    return None, "unknown"


def _long_input(opts: PlanOptions, ctx: int | None, ctx_from: str,
                max_tokens: int) -> tuple[int, str]:
    """The longer input: what was asked (``--long-input-tokens``) or a size that leaves room
    for the output step, never more than the context minus the current output cap."""
    asked = opts.long_input_tokens
    if not ctx:
        return asked or 8192, ""
    fit = max(1, ctx - max_tokens - PROMPT_MARGIN)
    if asked is not None:
        if asked <= fit:
            return asked, ""
        return fit, (f" (asked {asked}; the {ctx}-token context from {ctx_from} leaves {fit} "
                     f"with max_tokens {max_tokens})")
    target = min(int(ctx * 0.75), max(int(ctx * 0.6), ctx - opts.large_max_tokens - PROMPT_MARGIN))
    return min(target, fit), f" (sized to the {ctx}-token context from {ctx_from})"


def _large_output(opts: PlanOptions, ctx: int | None, ctx_from: str,
                  input_tokens: int) -> tuple[int, str]:
    want = opts.large_max_tokens
    if not ctx:
        return want, ""
    fit = max(1, ctx - input_tokens - PROMPT_MARGIN)
    if want <= fit:
        return want, ""
    return fit, (f" ({want} asked; the {ctx}-token context from {ctx_from} leaves {fit} after "
                 f"~{input_tokens} input tokens)")


def model_context(model: str | None) -> int | None:
    """``max_position_embeddings`` (or the like) from a local model folder's config.json."""
    if not model:
        return None
    path = Path(model) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = data.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


PREFIX_FLAG = "enable-prefix-caching"

#: request fields that are one variable together (a prefix probe is "the same prompt twice")
_REQUEST_VARIABLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("input", ("prompt", "input_tokens", "repeat")),
    ("max_tokens", ("max_tokens",)),
    ("temperature", ("temperature",)),
    ("concurrency", ("concurrency",)),
    ("tools", ("tools",)),
    ("model", ("model",)),
)


def step_variables(prev: PlanStep, step: PlanStep, *, table: ArgTable | None = None,
                   classes: FlagClasses | None = None) -> list[str]:
    """The variables ``step`` changes against ``prev`` (the seed's rule: at most one).

    Flags restored under one ladder variable (``step`` in data/flag-classes.toml, e.g. the
    multi-node flags) count once; request fields count by :data:`_REQUEST_VARIABLES`;
    environment changes count one each.
    """
    out: list[str] = []
    if prev.argv != step.argv:
        table = table or load_arg_table()
        try:
            a = parse_serve_argv(list(prev.argv), table)
            b = parse_serve_argv(list(step.argv), table)
        except InputError:
            out.append("argv")
        else:
            classes = classes or load_flag_classes()
            names = {c.name for c in flag_diff(a, b)}
            if a.model != b.model:
                out.append("model")
            for name in sorted(names - {"model"}):
                spec = table.spec(name)
                var = classes.rule_for(name, spec.group if spec else None).step or name
                if var not in out:
                    out.append(var)
    for name in sorted(set(prev.env) | set(step.env)):
        if prev.env.get(name) != step.env.get(name):
            out.append(f"env {name}")
    pa, pb = prev.request.to_json(), step.request.to_json()
    for var, fields in _REQUEST_VARIABLES:
        if any(pa.get(f) != pb.get(f) for f in fields):
            out.append(var)
    return out


def _fmt_value(name: str, v: FlagValue) -> str:
    if v is None:
        return "absent"
    if isinstance(v, bool):
        return f"--{name}" if v else f"--no-{name}"
    if isinstance(v, tuple):
        return f"--{name} " + " ".join(str(x) for x in v)
    return f"--{name} {v}"


def _secret_ref(name: str, value: FlagValue) -> FlagValue:
    env = _SECRET_FLAGS.get(name)
    if env is None:
        return value
    if isinstance(value, tuple):
        return tuple(f"${{{env}}}" for _ in value)
    return f"${{{env}}}"


def build_plan(
    mini: Minimized, options: PlanOptions | None = None, *, created: str | None = None
) -> LadderPlanJSON:
    """The ladder plan (a JSON-like dict; see ``schemas/ladder-plan.schema.json``)."""
    b = _PlanBuilder(mini, options or PlanOptions())
    b.add(
        "baseline",
        "baseline",
        "production command",
        "minimal command, fixed request",
        "the guide: keep only what starts the engine and send one fixed request "
        "(same input, output cap, temperature, path every time)",
    )
    # the guide's order: one variable per step, the business wrapper last
    b.prefix_caching()  # 1.
    b.restore("context-length")  # 2. the server side of a longer input
    b.longer_input()  # 3.
    b.larger_output()  # 4.
    b.load_and_concurrency()  # 5.
    b.restore(  # 6.
        "multi-node",
        "the guide: add multi-node communication alone, after a stable single node; restored "
        "as one variable because these flags only work together (start the other nodes too)",
    )
    b.tool_calls()  # 7.
    # 8. other features, then observability, then the business wrapper (last)
    for wanted in ("feature", "multi-node", "load", "observability", "business-wrapper"):
        b.restore_class(wanted)
    return _plan_json(mini, b.steps, b.env, created)


class _PlanBuilder:
    """The ladder's steps as they are added: the command and request each step runs with."""

    def __init__(self, mini: Minimized, opts: PlanOptions) -> None:
        self.mini = mini
        self.opts = opts
        self.src = mini.source
        self.order = list(mini.source.flags)  # restored flags go back to their production place
        self.current: dict[str, FlagValue] = dict(mini.minimal.flags)
        self.steps: list[PlanStep] = []
        self.req = RequestSpec()
        # Secret-looking environment values go into the plan by name only.
        self.env = {k: f"${{{k}}}" if _secret_env(k) else v for k, v in mini.source.env.items()}
        self.by_var: dict[str, list[ClassifiedFlag]] = {}
        for c in mini.removed:
            if c.cls != "unknown":
                self.by_var.setdefault(c.variable, []).append(c)
        self.ctx, self.ctx_from = _context(self.src, opts)

    def argv_now(self) -> tuple[str, ...]:
        # production order, then flags only the minimal command has (--no-enable-prefix-caching)
        names = [n for n in self.order if n in self.current]
        names += [n for n in self.current if n not in self.order]
        flags = {n: _secret_ref(n, self.current[n]) for n in names}
        cmd = ServeCommand(
            program=self.src.program, model=self.src.model, flags=flags, table=self.src.table
        )
        return tuple(render_argv(cmd))

    def add(self, variable: str, kind: str, frm: str, to: str, why: str) -> None:
        self.steps.append(PlanStep(len(self.steps), variable, frm, to, self.argv_now(),
                                   self.req, why, env=self.env, kind=kind))

    def restore(self, variable: str, why: str | None = None) -> bool:
        group = self.by_var.pop(variable, None)
        if not group:
            return False
        frm = "absent" if len(group) == 1 else f"{len(group)} flags absent"
        to = " ".join(_fmt_value(c.name, _secret_ref(c.name, c.value)) for c in group)
        for c in group:
            self.current[c.name] = c.value
        self.add(variable, "argv", frm, to, why or group[0].why)
        return True

    def restore_class(self, cls: str) -> None:
        for var in [v for v, cs in list(self.by_var.items()) if cs[0].cls == cls]:
            self.restore(var)

    def prefix_caching(self) -> None:
        """First the same long prompt twice without the cache (a request-only step on the
        baseline server), then the flag alone with that same request."""
        src, opts, req, ctx = self.src, self.opts, self.req, self.ctx
        default_on = self.current.get(PREFIX_FLAG) is False and src.get(PREFIX_FLAG) is None
        if "prefix-caching" not in self.by_var and not default_on:
            return
        block = src.block_size or 16
        probe = prompts.prefix_probe_words(
            block, ctx, req.max_tokens, at_least=opts.prefix_probe_tokens, margin=PROMPT_MARGIN
        )
        self.req = replace(req, input_tokens=probe, repeat=2)
        self.add(
            "prefix-probe",
            "request",
            "fixed prompt once",
            f"the same ~{probe}-token prompt twice",
            "the prefix-cache probe without the cache: the request the next step repeats with "
            "caching on (the guide: does a request that worked without the cache fail with it?)",
        )
        why = ("the guide: prefix caching is never in the first baseline; add "
               "--enable-prefix-caching alone with the same prompt (longer than one KV block) "
               "sent twice; compare both logs and whether the second request hits the cache")
        if not self.restore("prefix-caching", why):
            # production gives no flag: it runs with vLLM's default, on for the V1 engine
            self.current.pop(PREFIX_FLAG, None)
            self.add("prefix-caching", "argv", "--no-enable-prefix-caching",
                     "absent (vLLM's default: on for the V1 engine)", why)

    def longer_input(self) -> None:
        """Input + the current output cap stays inside the context."""
        req = self.req
        long_in, note = _long_input(self.opts, self.ctx, self.ctx_from, req.max_tokens)
        if long_in > req.input_tokens or req.repeat > 1:
            self.req = replace(req, input_tokens=max(long_in, req.input_tokens), repeat=1)
            self.add(
                "input_tokens",
                "request",
                f"{req.input_tokens or 'fixed prompt'}",
                f"~{self.req.input_tokens} tokens",
                "the guide: increase only the input length" + note,
            )

    def larger_output(self) -> None:
        """The current input + the cap stays inside the context."""
        req = self.req
        big, note = _large_output(self.opts, self.ctx, self.ctx_from,
                                  req.input_tokens or FIXED_PROMPT_TOKENS)
        if big > req.max_tokens:
            self.req = replace(req, max_tokens=big)
            self.add(
                "max_tokens",
                "request",
                str(req.max_tokens),
                str(big),
                "the guide: increase only the output cap" + note,
            )

    def load_and_concurrency(self) -> None:
        """The server's load settings, one at a time, then concurrency."""
        self.restore_class("load")
        seqs = self.src.get("max-num-seqs")
        conc = self.opts.concurrency or (seqs if isinstance(seqs, int) and seqs > 1 else 32)
        if conc > 1:
            self.req = replace(self.req, concurrency=conc)
            self.add(
                "concurrency",
                "request",
                "1",
                str(conc),
                "the guide: increase only the concurrency (N identical requests at once)",
            )

    def tool_calls(self) -> None:
        """Agent tool calls: the parser first (argv), then a request that uses tools."""
        if self.restore("tool-calls"):
            self.req = replace(self.req, tools=True)
            self.add(
                "tools",
                "request",
                "no tools",
                "tools + tool_choice auto",
                "the guide: add agent tool calls alone (same server, a request with a tool)",
            )


def _plan_json(mini: Minimized, steps: list[PlanStep], env: dict[str, str],
               created: str | None) -> LadderPlanJSON:
    src, table = mini.source, mini.source.table

    def shell(flags: Mapping[str, FlagValue]) -> str:
        return render_shell(ServeCommand(
            program=src.program, model=src.model,
            flags={n: _secret_ref(n, v) for n, v in flags.items()}, env=env, table=table))

    plan: LadderPlanJSON = {
        "schema": PLAN_SCHEMA,
        "plan": {
            "created": created or datetime.now(UTC).isoformat(timespec="seconds"),
            "tool": f"kk3evidence {__version__}",
            "vllm_args_table": mini.table_source,
            "source_command": shell(src.flags),
            "minimal_command": shell(mini.minimal.flags),
            "request": RequestSpec().to_json(),
        },
        "removed": [
            {**c.to_json(), "value": _json_value(_secret_ref(c.name, c.value))}
            for c in mini.removed
        ],
        "step": [s.to_json() for s in steps],
    }
    secrets = sorted({_SECRET_FLAGS[c.name] for c in mini.removed if c.name in _SECRET_FLAGS})
    secrets += sorted(
        {_SECRET_FLAGS[c.name] for c in mini.kept if c.name in _SECRET_FLAGS} - set(secrets)
    )
    secrets += sorted(k for k in env if _secret_env(k) and k not in secrets)
    if secrets:
        plan["plan"]["env_required"] = secrets
    return plan


_SECRET_ENV_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


def _secret_env(name: str) -> bool:
    upper = name.upper()
    return any(part in upper for part in _SECRET_ENV_PARTS)


def _json_value(v: FlagValue) -> Any:
    return list(v) if isinstance(v, tuple) else v


# --------------------------------------------------------------------------------------------
# TOML output (a small writer for the plan's shapes: no extra dependency)
# --------------------------------------------------------------------------------------------


def _toml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        inner = ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items())
        return "{ " + inner + " }" if inner else "{}"
    if v is None:
        raise ValueError("TOML has no null")
    return _toml_str(str(v))


def _toml_key(k: str) -> str:
    if k and all(ch.isalnum() or ch in "-_" for ch in k):
        return k
    return _toml_str(k)


def _toml_table(lines: list[str], obj: Mapping[str, Any], header: str) -> None:
    # env is an inline table: it must come before any sub-table, whatever the dict order
    plain = {k: v for k, v in obj.items()
             if v is not None and (not isinstance(v, dict) or k == "env")}
    subs = {k: v for k, v in obj.items() if isinstance(v, dict) and k != "env"}
    lines.append(header)
    for k, v in plain.items():
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v) and len(v) > 4:
            lines.append(f"{_toml_key(k)} = [")
            lines.extend(f"  {_toml_value(x)}," for x in v)
            lines.append("]")
        else:
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    name = header.strip("[]")
    for k, v in subs.items():
        lines.append("")
        _toml_table(lines, v, f"[{name}.{_toml_key(k)}]")


def plan_to_toml(plan: LadderPlanJSON | Mapping[str, object]) -> str:
    """Render a plan as TOML (``tomllib.loads`` gives the same dict back)."""
    p: Mapping[str, Any] = plan  # a built plan or one read back from TOML/JSON
    lines = [
        "# kk3evidence ladder plan: step 0 is the minimal command with the guide's fixed request;",
        "# every later step changes exactly one variable. Run it: kk3evidence ladder PLAN -o DIR",
        f"schema = {_toml_str(p['schema'])}",
        "",
    ]
    _toml_table(lines, p["plan"], "[plan]")
    for r in p.get("removed", []):
        lines.append("")
        _toml_table(lines, {k: v for k, v in r.items() if v is not None}, "[[removed]]")
    for s in p.get("step", []):
        lines.append("")
        _toml_table(lines, s, "[[step]]")
    return "\n".join(lines) + "\n"
