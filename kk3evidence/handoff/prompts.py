"""The one prompt generator: deterministic filler prompts of a chosen size.

Three places need a prompt of about N tokens and must agree on it: capture's prefix probe
(``capture/http.py``: more than two KV blocks, sent twice), ``minimize`` (sizes the ladder's
prefix-probe and long-input steps) and the ladder (``capture/ladder``: builds and, through
``/tokenize``, trims a step's long prompt). Common English words are about one token each in
every tokenizer we met, so a count of words stands in for a count of tokens. Pure: no I/O.
"""

from __future__ import annotations

__all__ = [
    "PROBE_MARGIN",
    "WORDS",
    "filler",
    "long_prompt",
    "prefix_probe_prompt",
    "prefix_probe_words",
]

#: the vocabulary, cycled (each word one token in the tokenizers we met)
WORDS: tuple[str, ...] = (
    "the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "the",
    "server", "logs", "every", "request", "and", "the", "cache", "keeps", "each", "prefix",
    "block", "for", "the", "next", "question", "about", "memory", "tokens", "and", "engine",
    "workers",
)

#: tokens capture's prefix probe leaves free for the chat template and the answer
PROBE_MARGIN = 64

_INSTRUCTION = "\nSummarize the text above in one sentence."


def filler(words: int) -> str:
    """``words`` words of :data:`WORDS`, cycled, joined by spaces."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def long_prompt(tokens: int) -> str:
    """A prompt of about ``tokens`` tokens (at least one word) and a closing instruction."""
    return filler(max(1, tokens)) + _INSTRUCTION


def prefix_probe_words(
    block_size: int,
    context: int | None,
    max_tokens: int,
    *,
    at_least: int = 0,
    margin: int = PROBE_MARGIN,
) -> int:
    """Words for a prefix-cache probe: more than two KV blocks (or ``at_least``), cut to what
    fits ``context`` after ``max_tokens`` and ``margin``, but never below one block and a bit."""
    words = max(2 * block_size + 16, at_least)
    if context:
        words = max(block_size + 8, min(words, context - max_tokens - margin))
    return words


def prefix_probe_prompt(block_size: int, max_model_len: int | None, max_tokens: int) -> str:
    """Capture's prefix probe prompt: more than two KV blocks of filler words."""
    return filler(prefix_probe_words(block_size, max_model_len, max_tokens))
