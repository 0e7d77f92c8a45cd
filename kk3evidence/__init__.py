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
    from .analysis import analyze
    from .bundle import Bundle, BundleWriter, Limits, iter_problems, open_bundle, seal, validate
    from .capture import CaptureOptions, CaptureResult, run_capture
    from .classify import classify_line
    from .compare import Comparison, compare
    from .compat import CheckResult, check
    from .diff import DiffResult, diff
    from .fingerprint import collect as collect_fingerprint
    from .ladder import LadderResult, load_plan, run_ladder
    from .minimize import build_plan, minimize
    from .redact import Redactor
    from .report import render_report
    from .vllm_args import ServeCommand, flag_diff, parse_serve_argv

# public name -> (module, attribute)
_LAZY: dict[str, tuple[str, str]] = {
    "analyze": ("analysis", "analyze"),
    "classify_line": ("classify", "classify_line"),
    "Bundle": ("bundle", "Bundle"),
    "BundleWriter": ("bundle", "BundleWriter"),
    "Limits": ("bundle", "Limits"),
    "iter_problems": ("bundle", "iter_problems"),
    "open_bundle": ("bundle", "open_bundle"),
    "seal": ("bundle", "seal"),
    "validate": ("bundle", "validate"),
    "Redactor": ("redact", "Redactor"),
    "CaptureOptions": ("capture", "CaptureOptions"),
    "CaptureResult": ("capture", "CaptureResult"),
    "run_capture": ("capture", "run_capture"),
    "collect_fingerprint": ("fingerprint", "collect"),
    "ServeCommand": ("vllm_args", "ServeCommand"),
    "flag_diff": ("vllm_args", "flag_diff"),
    "parse_serve_argv": ("vllm_args", "parse_serve_argv"),
    "DiffResult": ("diff", "DiffResult"),
    "diff": ("diff", "diff"),
    "CheckResult": ("compat", "CheckResult"),
    "check": ("compat", "check"),
    "render_report": ("report", "render_report"),
    "Comparison": ("compare", "Comparison"),
    "compare": ("compare", "compare"),
    "build_plan": ("minimize", "build_plan"),
    "minimize": ("minimize", "minimize"),
    "LadderResult": ("ladder", "LadderResult"),
    "load_plan": ("ladder", "load_plan"),
    "run_ladder": ("ladder", "run_ladder"),
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
    "render_report",
    "run_capture",
    "run_ladder",
    "seal",
    "validate",
]
