"""ladder: runs each step through capture against a real (small) HTTP server program, stops at
the first step whose outcome changes, reuses the server for request-only steps, resumes."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from progs.helpers import free_port

from kk3evidence.capture.ladder.run import (
    NoProgress,
    load_plan,
    parse_plan,
    request_body,
    run_ladder,
)
from kk3evidence.cli import main
from kk3evidence.errors import InputError, UsageError
from kk3evidence.handoff.minimize import (
    PlanOptions,
    RequestSpec,
    build_plan,
    minimize,
    plan_to_toml,
)

# A tiny vLLM look-alike: real process, real HTTP on 127.0.0.1. Tokens are words.
# --fail-start prints vLLM's real KV-capacity error (from a CPU-build run) and exits 1.
SERVER = textwrap.dedent(
    r"""
    import json, os, signal, sys, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    args = sys.argv[1:]
    def opt(name, default=None):
        return args[args.index(name) + 1] if name in args else default
    host, port = opt("--host", "127.0.0.1"), int(opt("--port", "8000"))
    max_len = int(opt("--max-model-len", "512"))
    name = opt("--served-model-name", args[1])
    pid = os.getpid()
    def log(level, msg):
        print(f"(APIServer pid={pid}) {level} 11-30 01:56:15 [api_server.py:1] {msg}", flush=True)
    log("INFO", "Starting to load model " + args[1])
    hang = opt("--hang-if-exists")
    if hang and os.path.exists(hang):
        log("INFO", "loading weights (hanging)")
        signal.pause()
    if "--fail-start" in args:
        print(f"(EngineCore pid={pid}) ERROR 11-30 01:56:15 [core.py:1510] ValueError: To serve "
              "at least one request with the model's max seq len (2048), (0.0 GiB KV cache is "
              "needed, which is larger than the available KV cache memory (0.0 GiB). Based on "
              "the available memory, the estimated maximum model length is 896. Try increasing "
              "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
              "engine.", flush=True)
        sys.exit(1)
    calls = {"n": 0}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def _send(self, code, obj):
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            if self.path == "/health":
                return self._send(200, {})
            if self.path == "/v1/models":
                return self._send(200, {"data": [{"id": name, "max_model_len": max_len}]})
            if self.path == "/metrics":
                data = b"vllm:num_requests_running 0\n"
                self.send_response(200); self.send_header("Content-Length", str(len(data)))
                self.end_headers(); return self.wfile.write(data)
            self._send(404, {})
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            words = len(body["messages"][0]["content"].split())
            calls["n"] += 1
            if words > max_len:
                log("INFO", f'"POST /v1/chat/completions HTTP/1.1" 400 Bad Request')
                return self._send(400, {"error": {"message": f"This model's maximum context "
                    f"length is {max_len} tokens. However, your prompt contains at least "
                    f"{words} input tokens"}})
            log("INFO", '"POST /v1/chat/completions HTTP/1.1" 200 OK')
            self._send(200, {"choices": [{"message": {"content": "ok"}}],
                             "usage": {"prompt_tokens": words, "completion_tokens": 1}})

    srv = ThreadingHTTPServer((host, port), H)
    def stop(*_):
        log("INFO", "Shutting down")
        threading.Thread(target=srv.shutdown).start()
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    log("INFO", "Starting vLLM API server 0 on http://%s:%d" % (host, port))
    log("INFO", "Application startup complete.")
    srv.serve_forever()
    """
)


@pytest.fixture
def server(tmp_path: Path) -> list[str]:
    path = tmp_path / "fake_vllm.py"
    path.write_text(SERVER)
    return [sys.executable, str(path), "serve", "tiny-model", "--host", "127.0.0.1"]


def step(i: int, variable: str, argv: list[str], kind: str = "argv", **request: object) -> str:
    req = "".join(f"{k} = {json.dumps(v)}\n" for k, v in request.items())
    return (
        f"[[step]]\nid = {i}\nvariable = {json.dumps(variable)}\nkind = {json.dumps(kind)}\n"
        f'from = "a"\nto = "b"\nargv = {json.dumps(argv)}\n[step.request]\nmax_tokens = 4\n{req}\n'
    )


def write_plan(path: Path, *steps: str) -> Path:
    path.write_text(
        'schema = "kk3evidence/ladder-plan/v1"\n[plan]\ncreated = "t"\n\n' + "".join(steps)
    )
    return path


QUIET = NoProgress()


# ---- plan loading -------------------------------------------------------------------------


def test_a_plan_that_is_not_toml_is_an_input_error(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text("schema = [")
    with pytest.raises(InputError, match="not valid TOML"):
        load_plan(p)


def test_a_plan_missing_argv_names_the_json_path() -> None:
    text = 'schema = "kk3evidence/ladder-plan/v1"\n[[step]]\nid = 0\nvariable = "baseline"\n'
    with pytest.raises(InputError, match=r"\$\.step\[0\]"):
        parse_plan(text, "p.toml")


def test_steps_out_of_order_are_rejected() -> None:
    text = 'schema = "kk3evidence/ladder-plan/v1"\n' + step(1, "x", ["vllm", "serve", "M"])
    with pytest.raises(InputError, match="expected 0"):
        parse_plan(text, "p.toml")


def test_cli_bad_plan_exits_4_with_one_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text('schema = "something/else"\n')
    res = CliRunner().invoke(main, ["ladder", str(p), "-o", str(tmp_path / "o")])
    assert res.exit_code == 4
    assert res.output.count("\n") == 1 and "ladder-plan/v1" in res.output


def test_cli_dry_run_lists_steps_and_starts_nothing(tmp_path: Path) -> None:
    plan = build_plan(minimize(["vllm", "serve", "M", "--enable-prefix-caching"]))
    p = tmp_path / "plan.toml"
    p.write_text(plan_to_toml(plan))
    res = CliRunner().invoke(main, ["ladder", str(p), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "step 2: prefix-caching" in res.output
    assert not (tmp_path / "ladder-plan").exists()


def test_secret_reference_must_be_set(tmp_path: Path) -> None:
    plan = build_plan(minimize(["vllm", "serve", "M", "--api-key", "k"]))
    p = tmp_path / "plan.toml"
    p.write_text(plan_to_toml(plan))
    with pytest.raises(UsageError, match="VLLM_API_KEY"):
        run_ladder(load_plan(p), tmp_path / "o", progress=QUIET, environ={})


# ---- requests -----------------------------------------------------------------------------


def test_request_body_follows_the_spec() -> None:
    body = request_body(RequestSpec(), "tiny")
    assert body == {
        "model": "tiny",
        "messages": [{"role": "user", "content": "고정된 짧은 테스트 문장에 답하세요."}],
        "max_tokens": 128,
        "temperature": 0.0,
    }
    long = request_body(RequestSpec(input_tokens=600, tools=True), "tiny")
    assert len(long["messages"][0]["content"].split()) > 600
    assert long["tool_choice"] == "auto" and long["tools"][0]["function"]["name"] == "get_weather"


# ---- running (real subprocesses, real HTTP) -------------------------------------------------


def test_ladder_stops_at_the_step_whose_request_fails(tmp_path: Path, server: list[str]) -> None:
    port = str(free_port())
    base = [*server, "--port", port, "--max-model-len", "512"]
    plan = write_plan(
        tmp_path / "plan.toml",
        step(0, "baseline", base, "baseline"),
        step(1, "repeat", base, "request", repeat=2),
        step(2, "input_tokens", base, "request", input_tokens=600),
        step(3, "never-run", base, "request"),
    )
    out = tmp_path / "run"
    result = run_ladder(load_plan(plan), out, progress=QUIET)
    assert result.verdict == "changed" and result.exit_code == 3
    assert result.changed == 2 and result.last_stable == 1
    assert "step 2 (variable input_tokens: a → b) changes the outcome" in result.message
    assert "HTTP 2xx" in result.message and "HTTP 400" in result.message
    # one server for the three request-only steps: one bundle, shared
    assert [r.bundle for r in result.records] == ["step-00.tar"] * 3
    assert [r.shares_server_with for r in result.records] == [None, 0, 0]
    assert (out / "step-00.tar").is_file()
    recs = sorted((out / "step-02" / "requests").glob("*.json"))
    assert len(recs) == 1 and json.loads(recs[0].read_text())["status"] == 400
    assert (out / "step-02" / "metrics-after.prom").is_file()
    assert len(list((out / "step-01" / "requests").glob("*.json"))) == 2


def test_ladder_names_the_argv_step_that_breaks_the_start(
    tmp_path: Path, server: list[str]
) -> None:
    port = str(free_port())
    base = [*server, "--port", port]
    plan = write_plan(
        tmp_path / "plan.toml",
        step(0, "baseline", base, "baseline"),
        step(1, "context-length", [*base, "--fail-start"]),
    )
    result = run_ladder(load_plan(plan), tmp_path / "run", progress=QUIET)
    assert result.changed == 1 and result.last_stable == 0
    bad = result.records[1].outcome
    assert not bad.ready
    assert (bad.failure_stage, bad.failure_category) == ("engine_init", "kv_cache")
    assert result.records[1].bundle == "step-01.tar"
    assert "start fails at engine_init (kv_cache" in result.message


def test_all_stable_exits_0_and_a_rerun_resumes_without_starting_anything(
    tmp_path: Path, server: list[str]
) -> None:
    port = str(free_port())
    base = [*server, "--port", port]
    plan_path = write_plan(
        tmp_path / "plan.toml",
        step(0, "baseline", base, "baseline"),
        step(1, "concurrency", base, "request", concurrency=4),
        step(2, "served-model-name", [*base, "--served-model-name", "kimi"], concurrency=4),
    )
    out = tmp_path / "run"
    first = run_ladder(load_plan(plan_path), out, progress=QUIET)
    assert first.verdict == "stable" and first.exit_code == 0
    assert len(list((out / "step-01" / "requests").glob("*.json"))) == 4
    assert [r.bundle for r in first.records] == ["step-00.tar", "step-00.tar", "step-02.tar"]
    state = json.loads((out / "ladder-state.json").read_text())
    assert set(state["steps"]) == {"0", "1", "2"}
    # Resume: everything is done and every bundle validates, so nothing runs again.
    for tar in out.glob("*.console.log"):
        tar.unlink()
    again = run_ladder(load_plan(plan_path), out, progress=QUIET)
    assert again.skipped == (0, 1, 2)
    assert again.verdict == "stable"
    assert not list(out.glob("*.console.log"))


def test_a_damaged_bundle_is_run_again_on_resume(tmp_path: Path, server: list[str]) -> None:
    port = str(free_port())
    base = [*server, "--port", port]
    plan_path = write_plan(
        tmp_path / "plan.toml",
        step(0, "baseline", base, "baseline"),
        step(1, "served-model-name", [*base, "--served-model-name", "kimi"]),
    )
    out = tmp_path / "run"
    run_ladder(load_plan(plan_path), out, progress=QUIET)
    (out / "step-01.tar").write_bytes(b"not a tar")
    again = run_ladder(load_plan(plan_path), out, progress=QUIET)
    assert again.skipped == (0,)
    assert again.verdict == "stable"


def test_a_changed_plan_is_not_mixed_with_an_old_run(tmp_path: Path, server: list[str]) -> None:
    port = str(free_port())
    base = [*server, "--port", port]
    plan_path = write_plan(tmp_path / "plan.toml", step(0, "baseline", base, "baseline"))
    out = tmp_path / "run"
    run_ladder(load_plan(plan_path), out, progress=QUIET)
    write_plan(plan_path, step(0, "baseline", [*base, "--max-model-len", "64"], "baseline"))
    with pytest.raises(UsageError, match="another plan"):
        run_ladder(load_plan(plan_path), out, progress=QUIET)
    fresh = run_ladder(load_plan(plan_path), out, progress=QUIET, fresh=True)
    assert fresh.verdict == "stable"


def test_baseline_that_fails_stops_at_once(tmp_path: Path, server: list[str]) -> None:
    port = str(free_port())
    base = [*server, "--port", port, "--fail-start"]
    plan_path = write_plan(
        tmp_path / "plan.toml",
        step(0, "baseline", base, "baseline"),
        step(1, "x", base),
    )
    result = run_ladder(load_plan(plan_path), tmp_path / "run", progress=QUIET)
    assert result.verdict == "baseline-fails" and result.exit_code == 3
    assert len(result.records) == 1
    assert "fix the start before restoring features" in result.message


def test_cli_reports_the_changed_step_and_the_baseline_to_revert_to(
    tmp_path: Path, server: list[str]
) -> None:
    port = str(free_port())
    base = [*server, "--port", port, "--max-model-len", "64"]
    plan_path = write_plan(
        tmp_path / "plan.toml",
        step(0, "baseline", base, "baseline"),
        step(1, "input_tokens", base, "request", input_tokens=100),
    )
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["ladder", str(plan_path), "-o", str(out), "-q"])
    assert res.exit_code == 3, res.output
    assert "step 1 (variable input_tokens: a → b) changes the outcome from" in res.output
    assert "last stable baseline: step 0 (baseline)" in res.output
    assert "maximum context length is 64 tokens" in res.output
    res_json = CliRunner().invoke(main, ["ladder", str(plan_path), "-o", str(out), "--json"])
    obj = json.loads(res_json.stdout)
    assert obj["verdict"] == "changed" and obj["changed_step"] == 1
    assert obj["resumed_steps"] == [0, 1]


def test_minimize_plan_runs_on_the_fake_server(tmp_path: Path, server: list[str]) -> None:
    """The plan minimize writes is runnable as is: the flag restored first breaks the start."""
    port = str(free_port())
    argv = [*server, "--port", port]
    # minimize needs a vllm command; take its plan and point the argv at the fake server
    plan = build_plan(
        minimize(["vllm", "serve", "tiny-model", "--port", port, "--max-model-len", "64"]),
        PlanOptions(large_max_tokens=8, concurrency=2),
    )
    for s in plan["step"]:
        s["argv"] = argv + s["argv"][3:]
    p = tmp_path / "plan.toml"
    p.write_text(plan_to_toml(plan))
    result = run_ladder(load_plan(p), tmp_path / "run", progress=QUIET)
    assert result.verdict == "stable", result.message
    assert [r.variable for r in result.records] == [s["variable"] for s in plan["step"]]


def test_changed_argv_step_gets_the_bundle_diff_verdict(tmp_path: Path, server: list[str]) -> None:
    port = str(free_port())
    base = [*server, "--port", port]
    plan_path = write_plan(
        tmp_path / "plan.toml",
        step(0, "baseline", base, "baseline"),
        step(1, "context-length", [*base, "--fail-start"]),
    )
    result = run_ladder(load_plan(plan_path), tmp_path / "run", progress=QUIET)
    assert result.diff_summary is not None
    assert "changed" in result.diff_summary


def test_ctrl_c_exits_130_and_a_rerun_resumes(tmp_path: Path, server: list[str]) -> None:
    import signal
    import subprocess

    flag = tmp_path / "hang"
    flag.write_text("")
    port = str(free_port())
    base = [*server, "--port", port, "--hang-if-exists", str(flag)]
    plan_path = write_plan(tmp_path / "plan.toml", step(0, "baseline", base, "baseline"))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "kk3evidence", "ladder", str(plan_path), "-o", str(out), "-v"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # wait until the served program is up and hanging
        if "hanging" in line:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "run the same command again to resume" in err
    flag.unlink()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "the baseline works" in again.stdout
