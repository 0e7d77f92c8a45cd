"""HTTP side of a capture: readiness polling, the fixed request, ``/metrics``, the prefix probe.

Everything here talks to the served program over plain HTTP with httpx (proxies from the
environment are ignored: the server is local or named explicitly). Each call is bounded by a
timeout; a failure becomes a field in the record (``status: null``, ``error: "..."``), never an
exception out of this module.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from kk3evidence.handoff import prompts
from kk3evidence.model import FORMAT_IDS, JSONObject

REQUEST_SCHEMA = FORMAT_IDS["request"]
DEFAULT_PORT = 8000
DEFAULT_HOST = "127.0.0.1"

#: SPEC §5: the guide's own fixed request (``model`` is filled in from /v1/models)
FIXED_PROMPT = "고정된 짧은 테스트 문장에 답하세요."
MAX_BODY_CHARS = 1_000_000


def default_request_body(model: str | None) -> JSONObject:
    return {
        "model": model,
        "messages": [{"role": "user", "content": FIXED_PROMPT}],
        "max_tokens": 128,
        "temperature": 0,
    }


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True, slots=True)
class ApiTarget:
    host: str
    port: int
    base_url: str
    api_key: str | None = None
    how: str = "vLLM defaults"

    def to_json(self) -> JSONObject:
        return {"host": self.host, "port": self.port, "base_url": self.base_url}


def _connect_host(host: str) -> str:
    # A server bound to every address is reached on loopback.
    if host in ("", "0.0.0.0", "::", "[::]"):
        return DEFAULT_HOST
    return host


def _flag_value(argv: Sequence[str], names: Sequence[str]) -> str | None:
    value: str | None = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def api_target(argv: Sequence[str], env: Mapping[str, str], url: str | None = None) -> ApiTarget:
    """Where the served program will listen: ``--url`` > CMD's ``--host/--port`` > defaults."""
    key = _flag_value(argv, ["--api-key"]) or env.get("VLLM_API_KEY") or None
    if url:
        parsed = httpx.URL(url)
        url_port = parsed.port or (443 if parsed.scheme == "https" else 80)
        return ApiTarget(parsed.host, url_port, str(parsed).rstrip("/"), key, "option --url")
    host_s: str | None = None
    port_s: str | None = None
    how = "vLLM defaults"
    try:
        from kk3evidence import vllm_args

        cmd = vllm_args.parse_serve_argv(list(argv))
    except Exception:
        host_s = _flag_value(argv, ["--host"])
        port_s = _flag_value(argv, ["--port"])
    else:
        if cmd.has("host") or cmd.has("port"):
            how = "CMD arguments"
        api_key = cmd.get("api-key")
        if isinstance(api_key, tuple):  # an appended flag: its first value, as before
            api_key = str(api_key[0]) if api_key else None
        key = str(api_key) if api_key else key
        return ApiTarget(cmd.host, cmd.port, cmd.base_url, key, how)
    if host_s is not None or port_s is not None:
        how = "CMD arguments"
    host = _connect_host(host_s or DEFAULT_HOST)
    try:
        port = int(port_s) if port_s is not None else DEFAULT_PORT
    except ValueError:
        port = DEFAULT_PORT
    shown = f"[{host}]" if ":" in host else host
    return ApiTarget(host, port, f"http://{shown}:{port}", key, how)


def make_client(timeout: float = 10.0) -> httpx.Client:
    return httpx.Client(timeout=timeout, trust_env=False)


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    seconds: float | None  # from the launch to the first full answer
    served_model: str | None
    models: Any
    max_model_len: int | None
    error: str | None  # why it was not reached
    attempts: int


def wait_ready(
    client: httpx.Client,
    target: ApiTarget,
    *,
    started_mono: float,
    timeout: float,
    alive: Callable[[], bool],
    stop: threading.Event,
    interval: float = 0.25,
    headers: Mapping[str, str] | None = None,
    verify: Callable[[str | None], str | None] | None = None,
) -> Readiness:
    """Poll ``/health`` then ``/v1/models`` until both answer 200, the child dies or time is up.

    ``verify(served_model)`` returns why the answering server is not the launched one (a stale
    server on the port, another model), or None: such answers never count as ready.
    """
    attempts = 0
    last_error = "no answer yet"
    deadline = started_mono + timeout
    while True:
        if not alive():
            return Readiness(
                False,
                None,
                None,
                None,
                None,
                f"api_ready not reached: the program exited ({last_error})",
                attempts,
            )
        if stop.is_set():
            return Readiness(
                False, None, None, None, None, "api_ready not reached: capture stopped", attempts
            )
        if time.monotonic() >= deadline:
            return Readiness(
                False,
                None,
                None,
                None,
                None,
                f"api_ready not reached after {timeout:g} s ({last_error})",
                attempts,
            )
        attempts += 1
        try:
            health = client.get(target.base_url + "/health", timeout=5.0)
            if health.status_code == 200:
                models = client.get(
                    target.base_url + "/v1/models", headers=dict(headers or {}), timeout=10.0
                )
                if models.status_code == 200:
                    seconds = time.monotonic() - started_mono
                    body: Any = None
                    served: str | None = None
                    max_len: int | None = None
                    try:
                        body = models.json()
                        first = (body.get("data") or [{}])[0]
                        served = first.get("id")
                        raw_len = first.get("max_model_len")
                        max_len = int(raw_len) if isinstance(raw_len, int) else None
                    except (ValueError, AttributeError, IndexError, TypeError):
                        body = models.text[:10_000]
                    foreign = verify(served) if verify is not None else None
                    if foreign is None:
                        return Readiness(True, seconds, served, body, max_len, None, attempts)
                    last_error = foreign
                    stop.wait(interval)
                    continue
                last_error = f"/v1/models answered {models.status_code}"
            else:
                last_error = f"/health answered {health.status_code}"
        except httpx.HTTPError as exc:
            last_error = _why_no_answer(exc, target)
        stop.wait(interval)


def _why_no_answer(exc: httpx.HTTPError, target: ApiTarget) -> str:
    """A sentence, not an exception class name ("(ConnectError)" told users nothing)."""
    where = f"{target.host}:{target.port}"
    if isinstance(exc, httpx.ConnectError):
        return f"nothing accepted a connection on {where}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{where} accepted the connection but did not answer in time"
    return f"HTTP error talking to {where}: {exc or type(exc).__name__}"


def _decode_body(resp: httpx.Response) -> tuple[Any, bool]:
    text = resp.text
    truncated = len(text) > MAX_BODY_CHARS
    if not truncated:
        try:
            return resp.json(), False
        except ValueError:
            pass
    return text[:MAX_BODY_CHARS], truncated


def body_sha256(body: object) -> str:
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, ensure_ascii=False).encode("utf-8")
    ).hexdigest()


def send_request(
    client: httpx.Client,
    *,
    name: str,
    kind: str,
    url: str,
    body: object,
    headers: Mapping[str, str],
    shown_headers: Mapping[str, str],
    timeout: float,
    method: str = "POST",
) -> JSONObject:
    """Send one request; the record is ``requests/<name>.json`` (headers already redacted)."""
    record: dict[str, Any] = {
        "schema": REQUEST_SCHEMA,
        "name": name,
        "kind": kind,
        "method": method,
        "url": url,
        "request_headers": dict(shown_headers),
        "request_body": body,
        "request_sha256": body_sha256(body),
        "sent_at": now_iso(),
        "status": None,
        "error": None,
        "latency_s": None,
        "response_body": None,
        "usage": None,
        "cached_tokens": None,
    }
    start = time.monotonic()
    try:
        resp = client.request(method, url, json=body, headers=dict(headers), timeout=timeout)
    except httpx.HTTPError as exc:
        record["latency_s"] = round(time.monotonic() - start, 6)
        record["error"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return record
    record["latency_s"] = round(time.monotonic() - start, 6)
    record["status"] = resp.status_code
    record["response_body"], truncated = _decode_body(resp)
    if truncated:
        record["response_truncated"] = True
    rb = record["response_body"]
    if isinstance(rb, dict):
        usage = rb.get("usage")
        if isinstance(usage, dict):
            record["usage"] = usage
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                record["cached_tokens"] = details["cached_tokens"]
        if resp.status_code >= 400:
            err = rb.get("error") if isinstance(rb.get("error"), dict) else rb
            msg = err.get("message") if isinstance(err, dict) else None
            record["error"] = (
                f"HTTP {resp.status_code}: {msg}" if msg else f"HTTP {resp.status_code}"
            )
    elif resp.status_code >= 400:
        record["error"] = f"HTTP {resp.status_code}"
    return record


def fetch_metrics(
    client: httpx.Client, target: ApiTarget, headers: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """``(text, error)`` of ``GET /metrics``."""
    try:
        resp = client.get(target.base_url + "/metrics", headers=dict(headers), timeout=10.0)
    except httpx.HTTPError as exc:
        return None, f"GET /metrics failed: {_why_no_answer(exc, target)}"
    if resp.status_code != 200:
        return None, f"GET /metrics answered {resp.status_code}"
    return resp.text, None


_SAMPLE_RE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)"
)


def prom_value(text: str | None, metric: str) -> float | None:
    """Sum of every sample of ``metric`` (over label sets); ``None`` when absent."""
    if not text:
        return None
    total: float | None = None
    for line in text.splitlines():
        if not line.startswith(metric):
            continue
        m = _SAMPLE_RE.match(line)
        if m is None or m.group("name") != metric:
            continue
        try:
            total = (total or 0.0) + float(m.group("value"))
        except ValueError:
            continue
    return total


def prom_label(text: str | None, metric: str, label: str) -> str | None:
    """The value of ``label`` on the first sample of ``metric``."""
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith(metric + "{"):
            m = re.search(r"[{,]" + re.escape(label) + r'="([^"]*)"', line)
            if m:
                return m.group(1)
    return None


def prefix_probe_prompt(block_size: int, max_model_len: int | None, max_tokens: int) -> str:
    """A deterministic prompt of more than two KV blocks (the one generator: handoff.prompts)."""
    return prompts.prefix_probe_prompt(block_size, max_model_len, max_tokens)
