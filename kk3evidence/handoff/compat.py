"""Official compatibility boundaries, checked against a bundle's evidence.

The facts live as data in ``rules/compat/*.toml`` (each rule with its source URL and date);
this module only knows a small vocabulary of *checks* (``image_flavour``, ``cuda_driver_floor``,
``gpu_count_at_least`` ...). Every rule ends ``pass``, ``fail`` or ``unknown`` and carries the
evidence it used, so a reader can verify the verdict without rerunning anything. A failed rule
of level ``error`` makes the check fail (exit 6); ``warning`` rules are reported only.

Files without a ``recipe`` key apply to every bundle; a recipe file applies when asked for
(``--recipe kimi-k3``) or when the served model is one of its ``models``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kk3evidence import _resources
from kk3evidence.bundle.schema import load_toml
from kk3evidence.errors import EXIT_INCOMPATIBLE, EXIT_OK, RuleError, UsageError
from kk3evidence.handoff import evidence as _evidence
from kk3evidence.handoff.diff import serve_command
from kk3evidence.handoff.evidence import Evidence
from kk3evidence.handoff.records import Fingerprint
from kk3evidence.model import FORMAT_IDS, JSONObject

__all__ = [
    "CheckResult",
    "CompatRule",
    "RuleResult",
    "check",
    "check_evidence",
    "load_compat_rules",
    "recipes",
]

Status = Literal["pass", "fail", "unknown"]
Level = Literal["error", "warning"]

RULES_SCHEMA = FORMAT_IDS["compat-rules"]


@dataclass(frozen=True, slots=True)
class CompatRule:
    id: str
    name: str
    check: str
    level: Level
    summary: str
    why: str
    next_steps: str
    source: str
    source_date: str
    recipe: str | None
    params: Mapping[str, Any] = field(default_factory=dict)
    file: str = ""


@dataclass(frozen=True, slots=True)
class RuleResult:
    rule: CompatRule
    status: Status
    reason: str  # one line: why pass / fail / unknown
    evidence: tuple[str, ...]  # "where: value" strings the verdict used

    def to_json(self) -> JSONObject:
        r = self.rule
        return {
            "id": r.id,
            "name": r.name,
            "recipe": r.recipe,
            "level": r.level,
            "status": self.status,
            "reason": self.reason,
            "evidence": list(self.evidence),
            "summary": r.summary,
            "next_steps": r.next_steps,
            "source": r.source,
            "source_date": r.source_date,
        }


@dataclass(frozen=True, slots=True)
class CheckResult:
    source: str
    recipe: str | None
    recipe_auto: bool  # the recipe was picked from the served model, not asked for
    results: tuple[RuleResult, ...]

    @property
    def failed(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.results if r.status == "fail")

    @property
    def ok(self) -> bool:
        return not any(r.rule.level == "error" for r in self.failed)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_INCOMPATIBLE

    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "unknown": 0}
        for r in self.results:
            out[r.status] += 1
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "schema": FORMAT_IDS["check"],
            "source": self.source,
            "recipe": self.recipe,
            "recipe_auto": self.recipe_auto,
            "ok": self.ok,
            "counts": self.counts(),
            "results": [r.to_json() for r in self.results],
        }


# --- rule files ----------------------------------------------------------------------------

_LEVELS = ("error", "warning")
_RULE_KEYS = ("id", "name", "check", "level", "summary", "why", "next_steps", "source",
              "source_date")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _parse_rule_file(name: str, text: str) -> list[CompatRule]:
    data: dict[str, Any] = load_toml(text, f"rules/compat/{name}", error=RuleError,
                                     schema="compat-rule", schema_id=RULES_SCHEMA)
    recipe = data.get("recipe")
    out: list[CompatRule] = []
    for i, raw in enumerate(data.get("rule") or []):
        where = f"rules/compat/{name} rule[{i}]"
        missing = [k for k in _RULE_KEYS if not isinstance(raw.get(k), str) or not raw[k]]
        if missing:
            raise RuleError(f"{where}: missing or empty {', '.join(missing)}")
        if raw["check"] not in _CHECKS:
            raise RuleError(f"{where}: unknown check {raw['check']!r}; known: "
                            f"{', '.join(sorted(_CHECKS))}")
        if raw["level"] not in _LEVELS:
            raise RuleError(f"{where}: level must be one of {', '.join(_LEVELS)}")
        if not _DATE.match(raw["source_date"]):
            raise RuleError(f"{where}: source_date must be YYYY-MM-DD")
        if not raw["source"].startswith("https://"):
            raise RuleError(f"{where}: source must be an https URL")
        out.append(CompatRule(
            id=raw["id"], name=raw["name"], check=raw["check"], level=raw["level"],
            summary=raw["summary"], why=raw["why"], next_steps=raw["next_steps"],
            source=raw["source"], source_date=raw["source_date"],
            recipe=str(recipe) if recipe else None, params=dict(raw.get("params") or {}),
            file=f"rules/compat/{name}",
        ))
    return out


def _recipe_models() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for node in _compat_files():
        data: dict[str, Any] = load_toml(node.read_text(encoding="utf-8"),
                                         f"rules/compat/{node.name}", error=RuleError)
        if data.get("recipe"):
            out[str(data["recipe"])] = [str(m) for m in data.get("models") or []]
    return out


def _compat_files() -> list[Any]:
    try:
        folder = _resources.data_dir("rules").joinpath("compat")
    except FileNotFoundError as exc:
        raise RuleError(str(exc)) from exc
    if not folder.is_dir():
        raise RuleError("rules/compat is missing from this install; reinstall kk3evidence")
    return sorted((n for n in folder.iterdir() if n.name.endswith(".toml")),
                  key=lambda n: n.name)


def load_compat_rules() -> list[CompatRule]:
    """Every shipped compatibility rule (generic and recipe), validated."""
    rules: list[CompatRule] = []
    seen: set[str] = set()
    for node in _compat_files():
        for rule in _parse_rule_file(node.name, node.read_text(encoding="utf-8")):
            if rule.id in seen:
                raise RuleError(f"{rule.file}: duplicate rule id {rule.id}")
            seen.add(rule.id)
            rules.append(rule)
    return rules


def recipes() -> list[str]:
    """Names accepted by ``--recipe``."""
    return sorted(_recipe_models())


# --- helpers over the evidence ---------------------------------------------------------------




def parse_version(text: object) -> tuple[int, ...] | None:
    """``"0.32.0+cpu"`` -> (0, 32, 0); ``"580.65.06"`` -> (580, 65, 6); ``13000`` -> (13, 0)."""
    if text is None:
        return None
    if isinstance(text, int):
        # NVML/cudaDriverGetVersion style: 13000 = 13.0, 12090 = 12.9
        return (text // 1000, (text % 1000) // 10) if text >= 1000 else (text,)
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    if not m:
        return None
    return tuple(int(p) for p in m.group(1).split("."))


def _vstr(v: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in v)


def _flavour_of_cuda(cuda: tuple[int, ...]) -> str:
    return f"cu{cuda[0]}{cuda[1] if len(cuda) > 1 else 0}"


_TAG_FLAVOUR = re.compile(r"cu(\d{2})(\d)\b")


def container_cuda(ev: Evidence) -> tuple[tuple[int, ...] | None, list[str]]:
    """The container's CUDA runtime (major, minor) and the evidence it came from.

    Order of trust: ``torch.version.cuda`` (what the served program uses), the loaded
    ``libcudart``, then the image tag (``...-cu129``). Never nvcc.
    """
    evidence: list[str] = []
    found: tuple[int, ...] | None = None
    torch_cuda = ev.fingerprint.python.torch_cuda
    if torch_cuda:
        v = parse_version(torch_cuda)
        evidence.append(f"fingerprint python.torch_cuda: {torch_cuda}")
        if v:
            found = v[:2]
    for lib in ev.fingerprint.libraries:
        if lib.name.startswith("libcudart"):
            ver = lib.version or _soname_version(lib.name)
            evidence.append(f"fingerprint libraries {lib.name}: {ver or '?'}")
            v = parse_version(ver)
            if found is None and v:
                found = v[:2]
    ref = ev.fingerprint.container.image_ref
    if ref is not None:
        m = _TAG_FLAVOUR.search(ref)
        if m:
            evidence.append(f"fingerprint container.image_ref: {ref}")
            if found is None:
                found = (int(m.group(1)), int(m.group(2)))
    return found, evidence


def _soname_version(name: str) -> str | None:
    m = re.search(r"\.so\.(\d+(?:\.\d+)*)", name)
    return m.group(1) if m else None


def _flags(ev: Evidence) -> dict[str, Any]:
    """Canonical flag name (``--tensor-parallel-size``) -> value, aliases resolved."""
    cmd = serve_command(ev.argv)
    if cmd is None:
        return {}
    return {f"--{k}": v for k, v in cmd.flags.items()}


def _flag(flags: Mapping[str, Any], name: str) -> Any:
    return flags.get(name)


def _int_flag(flags: Mapping[str, Any], name: str, default: int) -> int:
    v = _flag(flags, name)
    try:
        return int(v) if v is not None and v is not False else default
    except (TypeError, ValueError):
        return default


def visible_gpus(ev: Evidence) -> tuple[int | None, list[str]]:
    """How many GPUs the served program can see, and the evidence."""
    fp = ev.fingerprint
    evidence: list[str] = []
    count = fp.python.cuda_device_count
    if count is not None:
        evidence.append(f"fingerprint python.cuda_device_count: {count}")
        return count, evidence
    source = fp.gpus.source
    if fp.gpus.nvml:
        n = len(fp.gpus.devices)
        evidence.append(f"fingerprint gpus.devices (NVML): {n}")
        cvd = fp.env.get("CUDA_VISIBLE_DEVICES")
        if cvd is not None:
            evidence.append(f"fingerprint env.CUDA_VISIBLE_DEVICES: {cvd!r}")
            ids = [x for x in cvd.split(",") if x.strip()]
            n = min(n, len(ids)) if cvd.strip() not in ("", "all") else n
            if cvd.strip() == "":
                n = 0
        return n, evidence
    if source is not None:
        evidence.append(f"fingerprint gpus.source: {source}")
    return None, evidence


def _gpu_names(ev: Evidence) -> list[str]:
    return [d.name or "" for d in ev.fingerprint.gpus.devices]


def cpu_build(ev: Evidence) -> list[str] | None:
    """The proof that the run used a CPU build of vLLM/PyTorch (a ``+cpu`` version, NVML
    absent), as evidence lines; None when there is no such proof."""
    py = ev.fingerprint.python
    proof = [f"fingerprint python.{k}: {v}" for k, v in (
        ("torch_version", py.torch_version), ("vllm_version", py.vllm_version))
        if v is not None and v.endswith("+cpu")]
    if not proof or ev.fingerprint.gpus.nvml:
        return None
    return [*proof, f"fingerprint gpus.source: {ev.fingerprint.gpus.source or 'absent'} "
            "(no NVML)"]


def _cpu_fail(ev: Evidence, what: str, evidence: list[str]) -> Outcome | None:
    proof = cpu_build(ev)
    if proof is None:
        return None
    return "fail", f"CPU build: {what}", evidence + proof


# --- the checks ------------------------------------------------------------------------------

Outcome = tuple[Status, str, list[str]]


def _check_image_flavour(ev: Evidence, p: Mapping[str, Any]) -> Outcome:
    allowed = [str(x) for x in p.get("allowed") or []]
    cuda, evidence = container_cuda(ev)
    if cuda is None:
        return _cpu_fail(ev, f"not a CUDA build at all (allowed: {', '.join(allowed)})",
                         evidence) or (
            "unknown", "the container's CUDA version is not in the fingerprint", evidence)
    flavour = _flavour_of_cuda(cuda)
    if flavour in allowed:
        return "pass", f"container CUDA {_vstr(cuda)} is a {flavour} build", evidence
    return ("fail", f"container CUDA {_vstr(cuda)} is a {flavour} build; allowed: "
            f"{', '.join(allowed)}", evidence)


def _driver(ev: Evidence) -> tuple[tuple[int, ...] | None, list[str]]:
    drv = ev.fingerprint.gpus.driver_version
    if not drv:
        src = ev.fingerprint.gpus.source
        return None, [f"fingerprint gpus.source: {src}"] if src else []
    return parse_version(drv), [f"fingerprint gpus.driver_version: {drv}"]


def _driver_text(ev: Evidence) -> str:
    return str(ev.fingerprint.gpus.driver_version)


def _check_driver_branch(ev: Evidence, p: Mapping[str, Any]) -> Outcome:
    need = int(p["min_branch"])
    drv, evidence = _driver(ev)
    if drv is None:
        return _cpu_fail(ev, f"no NVIDIA driver in use (needs r{need}+)", evidence) or (
            "unknown", "no NVIDIA driver version in the fingerprint", evidence)
    if drv[0] >= need:
        return "pass", f"driver branch r{drv[0]} >= r{need}", evidence
    return "fail", f"driver branch r{drv[0]} is older than r{need}", evidence


#: fingerprint fields a ``version_at_least`` rule may name (rule data stays dotted strings)
_VERSION_FIELDS: dict[str, Callable[[Fingerprint], str | None]] = {
    "python.vllm_version": lambda f: f.python.vllm_version,
    "python.torch_version": lambda f: f.python.torch_version,
    "python.torch_cuda": lambda f: f.python.torch_cuda,
    "python.nccl_version": lambda f: f.python.nccl_version,
    "python.python_version": lambda f: f.python.python_version,
    "gpus.driver_version": lambda f: f.gpus.driver_version,
    "gpus.cuda_driver_version": lambda f: f.gpus.cuda_driver_version,
    "host.kernel": lambda f: f.host.kernel,
}


def _check_version_at_least(ev: Evidence, p: Mapping[str, Any]) -> Outcome:
    field_ = str(p["field"])
    what = str(p.get("what") or field_)
    raw = _VERSION_FIELDS[field_](ev.fingerprint)
    evidence = [f"fingerprint {field_}: {raw}"] if raw else []
    have, need = parse_version(raw), parse_version(p["min"])
    if have is None or need is None:
        return "unknown", f"{what} version is not in the fingerprint", evidence
    if raw is not None and raw.endswith("+cpu"):
        # A CPU build is outside a GPU recipe's version boundary, whatever its number.
        return ("fail", f"{what} {raw} is a CPU build; the boundary is a CUDA build "
                f">= {p['min']}", evidence)
    if have >= need:
        return "pass", f"{what} {raw} >= {p['min']}", evidence
    return "fail", f"{what} {raw} is older than {p['min']}", evidence


def _check_gpu_count(ev: Evidence, p: Mapping[str, Any]) -> Outcome:
    flags = _flags(ev)
    pp = _int_flag(flags, "--pipeline-parallel-size", 1)
    dp = _int_flag(flags, "--data-parallel-size", 1)
    ep = bool(_flag(flags, "--enable-expert-parallel"))
    need = int(p.get("single_node_tp", 1))
    layout = "single-node tensor parallel"
    if pp > 1 or (dp > 1 and ep):
        need = int(p.get("dep_or_tp_pp", need))
        layout = "TP+PP" if pp > 1 else "DEP (data + expert parallel)"
    names = _gpu_names(ev)
    for key, n in dict(p.get("by_gpu_name") or {}).items():
        if names and any(key.lower() in name.lower() for name in names):
            need = max(need, int(n))
            layout += f" on {key}"
    count, evidence = visible_gpus(ev)
    if names:
        evidence.append(f"fingerprint gpus.devices names: {', '.join(sorted(set(names)))}")
    if count is None:
        return "unknown", f"visible GPU count unknown (needs {need} for {layout})", evidence
    nnodes = _int_flag(flags, "--nnodes", 1)
    total = count * nnodes
    if nnodes > 1:
        evidence.append(f"launch argv --nnodes: {nnodes}")
    if total >= need:
        return "pass", f"{total} GPUs visible >= {need} for {layout}", evidence
    return "fail", f"{total} GPUs visible, {layout} needs at least {need}", evidence


_MULTI_NODE_FLAGS = ("--nnodes", "--headless", "--data-parallel-address",
                     "--distributed-executor-backend")


def _check_parallel_fits(ev: Evidence, p: Mapping[str, Any]) -> Outcome:
    flags = _flags(ev)
    tp = _int_flag(flags, "--tensor-parallel-size", 1)
    pp = _int_flag(flags, "--pipeline-parallel-size", 1)
    dp_local = _int_flag(flags, "--data-parallel-size-local",
                         _int_flag(flags, "--data-parallel-size", 1))
    world = tp * pp * dp_local
    evidence = [f"launch argv: tp={tp} pp={pp} local dp={dp_local} -> {world} ranks"]
    count, ev_gpus = visible_gpus(ev)
    evidence += ev_gpus
    if count is None or (count == 0 and not ev.fingerprint.gpus.nvml
                         and cpu_build(ev) is None):
        return "unknown", "no GPU inventory in the fingerprint (CPU run or NVML absent)", evidence
    if world <= count:
        return "pass", f"{world} ranks fit on {count} visible GPUs", evidence
    multi = [f for f in _MULTI_NODE_FLAGS if _flag(flags, f) not in (None, False)
             and not (f == "--distributed-executor-backend" and _flag(flags, f) != "ray")
             and not (f == "--nnodes" and _int_flag(flags, f, 1) <= 1)]
    if multi:
        return ("unknown", f"{world} ranks > {count} local GPUs, but the command is multi-node "
                f"({', '.join(multi)}); check the other nodes", evidence)
    return "fail", f"{world} ranks need {world} GPUs, only {count} visible", evidence


def _check_cuda_driver_floor(ev: Evidence, p: Mapping[str, Any]) -> Outcome:
    floors = {parse_version(k): str(v) for k, v in dict(p["floors"]).items()}
    cuda, evidence = container_cuda(ev)
    drv, ev_drv = _driver(ev)
    evidence += ev_drv
    if cuda is None:
        return _cpu_fail(ev, "no CUDA runtime and no NVIDIA driver", evidence) or (
            "unknown", "the container's CUDA version is not in the fingerprint", evidence)
    if drv is None:
        return "unknown", f"container CUDA {_vstr(cuda)}, but no host driver version", evidence
    floor = floors.get(cuda[:2])
    if floor is None:
        return ("unknown", f"no driver floor on record for CUDA {_vstr(cuda)} "
                f"(known: {', '.join(sorted(_vstr(k) for k in floors if k))})", evidence)
    need = parse_version(floor) or ()
    if drv >= need:
        return ("pass", f"driver {_driver_text(ev)} >= {floor} required by CUDA {_vstr(cuda)}",
                evidence)
    return ("fail", f"CUDA {_vstr(cuda)} needs driver >= {floor}, host has {_driver_text(ev)}",
            evidence)


def _check_runtime_le_driver(ev: Evidence, p: Mapping[str, Any]) -> Outcome:
    cuda, evidence = container_cuda(ev)
    raw = ev.fingerprint.gpus.cuda_driver_version
    drv_cuda = parse_version(int(raw) if raw is not None and raw.isdigit() else raw)
    if raw is not None:
        evidence.append(f"fingerprint gpus.cuda_driver_version: {raw}")
    if cuda is None and drv_cuda is None:
        return _cpu_fail(ev, "no CUDA runtime and no NVIDIA driver", evidence) or (
            "unknown", "container CUDA or NVML CUDA driver version missing", evidence)
    if cuda is None or drv_cuda is None:
        return "unknown", "container CUDA or NVML CUDA driver version missing", evidence
    if cuda[:2] <= drv_cuda[:2]:
        return ("pass", f"runtime CUDA {_vstr(cuda[:2])} <= driver CUDA {_vstr(drv_cuda[:2])}",
                evidence)
    return ("fail", f"runtime CUDA {_vstr(cuda[:2])} is newer than the driver's CUDA "
            f"{_vstr(drv_cuda[:2])}", evidence)


def _check_flag_present(ev: Evidence, p: Mapping[str, Any]) -> Outcome:
    flag = str(p["flag"])
    if not ev.argv:
        return "unknown", "no launch argv in the bundle", []
    value = _flag(_flags(ev), flag)
    shown = "(absent)" if value is None else "on" if value is True else "off" if value is False \
        else value
    evidence = [f"launch argv {flag}: {shown}"]
    if value not in (None, False, "false", "False"):
        return "pass", f"{flag} is given", evidence
    return "fail", f"{flag} is missing from the start command", evidence


def _check_flag_value(ev: Evidence, p: Mapping[str, Any]) -> Outcome:
    flag, want = str(p["flag"]), str(p["value"])
    if not ev.argv:
        return "unknown", "no launch argv in the bundle", []
    value = _flag(_flags(ev), flag)
    shown = value if value is not None else f"(absent: vLLM default {p.get('default', '?')})"
    evidence = [f"launch argv {flag}: {shown}"]
    if value is not None and str(value) == want:
        return "pass", f"{flag} {want}", evidence
    return "fail", f"{flag} is {shown}, recipe uses {want}", evidence


def _check_env_at_least(ev: Evidence, p: Mapping[str, Any]) -> Outcome:
    name, need = str(p["name"]), int(p["min"])
    env = ev.fingerprint.env
    if "env" not in ev.fingerprint.raw:
        return "unknown", "no environment variables in the fingerprint", []
    raw = env.get(name)
    evidence = [f"fingerprint env.{name}: {raw if raw is not None else '(unset)'}"]
    if raw is None:
        return "fail", f"{name} unset (vLLM default {p.get('default', '?')} < {need})", evidence
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return "unknown", f"{name}={raw!r} is not a number", evidence
    if value >= need:
        return "pass", f"{name}={raw} >= {need}", evidence
    return "fail", f"{name}={raw} < {need}", evidence


def _check_image_ref_is(ev: Evidence, p: Mapping[str, Any]) -> Outcome:
    want = str(p["ref"])
    ref = ev.fingerprint.container.image_ref
    if not ref:
        runtime = ev.fingerprint.container.runtime
        return ("unknown", "no image reference in the fingerprint",
                [f"fingerprint container.runtime: {runtime}"] if runtime else [])
    evidence = [f"fingerprint container.image_ref: {ref}"]
    image_id = ev.fingerprint.container.image_id
    if image_id:
        evidence.append(f"fingerprint container.image_id: {image_id}")
    bare = str(ref).removeprefix("docker.io/")
    if bare == want or bare.startswith(want + "@"):
        return "pass", f"image {ref}", evidence
    return "fail", f"image {ref} is not the recipe's {want}", evidence


_CHECKS: dict[str, Callable[[Evidence, Mapping[str, Any]], Outcome]] = {
    "image_flavour": _check_image_flavour,
    "driver_branch_at_least": _check_driver_branch,
    "version_at_least": _check_version_at_least,
    "gpu_count_at_least": _check_gpu_count,
    "parallel_fits_gpus": _check_parallel_fits,
    "cuda_driver_floor": _check_cuda_driver_floor,
    "runtime_le_driver_cuda": _check_runtime_le_driver,
    "flag_present": _check_flag_present,
    "flag_value": _check_flag_value,
    "env_at_least": _check_env_at_least,
    "image_ref_is": _check_image_ref_is,
}


def _served_model(ev: Evidence) -> list[str]:
    names = []
    if ev.launch.served_model:
        names.append(ev.launch.served_model)
    cmd = serve_command(ev.argv)
    if cmd is not None:
        names += [str(n) for n in cmd.served_model_names]
        if cmd.model:
            names.append(str(cmd.model))
    return names


def _auto_recipe(ev: Evidence) -> str | None:
    names = [n.lower().rstrip("/") for n in _served_model(ev)]
    for recipe, models in _recipe_models().items():
        for m in models:
            if any(n == m.lower() or n.endswith("/" + m.lower()) for n in names):
                return recipe
    return None


def check_evidence(ev: Evidence, recipe: str | None = None,
                   rules: Sequence[CompatRule] | None = None) -> CheckResult:
    """Evaluate the generic rules and, if any, one recipe's rules against loaded evidence."""
    all_rules = list(rules) if rules is not None else load_compat_rules()
    known = {r.recipe for r in all_rules if r.recipe}
    auto = False
    if recipe is not None and recipe not in known:
        raise UsageError(f"unknown recipe {recipe!r}; known: {', '.join(sorted(known)) or 'none'}")
    if recipe is None:
        recipe = _auto_recipe(ev)
        auto = recipe is not None
    results = []
    for rule in all_rules:
        if rule.recipe is not None and rule.recipe != recipe:
            continue
        try:
            status, reason, evidence = _CHECKS[rule.check](ev, rule.params)
        except (KeyError, TypeError, ValueError) as exc:
            raise RuleError(f"{rule.file} {rule.id}: bad params for check {rule.check} "
                            f"({exc})") from exc
        results.append(RuleResult(rule, status, reason, tuple(evidence)))
    return CheckResult(ev.source, recipe, auto, tuple(results))


def check(bundle: Evidence | str | Path, recipe: str | None = None) -> CheckResult:
    """Check one bundle (path or loaded evidence) against the compatibility rules."""
    return check_evidence(_evidence.coerce(bundle), recipe)
