"""A tiny OpenAI-like HTTP server on 127.0.0.1 for fast capture tests (a real server, no vLLM).

usage: fake_openai.py --port N [--host H] [--api-key K] [--served-model-name NAME]
                      [--not-ready-polls N] [--never-ready] [--enable-prefix-caching]
                      [--block-size N] [--max-model-len N] [--crash-on-request]
                      [--enforce-context]

Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions,
GET /metrics (vLLM's prefix-cache counters and cache_config_info), POST /tokenize (words plus
10 template tokens, and max_model_len). Tokens are words. With
--enable-prefix-caching, a prompt seen before counts its full blocks as prefix-cache hits.
SIGINT/SIGTERM: prints "Shutting down" and exits 0. Log lines imitate vLLM's API server.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PID = os.getpid()
TEMPLATE_TOKENS = 10  # what a chat template adds (the real count exceeds the word count)


def log(msg: str) -> None:
    print(f"(APIServer pid={PID}) INFO 11-30 01:48:29 [api_server.py:1] {msg}", flush=True)


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.health_polls = 0
        self.queries = 0
        self.hits = 0
        self.seen: set[str] = set()
        self.lock = threading.Lock()


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    args = state.args

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *a: object) -> None:
            print(f'INFO:     {self.client_address[0]} - "{self.requestline}" {a[1]}', flush=True)

        def _send(self, code: int, obj: object, ctype: str = "application/json") -> None:
            body = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self) -> bool:
            if not args.api_key:
                return True
            if self.headers.get("Authorization") == f"Bearer {args.api_key}":
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:
            if self.path == "/health":
                with state.lock:
                    state.health_polls += 1
                    ready = not args.never_ready and state.health_polls > args.not_ready_polls
                self._send(200 if ready else 503, "" if ready else "starting")
            elif self.path == "/v1/models":
                if self._authorized():
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": [
                                {
                                    "id": args.served_model_name,
                                    "object": "model",
                                    "max_model_len": args.max_model_len,
                                }
                            ],
                        },
                    )
            elif self.path == "/metrics":
                with state.lock:
                    q, h = state.queries, state.hits
                labels = f'engine="0",model_name="{args.served_model_name}"'
                text = (
                    "# TYPE vllm:prefix_cache_queries_total counter\n"
                    f"vllm:prefix_cache_queries_total{{{labels}}} {float(q)}\n"
                    "# TYPE vllm:prefix_cache_hits_total counter\n"
                    f"vllm:prefix_cache_hits_total{{{labels}}} {float(h)}\n"
                    f'vllm:cache_config_info{{block_size="{args.block_size}",'
                    f'enable_prefix_caching="{args.enable_prefix_caching}",engine="0"}} 1.0\n'
                )
                self._send(200, text, "text/plain; version=0.0.4")
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._send(400, {"error": {"message": "bad JSON"}})
                return
            if args.crash_on_request:
                print(
                    "RuntimeError: CUDA error: an illegal memory access was encountered", flush=True
                )
                os._exit(1)
            if self.path == "/tokenize":
                text = " ".join(m.get("content", "") for m in body.get("messages", []))
                # words plus a chat template, like a real tokenizer counts more than words
                count = len(text.split()) + TEMPLATE_TOKENS
                self._send(200, {"count": count, "max_model_len": args.max_model_len,
                                 "tokens": list(range(count))})
                return
            if self.path == "/v1/chat/completions":
                prompt = " ".join(m.get("content", "") for m in body.get("messages", []))
            elif self.path == "/v1/completions":
                prompt = str(body.get("prompt", ""))
            else:
                self._send(404, {"error": "not found"})
                return
            tokens = len(prompt.split())
            asked = int(body.get("max_tokens") or 0)
            if args.enforce_context and tokens + TEMPLATE_TOKENS + asked > args.max_model_len:
                # vLLM's answer when input + max_tokens exceeds the context
                self._send(400, {"error": {"message": (
                    f"This model's maximum context length is {args.max_model_len} tokens. "
                    f"However, you requested {asked} output tokens and your prompt contains "
                    f"{tokens + TEMPLATE_TOKENS} input tokens"), "code": 400}})
                return
            cached = 0
            with state.lock:
                state.queries += tokens
                if args.enable_prefix_caching and prompt in state.seen:
                    cached = (tokens // args.block_size) * args.block_size
                    state.hits += cached
                state.seen.add(prompt)
            if cached:
                log(f"Prefix cache hit rate: {100.0 * cached / max(tokens, 1):.1f}%")
            answer = "fixed answer"
            usage = {"prompt_tokens": tokens, "completion_tokens": 2, "total_tokens": tokens + 2}
            if args.prompt_tokens_details:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            self._send(
                200,
                {
                    "id": "cmpl-1",
                    "object": "chat.completion",
                    "model": body.get("model"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}],
                    "usage": usage,
                },
            )

    return Handler


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--api-key")
    ap.add_argument("--served-model-name", default="tiny")
    ap.add_argument("--not-ready-polls", type=int, default=2)
    ap.add_argument("--never-ready", action="store_true")
    ap.add_argument("--enable-prefix-caching", action="store_true")
    ap.add_argument("--prompt-tokens-details", action="store_true")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--enforce-context", action="store_true",
                    help="answer 400 when input + max_tokens exceeds --max-model-len")
    ap.add_argument("--crash-on-request", action="store_true")
    args = ap.parse_args()
    state = State(args)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))

    def stop(signum: int, frame: object) -> None:
        log("Shutting down")
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    log(f"Starting vLLM API server 0 on http://{args.host}:{args.port}")
    print("INFO:     Application startup complete.", flush=True)
    server.serve_forever()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
