"""The ladder on the real vLLM CPU build: it stops at the step that introduces a real failure.

* Ladder 1 (2 vLLM starts): step 0 baseline (``--max-model-len 512``), step 1 prefix caching on
  (stable), step 2 a prompt longer than the model length (HTTP 400, as in
  ``realruns/ok_request_too_long``). Step 2 only changes the request, so it reuses the server
  of step 1 — the ladder must name step 2 and point at step 1 as the baseline to revert to.
* Ladder 2 (2 vLLM starts): with a fixed 1 MiB KV cache, step 1 raises ``--max-model-len`` from
  512 to 2048 (``realruns/fail_kv_cache_too_small``): the engine fails at engine_init (kv_cache).

Each vLLM start holds a vLLM slot (``tests/vllm_slots.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import VllmCpu, free_port, vllm_lock

from kk3evidence.capture.ladder.run import NoProgress, load_plan, run_ladder

ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def vllm_paths(vllm_cpu: VllmCpu) -> tuple[Path, Path]:
    return vllm_cpu.vllm, vllm_cpu.model


def _plan(path: Path, steps: list[dict[str, object]], env: dict[str, str] = ENV) -> Path:
    lines = ['schema = "kk3evidence/ladder-plan/v1"', "[plan]", 'created = "e2e"', ""]
    for i, s in enumerate(steps):
        lines += [
            "[[step]]",
            f"id = {i}",
            f"variable = {json.dumps(s['variable'])}",
            f"kind = {json.dumps(s['kind'])}",
            f"from = {json.dumps(s['from'])}",
            f"to = {json.dumps(s['to'])}",
            f"argv = {json.dumps(s['argv'])}",
            "env = { " + ", ".join(f'{k} = "{v}"' for k, v in env.items()) + " }",
            "[step.request]",
            "max_tokens = 16",
            *(f"{k} = {json.dumps(v)}" for k, v in dict(s.get("request") or {}).items()),  # type: ignore[call-overload]
            "",
        ]
    path.write_text("\n".join(lines))
    return path


def _base(vllm_paths: tuple[Path, Path]) -> list[str]:
    vllm, model = vllm_paths
    return [
        str(vllm), "serve", str(model), "--served-model-name", "tiny", "--host", "127.0.0.1",
        "--port", str(free_port()), "--dtype", "float32",
    ]  # fmt: skip


def test_ladder_names_the_longer_input_step_on_real_vllm(
    tmp_path: Path, vllm_paths: tuple[Path, Path]
) -> None:
    base = [*_base(vllm_paths), "--max-model-len", "512"]
    plan = _plan(
        tmp_path / "plan.toml",
        [
            # the probe request from the start: a step changes one variable (issue 10)
            {"variable": "baseline", "kind": "baseline", "from": "", "to": "minimal",
             "argv": [*base, "--no-enable-prefix-caching"],
             "request": {"input_tokens": 64, "repeat": 2}},
            {"variable": "prefix-caching", "kind": "argv", "from": "absent",
             "to": "--enable-prefix-caching", "argv": [*base, "--enable-prefix-caching"],
             "request": {"input_tokens": 64, "repeat": 2}},
            {"variable": "input_tokens", "kind": "request", "from": "64", "to": "~600 tokens",
             "argv": [*base, "--enable-prefix-caching"], "request": {"input_tokens": 600}},
        ],
    )  # fmt: skip
    out = tmp_path / "run"
    with vllm_lock():
        result = run_ladder(load_plan(plan), out, progress=NoProgress())
    assert result.verdict == "changed", result.message
    assert result.changed == 2 and result.last_stable == 1
    assert result.message.startswith("step 2 (variable input_tokens: 64 → ~600 tokens)")
    recs = {r.id: r for r in result.records}
    assert recs[0].outcome.healthy and recs[1].outcome.healthy
    assert recs[2].outcome.ready and recs[2].outcome.requests == ("HTTP 400",)
    assert any("maximum context length is 512" in s for s in recs[2].request_summaries)
    # two server starts, two bundles; step 2 ran on step 1's server
    assert (recs[0].bundle, recs[1].bundle, recs[2].bundle) == (
        "step-00.tar", "step-01.tar", "step-01.tar",
    )  # fmt: skip
    from kk3evidence.bundle.archive import open_bundle, validate

    for name in ("step-00.tar", "step-01.tar"):
        assert validate(out / name) == []
    with open_bundle(out / "step-00.tar") as b:
        # the "without cache" baseline really ran without it (the engine says so)
        assert b.analysis is not None
        assert b.analysis["engine_config"]["enable_prefix_caching"] is False
    with open_bundle(out / "step-01.tar") as b:
        statuses = [r.get("status") for r in b.requests() if r.get("kind") != "prefix_probe"]
        assert b.analysis is not None
        assert b.analysis["engine_config"]["enable_prefix_caching"] is True
        assert statuses == [200, 200]  # step 1's prompt twice, sent by capture
        # the prefix step records capture's four prefix checks (issue 10)
        probe = json.loads(b.read_bytes("probes/prefix_probe.json"))
        checks = {c["id"]: c["status"] for c in probe["checks"]}
        assert set(checks) == {"second_request_hits_cache", "inputs_identical",
                               "no_memory_error_after_enable", "request_ok_with_cache"}
        assert checks["second_request_hits_cache"] == "pass"
        assert (b.launch is not None and b.launch["exit_code"] is not None) or b.launch["signal"]
    # the state says what a rerun would skip
    state = json.loads((out / "ladder-state.json").read_text())
    assert state["result"]["verdict"] == "changed" and state["result"]["last_stable_step"] == 1


def test_ladder_names_the_kv_capacity_step_on_real_vllm(
    tmp_path: Path, vllm_paths: tuple[Path, Path]
) -> None:
    # A fixed 1 MiB KV cache holds about 896 tokens of this model: 512 fits, 2048 does not.
    # (VLLM_CPU_KVCACHE_SPACE is left out: it would override --kv-cache-memory-bytes.)
    base = [*_base(vllm_paths), "--kv-cache-memory-bytes", "1048576"]
    env = {k: v for k, v in ENV.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    plan = _plan(
        tmp_path / "plan.toml",
        [
            {"variable": "baseline", "kind": "baseline", "from": "", "to": "minimal",
             "argv": [*base, "--max-model-len", "512"]},
            {"variable": "context-length", "kind": "argv", "from": "--max-model-len 512",
             "to": "--max-model-len 2048", "argv": [*base, "--max-model-len", "2048"]},
        ],
        env,
    )  # fmt: skip
    with vllm_lock():
        result = run_ladder(load_plan(plan), tmp_path / "run", progress=NoProgress())
    assert result.verdict == "changed", result.message
    assert result.changed == 1 and result.last_stable == 0
    bad = result.records[1].outcome
    assert not bad.ready
    assert (bad.failure_stage, bad.failure_category) == ("engine_init", "kv_cache")
    assert result.records[1].bundle == "step-01.tar"
    assert "changes the outcome from ready, requests HTTP 2xx to start fails at engine_init" in (
        result.message
    )
