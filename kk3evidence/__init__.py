"""kk3evidence: evidence bundles for vLLM start-up failures.

The public API is what ``__all__`` lists; modules whose names start with ``_`` are private.
Names load lazily, so ``import kk3evidence`` stays cheap (no polars, httpx or pyparsing until a
name that needs them is used). See ``docs/user-guide.md``::

    import kk3evidence as kk
    result = kk.analyze("run1.tar.gz")
    with kk.open_bundle("run1.tar.gz") as b:
        print(b.fingerprint["host"]["kernel"])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import BundleError, CaptureError, InputError, Kk3Error, RuleError, UsageError
from .model import CATEGORIES, STAGES, Analysis, Finding, Problem, StageSpan

if TYPE_CHECKING:
    from .analysis.classify import classify_line
    from .analysis.engine import analyze
    from .bundle.archive import (
        Bundle,
        BundleWriter,
        Limits,
        iter_problems,
        open_bundle,
        seal,
        validate,
    )
    from .bundle.redact import Redactor
    from .capture.fingerprint import collect as collect_fingerprint
    from .capture.ladder.run import LadderResult, load_plan, run_ladder
    from .capture.preflight_host import run_preflight as preflight
    from .capture.run import CaptureOptions, CaptureResult, run_capture
    from .handoff.compare import Comparison, compare
    from .handoff.compat import CheckResult, check
    from .handoff.diff import DiffResult, diff
    from .handoff.minimize import build_plan, minimize
    from .handoff.preflight import PreflightResult
    from .handoff.report.markdown import render_report
    from .vllm_args import ServeCommand, flag_diff, parse_serve_argv

# public name -> (module, attribute)
_LAZY: dict[str, tuple[str, str]] = {
    "analyze": ("analysis.engine", "analyze"),
    "classify_line": ("analysis.classify", "classify_line"),
    "Bundle": ("bundle.archive", "Bundle"),
    "BundleWriter": ("bundle.archive", "BundleWriter"),
    "Limits": ("bundle.archive", "Limits"),
    "iter_problems": ("bundle.archive", "iter_problems"),
    "open_bundle": ("bundle.archive", "open_bundle"),
    "seal": ("bundle.archive", "seal"),
    "validate": ("bundle.archive", "validate"),
    "Redactor": ("bundle.redact", "Redactor"),
    "CaptureOptions": ("capture.run", "CaptureOptions"),
    "CaptureResult": ("capture.run", "CaptureResult"),
    "run_capture": ("capture.run", "run_capture"),
    "collect_fingerprint": ("capture.fingerprint", "collect"),
    "ServeCommand": ("vllm_args", "ServeCommand"),
    "flag_diff": ("vllm_args", "flag_diff"),
    "parse_serve_argv": ("vllm_args", "parse_serve_argv"),
    "DiffResult": ("handoff.diff", "DiffResult"),
    "diff": ("handoff.diff", "diff"),
    "CheckResult": ("handoff.compat", "CheckResult"),
    "check": ("handoff.compat", "check"),
    "render_report": ("handoff.report.markdown", "render_report"),
    "Comparison": ("handoff.compare", "Comparison"),
    "compare": ("handoff.compare", "compare"),
    "build_plan": ("handoff.minimize", "build_plan"),
    "minimize": ("handoff.minimize", "minimize"),
    "LadderResult": ("capture.ladder.run", "LadderResult"),
    "load_plan": ("capture.ladder.run", "load_plan"),
    "run_ladder": ("capture.ladder.run", "run_ladder"),
    "PreflightResult": ("handoff.preflight", "PreflightResult"),
    "preflight": ("capture.preflight_host", "run_preflight"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'kk3evidence' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CATEGORIES",
    "STAGES",
    "Analysis",
    "Bundle",
    "BundleError",
    "BundleWriter",
    "CaptureError",
    "CaptureOptions",
    "CaptureResult",
    "CheckResult",
    "Comparison",
    "DiffResult",
    "Finding",
    "InputError",
    "Kk3Error",
    "LadderResult",
    "Limits",
    "PreflightResult",
    "Problem",
    "Redactor",
    "RuleError",
    "ServeCommand",
    "StageSpan",
    "UsageError",
    "__version__",
    "analyze",
    "build_plan",
    "check",
    "classify_line",
    "collect_fingerprint",
    "compare",
    "diff",
    "flag_diff",
    "iter_problems",
    "load_plan",
    "minimize",
    "open_bundle",
    "parse_serve_argv",
    "preflight",
    "render_report",
    "run_capture",
    "run_ladder",
    "seal",
    "validate",
]
