"""The hand-off document: everything a platform or upstream team needs to reproduce a run.

``render_report(bundle, baseline=..., fmt=..., lang=...)`` builds one document from a bundle:
the fingerprint table, the minimal start command, the fixed request and response, the first
failing stage with its evidence lines, the single-variable result against a baseline, the
official compatibility boundaries, the guide's 11-item checklist evaluated from the evidence
(pass / fail / unknown and why), and the reproducibility limits of online serving.

The content is built once as a small block model (:class:`Doc`) and rendered as Markdown,
as a GitHub issue following vLLM's bug-report template, or as one self-contained HTML file
(inline CSS and an inline-SVG stage timeline, nothing fetched from the network).
Pure: no I/O besides reading the bundles.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import urlsplit

from kk3evidence._version import __version__
from kk3evidence.errors import UsageError
from kk3evidence.handoff import evidence as _evidence
from kk3evidence.handoff.compat import CheckResult, check_evidence
from kk3evidence.handoff.diff import DiffResult, diff_evidence, serve_command
from kk3evidence.handoff.evidence import Evidence, LogLine
from kk3evidence.handoff.report.checklist import evaluate_checklist
from kk3evidence.handoff.report.common import (
    ChecklistItem,
    minimal_command,
)
from kk3evidence.handoff.report.common import fixed_request as _fixed
from kk3evidence.handoff.report.common import round_flags as _round_flags
from kk3evidence.handoff.report.common import truncate as _truncate
from kk3evidence.handoff.report.common import verdict_text as _verdict_text
from kk3evidence.handoff.report.i18n import (
    LANGS,
    Lang,
    class_name,
    stage_name,
    status_name,
    text,
)
from kk3evidence.model import STAGES

__all__ = [
    "FORMATS",
    "ChecklistItem",
    "Doc",
    "build_report",
    "evaluate_checklist",
    "render_report",
]

Format = Literal["markdown", "html", "github", "snippet"]
FORMATS: tuple[Format, ...] = ("markdown", "html", "github", "snippet")



# --- block model ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True, slots=True)
class Para:
    text: str  # may hold **bold** and `code`


@dataclass(frozen=True, slots=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    status_col: int | None = None  # a column holding pass/fail/unknown, styled in HTML


@dataclass(frozen=True, slots=True)
class Code:
    text: str
    lang: str = ""


@dataclass(frozen=True, slots=True)
class Lines:
    lines: tuple[LogLine, ...]
    mark: int | None = None  # line_no of the first causal line


@dataclass(frozen=True, slots=True)
class Details:
    summary: str
    blocks: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Timeline:
    spans: tuple[tuple[str, str, float, float], ...]  # stage, status, start, end
    unit: Literal["s", "line"]
    failure_at: float | None
    ready_at: float | None
    labels: Mapping[str, str] = field(default_factory=dict)


Block = Heading | Para | Bullets | Table | Code | Lines | Details | Timeline


@dataclass(frozen=True, slots=True)
class Doc:
    title: str
    lang: Lang
    blocks: tuple[Block, ...]


# --- small helpers ---------------------------------------------------------------------------




def _v(value: Any, lang: Lang) -> str:
    if value is None or value == "":
        return text(lang, "not_recorded")
    return str(value)


def _gib(n: Any) -> str:
    return f"{n / 2**30:.1f} GiB" if isinstance(n, int | float) else "?"


def _secs(x: Any) -> str:
    return f"{float(x):.1f} s" if isinstance(x, int | float) else "?"


def _model_name(ev: Evidence) -> str:
    cmd = serve_command(ev.argv)
    if cmd is not None and cmd.model:
        return str(cmd.model)
    return ev.launch.served_model or "?"


# --- sections ------------------------------------------------------------------------------


def _summary(ev: Evidence, lang: Lang) -> list[Block]:
    ff = ev.first_failure
    last = stage_name(lang, ev.last_stage_reached) if ev.last_stage_reached else text(
        lang, "unknown")
    out: list[Block] = []
    if ff is not None:
        proc = text(lang, "process", process=ff["process"]) if ff.get("process") else ""
        out.append(Para(text(lang, "sum_failed", stage=stage_name(lang, ff.get("stage")),
                             category=ff.get("category"), rule=ff.get("rule"),
                             line_no=ff.get("line_no"), process=proc, last=last)))
    else:
        req = _fixed(ev)
        if req is not None and ev.launch.ready_seconds is not None:
            out.append(Para(text(lang, "sum_ok_ready", ready=_secs(ev.launch.ready_seconds),
                                 status=req.status)))
        else:
            out.append(Para(text(lang, "sum_ok_noreq", last=last)))
    if ev.launch.port_holder:
        out.append(Para(text(lang, "sum_port_holder", holder=ev.launch.port_holder)))
    code = ev.launch.exit_code
    extra = text(lang, "sum_exit", code=code) if code is not None else ""
    out.append(Para(f"{text(lang, 'sum_model', model=_model_name(ev), bundle=ev.label)} {extra}"
                    .strip()))
    return out


def fingerprint_rows(ev: Evidence, lang: Lang) -> list[tuple[str, str, str]]:
    fp = ev.fingerprint
    host = " / ".join(str(x) for x in (fp.host.kernel, fp.host.os, fp.host.arch) if x)
    devices = fp.gpus.devices
    if devices:
        names: dict[str, int] = {}
        for d in devices:
            key = f"{d.name or '?'} ({_gib(d.memory_total_bytes)})"
            names[key] = names.get(key, 0) + 1
        gpus = ", ".join(f"{n}x {k}" for k, n in names.items())
        used = [d.memory_used_bytes for d in devices]
        gpus += "; " + text(lang, "fp_in_use", size=_gib(
            None if None in used else sum(u or 0 for u in used)))
    else:
        gpus = text(lang, "fp_no_gpu", source=fp.gpus.source or "?")
    libs = [f"{lib.name} {lib.version or ''}".strip() for lib in fp.libraries]
    env = fp.env
    env_text = ", ".join(f"{k}={v}" for k, v in sorted(env.items())) if env else ""
    c = "fingerprint.json"
    return [
        (text(lang, "fp_host"), _v(host, lang), f"{c} host"),
        (text(lang, "fp_cpu"), text(lang, "fp_cpu_value", n=fp.host.cpu_count or "?",
                                    mem=_gib(fp.host.mem_total_bytes)), f"{c} host"),
        (text(lang, "fp_gpus"), gpus, f"{c} gpus (NVML)"),
        (text(lang, "fp_driver"), _v(fp.gpus.driver_version, lang), f"{c} gpus"),
        (text(lang, "fp_cuda_driver"), _v(fp.gpus.cuda_driver_version, lang),
         f"{c} gpus"),
        (text(lang, "fp_runtime"), _v(fp.container.runtime, lang),
         _v(fp.container.runtime_source, lang)),
        (text(lang, "fp_image_ref"), _v(fp.container.image_ref, lang),
         _v(fp.container.image_ref_source, lang)),
        (text(lang, "fp_image_id"), _v(fp.container.image_id, lang),
         _v(fp.container.image_id_source, lang)),
        (text(lang, "fp_python"), f"{_v(fp.python.python_version, lang)} "
                                  f"({_v(fp.python.interpreter, lang)})",
         f"{c} python"),
        (text(lang, "fp_vllm"), _v(fp.python.vllm_version, lang), f"{c} python"),
        (text(lang, "fp_torch"), _v(fp.python.torch_version, lang), f"{c} python"),
        (text(lang, "fp_torch_cuda"), _v(fp.python.torch_cuda, lang), f"{c} python"),
        (text(lang, "fp_nccl"), _v(fp.python.nccl_version, lang), f"{c} python"),
        (text(lang, "fp_visible"), _v(fp.python.cuda_device_count, lang),
         f"{c} python"),
        (text(lang, "fp_libs"), ", ".join(libs) or text(lang, "not_recorded"),
         f"{c} libraries (/proc/PID/maps)"),
        (text(lang, "fp_env"), env_text or text(lang, "none"), f"{c} env"),
        (text(lang, "fp_collected"), _v(fp.raw.get("collected_at"), lang), c),
    ]


def _command(ev: Evidence, lang: Lang, keep: set[str] | frozenset[str] = frozenset()
             ) -> list[Block]:
    if not ev.argv:
        return [Para(text(lang, "cmd_none"))]
    import shlex

    out: list[Block] = [Para(text(lang, "cmd_as_run")),
                        Code(" ".join(shlex.quote(a) for a in ev.argv), "bash")]
    minimal, removed = minimal_command(ev, keep)
    if minimal is None:
        return out
    if removed:
        out += [Para(text(lang, "cmd_minimal")), Code(minimal, "bash"),
                Para(text(lang, "cmd_removed")),
                Bullets(tuple(f"`{r.flag}` ({class_name(lang, r.cls)}): {r.why}"
                              for r in removed))]
    else:
        out.append(Para(text(lang, "cmd_is_minimal")))
    return out


def _response_excerpt(body: Any) -> str:
    if isinstance(body, Mapping):
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
            ch = choices[0]
            msg = ch.get("message") if isinstance(ch.get("message"), Mapping) else None
            content = msg.get("content") if msg else ch.get("text")
            if isinstance(content, str):
                content = _truncate(content, 400)
            slim = {"content": content, "finish_reason": ch.get("finish_reason")}
            return json.dumps(slim, ensure_ascii=False, indent=2)
        return _truncate(json.dumps(body, ensure_ascii=False, indent=2), 1200)
    return _truncate(str(body), 1200)


def _request(ev: Evidence, lang: Lang) -> list[Block]:
    req = _fixed(ev)
    if req is None:
        return [Para(text(lang, "req_none"))]
    url = req.url or ""
    out: list[Block] = [Para(text(
        lang, "req_line", method=req.method or "POST", path=urlsplit(url).path or url,
        status=req.status if req.status is not None else "-",
        latency=_secs(req.latency_s)))]
    out += [Para(text(lang, "req_body")),
            Code(json.dumps(req.request_body, ensure_ascii=False, indent=2), "json")]
    if req.error:
        out.append(Para(text(lang, "req_error", error=req.error)))
    if req.response_body is not None:
        out += [Para(text(lang, "req_response")),
                Code(_response_excerpt(req.response_body), "json")]
    cached = req.cached_tokens
    usage = req.usage
    out.append(Para(text(lang, "req_usage",
                         usage=json.dumps(usage, ensure_ascii=False) if usage else "-",
                         cached=cached if cached is not None else
                         text(lang, "req_cached_unknown"))))
    others = [r for r in ev.requests if r is not req]
    if others:
        out.append(Para(text(lang, "req_more", n=len(others), names=", ".join(
            f"{r.name} ({r.kind}, HTTP {r.status})" for r in others))))
    return out


def _failure(ev: Evidence, lang: Lang) -> list[Block]:
    ff = ev.first_failure
    if ff is None:
        out: list[Block] = [Para(text(lang, "fail_none",
                                      last=ev.last_stage_reached or text(lang, "unknown")))]
        return out
    proc = text(lang, "process", process=ff["process"]) if ff.get("process") else ""
    out = [Para(text(lang, "fail_fields", stage=stage_name(lang, ff.get("stage")),
                     category=ff.get("category"),
                     rule=ff.get("rule"), line_no=ff.get("line_no"), process=proc))]
    if ev.log_window:
        out += [Para(text(lang, "fail_lines")), Lines(ev.log_window, int(cast(int, ff["line_no"])))]
    else:
        out.append(Code(str(ff.get("text") or ""), "text"))
    cons = (ev.analysis or {}).get("consequences") or []
    if cons:
        out.append(Para(text(lang, "fail_conseq", n=len(cons))))
        out.append(Bullets(tuple(text(lang, "line_no", n=c.get("line_no"))
                                 + f": `{_truncate(str(c.get('text')), 160)}`"
                                 for c in cons[:3])))
        out.append(Para(text(lang, "fail_note")))
    stall = (ev.analysis or {}).get("stall")
    if isinstance(stall, dict):
        # A hang: where progress stopped, the rank matrix and what each process waited in.
        from kk3evidence.analysis.hang import describe_stall

        out += [Para(text(lang, "fail_stall")), Code("\n".join(describe_stall(stall)), "text")]
    return out


def _iso_seconds(value: Any) -> float | None:
    from datetime import datetime

    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def timeline(ev: Evidence, lang: Lang) -> Timeline | None:
    stages = (ev.analysis or {}).get("stages") or []
    if not stages:
        return None
    times = ev.line_times
    t0 = _iso_seconds(ev.launch.started_at)
    if times and t0 is None:
        t0 = min(times.values())
    unit: Literal["s", "line"] = "s" if times and t0 is not None else "line"

    def at(line: int) -> float:
        if unit == "s" and t0 is not None:
            # nearest known line at or before
            for n in range(line, 0, -1):
                if n in times:
                    return max(0.0, times[n] - t0)
            return 0.0
        return float(line)

    spans = []
    for s in stages:
        first, last = int(s.get("first_line") or 0), int(s.get("last_line") or 0)
        start, end = at(first), at(max(first, last))
        took = s.get("seconds")
        if unit == "s" and isinstance(took, int | float):
            end = max(end, start + float(took))  # time in the stage, until the next one began
        spans.append((str(s.get("stage")), str(s.get("status")), start, end))
    ff = ev.first_failure
    failure_at = at(int(cast(int, ff["line_no"]))) if ff and ff.get("line_no") else None
    ready = ev.launch.ready_seconds
    ready_at = float(ready) if unit == "s" and isinstance(ready, int | float) else None
    labels = {"ready": text(lang, "tl_ready"), "failure": text(lang, "tl_first_failure"),
              "axis": text(lang, "tl_axis_s" if unit == "s" else "tl_axis_l")}
    return Timeline(tuple(spans), unit, failure_at, ready_at, labels)


def _timeline(ev: Evidence, lang: Lang) -> list[Block]:
    tl = timeline(ev, lang)
    if tl is None:
        return [Para(text(lang, "tl_none"))]
    rows = []
    for stage, status, start, end in tl.spans:
        s: Mapping[str, Any] = next((x for x in (ev.analysis or {}).get("stages") or []
                                     if x.get("stage") == stage), {})
        when = f"{start:.1f}–{end:.1f} s" if tl.unit == "s" else "-"
        took = s.get("seconds")
        dur = f"{float(took):.1f} s" if isinstance(took, int | float) else "-"
        rows.append((stage_name(lang, stage), status_name(lang, status),
                     f"{s.get('first_line')}–{s.get('last_line')}", when, dur))
    return [tl, Table((text(lang, "tl_stage"), text(lang, "tl_status"), text(lang, "tl_lines"),
                       text(lang, "tl_time"), text(lang, "tl_duration")), tuple(rows),
                      status_col=1)]


def _baseline(d: DiffResult | None, lang: Lang) -> list[Block]:
    if d is None:
        return [Para(text(lang, "base_none"))]
    out: list[Block] = [Para(text(lang, "base_against", baseline=Path(d.a).name,
                                  summary=_verdict_text(d, lang)))]
    if d.variables:
        out += [Para(text(lang, "base_changes")),
                Bullets(tuple(f"`{c.describe()}`" for c in d.variables))]
    follow = [c for c in d.changes if c.group != "outcome" and not c.counted]
    if follow:
        out += [Para(text(lang, "base_follow")),
                Bullets(tuple(f"`{c.describe()}`" for c in follow))]
    if d.outcome:
        out += [Para(text(lang, "base_outcome")),
                Bullets(tuple(f"`{c.describe()}`" for c in d.outcome))]
    else:
        out.append(Para(text(lang, "base_same_outcome")))
    if d.verdict == "several":
        out.append(Para(text(lang, "base_several_hint")))
    return out


_STATUS_KEY = {"pass": "pass", "fail": "fail", "unknown": "unknown_status"}


def _compat(result: CheckResult, lang: Lang) -> list[Block]:
    head = (text(lang, "compat_recipe", recipe=result.recipe,
                 auto=text(lang, "compat_auto") if result.recipe_auto else "")
            if result.recipe else text(lang, "compat_generic"))
    rows = []
    for r in result.results:
        level = text(lang, "warning") if r.rule.level == "warning" else ""
        rows.append((f"{r.rule.id} {r.rule.name}{level}",
                     text(lang, _STATUS_KEY[r.status]), r.reason,
                     f"{r.rule.source} ({r.rule.source_date})"))
    return [Para(head), Table((text(lang, "compat_rule"), text(lang, "compat_result"),
                               text(lang, "compat_why"), text(lang, "compat_source")),
                              tuple(rows), status_col=1)]


# --- checklist -----------------------------------------------------------------------------


def _checklist(items: Sequence[ChecklistItem], lang: Lang) -> list[Block]:
    mark = {"pass": "[x]", "fail": "[ ]", "unknown": "[?]"}
    rows = tuple((f"{mark[i.status]} {i.title}", text(lang, _STATUS_KEY[i.status]), i.why)
                 for i in items)
    c = {s: sum(1 for i in items if i.status == s) for s in ("pass", "fail", "unknown")}
    return [Table((text(lang, "ck_item"), text(lang, "ck_result"), text(lang, "ck_why")), rows,
                  status_col=1),
            Para(text(lang, "ck_counts", p=c["pass"], f=c["fail"], u=c["unknown"]) + " "
                 + text(lang, "ck_gate"))]


def _limits(ev: Evidence, lang: Lang) -> list[Block]:
    names = sorted({str(d.name) for d in ev.fingerprint.gpus.devices})
    gpus = ", ".join(names) if names else f"CPU {ev.fingerprint.host.arch or ''}".strip()
    items = [text(lang, "lim_1"), text(lang, "lim_2", gpus=gpus), text(lang, "lim_3"),
             text(lang, "lim_4"),
             text(lang, "lim_5", n=len(ev.manifest.get("redactions") or []))]
    req = _fixed(ev)
    if req is not None and req.cached_tokens is None:
        items.append(text(lang, "lim_cached"))
    nc = ev.manifest.get("not_collected") or []
    if nc:
        items.append(text(lang, "lim_nc", items="; ".join(
            f"{x.get('what')} ({x.get('reason')})" for x in nc if isinstance(x, Mapping))))
    return [Para(text(lang, "lim_intro")), Bullets(tuple(items))]


def _about(ev: Evidence, lang: Lang) -> list[Block]:
    m = ev.manifest
    tool = m.get("tool") if isinstance(m.get("tool"), Mapping) else {}
    rows = (
        (text(lang, "b_id"), _v(m.get("bundle_id"), lang)),
        (text(lang, "b_created"), _v(m.get("created"), lang)),
        (text(lang, "b_tool"), f"{(tool or {}).get('name', '?')} {(tool or {}).get('version', '')}"
         .strip()),
    )
    return [Table((text(lang, "fp_item"), text(lang, "fp_value")), rows),
            Para(text(lang, "b_verify", name=ev.label))]


# --- document assembly ---------------------------------------------------------------------


def build_report(ev: Evidence, baseline: Evidence | None = None, *, lang: Lang = "en",
                 recipe: str | None = None, fmt: Format = "markdown") -> Doc:
    """Assemble the hand-off document for ``ev`` (optionally against ``baseline``)."""
    if lang not in LANGS:
        raise UsageError(f"unknown language {lang!r}; use one of {', '.join(LANGS)}")
    d = diff_evidence(baseline, ev) if baseline is not None else None
    compat = check_evidence(ev, recipe)
    items = evaluate_checklist(ev, d, baseline, lang)
    title = f"{text(lang, 'title')} — {_model_name(ev)}"
    fp_rows = fingerprint_rows(ev, lang)
    fp_table = Table((text(lang, "fp_item"), text(lang, "fp_value"), text(lang, "fp_where")),
                     tuple(fp_rows))
    blocks: list[Block] = []
    if fmt == "github":
        blocks += [Heading(text(lang, "gh_env"), 3),
                   Details(text(lang, "gh_env_summary"), (Code(_collect_env(ev, fp_rows),
                                                               "text"),)),
                   Heading(text(lang, "gh_bug"), 3)]
        blocks += _summary(ev, lang)
        blocks += _command(ev, lang, _round_flags(d))
        blocks += [Para(text(lang, "gh_expected"))]
        blocks += _request(ev, lang)
        blocks += [Details(text(lang, "gh_logs"), tuple(_failure(ev, lang)))]
        blocks += [Heading(text(lang, "h_baseline"), 4), *_baseline(d, lang)]
        blocks += [Details(text(lang, "h_compat"), tuple(_compat(compat, lang)))]
        blocks += [Details(text(lang, "h_checklist"), tuple(_checklist(items, lang)))]
        blocks += [Heading(text(lang, "h_limits"), 4), *_limits(ev, lang)]
        blocks += [Heading(text(lang, "gh_before"), 3),
                   Bullets((f"[x] {text(lang, 'gh_searched')}",))]
    else:
        blocks += [Heading(text(lang, "h_summary")), *_summary(ev, lang)]
        blocks += [Heading(text(lang, "h_fingerprint")), fp_table]
        blocks += [Heading(text(lang, "h_command")), *_command(ev, lang, _round_flags(d))]
        blocks += [Heading(text(lang, "h_request")), *_request(ev, lang)]
        blocks += [Heading(text(lang, "h_failure")), *_failure(ev, lang)]
        blocks += [Heading(text(lang, "h_timeline")), *_timeline(ev, lang)]
        blocks += [Heading(text(lang, "h_baseline")), *_baseline(d, lang)]
        blocks += [Heading(text(lang, "h_compat")), *_compat(compat, lang)]
        blocks += [Heading(text(lang, "h_checklist")), *_checklist(items, lang)]
        blocks += [Heading(text(lang, "h_limits")), *_limits(ev, lang)]
        blocks += [Heading(text(lang, "h_bundle")), *_about(ev, lang)]
    blocks.append(Para(text(lang, "generated", version=__version__)))
    return Doc(title, lang, tuple(blocks))


def _collect_env(ev: Evidence, rows: Sequence[tuple[str, str, str]]) -> str:
    """A ``collect_env``-like text block (what vLLM's bug template asks for)."""
    width = max(len(r[0]) for r in rows)
    lines = [f"{name:<{width}} : {value}" for name, value, _ in rows]
    if ev.argv:
        lines.append(f"{'argv':<{width}} : {' '.join(ev.argv)}")
    return "\n".join(lines)


# --- renderers -----------------------------------------------------------------------------


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _fence(body: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    return "`" * max(3, longest + 1)


def _render_md(doc: Doc, *, top_heading: bool = True) -> str:
    out: list[str] = [f"# {doc.title}", ""] if top_heading else []

    def emit(block: Block) -> None:
        if isinstance(block, Heading):
            out.extend(["#" * block.level + " " + block.text, ""])
        elif isinstance(block, Para):
            out.extend([block.text, ""])
        elif isinstance(block, Bullets):
            out.extend([*(f"- {i}" for i in block.items), ""])
        elif isinstance(block, Table):
            out.append("| " + " | ".join(_md_cell(h) for h in block.headers) + " |")
            out.append("|" + "|".join("---" for _ in block.headers) + "|")
            for row in block.rows:
                out.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
            out.append("")
        elif isinstance(block, Code):
            f = _fence(block.text)
            out.extend([f + block.lang, block.text, f, ""])
        elif isinstance(block, Lines):
            body = "\n".join((">> " if ln.line_no == block.mark else "   ")
                             + f"{ln.line_no:>6}  {ln.text}" for ln in block.lines)
            f = _fence(body)
            out.extend([f + "text", body, f, ""])
        elif isinstance(block, Details):
            out.extend(["<details>", f"<summary>{block.summary}</summary>", ""])
            for b in block.blocks:
                emit(b)
            out.extend(["</details>", ""])
        elif isinstance(block, Timeline):
            pass  # the table that follows carries the same facts in text

    for b in doc.blocks:
        emit(b)
    return "\n".join(out).rstrip() + "\n"


def render_doc(doc: Doc, fmt: Format) -> str:
    if fmt == "html":
        from kk3evidence.handoff.report.html import render_html

        return render_html(doc)
    return _render_md(doc, top_heading=fmt != "github")


def render_report(bundle: Evidence | str | Path, *, baseline: Evidence | str | Path | None = None,
                  fmt: Format = "markdown", lang: Lang = "en",
                  recipe: str | None = None) -> str:
    """The hand-off document for ``bundle`` as text (Markdown, GitHub issue body or HTML).

    ``baseline`` (a bundle) adds the single-variable result; ``recipe`` forces a compatibility
    recipe (default: picked from the served model). Raises :class:`kk3evidence.errors.UsageError`
    for an unknown format or language and :class:`kk3evidence.errors.BundleError` for an
    unreadable bundle.
    """
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    ev = _evidence.coerce(bundle)
    if fmt == "snippet":  # paste-sized: no baseline, checklist or compatibility sections
        from kk3evidence.handoff.report.snippet import render_snippet

        return render_snippet(ev)
    base = _evidence.coerce(baseline) if baseline is not None else None
    doc = build_report(ev, base, lang=lang, recipe=recipe, fmt=fmt)
    return render_doc(doc, fmt)


# Order of stages on the timeline's rows: the seed's diagnostic order.
STAGE_ORDER = {s: i for i, s in enumerate(STAGES)}
