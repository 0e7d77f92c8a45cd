"""``report --format snippet``: the paste-sized hand-off (at most :data:`MAX_LINES` lines).

What someone pastes into an issue instead of a screenshot: the first causal line with a few
lines of context, its stage, category and basis, the fingerprint essentials, the minimal start
command and the bundle's sha256 (so the receiver can ask for the very bundle). Pure: reads the
bundle file only to hash it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kk3evidence._version import __version__
from kk3evidence.handoff.evidence import Evidence

__all__ = ["MAX_LINES", "render_snippet"]

MAX_LINES = 40
_CONTEXT = 3  # lines before and after the first causal line
_WIDTH = 200  # characters of one log line kept


def _clip(text: str, width: int = _WIDTH) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def bundle_sha256(path: str) -> str | None:
    """sha256 of the bundle file, or None when it is not a readable file."""
    p = Path(path)
    if not p.is_file():
        return None
    h = hashlib.sha256()
    try:
        with p.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def _failure(ev: Evidence, ff: Mapping[str, Any] | None) -> list[str]:
    if ff is None:
        last = ev.last_stage_reached or "unknown"
        return [f"No failure found (last stage reached: {last})."]
    basis = ff.get("basis") or "rule"
    head = (
        f"First causal failure: stage `{ff.get('stage')}`, category `{ff.get('category')}`, "
        f"rule `{ff.get('rule')}`, basis `{basis}`, line {ff.get('line_no')}"
    )
    if ff.get("process"):
        head += f" ({ff['process']})"
    out = [head]
    if basis == "fallback":
        out.append("(no rule knew this failure: it is the strongest evidence in the log)")
    no = int(ff.get("line_no") or 0)
    window = [ln for ln in ev.log_window if abs(ln.line_no - no) <= _CONTEXT]
    if not window:
        window_text = [f">> {no:>6}  {_clip(str(ff.get('text') or ''))}"]
    else:
        window_text = [
            f"{'>>' if ln.line_no == no else '  '} {ln.line_no:>6}  {_clip(ln.text)}"
            for ln in window
        ]
    return [*out, "```text", *window_text, "```"]


def _essentials(ev: Evidence) -> list[str]:
    fp = ev.fingerprint
    names: dict[str, int] = {}
    for d in fp.gpus.devices:
        key = d.name or "?"
        names[key] = names.get(key, 0) + 1
    gpus = ", ".join(f"{n}x {k}" for k, n in names.items()) or "none visible"
    facts = [
        ("vLLM", fp.python.vllm_version),
        ("torch", fp.python.torch_version),
        ("torch CUDA", fp.python.torch_cuda),
        ("driver", fp.gpus.driver_version),
        ("CUDA driver", fp.gpus.cuda_driver_version),
    ]
    line = ", ".join(f"{k} {v}" for k, v in facts if v not in (None, ""))
    image = fp.container.image_ref or fp.container.image_id
    out = [f"- {line or 'versions not recorded'}", f"- GPUs: {gpus}"]
    if image:
        out.append(f"- image: {image}")
    code = ev.launch.exit_code
    sig = ev.launch.signal
    end = f"exit code {code}" if code is not None else (f"signal {sig}" if sig else "running")
    out.append(f"- outcome: {end}; last stage reached: {ev.last_stage_reached or 'unknown'}")
    return out


def _command(ev: Evidence) -> list[str]:
    from kk3evidence.handoff.report.common import minimal_command

    if not ev.argv:
        return []
    minimal, removed = minimal_command(ev)
    if minimal is None:
        import shlex

        minimal = " ".join(shlex.quote(a) for a in ev.argv)
    title = "Minimal command" + (f" ({len(removed)} flags dropped)" if removed else "") + ":"
    return [title, "```bash", _clip(minimal, 600), "```"]


def render_snippet(ev: Evidence) -> str:
    """The snippet as Markdown text, never longer than :data:`MAX_LINES` lines."""
    sha = bundle_sha256(ev.source)
    bundle_id = ev.manifest.get("bundle_id")
    tail = f"Bundle `{ev.label}`" + (f" sha256 `{sha}`" if sha else "")
    if bundle_id:
        tail += f" (id {bundle_id})"
    ff = ev.first_failure
    out = [
        f"**kk3evidence {__version__} snippet** — `{ev.label}`",
        "",
        *_failure(ev, ff),
        "",
        *_essentials(ev),
        "",
        *_command(ev),
        tail,
    ]
    if len(out) > MAX_LINES:  # only a very long context could do this: keep head and tail
        out = [*out[: MAX_LINES - 1], tail]
    return "\n".join(out) + "\n"
