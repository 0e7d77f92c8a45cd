"""capture against a real (small) OpenAI-like HTTP server on 127.0.0.1: readiness, the fixed
request, /metrics, the prefix probe, --stop-after-request, secrets in headers."""

from __future__ import annotations

import json
from pathlib import Path

from progs.helpers import PY, all_member_bytes, free_port, own_lines, prog, run_capture

from kk3evidence.bundle.archive import open_bundle, validate
from kk3evidence.capture.http import FIXED_PROMPT


def _server(port: int, *extra: str) -> list[str]:
    return [PY, prog("fake_openai.py"), "--host", "127.0.0.1", "--port", str(port), *extra]


def test_ready_fixed_request_and_metrics_are_recorded(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    port = free_port()
    ran = run_capture(bundle, _server(port), ["--probe", "--stop-after-request"])
    assert ran.returncode == 0, ran.stderr
    assert validate(bundle) == []
    with open_bundle(bundle) as b:
        launch = b.launch
        reqs = b.requests()
        before = b.metrics("before")
        after = b.metrics("after")
    assert launch is not None
    assert launch["ready_seconds"] is not None and launch["ready_seconds"] > 0
    assert launch["served_model"] == "tiny"
    assert launch["api"] == {
        "host": "127.0.0.1",
        "port": port,
        "base_url": f"http://127.0.0.1:{port}",
    }
    assert launch["stopped_by"] == "stop-after-request"
    assert "api_ready" in launch["stages_reached"] and "serving" in launch["stages_reached"]
    assert [r["name"] for r in reqs] == ["fixed-1"]
    fixed = reqs[0]
    assert fixed["kind"] == "fixed" and fixed["status"] == 200 and fixed["error"] is None
    assert fixed["request_body"] == {
        "model": "tiny",
        "messages": [{"role": "user", "content": FIXED_PROMPT}],
        "max_tokens": 128,
        "temperature": 0,
    }
    assert fixed["url"] == f"http://127.0.0.1:{port}/v1/chat/completions"
    assert fixed["usage"]["prompt_tokens"] == len(FIXED_PROMPT.split())
    assert fixed["cached_tokens"] is None  # absent in the response: unknown, not zero
    assert fixed["latency_s"] > 0
    assert before is not None and "vllm:prefix_cache_queries_total" in before
    assert after is not None
    summary = own_lines(ran.stderr)[-1]
    assert "API ready in" in summary and "fixed request 1/1 answered 200" in summary


def test_repeat_and_request_file(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    req = tmp_path / "req.json"
    req.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4})
    )
    ran = run_capture(
        bundle,
        _server(free_port()),
        ["--probe", "--stop-after-request", "--repeat", "3", "--request", str(req)],
    )
    assert ran.returncode == 0, ran.stderr
    with open_bundle(bundle) as b:
        reqs = b.requests()
    assert [r["name"] for r in reqs] == ["fixed-1", "fixed-2", "fixed-3"]
    assert all(r["kind"] == "custom" and r["status"] == 200 for r in reqs)
    assert reqs[0]["request_body"]["model"] == "tiny"  # filled in from /v1/models


def test_prefix_probe_records_hits_and_the_four_checks(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    ran = run_capture(
        bundle,
        _server(
            free_port(), "--enable-prefix-caching", "--block-size", "16", "--prompt-tokens-details"
        ),
        ["--probe", "--prefix-probe", "--stop-after-request"],
    )
    assert ran.returncode == 0, ran.stderr
    with open_bundle(bundle) as b:
        names = b.names()
        probe = json.loads(b.read_bytes("probes/prefix_probe.json"))
        reqs = {r["name"]: r for r in b.requests()}
        assert b.metrics("after-prefix-1") is not None
        assert b.metrics("after-prefix-2") is not None
    assert "requests/prefix-1.json" in names and "requests/prefix-2.json" in names
    assert probe["block_size"] == 16
    assert probe["block_size_source"].startswith("/metrics")
    assert probe["prefix_caching_enabled"] is True
    assert probe["exceeds_one_block"] is True
    assert probe["deltas"]["request_1"]["hits"] == 0
    # the first delta counts the probe's own prompt only, not the fixed request before it
    assert probe["deltas"]["request_1"]["queries"] == reqs["prefix-1"]["usage"]["prompt_tokens"]
    assert probe["deltas"]["request_2"]["hits"] > 0
    checks = {c["id"]: c["status"] for c in probe["checks"]}
    assert checks == {
        "second_request_hits_cache": "pass",
        "inputs_identical": "pass",
        "no_memory_error_after_enable": "pass",
        "request_ok_with_cache": "pass",
    }
    assert reqs["prefix-2"]["cached_tokens"] > 0
    assert reqs["prefix-1"]["cached_tokens"] == 0


def test_prefix_probe_without_caching_fails_the_hit_check(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    ran = run_capture(
        bundle, _server(free_port()), ["--probe", "--prefix-probe", "--stop-after-request"]
    )
    assert ran.returncode == 0, ran.stderr
    with open_bundle(bundle) as b:
        probe = json.loads(b.read_bytes("probes/prefix_probe.json"))
    checks = {c["id"]: c["status"] for c in probe["checks"]}
    assert checks["second_request_hits_cache"] == "fail"
    assert checks["request_ok_with_cache"] == "not_applicable"
    assert probe["prefix_caching_enabled"] is False


def test_ready_timeout_records_api_ready_not_reached(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    port = free_port()
    # The server never becomes ready; after --ready-timeout capture stops polling and lets it
    # run. A wrapper ends it a little later so that the test finishes.
    cmd = [
        PY,
        "-c",
        "import subprocess,sys,time\n"
        f"p=subprocess.Popen({_server(port, '--never-ready')!r})\n"
        "time.sleep(3)\np.terminate()\nsys.exit(p.wait())",
    ]
    ran = run_capture(
        bundle, cmd, ["--probe", "--url", f"http://127.0.0.1:{port}", "--ready-timeout", "1"]
    )
    assert ran.returncode == 0, ran.stderr
    with open_bundle(bundle) as b:
        launch = b.launch
        assert not b.requests()
    assert launch is not None
    assert launch["ready_seconds"] is None
    assert launch["ready_error"].startswith("api_ready not reached after 1 s")
    assert any("api_ready not reached" in line for line in own_lines(ran.stderr))


def test_server_dying_before_ready_is_reported(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    ran = run_capture(
        bundle,
        [PY, prog("crasher.py"), "raise"],
        ["--probe", "--url", f"http://127.0.0.1:{free_port()}"],
    )
    assert ran.returncode == 1
    with open_bundle(bundle) as b:
        launch = b.launch
    assert launch is not None
    assert launch["ready_error"].startswith("api_ready not reached: the program exited")


def test_api_key_is_sent_but_never_stored(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    key = "sk-test-0123456789abcdefghijkl"
    ran = run_capture(
        bundle, _server(free_port(), "--api-key", key), ["--probe", "--stop-after-request"]
    )
    assert ran.returncode == 0, ran.stderr
    with open_bundle(bundle) as b:
        fixed = b.requests()[0]
        launch = b.launch
    assert fixed["status"] == 200  # the key was sent
    assert fixed["request_headers"]["Authorization"].startswith("Bearer <redacted:")
    assert launch is not None and key not in launch["argv"]
    assert key.encode() not in all_member_bytes(bundle)


def test_request_failure_mid_serving_is_recorded(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    ran = run_capture(bundle, _server(free_port(), "--crash-on-request"), ["--probe"])
    assert ran.returncode == 1
    with open_bundle(bundle) as b:
        fixed = b.requests()[0]
        log = b.read_bytes("logs/combined.log")
    assert fixed["status"] is None and fixed["error"]
    assert b"illegal memory access" in log
