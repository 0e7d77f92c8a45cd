"""What the hand-off's sections and its checklist share: the minimal command, the feature
flags, the round's own variable, the checklist item record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kk3evidence.errors import Kk3Error
from kk3evidence.handoff.diff import DiffResult, serve_command
from kk3evidence.handoff.evidence import Evidence, Request
from kk3evidence.handoff.report.i18n import Lang, text
from kk3evidence.model import JSONObject

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


@dataclass(frozen=True, slots=True)
class ChecklistItem:
    key: str
    title: str
    status: Status
    why: str

    def to_json(self) -> JSONObject:
        return {"key": self.key, "title": self.title, "status": self.status, "why": self.why}


def truncate(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


@dataclass(frozen=True, slots=True)
class RemovedFlag:
    flag: str  # "--enable-prefix-caching"
    cls: str  # minimize's class: feature, load, business-wrapper, multi-node, observability...
    why: str


#: flags that name or place the server, never a feature (the checklist must not count them)
_IDENTITY_FLAGS = frozenset({"--served-model-name", "--host", "--port"})


def round_flags(d: DiffResult | None) -> set[str]:
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


def fixed_request(ev: Evidence) -> Request | None:
    fixed = [r for r in ev.requests if r.kind == "fixed"]
    pool = fixed or list(ev.requests)
    return pool[0] if pool else None


def verdict_text(d: DiffResult, lang: Lang) -> str:
    names = ", ".join(f"`{c.label}`" for c in d.variables)
    if d.verdict == "none":
        return text(lang, "base_verdict_none")
    if d.verdict == "one":
        return text(lang, "base_verdict_one", names=names)
    return text(lang, "base_verdict_several", n=len(d.variables), names=names)
