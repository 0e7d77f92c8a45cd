"""The one literal scanner (kk3evidence._literals): every engine agrees with naive ``in``."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kk3evidence._literals import LiteralScanner

ENGINES = ["hyperscan", "re2", "ahocorasick"]

# A small alphabet (with upper case and a non-ASCII byte) so literals do occur in texts.
_ALPHA = st.sampled_from([b"a", b"b", b"A", b"B", b"_", b"\xe9", b"\n"])
_TEXT = st.lists(_ALPHA, max_size=60).map(b"".join)
_LIT = st.lists(_ALPHA, min_size=1, max_size=4).map(b"".join)
_LITS = st.lists(_LIT, min_size=1, max_size=8)


def _naive_ids(lits: list[bytes], caseless: list[bool], text: bytes) -> list[int]:
    low = text.lower()
    return [i for i, a in enumerate(lits) if (a.lower() in low if caseless[i] else a in text)]


def _occurrences(lit: bytes, text: bytes, caseless: bool) -> list[int]:
    hay, needle = (text.lower(), lit.lower()) if caseless else (text, lit)
    ends, pos = [], hay.find(needle)
    while pos >= 0:
        ends.append(pos + len(needle))
        pos = hay.find(needle, pos + 1)
    return ends


@settings(max_examples=150, deadline=None)
@given(_LITS, _TEXT, st.data())
def test_ids_any_matches_equal_naive_in(
    lits: list[bytes], text: bytes, data: st.DataObject
) -> None:
    caseless = data.draw(st.lists(st.booleans(), min_size=len(lits), max_size=len(lits)))
    sc = LiteralScanner(lits, caseless=caseless)
    want = _naive_ids(lits, caseless, text)
    assert sc.ids(text) == want
    assert sc.ids(memoryview(text)) == want
    assert sc.any(text) == bool(want)
    assert sorted(set(sc.matches(text))) == want
    occ = sum(len(_occurrences(a, text, c)) for a, c in zip(lits, caseless, strict=True))
    assert len(sc.matches(text)) == occ


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.text(alphabet="abAB_é→", min_size=0, max_size=3), max_size=8),
    st.text("abAB_é→ ", max_size=40),
)
def test_str_literals_in_str_and_utf8(lits: list[str], text: str) -> None:
    sc = LiteralScanner(lits)
    want = [i for i, a in enumerate(lits) if a in text]
    assert sc.ids(text) == want  # "" is in every text
    assert sc.ids(text.encode("utf-8")) == want


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=100, deadline=None)
@given(lits=_LITS, text=_TEXT, data=st.data())
def test_hits_every_engine(
    engine: str, lits: list[bytes], text: bytes, data: st.DataObject
) -> None:
    n = len(lits)
    caseless = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    single = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    lo = data.draw(st.integers(0, len(text)))
    hi = data.draw(st.integers(lo, len(text)))
    assume(engine != "re2" or all(b"\xe9" not in a for a in lits))  # re2 wants UTF-8 patterns
    sc = LiteralScanner(lits, single=single, caseless=caseless, engine=engine)
    assert sc.engine == engine
    hits = sc.hits(text, lo, hi)
    window = text[lo:hi]
    assert [e for e, _ in hits] == sorted(e for e, _ in hits)
    for end, aid in hits:  # every hit is a real occurrence
        assert end - len(lits[aid]) - lo in [
            e - len(lits[aid]) for e in _occurrences(lits[aid], window, caseless[aid])
        ]
    found = {aid for _, aid in hits}
    naive = set(_naive_ids(lits, caseless, window))
    if engine == "re2":  # leftmost non-overlapping: a subset, recounted per line by callers
        assert found <= naive
        assert bool(found) == bool(naive)
        return
    assert found == naive
    for aid in range(n):
        got = [e for e, a in hits if a == aid]
        ends = [lo + e for e in _occurrences(lits[aid], window, caseless[aid])]
        if single[aid]:
            assert len(got) == min(1, len(ends))
        else:
            assert sorted(got) == ends


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=60, deadline=None)
@given(lits=_LITS, text=_TEXT, data=st.data())
def test_last_offsets(engine: str, lits: list[bytes], text: bytes, data: st.DataObject) -> None:
    caseless = data.draw(st.lists(st.booleans(), min_size=len(lits), max_size=len(lits)))
    assume(engine != "re2" or all(b"\xe9" not in a for a in lits))  # re2 wants UTF-8 patterns
    sc = LiteralScanner(lits, single=[True] * len(lits), caseless=caseless, engine=engine)
    lo = data.draw(st.integers(0, len(text)))
    got = sc.last_offsets(text, range(len(lits)), lo)
    for aid, a in enumerate(lits):
        hay, needle = (text.lower(), a.lower()) if caseless[aid] else (text, a)
        assert got[aid] == hay.rfind(needle, lo)


def test_clone_shares_database_with_own_scratch() -> None:
    sc = LiteralScanner([b"ERROR", b"Traceback"], single=[False, True])
    twin = sc.clone()
    block = b"x ERROR y\nTraceback\nERROR\nTraceback\n"
    assert twin.hits(block) == sc.hits(block) == [(7, 0), (19, 1), (25, 0)]
    if sc.engine == "hyperscan":
        assert twin._hs_db is sc._hs_db and twin._hs_scratch is not sc._hs_scratch


def test_empty_literals_and_empty_set() -> None:
    sc = LiteralScanner(["", "a"])
    assert sc.ids("xyz") == [0]
    assert sc.any("xyz")
    assert sc.hits(b"aa") == [(1, 1), (2, 1)]
    none = LiteralScanner([])
    assert none.ids("abc") == [] and not none.any("abc") and none.hits(b"abc") == []
    assert none.engine == "ahocorasick"


def test_flags_need_one_per_literal() -> None:
    with pytest.raises(ValueError, match="one flag per literal"):
        LiteralScanner([b"a"], single=[True, False])
