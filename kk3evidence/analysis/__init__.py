"""The pure analysis core: envelope grammar, rules, classification, causality, the engine.

Runs anywhere on a log or a bundle captured elsewhere: it never imports click, httpx, pynvml,
subprocess or signal (import-linter contract in ``pyproject.toml``).
"""

from kk3evidence.analysis.classify import classify_line
from kk3evidence.analysis.engine import analyze

__all__ = ["analyze", "classify_line"]
