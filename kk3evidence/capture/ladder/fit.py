"""Fit a step's request into the running server's context, counted in real tokens.

The plan sizes prompts in words (about one token each); the server's tokenizer and chat
template decide the real count. Before a step sends a long prompt, ``POST /tokenize`` on the
running vLLM server counts it (and reports the server's ``max_model_len``); when the prompt plus
``max_tokens`` would not fit although the plan sized it to fit (words + ``max_tokens`` within
the context), words are taken off until it does, so a step never fails on a request the plan
itself made too long. A request planned beyond the context (a hand-written step whose point is
to exceed it) and the ``context-length`` step (the context is its variable) are sent as
planned.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import httpx

from kk3evidence.model import JSONObject

#: steps whose variable is the context itself: the request is sent unchanged
CONTEXT_VARIABLES = frozenset({"context-length"})


@dataclass(frozen=True, slots=True)
class Fit:
    words: int  # prompt words sent
    tokens: int | None  # counted by /tokenize (None: not counted)
    context: int | None  # the server's max_model_len
    note: str  # one line for the step's summaries

    def to_json(self) -> JSONObject:
        return {"words": self.words, "tokens": self.tokens, "context": self.context,
                "note": self.note}


def count_tokens(client: httpx.Client, base_url: str, headers: Mapping[str, str],
                 body: Mapping[str, object]) -> tuple[int | None, int | None]:
    """(prompt tokens, server max_model_len) from ``POST /tokenize``; (None, None) without it."""
    payload = {"model": body.get("model"), "messages": body.get("messages")}
    try:
        resp = client.post(base_url + "/tokenize", json=payload, headers=dict(headers),
                           timeout=30.0)
        data = resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    count, ctx = data.get("count"), data.get("max_model_len")
    return (count if isinstance(count, int) else None, ctx if isinstance(ctx, int) else None)


_Body = TypeVar("_Body", bound=Mapping[str, object])


def fit_prompt(
    words: int,
    make_body: Callable[[int], _Body],
    counter: Callable[[Mapping[str, object]], tuple[int | None, int | None]],
    *,
    max_tokens: int,
    context: int | None,
    variable: str,
) -> tuple[_Body, Fit]:
    """The body to send for a prompt of about ``words`` words, trimmed to fit the context."""
    body = make_body(words)
    tokens, server_ctx = counter(body)
    ctx = server_ctx or context
    if tokens is None or ctx is None:
        return body, Fit(words, tokens, ctx, f"prompt ~{words} words (no /tokenize count)")
    if variable in CONTEXT_VARIABLES or tokens + max_tokens <= ctx:
        return body, Fit(words, tokens, ctx, f"prompt {tokens} tokens + max_tokens {max_tokens} "
                                             f"(context {ctx})")
    if words + max_tokens > ctx:
        return body, Fit(words, tokens, ctx, f"prompt {tokens} tokens + max_tokens {max_tokens} "
                                             f"planned beyond the {ctx}-token context: sent as "
                                             "planned")
    start = words
    for _ in range(4):  # the count is close to linear in words: a few rounds converge
        over = tokens + max_tokens - ctx
        words = max(1, words - over - 8)
        body = make_body(words)
        counted, _ = counter(body)
        if counted is None:
            break
        tokens = counted
        if tokens + max_tokens <= ctx:
            break
    return body, Fit(words, tokens, ctx,
                     f"prompt trimmed from ~{start} to {words} words = {tokens} tokens so that "
                     f"input + max_tokens {max_tokens} fits the {ctx}-token context (/tokenize)")
