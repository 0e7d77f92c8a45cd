"""kk3evidence: evidence bundles for vLLM start-up failures.

The public API is re-exported here; everything in a module whose name starts with ``_`` is
private. See ``docs/`` for the user guide.
"""

from ._version import __version__
from .errors import BundleError, CaptureError, InputError, Kk3Error, RuleError, UsageError
from .model import CATEGORIES, STAGES, Analysis, Finding, Problem, StageSpan

__all__ = [
    "CATEGORIES",
    "STAGES",
    "Analysis",
    "BundleError",
    "CaptureError",
    "Finding",
    "InputError",
    "Kk3Error",
    "Problem",
    "RuleError",
    "StageSpan",
    "UsageError",
    "__version__",
]
