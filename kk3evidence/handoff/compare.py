"""Compare many runs: which configurations were repeated, is the failure stable, and what next.

``compare(bundles)`` puts one row per run into a polars DataFrame (configuration variables and
outcome), groups runs by identical configuration and environment, measures how stable the first
failing stage is across repeats, and applies the guide's decision (seed, last section):

* **move to an isolated environment** when, on the original cluster, (1) the failure point
  varies from run to run even within the official compatibility boundaries, (2) the
  fingerprints of runs meant to be identical differ (driver or container cannot be pinned), or
  (3) other jobs use the GPUs (NVML process lists, or recorded notes such as
  ``--cluster 'shared node, 3 other training jobs'``); a run outside the official boundaries
  is stated as such. Unknown GPU occupancy (no NVML) is said to be unknown, never "no jobs";
* **hand off upstream** when the same failure (stage + category + rule) reproduces on a
  different, isolated host with the same configuration, and the failure is not in the user's
  own configuration (categories ``config``, ``port``, ``weights``);
* **keep fixing here** otherwise (a stable failure in a pinned, quiet environment; or a failure
  that appears only on the original cluster, whose configuration is then the suspect).

A run belongs to the isolated environment when it is named with ``isolated=`` (path or file
name), when its host is in ``isolated_hosts``, or when its notes say so
(``environment: isolated`` in ``notes.json`` notes or cluster text). Everything else is the
original environment.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl

from kk3evidence.handoff import evidence as _evidence
from kk3evidence.handoff.compat import check_evidence, load_compat_rules
from kk3evidence.handoff.diff import request_signature, serve_command
from kk3evidence.handoff.evidence import Evidence, other_gpu_processes
from kk3evidence.handoff.records import Fingerprint
from kk3evidence.model import FORMAT_IDS, JSONObject

__all__ = ["Comparison", "Decision", "RunGroup", "compare", "compare_evidence"]

Action = Literal["keep_fixing_here", "move_to_isolated", "hand_off_upstream"]
Environment = Literal["original", "isolated"]

ACTION_TEXT: dict[str, str] = {
    "keep_fixing_here": "keep fixing here",
    "move_to_isolated": "move to an isolated environment",
    "hand_off_upstream": "hand off upstream",
}

# Fingerprint fields that must not move between runs meant to be identical.
_PINNED: tuple[tuple[str, Callable[[Fingerprint], str | None]], ...] = (
    ("driver", lambda f: f.gpus.driver_version),
    ("cuda_driver", lambda f: f.gpus.cuda_driver_version),
    ("kernel", lambda f: f.host.kernel),
    ("image_id", lambda f: f.container.image_id),
    ("vllm", lambda f: f.python.vllm_version),
    ("torch", lambda f: f.python.torch_version),
    ("torch_cuda", lambda f: f.python.torch_cuda),
)
#: failure categories that live in the user's own configuration: never "hand off upstream"
_USER_CATEGORIES = frozenset({"config", "port", "weights"})
# Notes that say the GPUs or node are shared with other work ("shared node, 3 other training
# jobs"); "no other jobs" does not count.
_BUSY_NOTE = re.compile(
    r"(?<!no )(?<!without )\b(?:\d+|several|many|other)\s+(?:other\s+)?(?:\w+\s+)?jobs?\b"
    r"|\bshared\s+(?:node|gpus?|cluster|host)\b", re.I)

_ISOLATED_NOTE = re.compile(r"\b(environment|env)\s*[:=]\s*isolated\b|#isolated\b", re.I)




@dataclass(frozen=True, slots=True)
class RunGroup:
    config: str
    environment: Environment
    runs: tuple[str, ...]
    signatures: Mapping[str, int]  # outcome signature -> count
    varying_fingerprint: Mapping[str, tuple[str, ...]]  # field -> distinct values seen

    @property
    def stability(self) -> Literal["single run", "stable", "varies"]:
        if len(self.runs) < 2:
            return "single run"
        return "stable" if len(self.signatures) == 1 else "varies"

    def to_json(self) -> JSONObject:
        return {
            "config": self.config,
            "environment": self.environment,
            "runs": list(self.runs),
            "signatures": dict(self.signatures),
            "stability": self.stability,
            "varying_fingerprint": {k: list(v) for k, v in self.varying_fingerprint.items()},
        }


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reasons: tuple[str, ...]  # one line each: which condition fired
    evidence: tuple[str, ...]  # the facts (run names, values) behind it

    @property
    def text(self) -> str:
        return ACTION_TEXT[self.action]

    def to_json(self) -> JSONObject:
        return {"action": self.action, "text": self.text, "reasons": list(self.reasons),
                "evidence": list(self.evidence)}


@dataclass(frozen=True, slots=True)
class Comparison:
    runs: pl.DataFrame
    groups: tuple[RunGroup, ...]
    decision: Decision

    def to_json(self) -> dict[str, object]:
        return {
            "schema": FORMAT_IDS["compare"],
            "runs": self.runs.to_dicts(),
            "groups": [g.to_json() for g in self.groups],
            "decision": self.decision.to_json(),
        }

    def to_csv(self) -> str:
        return self.runs.write_csv()


# --- per run -------------------------------------------------------------------------------


def _environment(ev: Evidence, isolated: set[str], isolated_hosts: set[str]) -> Environment:
    src = ev.source
    if src in isolated or Path(src).name in isolated or str(Path(src).resolve()) in isolated:
        return "isolated"
    if ev.fingerprint.host.hostname in isolated_hosts:
        return "isolated"
    if any(_ISOLATED_NOTE.search(t) for t in ev.notes.texts):
        return "isolated"
    return "original"


def _config(ev: Evidence) -> tuple[str, str | None]:
    """Hashes of the configuration an operator chose: (command + env + image tag, the same plus
    the request). The second is None when no request was sent (the server never became
    ready); such a run joins the group of the same command with a request."""
    cmd = serve_command(ev.argv)
    if cmd is not None:
        flags = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cmd.flags.items()
                 if k != "port"}
        # a flag equal to what the engine ran with anyway is not a different configuration
        eng = ev.engine_config
        if eng is not None and eng.enable_prefix_caching is not None:
            flags.pop("enable-prefix-caching", None)
            flags["effective:enable_prefix_caching"] = eng.enable_prefix_caching
        command: Any = {"model": cmd.model, "flags": dict(sorted(flags.items()))}
    else:
        command = list(ev.argv)
    config: dict[str, Any] = {
        "command": command,
        "env": dict(sorted(ev.fingerprint.env.items())),
        "image_ref": ev.fingerprint.container.image_ref,
    }
    base = _digest(config)
    sig = request_signature(ev)
    if not sig:
        return base, None
    config["request"] = {k: sig.get(k) for k in ("endpoint", "input", "max_tokens",
                                                 "temperature", "concurrency")}
    return base, _digest(config)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _signature(ev: Evidence) -> str:
    ff = ev.first_failure
    if ff is None:
        return "ok"
    return f"{ff.get('stage')}/{ff.get('category')}/{ff.get('rule')}"


def _flags_text(ev: Evidence) -> str:
    cmd = serve_command(ev.argv)
    if cmd is None:
        return " ".join(ev.argv)
    parts = []
    for k, v in cmd.flags.items():
        if k == "port":
            continue
        shown = ",".join(map(str, v)) if isinstance(v, tuple) else v
        parts.append(f"--{k}" if v is True else f"--{k}={shown}")
    return " ".join(parts)


_RUN_SCHEMA: dict[str, Any] = {
    "run": pl.Utf8, "environment": pl.Utf8, "host": pl.Utf8, "config": pl.Utf8,
    "model": pl.Utf8, "flags": pl.Utf8, "image_ref": pl.Utf8, "image_id": pl.Utf8,
    "driver": pl.Utf8, "cuda_driver": pl.Utf8, "kernel": pl.Utf8, "vllm": pl.Utf8,
    "torch": pl.Utf8, "torch_cuda": pl.Utf8, "gpus": pl.Int64, "gpu_name": pl.Utf8,
    "input_length": pl.Int64, "max_tokens": pl.Int64, "concurrency": pl.Int64,
    "other_gpu_processes": pl.Int64, "within_boundaries": pl.Utf8,
    "first_failure_stage": pl.Utf8, "first_failure_category": pl.Utf8,
    "first_failure_rule": pl.Utf8, "last_stage": pl.Utf8, "exit_code": pl.Int64,
    "request_status": pl.Int64, "signature": pl.Utf8,
}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _row(ev: Evidence, env: Environment, config_id: str, boundaries: str) -> dict[str, Any]:
    fp = ev.fingerprint
    ff = ev.first_failure or {}
    sig = request_signature(ev)
    cmd = serve_command(ev.argv)
    names = sorted({str(d.name) for d in fp.gpus.devices})
    req = next((r for r in ev.requests if r.kind == "fixed"), None) or (
        ev.requests[0] if ev.requests else None)
    others = other_gpu_processes(ev)
    row: dict[str, Any] = {
        "run": ev.label,
        "environment": env,
        "host": fp.host.hostname,
        "config": config_id,
        "model": str(cmd.model) if cmd is not None and cmd.model else None,
        "flags": _flags_text(ev),
        "gpus": fp.gpus.count,
        "gpu_name": ", ".join(names) or None,
        "input_length": _int(sig.get("input_length")),
        "max_tokens": _int(sig.get("max_tokens")),
        "concurrency": _int(sig.get("concurrency")),
        "other_gpu_processes": None if others is None else len(others),
        "within_boundaries": boundaries,
        "first_failure_stage": ff.get("stage"),
        "first_failure_category": ff.get("category"),
        "first_failure_rule": ff.get("rule"),
        "last_stage": ev.last_stage_reached,
        "exit_code": ev.launch.exit_code,
        "request_status": req.status if req else None,
        "signature": _signature(ev),
        "image_ref": fp.container.image_ref,
    }
    for name, get in _PINNED:
        row[name] = get(fp)
    return {k: _cell(row.get(k), t) for k, t in _RUN_SCHEMA.items()}


_INT64 = range(-(2**63), 2**63)


def _cell(value: Any, dtype: Any) -> Any:
    """A value the frame can hold: an integer beyond 64 bits is unknown (None), a lone
    surrogate from a received bundle becomes a visible escape."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int) and value not in _INT64:
        return None if dtype == pl.Int64 else str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


# --- decision ------------------------------------------------------------------------------


def _decide(frame: pl.DataFrame, groups: Sequence[RunGroup],
            evs: Mapping[str, Evidence]) -> Decision:
    """The seed's decision, stating only reasons the runs carry evidence for."""
    original = [g for g in groups if g.environment == "original"]
    isolated = [g for g in groups if g.environment == "isolated"]
    hosts = {r["run"]: r["host"] for r in frame.select("run", "host").iter_rows(named=True)}
    upstream = _hand_off(original, isolated, hosts, frame)
    if upstream is not None:
        return upstream
    for ig in isolated:
        twin = next((g for g in original if g.config == ig.config), None)
        if twin is not None and set(ig.signatures) == {"ok"} and any(
                s != "ok" for s in twin.signatures):
            return Decision("keep_fixing_here", (
                "the same configuration starts cleanly in the isolated environment but fails "
                "on the original cluster: look at the cluster's driver leftovers, device "
                "exposure, network, permissions and shared memory",), (
                f"original runs {', '.join(twin.runs)}: {_counts(twin.signatures)}",
                f"isolated runs {', '.join(ig.runs)}: {_counts(ig.signatures)}"))
    move, evidence, outside = _move_reasons(frame, original, evs)
    if move:
        return Decision("move_to_isolated", tuple(dict.fromkeys(move + outside)),
                        tuple(evidence))
    keep = _keep_fixing(original, evs, frame, evidence)
    if outside:
        # outside the boundary first; what the repeats show is still said
        return Decision("keep_fixing_here", (
            *outside, "bring the environment within the official compatibility boundaries "
            "first (kk3evidence check), then repeat", *keep.reasons), keep.evidence)
    return keep


def _hand_off(original: Sequence[RunGroup], isolated: Sequence[RunGroup],
              hosts: Mapping[str, str | None], frame: pl.DataFrame) -> Decision | None:
    """Hand off upstream only when the same failure reproduces on a different, isolated host
    and is not in the user's own configuration (config, port, weights)."""
    for ig in isolated:
        failing = [s for s in ig.signatures if s != "ok"]
        if len(ig.signatures) != 1 or not failing:
            continue
        sig = failing[0]
        twin = next((g for g in original if g.config == ig.config), None)
        if twin is None or sig not in twin.signatures:
            continue
        category = sig.split("/")[1] if sig.count("/") >= 2 else None
        iso_hosts = {hosts.get(r) for r in ig.runs}
        orig_hosts = {hosts.get(r) for r in twin.runs}
        facts = (f"original runs {', '.join(twin.runs)}: {_counts(twin.signatures)}",
                 f"isolated runs {', '.join(ig.runs)}: {_counts(ig.signatures)}")
        if None in iso_hosts or None in orig_hosts or iso_hosts & orig_hosts:
            return Decision("keep_fixing_here", (
                f"the failure {sig} repeats, but the run marked isolated is not on a different "
                "host (same or unknown hostname): rerun on a separate, isolated host before "
                "handing it off",), (
                *facts, f"hosts: original {sorted(map(str, orig_hosts))}, isolated "
                f"{sorted(map(str, iso_hosts))}"))
        if category in _USER_CATEGORIES:
            return Decision("keep_fixing_here", (
                f"the failure {sig} reproduces on an isolated host, but it is a {category} "
                "failure: it lies in this configuration (flags, port, weights), not in vLLM; "
                "fix the configuration",), facts)
        return Decision("hand_off_upstream", (
            f"the same failure ({sig}) reproduces on a different, isolated host with the same "
            f"configuration {ig.config}",), facts)
    return None


def _move_reasons(frame: pl.DataFrame, original: Sequence[RunGroup],
                  evs: Mapping[str, Evidence]) -> tuple[list[str], list[str], list[str]]:
    move: list[str] = []
    evidence: list[str] = []
    outside: list[str] = []
    for g in original:
        rows = frame.filter(pl.col("run").is_in(list(g.runs)))
        within = set(rows["within_boundaries"].to_list())
        if "no" in within:
            outside.append(f"configuration {g.config} runs outside the official compatibility "
                           "boundaries (kk3evidence check fails)")
            evidence.append(f"configuration {g.config}, runs {', '.join(g.runs)}: "
                            f"{_counts(g.signatures)}; outside the boundaries")
        elif g.stability == "varies":
            note = "" if within == {"yes"} else " (boundaries could not be fully checked)"
            move.append(f"(1) the failure point varies run to run within the official "
                        f"boundaries{note}")
            evidence.append(f"configuration {g.config}, runs {', '.join(g.runs)}: "
                            f"{_counts(g.signatures)}")
        if g.varying_fingerprint:
            move.append("(2) runs meant to be identical have different fingerprints: the "
                        "driver or container cannot be pinned")
            for k, vals in g.varying_fingerprint.items():
                evidence.append(f"configuration {g.config}: {k} varies: {', '.join(vals)}")
    busy = _busy(frame, evs)
    if busy:
        move.append("(3) other jobs use the GPUs or the node, so a single-variable experiment "
                    "is not possible")
        evidence.extend(busy[:5])
    return move, evidence, outside


def _original_runs(frame: pl.DataFrame, evs: Mapping[str, Evidence]) -> list[tuple[str, Evidence]]:
    names = set(frame.filter(pl.col("environment") == "original")["run"].to_list())
    return [(n, ev) for n, ev in evs.items() if n in names]


def _busy(frame: pl.DataFrame, evs: Mapping[str, Evidence]) -> list[str]:
    """Other work on the GPUs or node, from NVML process lists or the recorded notes."""
    out: list[str] = []
    for name, ev in _original_runs(frame, evs):
        procs = other_gpu_processes(ev)
        if procs:
            out.append(f"{name}: {'; '.join(procs[:3])}"
                       + (f" (+{len(procs) - 3} more)" if len(procs) > 3 else ""))
        noted = [t for t in ev.notes.texts if _BUSY_NOTE.search(t)]
        if noted:
            out.append(f"{name}: notes say {noted[0]!r}")
    return out


def _keep_fixing(original: Sequence[RunGroup], evs: Mapping[str, Evidence],
                 frame: pl.DataFrame, evidence: list[str]) -> Decision:
    runs = _original_runs(frame, evs)
    unknown = [n for n, ev in runs if other_gpu_processes(ev) is None]
    quiet = ("no other jobs seen on the GPUs" if not unknown else
             "GPU occupancy unknown (no NVML process list) for " + ", ".join(unknown[:3]))
    stable = [g for g in original if g.stability == "stable"]
    reasons: list[str] = []
    if stable:
        evidence.extend(f"configuration {g.config}, runs {', '.join(g.runs)}: "
                        f"{_counts(g.signatures)}" for g in stable)
        names = [r for g in stable for r in g.runs]
        pinned = frame.filter(pl.col("run").is_in(names)).select([n for n, _ in _PINNED])
        # "unchanged" only when something was recorded to compare
        fp = ("an unchanged fingerprint" if any(v is not None for col in pinned.iter_columns()
                                                 for v in col) else
              "no driver/image/vLLM versions recorded to compare")
        if any(s != "ok" for g in stable for s in g.signatures):
            reasons.append(f"the failure repeats at the same stage ({fp}; {quiet}): keep "
                           "changing one variable at a time here")
        else:
            reasons.append(f"the same configuration starts cleanly on every repeat ({fp}; "
                           f"{quiet}): keep restoring one variable at a time here")
    else:
        reasons.append("no repeated configuration yet: run the same configuration again to "
                       f"see whether the first failing stage is stable ({quiet})")
        evidence.extend(f"configuration {g.config}: {', '.join(g.runs)} -> "
                        f"{_counts(g.signatures)}" for g in original)
    return Decision("keep_fixing_here", tuple(reasons), tuple(evidence))


def _counts(sigs: Mapping[str, int]) -> str:
    return ", ".join(f"{s} x{n}" for s, n in sigs.items())


# --- entry points --------------------------------------------------------------------------


def compare_evidence(runs: Sequence[Evidence], *, isolated: Iterable[str] = (),
                     isolated_hosts: Iterable[str] = ()) -> Comparison:
    """Compare already-loaded runs (see module docs for the isolated-environment markers)."""
    iso = set(isolated)
    iso |= {str(Path(p).resolve()) for p in list(iso)}
    iso_hosts = set(isolated_hosts)
    rules = load_compat_rules()
    rows = []
    evs: dict[str, Evidence] = {}
    keys = [_config(ev) for ev in runs]
    with_request: dict[str, str] = {}
    for base, full in keys:
        if full is not None:
            with_request.setdefault(base, full)
    config_ids: dict[str, str] = {}
    for ev, (base, full) in zip(runs, keys, strict=True):
        name = ev.label
        n = 2
        while name in evs:
            name = f"{ev.label}#{n}"
            n += 1
        evs[name] = ev
        digest = full if full is not None else with_request.get(base, base)
        config_id = config_ids.setdefault(digest, f"C{len(config_ids) + 1}")
        result = check_evidence(ev, None, rules)
        unknown = any(r.status == "unknown" and r.rule.level == "error" for r in result.results)
        boundaries = "no" if not result.ok else "unknown" if unknown else "yes"
        row = _row(ev, _environment(ev, iso, iso_hosts), config_id, boundaries)
        row["run"] = name
        rows.append(row)
    frame = pl.DataFrame(rows, schema=_RUN_SCHEMA, orient="row") if rows else pl.DataFrame(
        schema=_RUN_SCHEMA)
    groups = []
    grouped = frame.group_by(["config", "environment"], maintain_order=True).agg(
        pl.col("run"), pl.col("signature"),
        *[pl.col(name).unique(maintain_order=True).alias(f"_{name}") for name, _ in _PINNED])
    for rec in grouped.iter_rows(named=True):
        sigs: dict[str, int] = {}
        for s in rec["signature"]:
            sigs[s] = sigs.get(s, 0) + 1
        varying = {name: tuple(str(v) for v in rec[f"_{name}"])
                   for name, _ in _PINNED if len(rec[f"_{name}"]) > 1}
        groups.append(RunGroup(rec["config"], rec["environment"], tuple(rec["run"]), sigs,
                               varying))
    return Comparison(frame, tuple(groups), _decide(frame, groups, evs))


def compare(bundles: Sequence[Evidence | str | Path], *, isolated: Iterable[str] = (),
            isolated_hosts: Iterable[str] = ()) -> Comparison:
    """Compare bundles (paths or loaded evidence): rows, groups, stability and the decision.

    ``isolated`` names bundles (paths or file names) run in the isolated environment;
    ``isolated_hosts`` names hosts that are isolated. Raises
    :class:`kk3evidence.errors.BundleError` for an unreadable bundle.
    """
    return compare_evidence([_evidence.coerce(b) for b in bundles], isolated=isolated,
                            isolated_hosts=isolated_hosts)
