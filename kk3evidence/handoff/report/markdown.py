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
from typing import Any, Literal
from urllib.parse import urlsplit

from kk3evidence._version import __version__
from kk3evidence.errors import Kk3Error, UsageError
from kk3evidence.handoff import evidence as _evidence
from kk3evidence.handoff.compat import CheckResult, check_evidence, container_cuda
from kk3evidence.handoff.diff import DiffResult, diff_evidence, request_signature, serve_command
from kk3evidence.handoff.evidence import Evidence, LogLine, Request, other_gpu_processes
from kk3evidence.handoff.report.i18n import (
    CHECKLIST,
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
Status = Literal["pass", "fail", "unknown"]

# Flags that add features on top of a plain start (the guide: agent wrappers, tool-call parsers,
# prefix caching, ...). The minimal command drops them; they come back one per round.
FEATURE_FLAGS: tuple[str, ...] = (
    "enable-prefix-caching",
    "enable-auto-tool-choice",
    "tool-call-parser",
    "tool-parser-plugin",
    "reasoning-parser",
    "speculative-config",
    "enable-lora",
    "lora-modules",
    "kv-transfer-config",
    "kv-events-config",
    "middleware",
    "enable-request-id-headers",
    "return-tokens-as-token-ids",
    "structured-outputs-config",
    "limit-mm-per-prompt",
    "max-num-seqs",
    "max-num-batched-tokens",
    "enable-chunked-prefill",
    "async-scheduling",
)


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


@dataclass(frozen=True, slots=True)
class ChecklistItem:
    key: str
    title: str
    status: Status
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "status": self.status, "why": self.why}


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


def _truncate(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


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


@dataclass(frozen=True, slots=True)
class RemovedFlag:
    flag: str  # "--enable-prefix-caching"
    cls: str  # minimize's class: feature, load, business-wrapper, multi-node, observability...
    why: str


#: flags that name or place the server, never a feature (the checklist must not count them)
_IDENTITY_FLAGS = frozenset({"--served-model-name", "--host", "--port"})


def _round_flags(d: DiffResult | None) -> set[str]:
    """The flags this round changed against its baseline (``--x``): the round's own variable,
    which the minimal command must keep so that it still reproduces the failure."""
    if d is None:
        return set()
    return {c.label for c in d.variables if c.variable.startswith("argv:--")}


def minimal_command(ev: Evidence, keep: set[str] | frozenset[str] = frozenset()
                    ) -> tuple[str | None, tuple[RemovedFlag, ...]]:
    """The minimal start command (as ``kk3evidence minimize`` computes it) and what it drops.

    Flags in ``keep`` (``--x``: the round's own variable, e.g. the one ``--baseline`` names as
    the cause) stay in. Returns ``(None, ())`` when the argv is not a ``vllm serve`` command.
    """
    from kk3evidence import vllm_args

    cmd = serve_command(ev.argv)
    if cmd is None:
        return None, ()
    try:
        from kk3evidence.handoff.minimize import minimize

        m = minimize(list(ev.argv))
    except (ImportError, Kk3Error):
        # minimize unavailable or the command names no model: drop the known feature flags
        flags = [f for f in cmd.flags if f in FEATURE_FLAGS and f"--{f}" not in keep]
        removed = tuple(RemovedFlag(f"--{f}", "feature", "adds a feature on top of a plain "
                                    "start") for f in flags)
        return vllm_args.render_shell(cmd.replace(drop=flags)), removed
    dropped = [r for r in m.removed if f"--{r.name}" not in keep]
    kept_back = [r.name for r in m.removed if f"--{r.name}" in keep]
    minimal = m.minimal
    if kept_back:
        minimal = cmd.replace(drop=[f for f in cmd.flags if f not in set(m.minimal.flags)
                                    and f not in kept_back])
    removed = tuple(RemovedFlag(f"--{r.name}", r.cls, r.why) for r in dropped)
    return vllm_args.render_shell(minimal), removed


def feature_flags(ev: Evidence, keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Flags that are business extras in a start command (features, wrapper options); not the
    server's name or address, not the round's own variable (``keep``)."""
    _, removed = minimal_command(ev, keep)
    return [r.flag for r in removed if r.cls in ("feature", "business-wrapper")
            and r.flag not in _IDENTITY_FLAGS]


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


def _fixed(ev: Evidence) -> Request | None:
    fixed = [r for r in ev.requests if r.kind == "fixed"]
    pool = fixed or list(ev.requests)
    return pool[0] if pool else None


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
        out += [Para(text(lang, "fail_lines")), Lines(ev.log_window, int(ff["line_no"]))]
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
    failure_at = at(int(ff["line_no"])) if ff and ff.get("line_no") else None
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


def _verdict_text(d: DiffResult, lang: Lang) -> str:
    names = ", ".join(f"`{c.label}`" for c in d.variables)
    if d.verdict == "none":
        return text(lang, "base_verdict_none")
    if d.verdict == "one":
        return text(lang, "base_verdict_one", names=names)
    return text(lang, "base_verdict_several", n=len(d.variables), names=names)


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


def evaluate_checklist(ev: Evidence, baseline_diff: DiffResult | None = None,
                       baseline: Evidence | None = None,
                       lang: Lang = "en") -> tuple[ChecklistItem, ...]:
    """The guide's 11-item hand-off checklist, each judged from the evidence."""
    fp = ev.fingerprint
    results: dict[str, tuple[Status, str]] = {}

    # 1. driver + container CUDA in the same snapshot
    driver = fp.gpus.driver_version
    cuda, _ = container_cuda(ev)
    source = fp.gpus.source or "?"
    cuda_s = ".".join(str(x) for x in cuda) if cuda else None
    if driver and cuda_s:
        results["driver_cuda_same_time"] = ("pass", text(
            lang, "ck1_pass", driver=driver, cuda=cuda_s, at=fp.raw.get("collected_at") or "?"))
    elif driver:
        results["driver_cuda_same_time"] = ("fail", text(lang, "ck1_fail_cuda", driver=driver))
    elif cuda_s and source == "nvml":
        results["driver_cuda_same_time"] = ("fail", text(lang, "ck1_fail_driver", cuda=cuda_s,
                                                         source=source))
    else:
        results["driver_cuda_same_time"] = ("unknown", text(lang, "ck1_unknown", source=source))

    # 2. image id
    image_id = fp.container.image_id
    runtime = fp.container.runtime
    ref = fp.container.image_ref
    if image_id:
        results["image_id"] = ("pass", text(lang, "ck2_pass", image_id=_truncate(image_id, 24),
                                            how=fp.container.image_id_source or "?"))
    elif ref:
        results["image_id"] = ("fail", text(lang, "ck2_fail", ref=ref))
    elif runtime:
        results["image_id"] = ("fail", text(lang, "ck2_fail_none", runtime=runtime))
    else:
        results["image_id"] = ("unknown", text(lang, "ck2_unknown", runtime=runtime or "none"))

    # 3. minimal command
    cmd = serve_command(ev.argv)
    if cmd is None:
        results["minimal_command"] = ("unknown", text(lang, "ck3_unknown"))
    else:
        feats = feature_flags(ev, _round_flags(baseline_diff))
        results["minimal_command"] = (("fail", text(lang, "ck3_fail", flags=", ".join(feats)))
                                      if feats else
                                      ("pass", text(lang, "ck3_pass", n=len(cmd.flags))))

    # 4. first error stack and the log before it
    members = {str(m.get("name")) for m in ev.manifest.get("members") or []
               if isinstance(m, Mapping)}
    losses = ev.manifest.get("losses") or []
    lines_total = (ev.analysis or {}).get("lines_total", "?")
    ff = ev.first_failure
    if losses:
        results["first_error_kept"] = ("fail", text(lang, "ck4_fail_loss", loss=_truncate(
            json.dumps(losses[0], ensure_ascii=False), 120)))
    elif ev.manifest and "logs/combined.log" not in members:
        results["first_error_kept"] = ("fail", text(lang, "ck4_fail_missing"))
    elif ff is not None:
        results["first_error_kept"] = ("pass", text(
            lang, "ck4_pass", lines=lines_total, line_no=ff.get("line_no"),
            before=max(0, int(ff.get("line_no") or 1) - 1)))
    else:
        results["first_error_kept"] = ("pass", text(lang, "ck4_pass_ok", lines=lines_total))

    # 5. fixed input and output cap; 6. single request vs load
    sig = request_signature(ev)
    req = _fixed(ev)
    if req is None:
        results["fixed_request"] = ("unknown", text(lang, "ck5_unknown"))
        results["single_vs_load"] = ("unknown", text(lang, "ck5_unknown"))
    else:
        if sig.get("max_tokens") is None:
            results["fixed_request"] = ("fail", text(lang, "ck5_fail"))
        else:
            results["fixed_request"] = ("pass", text(
                lang, "ck5_pass", cap=sig.get("max_tokens"), temp=sig.get("temperature"),
                chars=sig.get("input_length")))
        conc = [r for r in ev.requests if r.kind == "concurrency"]
        if req.kind == "concurrency":
            results["single_vs_load"] = ("fail", text(lang, "ck6_fail"))
        elif conc:
            results["single_vs_load"] = ("pass", text(lang, "ck6_pass_both", k=len(conc)))
        else:
            results["single_vs_load"] = ("pass", text(lang, "ck6_pass", n=len(ev.requests)))

    # 7. one variable per round
    changes = ev.notes.changes
    if baseline_diff is not None:
        summary = _verdict_text(baseline_diff, lang)
        results["one_variable"] = (("fail", text(lang, "ck7_fail", summary=summary))
                                   if baseline_diff.verdict == "several" else
                                   ("pass", text(lang, "ck7_pass", summary=summary)))
    elif changes:
        shown = "; ".join(f"{c.variable}: {c.before} -> {c.after}" for c in changes[:4])
        results["one_variable"] = (("pass", text(lang, "ck7_notes_pass", change=shown))
                                   if len(changes) == 1 else
                                   ("fail", text(lang, "ck7_notes_fail", n=len(changes),
                                                 changes=shown)))
    else:
        results["one_variable"] = ("unknown", text(lang, "ck7_unknown"))

    # 8. back to the last stable baseline when the error changed
    notes_text = list(ev.notes.notes) + [f"{c.variable} {c.after}" for c in changes]
    revert = next((n for n in notes_text
                   if re.search(r"revert|rollback|roll back|back to baseline|되돌|복귀", n, re.I)),
                  None)
    if baseline is not None and baseline_diff is not None:
        bff = baseline.first_failure
        if bff is None and baseline_diff.verdict == "none":
            # This run is the baseline's configuration again: that is going back.
            results["reverted_baseline"] = ("pass", text(lang, "ck8_pass_baseline"))
        elif bff is not None and not revert:
            results["reverted_baseline"] = ("fail", text(lang, "ck8_fail",
                                                         stage=stage_name(lang, bff.get("stage")),
                                                         category=bff.get("category")))
        else:
            results["reverted_baseline"] = ("unknown", text(lang, "ck8_unknown"))
    elif revert:
        results["reverted_baseline"] = ("pass", text(lang, "ck8_pass_notes",
                                                     note=_truncate(revert, 100)))
    else:
        results["reverted_baseline"] = ("unknown", text(lang, "ck8_unknown"))

    # 9. prefix caching verified separately and explicitly (judged on what the engine ran
    # with: vLLM's V1 engine turns it on by default)
    results["prefix_caching"] = _prefix_item(ev, cmd, baseline_diff, lang)

    # 10. limits written: this document has the section
    results["repro_limits"] = ("pass", text(lang, "ck10_pass"))

    # 11. other jobs and GPU occupancy
    cluster_text = (ev.notes.cluster.text if ev.notes.cluster else None) or ""
    auto_text = cluster_text.startswith("GPU state unknown")  # capture's own "no NVML" note
    devices = fp.gpus.devices
    if source == "nvml" and devices:
        results["cluster_state"] = ("pass", text(lang, "ck11_pass_nvml", n=len(devices),
                                                 others=len(other_gpu_processes(ev) or [])))
    elif cluster_text and not auto_text:
        results["cluster_state"] = ("pass", text(lang, "ck11_pass_notes",
                                                 text=_truncate(cluster_text, 100)))
    elif source == "error":
        err = fp.gpus.error or cluster_text or "NVML error"
        results["cluster_state"] = ("fail", text(lang, "ck11_fail", error=err))
    else:
        results["cluster_state"] = ("unknown", text(lang, "ck11_unknown"))

    items = []
    for key, en, ko in CHECKLIST:
        status, why = results[key]
        items.append(ChecklistItem(key, ko if lang == "ko" else en, status, why))
    return tuple(items)


def _prefix_item(ev: Evidence, cmd: Any, d: DiffResult | None,
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
