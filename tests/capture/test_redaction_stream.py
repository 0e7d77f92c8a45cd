"""Redaction of the live log stream, property-tested: however the child's output is cut into
writes and however long its lines are, no secret (declared, or learned from the log itself)
reaches the log, and everything but the secrets is kept in order."""

from __future__ import annotations

import io
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.bundle.redact import PLACEHOLDER_RE, Redactor
from kk3evidence.capture.pump import MAX_PARTIAL, LineRecorder
from kk3evidence.capture.run import LogRedactor, known_secrets

HF = "hf_" + "Pr0pT3stT0k3nAbCdEfGhIjKlMnOp"
LEARNED = "Le4rnedS3cret-99"
PEM_LINE = "MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQC7VJTUt9Us8cKj"
ENV = {"HF_TOKEN": HF, "HOME": "/root"}

pieces = st.sampled_from(
    [
        HF.encode(),
        b"password=" + LEARNED.encode(),
        LEARNED.encode(),
        b"-----BEGIN PRIVATE KEY-----\n" + PEM_LINE.encode() + b"\n-----END PRIVATE KEY-----",
        b"plain words ",
        b"\n",
    ]
)
pads = st.integers(min_value=0, max_value=3 * MAX_PARTIAL)


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    out = b""
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        out += b"x" * draw(pads) + b" " + draw(pieces) + b" "
    return out + b"\n"


def _run(data: bytes, cuts: list[int]) -> bytes:
    redactor = Redactor()
    redactor.env(ENV)
    log, index = io.BytesIO(), io.BytesIO()
    rec = LineRecorder(log, index, redact=LogRedactor(redactor, known_secrets(ENV, [])))
    pos = 0
    for size in cuts:
        if pos >= len(data):
            break
        rec.put(0, data[pos : pos + size], time.time_ns(), time.monotonic_ns())
        pos += size
    if pos < len(data):
        rec.put(0, data[pos:], time.time_ns(), time.monotonic_ns())
    rec.eof(0)
    rec.eof(1)
    assert rec.close(60)
    return log.getvalue()


@settings(max_examples=40, deadline=None)
@given(streams(), st.lists(st.integers(min_value=1, max_value=70_000), min_size=1, max_size=30))
def test_no_secret_survives_any_cut_of_the_stream(data: bytes, cuts: list[int]) -> None:
    out = _run(data, cuts)
    assert HF.encode() not in out
    assert PEM_LINE.encode() not in out
    if b"password=" + LEARNED.encode() in data:
        # learned from its first password= line: every later occurrence goes too
        first = data.index(b"password=" + LEARNED.encode())
        assert out.count(LEARNED.encode()) <= data[:first].count(LEARNED.encode())

    # only secrets changed: without placeholders and secrets, the bytes are the same
    def plain(b: bytes) -> bytes:
        b = PLACEHOLDER_RE.sub(b"", b)
        for s in (HF.encode(), LEARNED.encode(), PEM_LINE.encode()):
            b = b.replace(s, b"")
        return b

    assert plain(out) == plain(data)


def test_the_cut_matters() -> None:
    """Without the redactor choosing where a long line is cut, a secret across the cut leaks
    (this is what the property above guards against)."""
    data = b"x" * (MAX_PARTIAL - 10) + HF.encode() + b" tail\n"
    cuts = [MAX_PARTIAL + 5, len(data)]  # the first write ends inside the token
    assert b"<redacted:HF_TOKEN#1> tail" in _run(data, cuts)
    orig = LogRedactor.safe_cut
    try:
        del LogRedactor.safe_cut  # type: ignore[misc]
        out = _run(data, cuts)
        assert HF.encode()[:15] in out and HF.encode()[15:] in out  # both halves, unredacted
    finally:
        LogRedactor.safe_cut = orig  # type: ignore[method-assign]
