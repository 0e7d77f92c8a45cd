"""Recipe boundaries and CUDA/driver rules before launch, reusing ``rules/compat/*.toml``.

The compat rules judge a bundle's fingerprint; here the fingerprint is built from the host facts
the probes found, so the same rules (with their sources and dates) apply before a launch. Where
sources disagree (``[[disagreement]]`` tables) every source is named and the verdict is at most
``warn``: picking one silently is what the disagreement tables exist to prevent.
"""

from __future__ import annotations

import operator
import tomllib
from collections.abc import Mapping, Sequence

from kk3evidence import _resources
from kk3evidence.handoff import compat
from kk3evidence.handoff.evidence import from_dicts
from kk3evidence.handoff.preflight.host_checks import visible_devices
from kk3evidence.handoff.preflight.model_checks import Ctx
from kk3evidence.handoff.preflight.result import Check, Status

_SKIP_CHECKS = ("parallel_fits_gpus",)  # flags.world-size judges this, CPU builds included
_NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


def _fingerprint(ctx: Ctx) -> dict[str, object]:
    g = ctx.facts.gpus
    return {
        "python": {"vllm_version": ctx.facts.vllm.version, "torch_cuda": ctx.facts.vllm.torch_cuda},
        "gpus": {"source": g.source, "driver_version": g.driver_version,
                 "cuda_driver_version": g.cuda_driver_version,
                 "devices": [{"index": d.index, "name": d.name} for d in g.devices]},
        "env": dict(ctx.facts.env),
        "container": {},
    }


def compat_checks(ctx: Ctx, argv: Sequence[str], recipe: str | None) -> tuple[list[Check],
                                                                             str | None, bool]:
    """Generic CUDA/driver rules and the recipe's rules, as pre-flight checks."""
    ev = from_dicts("preflight", fingerprint=_fingerprint(ctx), launch={"argv": list(argv)})
    result = compat.check_evidence(ev, recipe)
    out: list[Check] = []
    for r in result.results:
        if r.rule.check in _SKIP_CHECKS:
            continue
        status: Status = r.status if r.status != "fail" else (
            "fail" if r.rule.level == "error" else "warn")
        area = "recipe" if r.rule.recipe else "host"
        evidence = tuple(e.replace("fingerprint ", "host ").replace("launch argv", "command")
                         for e in r.evidence)
        reason = r.reason.replace("in the fingerprint", "known before launch")
        if not r.rule.recipe and r.status == "fail" and r.reason.startswith("CPU build"):
            # `check` says a CPU build is outside a CUDA boundary; whether it *starts* is
            # another question: a CPU build needs no CUDA runtime and no NVIDIA driver.
            status, reason = "pass", f"not applicable: {r.reason}"
        out.append(Check(f"{area}.{r.rule.id}", area, status, f"{r.rule.summary} - {reason}",
                         evidence, r.rule.next_steps if status in ("fail", "warn") else None,
                         r.rule.source, r.rule.source_date))
    return out, result.recipe, result.recipe_auto


def _disagreements(recipe: str) -> list[Mapping[str, object]]:
    folder = _resources.data_dir("rules").joinpath("compat")
    out: list[Mapping[str, object]] = []
    for node in sorted(folder.iterdir(), key=lambda n: n.name):
        if node.name.endswith(".toml"):
            data = tomllib.loads(node.read_text(encoding="utf-8"))
            if data.get("recipe") == recipe:
                out += list(data.get("disagreement") or [])
    return out


def _measure(ctx: Ctx, measure: str, default: object) -> tuple[object, str]:
    if measure == "gpus":
        devices, _ = visible_devices(ctx)
        nnodes = ctx.cmd.flags.get("nnodes")
        n = None if devices is None else len(devices) * (nnodes if isinstance(nnodes, int) else 1)
        return n, f"visible GPUs x nodes: {n if n is not None else 'unknown (no NVML)'}"
    if measure == "vllm_version":
        return ctx.facts.vllm.version, f"installed vLLM: {ctx.facts.vllm.version}"
    if measure == "nccl_version":
        found = [(d, ctx.facts.vllm.dists[d]) for d in _NCCL_DISTS if d in ctx.facts.vllm.dists]
        v = found[0][1] if found else None
        return v, f"NCCL wheel in vLLM's environment: {found[0] if found else 'none found'}"
    kind, _, name = measure.partition(":")
    if kind == "env":
        raw = ctx.facts.env.get(name)
        if raw is None:
            return default, f"env {name}: (unset, default {default})"
        return raw, f"env {name}: {raw}"
    value = ctx.cmd.flags.get(name)
    if value is None:
        return default, f"--{name}: (absent, default {default})"
    return value, f"--{name}: {value}"


def _holds(value: object, claim: Mapping[str, object]) -> bool | None:
    def num(x: object) -> tuple[int, ...] | float | None:
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return float(x)
        try:
            return float(str(x))
        except ValueError:
            return compat.parse_version(x)

    if "avoid_prefix" in claim:
        return not str(value).startswith(str(claim["avoid_prefix"]))
    if "equals" in claim:
        a, b = num(value), num(claim["equals"])
        return a == b if a is not None and b is not None else str(value) == str(claim["equals"])
    for key, ok in (("min", operator.ge), ("max", operator.le)):
        if key in claim:
            a, b = num(value), num(claim[key])
            if a is None or b is None or type(a) is not type(b):
                return None
            return bool(ok(a, b))
    return None


def disagreement_checks(ctx: Ctx, recipe: str | None) -> list[Check]:
    if recipe is None:
        return []
    out = []
    for d in _disagreements(recipe):
        claims = [c for c in d.get("claims") or [] if isinstance(c, Mapping)]  # type: ignore[attr-defined]
        value, shown = _measure(ctx, str(d["measure"]), d.get("default"))
        ev = [shown] + [f"{c['who']} says {c['says']} ({c['source']}, {c['source_date']})"
                        for c in claims]
        verdicts = [(c, None if value is None else _holds(value, c)) for c in claims]
        ok = [str(c["who"]) for c, v in verdicts if v is True]
        bad = [str(c["who"]) for c, v in verdicts if v is False]
        status: Status
        if value is None or (not ok and not bad):
            status, summary = "unknown", f"{d['summary']} Cannot tell here."
        elif not bad:
            status, summary = "pass", f"{d['summary']} Met for every source ({', '.join(ok)})."
        elif ok:
            status, summary = "warn", (f"sources disagree: {d['summary']} Met for "
                                       f"{', '.join(ok)}; not for {', '.join(bad)}.")
        else:
            status, summary = "warn", f"{d['summary']} Not met for {', '.join(bad)}."
        out.append(Check(f"recipe.{d['id']}", "recipe", status, summary, tuple(ev),
                         "Decide which source applies to this cluster and record why "
                         "(notes.json); change one variable per run." if status == "warn"
                         else None,
                         "; ".join(sorted({str(c["source"]) for c in claims})),
                         max(str(c["source_date"]) for c in claims) if claims else None))
    return out
