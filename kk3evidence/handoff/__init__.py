"""Hand-off: typed evidence of a bundle, and the answers built from it.

``evidence`` reads a bundle once; ``diff`` (what changed), ``compat`` (official boundaries),
``compare`` (keep fixing / isolate / hand off), ``minimize`` (the minimal command and the
one-variable plan) and ``report`` (the hand-off document) work on that evidence. Pure: no
processes, no network, no terminal.
"""
