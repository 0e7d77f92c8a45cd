"""The guide's 11-item hand-off checklist, each item judged from the evidence.

One function per item, registered with its key; the order and the titles (en/ko) are
``i18n.CHECKLIST``. Adding an item: a title row in ``i18n.CHECKLIST``, its strings, and one
``@_item("key")`` function here (a test checks that the two lists agree).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

from kk3evidence.handoff.compat import container_cuda
from kk3evidence.handoff.diff import DiffResult, request_signature, serve_command
from kk3evidence.handoff.evidence import Evidence, other_gpu_processes
from kk3evidence.handoff.report.common import (
    ChecklistItem,
    Status,
    feature_flags,
    fixed_request,
    round_flags,
    truncate,
    verdict_text,
)
from kk3evidence.handoff.report.i18n import CHECKLIST, Lang, stage_name, text
from kk3evidence.vllm_args import ServeCommand

__all__ = ["ITEMS", "evaluate_checklist"]


@dataclass(frozen=True, slots=True)
class Round:
    """What every item is judged from: this run, and the baseline round when there is one."""

    ev: Evidence
    baseline_diff: DiffResult | None
    baseline: Evidence | None
    lang: Lang


Judgement = tuple[Status, str]
ItemFn = Callable[[Round], Judgement]

#: key -> the function judging that item (filled by ``@_item``; order comes from CHECKLIST)
ITEMS: dict[str, ItemFn] = {}


def _item(key: str) -> Callable[[ItemFn], ItemFn]:
    def register(fn: ItemFn) -> ItemFn:
        if key in ITEMS:
            raise ValueError(f"checklist item {key!r} registered twice")
        ITEMS[key] = fn
        return fn
    return register


def evaluate_checklist(ev: Evidence, baseline_diff: DiffResult | None = None,
                       baseline: Evidence | None = None,
                       lang: Lang = "en") -> tuple[ChecklistItem, ...]:
    """The guide's 11-item hand-off checklist, each judged from the evidence."""
    r = Round(ev, baseline_diff, baseline, lang)
    items = []
    for key, en, ko in CHECKLIST:
        status, why = ITEMS[key](r)
        items.append(ChecklistItem(key, ko if lang == "ko" else en, status, why))
    return tuple(items)


@_item("driver_cuda_same_time")
def _driver_cuda(r: Round) -> Judgement:
    """1. driver + container CUDA in the same snapshot"""
    fp, lang = r.ev.fingerprint, r.lang
    driver = fp.gpus.driver_version
    cuda, _ = container_cuda(r.ev)
    source = fp.gpus.source or "?"
    cuda_s = ".".join(str(x) for x in cuda) if cuda else None
    if driver and cuda_s:
        return "pass", text(lang, "ck1_pass", driver=driver, cuda=cuda_s,
                            at=fp.raw.get("collected_at") or "?")
    if driver:
        return "fail", text(lang, "ck1_fail_cuda", driver=driver)
    if cuda_s and source == "nvml":
        return "fail", text(lang, "ck1_fail_driver", cuda=cuda_s, source=source)
    return "unknown", text(lang, "ck1_unknown", source=source)


@_item("image_id")
def _image_id(r: Round) -> Judgement:
    """2. image id"""
    c, lang = r.ev.fingerprint.container, r.lang
    if c.image_id:
        return "pass", text(lang, "ck2_pass", image_id=truncate(c.image_id, 24),
                            how=c.image_id_source or "?")
    if c.image_ref:
        return "fail", text(lang, "ck2_fail", ref=c.image_ref)
    if c.runtime:
        return "fail", text(lang, "ck2_fail_none", runtime=c.runtime)
    return "unknown", text(lang, "ck2_unknown", runtime=c.runtime or "none")


@_item("minimal_command")
def _minimal_command(r: Round) -> Judgement:
    """3. minimal command"""
    cmd = serve_command(r.ev.argv)
    if cmd is None:
        return "unknown", text(r.lang, "ck3_unknown")
    feats = feature_flags(r.ev, round_flags(r.baseline_diff))
    if feats:
        return "fail", text(r.lang, "ck3_fail", flags=", ".join(feats))
    return "pass", text(r.lang, "ck3_pass", n=len(cmd.flags))


@_item("first_error_kept")
def _first_error_kept(r: Round) -> Judgement:
    """4. first error stack and the log before it"""
    ev, lang = r.ev, r.lang
    members = {str(m.get("name")) for m in ev.manifest.get("members") or []
               if isinstance(m, Mapping)}
    losses = ev.manifest.get("losses") or []
    lines_total = (ev.analysis or {}).get("lines_total", "?")
    ff = ev.first_failure
    if losses:
        return "fail", text(lang, "ck4_fail_loss", loss=truncate(
            json.dumps(losses[0], ensure_ascii=False), 120))
    if ev.manifest and "logs/combined.log" not in members:
        return "fail", text(lang, "ck4_fail_missing")
    if ff is not None:
        return "pass", text(lang, "ck4_pass", lines=lines_total, line_no=ff.get("line_no"),
                            before=max(0, int(cast(int, ff.get("line_no") or 1)) - 1))
    return "pass", text(lang, "ck4_pass_ok", lines=lines_total)


@_item("fixed_request")
def _fixed_request(r: Round) -> Judgement:
    """5. fixed input and output cap"""
    if fixed_request(r.ev) is None:
        return "unknown", text(r.lang, "ck5_unknown")
    sig = request_signature(r.ev)
    if sig.get("max_tokens") is None:
        return "fail", text(r.lang, "ck5_fail")
    return "pass", text(r.lang, "ck5_pass", cap=sig.get("max_tokens"),
                        temp=sig.get("temperature"), chars=sig.get("input_length"))


@_item("single_vs_load")
def _single_vs_load(r: Round) -> Judgement:
    """6. single request vs load"""
    req = fixed_request(r.ev)
    if req is None:
        return "unknown", text(r.lang, "ck5_unknown")
    conc = [q for q in r.ev.requests if q.kind == "concurrency"]
    if req.kind == "concurrency":
        return "fail", text(r.lang, "ck6_fail")
    if conc:
        return "pass", text(r.lang, "ck6_pass_both", k=len(conc))
    return "pass", text(r.lang, "ck6_pass", n=len(r.ev.requests))


@_item("one_variable")
def _one_variable(r: Round) -> Judgement:
    """7. one variable per round"""
    changes, d, lang = r.ev.notes.changes, r.baseline_diff, r.lang
    if d is not None:
        summary = verdict_text(d, lang)
        if d.verdict == "several":
            return "fail", text(lang, "ck7_fail", summary=summary)
        return "pass", text(lang, "ck7_pass", summary=summary)
    if changes:
        shown = "; ".join(f"{c.variable}: {c.before} -> {c.after}" for c in changes[:4])
        if len(changes) == 1:
            return "pass", text(lang, "ck7_notes_pass", change=shown)
        return "fail", text(lang, "ck7_notes_fail", n=len(changes), changes=shown)
    return "unknown", text(lang, "ck7_unknown")


_REVERT = re.compile(r"revert|rollback|roll back|back to baseline|되돌|복귀", re.I)


@_item("reverted_baseline")
def _reverted_baseline(r: Round) -> Judgement:
    """8. back to the last stable baseline when the error changed"""
    notes, lang = r.ev.notes, r.lang
    notes_text = list(notes.notes) + [f"{c.variable} {c.after}" for c in notes.changes]
    revert = next((n for n in notes_text if _REVERT.search(n)), None)
    if r.baseline is not None and r.baseline_diff is not None:
        bff = r.baseline.first_failure
        if bff is None and r.baseline_diff.verdict == "none":
            # This run is the baseline's configuration again: that is going back.
            return "pass", text(lang, "ck8_pass_baseline")
        if bff is not None and not revert:
            return "fail", text(lang, "ck8_fail", stage=stage_name(lang, bff.get("stage")),
                                category=bff.get("category"))
        return "unknown", text(lang, "ck8_unknown")
    if revert:
        return "pass", text(lang, "ck8_pass_notes", note=truncate(revert, 100))
    return "unknown", text(lang, "ck8_unknown")


@_item("prefix_caching")
def _prefix_caching(r: Round) -> Judgement:
    """9. prefix caching verified separately and explicitly (judged on what the engine ran
    with: vLLM's V1 engine turns it on by default)"""
    return _prefix_item(r.ev, serve_command(r.ev.argv), r.baseline_diff, r.lang)


@_item("repro_limits")
def _repro_limits(r: Round) -> Judgement:
    """10. limits written: this document has the section"""
    return "pass", text(r.lang, "ck10_pass")


@_item("cluster_state")
def _cluster_state(r: Round) -> Judgement:
    """11. other jobs and GPU occupancy"""
    ev, lang = r.ev, r.lang
    gpus = ev.fingerprint.gpus
    source = gpus.source or "?"
    cluster_text = (ev.notes.cluster.text if ev.notes.cluster else None) or ""
    auto_text = cluster_text.startswith("GPU state unknown")  # capture's own "no NVML" note
    if source == "nvml" and gpus.devices:
        return "pass", text(lang, "ck11_pass_nvml", n=len(gpus.devices),
                            others=len(other_gpu_processes(ev) or []))
    if cluster_text and not auto_text:
        return "pass", text(lang, "ck11_pass_notes", text=truncate(cluster_text, 100))
    if source == "error":
        return "fail", text(lang, "ck11_fail", error=gpus.error or cluster_text or "NVML error")
    return "unknown", text(lang, "ck11_unknown")


def _prefix_metrics(ev: Evidence) -> tuple[float, float] | None:
    text_ = ev.metrics.get("after") or next(
        (v for k, v in ev.metrics.items() if k.startswith("after")), None)
    if not text_:
        return None
    found: dict[str, float] = {}
    for line in text_.splitlines():
        m = re.match(r"^vllm:prefix_cache_(queries|hits)_total(?:\{[^}]*\})?\s+(\S+)", line)
        if m:
            try:
                found[m.group(1)] = found.get(m.group(1), 0.0) + float(m.group(2))
            except ValueError:
                continue
    if "queries" in found:
        return found["queries"], found.get("hits", 0.0)
    return None


def _prefix_item(ev: Evidence, cmd: ServeCommand | None, d: DiffResult | None,
                 lang: Lang) -> tuple[Status, str]:
    pc = cmd.flags.get("enable-prefix-caching") if cmd is not None else None
    eng = ev.engine_config
    eff = eng.enable_prefix_caching if eng is not None else None
    line = eng.lines.get("enable_prefix_caching") if eng is not None else None
    on = eff if eff is not None else (True if pc is True else None)
    pm = _prefix_metrics(ev)
    others = [c.label for c in d.variables] if d else []
    probe = ev.prefix_probe
    if probe is not None and on is not False:
        # capture's probe ran the same long prompt twice: its four checks are the evidence
        failed = [c.id for c in probe.checks if c.status == "fail"]
        if failed:
            return "fail", text(lang, "ck9_probe_fail", checks=", ".join(failed))
        if probe.status("second_request_hits_cache") == "pass":
            return "pass", text(lang, "ck9_probe_pass", n=len(probe.checks))
    if on is True:
        if d is not None and others == ["--enable-prefix-caching"]:
            return "pass", text(lang, "ck9_pass_diff")
        if d is not None and "--enable-prefix-caching" in others:
            return "fail", text(lang, "ck9_fail_mixed", names=", ".join(others))
        if pc is not True:
            # On by default: not chosen in this round, so not yet verified on its own.
            how = text(lang, "ck9_engine_line", line=line if line is not None else "?")
            if pm is not None:
                return "pass", text(lang, "ck9_pass_default_metrics", how=how,
                                    queries=int(pm[0]), hits=int(pm[1]))
            return "unknown", text(lang, "ck9_default_on", how=how)
        if pm is not None:
            return "pass", text(lang, "ck9_pass_metrics", queries=int(pm[0]), hits=int(pm[1]))
        return "fail", text(lang, "ck9_fail_nobase")
    if on is False:
        how = (text(lang, "ck9_engine_off", line=line) if line is not None else
               "--no-enable-prefix-caching")
        return "unknown", text(lang, "ck9_unknown_off", how=how)
    return "unknown", text(lang, "ck9_unknown_no_engine")
