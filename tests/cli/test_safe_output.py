"""Text from a received bundle is escaped before it reaches a terminal, and JSON output stays
the same JSON (property tests)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from kk3evidence.bundle.tarsafe import GZIP_HEADER_MAX, ArchiveError, check_gzip_header
from kk3evidence.cli._common import safe_json, safe_text

anything = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=200)


@given(anything)
def test_safe_text_is_printable_and_encodable(text: str) -> None:
    out = safe_text(text)
    out.encode("utf-8")  # no lone surrogate left
    assert all(c.isprintable() or c in "\n\t" for c in out)
    if text.isprintable():
        assert out == text


@given(st.recursive(anything | st.integers() | st.none(), lambda c: st.lists(c, max_size=4)))
def test_safe_json_is_the_same_json(value: object) -> None:
    text = json.dumps({"v": value}, indent=2, ensure_ascii=False)
    out = safe_json(text)
    out.encode("utf-8")
    assert json.loads(out) == json.loads(text)
    assert "\x1b" not in out and "\u202e" not in out


@given(st.binary(max_size=300), st.integers(min_value=0, max_value=255))
def test_gzip_header_check_accepts_or_refuses_cleanly(rest: bytes, flags: int) -> None:
    head = b"\x1f\x8b\x08" + bytes([flags]) + b"\0" * 6 + rest
    try:
        check_gzip_header(head)
    except ArchiveError as exc:
        assert exc.code == "header-too-large"
        assert len(head) <= GZIP_HEADER_MAX + 1 or b"\0" not in head[10:]
