"""Capture's redaction pre-filter (run._anchor_scan) on the one literal scanner: it reports,
for each anchor (any case) and each known secret (exact) found in a block, the end of its first
occurrence: what LogRedactor needs to find the first line that may hold a secret."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.capture.run import _anchor_scan, _pattern_anchors

_PIECES = st.sampled_from(
    [
        b"x",
        b" ",
        b"\n",
        b"HF_",
        b"hf_",
        b"Bearer ",
        b"api_KEY=",
        b"sk-",
        b"://",
        b"s3cr3tvalue",
        b"\xff",
    ]
)
_BLOCK = st.lists(_PIECES, max_size=40).map(b"".join)


def _naive(block: bytes, known: list[bytes]) -> list[int]:
    low = block.lower()
    out = []
    for hay, needles in ((low, _pattern_anchors()), (block, tuple(known))):
        for needle in needles:
            pos = hay.find(needle)
            if pos >= 0:
                out.append(pos + len(needle))
    return sorted(out)


@settings(max_examples=100, deadline=None)
@given(_BLOCK, st.lists(st.sampled_from([b"s3cr3tvalue", b"S3CR3TVALUE", b"x\nx x\n"]), max_size=2))
def test_anchor_hits_equal_a_naive_find(block: bytes, known: list[bytes]) -> None:
    known = sorted(set(known))
    scan = _anchor_scan(known)
    assert sorted(end for end, _id in scan(block)) == _naive(block, known)
    assert sorted(end for end, _id in scan(memoryview(block))) == _naive(block, known)
