"""Compare many runs: which configurations were repeated, is the failure stable, and what next.

``compare(bundles)`` puts one row per run into a polars DataFrame (configuration variables and
outcome), groups runs by identical configuration and environment, measures how stable the first
failing stage is across repeats, and applies the guide's decision (seed, last section):

* **move to an isolated environment** when, on the original cluster, (1) the failure point
  varies from run to run even within the official compatibility boundaries, (2) the
  fingerprints of runs meant to be identical differ (driver or container cannot be pinned), or
  (3) other jobs use the GPUs;
* **hand off upstream** when the same failure (stage + category + rule) reproduces in an
  isolated environment with the same configuration;
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl

from kk3evidence.handoff import evidence as _evidence
from kk3evidence.handoff.compat import check_evidence, load_compat_rules
from kk3evidence.handoff.diff import request_signature, serve_command
from kk3evidence.handoff.evidence import Evidence, dig, other_gpu_processes
from kk3evidence.model import FORMAT_IDS

__all__ = ["Comparison", "Decision", "RunGroup", "compare", "compare_evidence"]

Action = Literal["keep_fixing_here", "move_to_isolated", "hand_off_upstream"]
Environment = Literal["original", "isolated"]

ACTION_TEXT: dict[str, str] = {
    "keep_fixing_here": "keep fixing here",
    "move_to_isolated": "move to an isolated environment",
    "hand_off_upstream": "hand off upstream",
}

# Fingerprint fields that must not move between runs meant to be identical.
_PINNED: tuple[tuple[str, str], ...] = (
    ("driver", "gpus.driver_version"),
    ("cuda_driver", "gpus.cuda_driver_version"),
    ("kernel", "host.kernel"),
    ("image_id", "container.image_id"),
    ("vllm", "python.vllm_version"),
    ("torch", "python.torch_version"),
    ("torch_cuda", "python.torch_cuda"),
)

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

    def to_json(self) -> dict[str, Any]:
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

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "text": self.text, "reasons": list(self.reasons),
                "evidence": list(self.evidence)}


@dataclass(frozen=True, slots=True)
class Comparison:
    runs: pl.DataFrame
    groups: tuple[RunGroup, ...]
    decision: Decision

    def to_json(self) -> dict[str, Any]:
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
    if dig(ev.fingerprint, "host.hostname") in isolated_hosts:
        return "isolated"
    texts = [str(n) for n in ev.notes.get("notes") or []]
    cluster = ev.notes.get("cluster")
    if isinstance(cluster, Mapping) and cluster.get("text"):
        texts.append(str(cluster["text"]))
    if any(_ISOLATED_NOTE.search(t) for t in texts):
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
        command: Any = {"model": cmd.model, "flags": dict(sorted(flags.items()))}
    else:
        command = list(ev.argv)
    env = dig(ev.fingerprint, "env") or {}
    config: dict[str, Any] = {
        "command": command,
        "env": dict(sorted(env.items())) if isinstance(env, Mapping) else {},
        "image_ref": dig(ev.fingerprint, "container.image_ref"),
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
    devices = dig(fp, "gpus.devices") or []
    names = sorted({str(d.get("name")) for d in devices if isinstance(d, Mapping)})
    req = next((r for r in ev.requests if r.get("kind") == "fixed"), None) or (
        ev.requests[0] if ev.requests else None)
    row: dict[str, Any] = {
        "run": ev.label,
        "environment": env,
        "host": dig(fp, "host.hostname"),
        "config": config_id,
        "model": str(cmd.model) if cmd is not None and cmd.model else None,
        "flags": _flags_text(ev),
        "gpus": len(devices) if dig(fp, "gpus.source") == "nvml" else None,
        "gpu_name": ", ".join(names) or None,
        "input_length": _int(sig.get("input_length")),
        "max_tokens": _int(sig.get("max_tokens")),
        "concurrency": _int(sig.get("concurrency")),
        "other_gpu_processes": len(other_gpu_processes(ev)),
        "within_boundaries": boundaries,
        "first_failure_stage": ff.get("stage"),
        "first_failure_category": ff.get("category"),
        "first_failure_rule": ff.get("rule"),
        "last_stage": ev.last_stage_reached,
        "exit_code": _int(ev.launch.get("exit_code")),
        "request_status": _int(req.get("status")) if req else None,
        "signature": _signature(ev),
        "image_ref": dig(fp, "container.image_ref"),
    }
    for name, path in _PINNED:
        v = dig(fp, path)
        row[name] = None if v is None else str(v)
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
    reasons: list[str] = []
    evidence: list[str] = []
    original = [g for g in groups if g.environment == "original"]
    isolated = [g for g in groups if g.environment == "isolated"]

    # Hand off upstream: the same failure reproduces in the isolated environment.
    for ig in isolated:
        failing = [s for s in ig.signatures if s != "ok"]
        if len(ig.signatures) != 1 or not failing:
            continue
        sig = failing[0]
        twin = next((g for g in original if g.config == ig.config), None)
        if twin is not None and sig in twin.signatures:
            reasons.append(f"the same failure ({sig}) reproduces in the isolated environment "
                           f"with the same configuration {ig.config}")
            evidence.append(f"original runs {', '.join(twin.runs)}: "
                            f"{_counts(twin.signatures)}")
            evidence.append(f"isolated runs {', '.join(ig.runs)}: {_counts(ig.signatures)}")
            return Decision("hand_off_upstream", tuple(reasons), tuple(evidence))
        if twin is None and len(ig.runs) >= 2:
            reasons.append(f"the failure {sig} repeats in every isolated run of configuration "
                           f"{ig.config} (no original-cluster run of the same configuration to "
                           "match it against)")
            evidence.append(f"isolated runs {', '.join(ig.runs)}: {_counts(ig.signatures)}")
            return Decision("hand_off_upstream", tuple(reasons), tuple(evidence))

    # Isolated runs pass where the original cluster fails: the cluster is the suspect.
    for ig in isolated:
        twin = next((g for g in original if g.config == ig.config), None)
        if twin is not None and set(ig.signatures) == {"ok"} and any(
                s != "ok" for s in twin.signatures):
            reasons.append("the same configuration starts cleanly in the isolated environment "
                           "but fails on the original cluster: look at the cluster's driver "
                           "leftovers, device exposure, network, permissions and shared memory")
            evidence.append(f"original runs {', '.join(twin.runs)}: {_counts(twin.signatures)}")
            evidence.append(f"isolated runs {', '.join(ig.runs)}: {_counts(ig.signatures)}")
            return Decision("keep_fixing_here", tuple(reasons), tuple(evidence))

    move_reasons: list[str] = []
    boundary_failures: list[str] = []
    for g in original:
        rows = frame.filter(pl.col("run").is_in(list(g.runs)))
        within = set(rows["within_boundaries"].to_list())
        if g.stability == "varies":
            if "no" in within:
                boundary_failures.append(
                    f"configuration {g.config}: failure point varies ({_counts(g.signatures)}) "
                    "but the runs are outside the official boundaries")
            else:
                note = "" if within == {"yes"} else " (boundaries could not be fully checked)"
                move_reasons.append(f"(1) the failure point varies run to run within the "
                                    f"official boundaries{note}")
                evidence.append(f"configuration {g.config}, runs {', '.join(g.runs)}: "
                                f"{_counts(g.signatures)}")
        if g.varying_fingerprint:
            move_reasons.append("(2) runs meant to be identical have different fingerprints: "
                                "the driver or container cannot be pinned")
            for k, vals in g.varying_fingerprint.items():
                evidence.append(f"configuration {g.config}: {k} varies: {', '.join(vals)}")
    busy = [(name, procs) for name, ev in evs.items()
            if frame.filter(pl.col("run") == name)["environment"].to_list() == ["original"]
            and (procs := other_gpu_processes(ev))]
    if busy:
        move_reasons.append("(3) other jobs use the GPUs, so a single-variable experiment is "
                            "not possible")
        for name, procs in busy[:5]:
            evidence.append(f"{name}: {'; '.join(procs[:3])}"
                            + (f" (+{len(procs) - 3} more)" if len(procs) > 3 else ""))
    if move_reasons:
        return Decision("move_to_isolated", tuple(dict.fromkeys(move_reasons)), tuple(evidence))

    if boundary_failures:
        reasons.append("bring the environment within the official compatibility boundaries "
                       "first (kk3evidence check), then repeat")
        return Decision("keep_fixing_here", tuple(reasons), tuple(boundary_failures))
    stable = [g for g in original if g.stability == "stable"]
    if stable:
        for g in stable:
            evidence.append(f"configuration {g.config}, runs {', '.join(g.runs)}: "
                            f"{_counts(g.signatures)}")
        if any(s != "ok" for g in stable for s in g.signatures):
            reasons.append("the failure repeats at the same stage in a pinned environment with "
                           "no other jobs: keep changing one variable at a time here")
        else:
            reasons.append("the same configuration starts cleanly on every repeat in a pinned "
                           "environment with no other jobs: keep restoring one variable at a "
                           "time here")
    else:
        reasons.append("no repeated configuration yet: run the same configuration again to "
                       "see whether the first failing stage is stable")
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
