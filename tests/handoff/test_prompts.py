"""handoff.prompts: the one prompt generator gives exactly what the three copies it replaced
gave (capture's prefix probe, the ladder's long prompt, minimize's prefix-probe size)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kk3evidence.capture import http as probe
from kk3evidence.capture.ladder.run import long_prompt, request_body
from kk3evidence.handoff import prompts
from kk3evidence.handoff.minimize import PROMPT_MARGIN, RequestSpec

# The replaced implementations, verbatim, as the reference.
_OLD_HTTP_WORDS = (
    "the quick brown fox jumps over the lazy dog while the server logs every request and the "
    "cache keeps each prefix block for the next question about memory tokens and engine workers"
)


def _old_prefix_probe_prompt(block_size: int, max_model_len: int | None, max_tokens: int) -> str:
    words = 2 * block_size + 16
    if max_model_len:
        words = max(block_size + 8, min(words, max_model_len - max_tokens - 64))
    vocab = _OLD_HTTP_WORDS.split(" ")
    return " ".join(vocab[i % len(vocab)] for i in range(words))


_OLD_LADDER_WORDS = tuple(_OLD_HTTP_WORDS.split(" "))  # the ladder's tuple held the same words


def _old_long_prompt(tokens: int) -> str:
    words = " ".join(_OLD_LADDER_WORDS[i % len(_OLD_LADDER_WORDS)] for i in range(max(1, tokens)))
    return words + "\nSummarize the text above in one sentence."


def _old_minimize_probe(block: int, ctx: int | None, max_tokens: int, at_least: int) -> int:
    probe_tokens = max(2 * block + 16, at_least)
    if ctx:
        probe_tokens = max(block + 8, min(probe_tokens, ctx - max_tokens - PROMPT_MARGIN))
    return probe_tokens


@given(
    st.integers(1, 256),
    st.one_of(st.none(), st.integers(0, 20000)),
    st.integers(1, 512),
)
def test_prefix_probe_prompt_is_unchanged(block: int, mml: int | None, max_tokens: int) -> None:
    assert probe.prefix_probe_prompt(block, mml, max_tokens) == _old_prefix_probe_prompt(
        block, mml, max_tokens
    )


@given(st.integers(-3, 3000))
def test_long_prompt_is_unchanged(tokens: int) -> None:
    assert long_prompt(tokens) == _old_long_prompt(tokens) == prompts.long_prompt(tokens)


@given(
    st.integers(1, 256),
    st.one_of(st.none(), st.integers(0, 200000)),
    st.integers(1, 8192),
    st.integers(0, 5000),
)
def test_minimize_probe_size_is_unchanged(
    block: int, ctx: int | None, max_tokens: int, at_least: int
) -> None:
    got = prompts.prefix_probe_words(
        block, ctx, max_tokens, at_least=at_least, margin=PROMPT_MARGIN
    )
    assert got == _old_minimize_probe(block, ctx, max_tokens, at_least)


def test_ladder_request_uses_the_generator() -> None:
    body = request_body(RequestSpec(input_tokens=40), "tiny")
    assert body["messages"][0]["content"] == prompts.long_prompt(40)


def test_vocabulary_is_the_one_all_three_used() -> None:
    assert prompts.WORDS == _OLD_LADDER_WORDS
    assert len(prompts.WORDS) == 32
    assert prompts.filler(3) == "the quick brown"
