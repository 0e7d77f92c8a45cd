"""Evidence bundles (SPEC §3): the archive format, its schemas, safe reading and redaction.

The bottom layer above ``model``/``errors``: pure file I/O (tarfile, json), no processes, no
network. ``archive`` writes, reads and validates bundles; ``tarsafe`` is the hostile-archive
reader under it; ``schema`` validates JSON members; ``redact`` removes secrets before anything
is written.
"""

from kk3evidence.bundle.archive import (
    Bundle,
    BundleWriter,
    Limits,
    iter_problems,
    open_bundle,
    seal,
    validate,
)

__all__ = ["Bundle", "BundleWriter", "Limits", "iter_problems", "open_bundle", "seal", "validate"]
