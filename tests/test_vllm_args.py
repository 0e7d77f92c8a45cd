"""vllm_args: a `vllm serve` argv is normalized flag by flag, like vLLM's own parser does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.errors import InputError
from kk3evidence.vllm_args import (
    ServeCommand,
    flag_diff,
    is_vllm_serve,
    load_arg_table,
    parse_serve_argv,
    parse_serve_command,
    render_argv,
)

REPO = Path(__file__).resolve().parent.parent


def p(*argv: str) -> ServeCommand:
    return parse_serve_argv(["vllm", "serve", *argv])


# ---- the shipped table --------------------------------------------------------------------


def test_shipped_table_is_vllm_0_32_and_knows_the_core_flags() -> None:
    t = load_arg_table()
    assert t.vllm_version.startswith("0.32")
    for name in (
        "tensor-parallel-size",
        "pipeline-parallel-size",
        "enable-prefix-caching",
        "speculative-config",
        "tool-call-parser",
        "reasoning-parser",
        "max-model-len",
        "served-model-name",
        "gpu-memory-utilization",
    ):
        assert t.spec(name) is not None, name
    assert t.resolve("-tp") == ("tensor-parallel-size", False)
    assert t.resolve("--no-enable-prefix-caching") == ("enable-prefix-caching", True)
    assert "kimi_k2" in t.tool_call_parsers
    assert "kimi_k2" in t.reasoning_parsers


def test_shipped_table_names_its_generator_and_has_no_machine_paths() -> None:
    text = (REPO / "data" / "vllm_args" / "vllm-0.32.json").read_text()
    obj = json.loads(text)
    assert obj["generated_by"] == "scripts/gen-vllm-args"
    # no absolute path of the machine that generated it (its checkout, home or scratch dirs)
    assert re.search(r"/(?:work|root|home|tmp|scratch)/", text) is None


# ---- normalization ------------------------------------------------------------------------


def test_equals_and_space_forms_are_the_same_flag() -> None:
    assert p("M", "--max-num-seqs=8") == p("M", "--max-num-seqs", "8")


def test_alias_and_long_name_are_the_same_flag() -> None:
    a = p("M", "-tp", "8")
    b = p("M", "--tensor-parallel-size", "8")
    c = p("M", "-tp=8")
    assert a == b == c
    assert a.tensor_parallel_size == 8


def test_underscores_in_names_become_dashes() -> None:
    assert p("M", "--max_model_len", "512") == p("M", "--max-model-len", "512")


def test_unique_prefix_is_accepted_like_argparse() -> None:
    assert p("M", "--tensor-parallel", "2").get("tensor-parallel-size") == 2


def test_negated_boolean_sets_false_and_last_one_wins() -> None:
    assert p("M", "--no-enable-prefix-caching").flags["enable-prefix-caching"] is False
    cmd = p("M", "--no-enable-prefix-caching", "--enable-prefix-caching")
    assert cmd.flags["enable-prefix-caching"] is True


def test_model_option_equals_positional_model() -> None:
    a = p("--model", "moonshotai/Kimi-K3", "-tp", "8")
    b = p("moonshotai/Kimi-K3", "-tp", "8")
    assert a == b
    assert a.model == "moonshotai/Kimi-K3"


def test_api_server_module_form_is_a_serve_command() -> None:
    argv = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "M", "--port", "9"]
    assert is_vllm_serve(argv)
    cmd = parse_serve_argv(argv)
    assert cmd.model == "M" and cmd.port == 9
    assert cmd.program == ("python3", "-m", "vllm.entrypoints.openai.api_server")
    assert flag_diff(cmd, p("M", "--port", "9")) == []


def test_env_prefix_is_kept_apart_from_flags() -> None:
    cmd = parse_serve_argv(["env", "VLLM_ENGINE_READY_TIMEOUT_S=3600", "vllm", "serve", "M"])
    assert cmd.env == {"VLLM_ENGINE_READY_TIMEOUT_S": "3600"}
    assert cmd.model == "M"


def test_not_a_vllm_command_is_an_input_error() -> None:
    assert not is_vllm_serve(["python", "train.py"])
    with pytest.raises(InputError, match="not a vLLM serve command"):
        parse_serve_argv(["bash", "-c", "vllm serve M"])


def test_json_arguments_are_canonical_json_text() -> None:
    a = p("M", "--speculative-config", '{"num_speculative_tokens": 3, "method": "eagle3"}')
    b = p(
        "M",
        "--speculative-config.method",
        "eagle3",
        "--speculative-config.num_speculative_tokens",
        "3",
    )
    assert a == b
    assert a.flags["speculative-config"] == '{"method":"eagle3","num_speculative_tokens":3}'


def test_optimization_level_short_forms() -> None:
    assert p("M", "-O3").get("optimization-level") == "3"
    assert p("M", "-O", "3") == p("M", "-O3") == p("M", "-O=3")


def test_list_and_append_flags_become_tuples() -> None:
    cmd = p("M", "--served-model-name", "a", "b", "--middleware", "x", "--middleware", "y")
    assert cmd.flags["served-model-name"] == ("a", "b")
    assert cmd.served_model_name == "a"
    assert cmd.flags["middleware"] == ("x", "y")


def test_human_readable_ints_follow_vllm() -> None:
    assert p("M", "--max-model-len", "256K").get("max-model-len") == 262144
    assert p("M", "--max-model-len", "32k").get("max-model-len") == 32000


def test_unknown_option_is_kept_visible() -> None:
    cmd = p("M", "--frobnicate", "3", "--tp", "2")
    assert "--frobnicate" in cmd.unknown
    assert cmd.flags["frobnicate"] == "3"


def test_host_port_and_served_name_defaults() -> None:
    cmd = p("M")
    assert (cmd.host, cmd.port, cmd.served_model_name) == ("127.0.0.1", 8000, "M")
    assert p("M", "--host", "0.0.0.0").host == "127.0.0.1"
    assert p("M", "--host", "10.0.0.5", "--port", "8011").base_url == "http://10.0.0.5:8011"
    assert p("M", "--block-size", "32").block_size == 32


def test_get_accepts_any_spelling() -> None:
    cmd = p("M", "-tp", "4", "--trust-remote-code", "--gpu-memory-utilization", "0.95")
    assert (
        cmd.get("-tp") == cmd.get("tensor-parallel-size") == cmd.get("--tensor_parallel_size") == 4
    )
    assert cmd.trust_remote_code and cmd.gpu_memory_utilization == 0.95
    assert cmd.get("model") == "M"


# ---- diff ----------------------------------------------------------------------------------


def test_flag_given_with_its_default_equals_absent() -> None:
    assert flag_diff(p("M", "--max-num-seqs", "256"), p("M")) == []
    assert flag_diff(p("M", "--no-trust-remote-code"), p("M")) == []
    assert flag_diff(p("M", "-tp", "1"), p("M")) == []


def test_diff_names_one_changed_flag_with_default_marker() -> None:
    (ch,) = flag_diff(p("M"), p("M", "--enable-prefix-caching"))
    assert ch.name == "enable-prefix-caching"
    assert ch.a_default and not ch.b_default
    assert ch.a is None and ch.b is True
    assert "(default)" in ch.describe()


def test_diff_reports_model_change_first() -> None:
    changes = flag_diff(p("A", "-tp", "2"), p("B", "-tp", "4"))
    assert [c.name for c in changes] == ["model", "tensor-parallel-size"]


def test_with_defaults_fills_every_known_flag() -> None:
    merged = p("M", "-tp", "8").with_defaults()
    assert merged["tensor-parallel-size"] == 8
    assert merged["pipeline-parallel-size"] == 1
    assert merged["max-num-seqs"] == 256
    assert merged["model"] == "M"


# ---- property tests: order and form do not matter; render -> parse round-trips --------------

_VALUE_FLAGS = {
    "tensor-parallel-size": st.integers(1, 16).map(str),
    "max-model-len": st.integers(16, 10**6).map(str),
    "gpu-memory-utilization": st.sampled_from(["0.5", "0.9", "0.95"]),
    "dtype": st.sampled_from(["auto", "float32", "bfloat16"]),
    "served-model-name": st.sampled_from(["tiny", "kimi-k3"]),
    "port": st.integers(1024, 65535).map(str),
    "host": st.sampled_from(["127.0.0.1", "0.0.0.0", "10.1.2.3"]),
    "tool-call-parser": st.sampled_from(["kimi_k2", "hermes"]),
    "speculative-config": st.sampled_from(['{"method": "eagle3", "num_speculative_tokens": 3}']),
}
_ALIASES = {"tensor-parallel-size": "-tp"}
_BOOLS = ["enable-prefix-caching", "trust-remote-code", "enable-auto-tool-choice", "enforce-eager"]


@st.composite
def flag_sets(draw: st.DrawFn) -> list[tuple[str, str | bool]]:
    names = draw(st.lists(st.sampled_from(sorted(_VALUE_FLAGS)), unique=True, max_size=6))
    items: list[tuple[str, str | bool]] = [(n, draw(_VALUE_FLAGS[n])) for n in names]
    bools = draw(st.lists(st.sampled_from(_BOOLS), unique=True, max_size=3))
    items += [(b, draw(st.booleans())) for b in bools]
    return items


def _tokens(name: str, value: str | bool, form: int) -> list[str]:
    if isinstance(value, bool):
        body = name if value else f"no-{name}"
        return ["--" + (body.replace("-", "_") if form == 2 else body)]
    opt = _ALIASES.get(name, f"--{name}") if form == 1 else f"--{name}"
    if form == 2 and opt.startswith("--"):
        opt = "--" + opt[2:].replace("-", "_")
    return [f"{opt}={value}"] if form == 0 else [opt, value]


@settings(max_examples=150, deadline=None)
@given(items=flag_sets(), data=st.data())
def test_order_and_spelling_do_not_change_the_command(
    items: list[tuple[str, str | bool]], data: st.DataObject
) -> None:
    base: list[str] = ["vllm", "serve", "moonshotai/Kimi-K3"]
    canonical = parse_serve_argv(base + [t for n, v in items for t in _tokens(n, v, 3)])
    shuffled = data.draw(st.permutations(items))
    forms = data.draw(st.lists(st.integers(0, 2), min_size=len(items), max_size=len(items)))
    argv = base + [t for (n, v), f in zip(shuffled, forms, strict=True) for t in _tokens(n, v, f)]
    other = parse_serve_argv(argv)
    assert dict(other.flags) == dict(canonical.flags)
    assert flag_diff(other, canonical) == []
    assert other.unknown == ()


@settings(max_examples=150, deadline=None)
@given(items=flag_sets())
def test_render_then_parse_round_trips(items: list[tuple[str, str | bool]]) -> None:
    argv = ["vllm", "serve", "M"] + [t for n, v in items for t in _tokens(n, v, 0)]
    cmd = parse_serve_argv(argv)
    again = parse_serve_argv(render_argv(cmd))
    assert again == cmd
    assert render_argv(again) == render_argv(cmd)


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.text(min_size=0, max_size=12), max_size=12))
def test_arbitrary_tokens_never_crash(tokens: list[str]) -> None:
    cmd = parse_serve_argv(["vllm", "serve", *tokens])
    parse_serve_argv(render_argv(cmd))  # whatever we render parses again


# ---- real command lines ---------------------------------------------------------------------


def test_real_command_lines_parse_without_unknown_tokens(realruns: Path) -> None:
    files = sorted(realruns.glob("*/command.txt"))
    assert files
    for f in files:
        cmd = parse_serve_command(f.read_text())
        assert cmd.model, f
        assert cmd.unknown == (), (f, cmd.unknown)
        # shared/realruns used 8011; the later two-node hang run (issue 11) its own port
        assert cmd.port in (8011, 18201) and cmd.host == "127.0.0.1"
        again = parse_serve_argv(render_argv(cmd))
        assert again == cmd


def test_real_scenarios_differ_by_exactly_the_flag_they_changed(realruns: Path) -> None:
    base = parse_serve_command((realruns / "ok_baseline" / "command.txt").read_text())
    pc = parse_serve_command((realruns / "ok_prefix_caching" / "command.txt").read_text())
    assert [c.name for c in flag_diff(base, pc)] == ["enable-prefix-caching"]
    tp = parse_serve_command((realruns / "fail_bad_arg_tp4" / "command.txt").read_text())
    assert [c.describe() for c in flag_diff(base, tp)] == ["tensor-parallel-size: 1 (default) -> 4"]


def test_the_standalone_extractor_writes_the_format_id_of_the_table() -> None:
    # _vllm_extract.py runs inside vLLM's interpreter without kk3evidence, so it keeps a literal.
    from kk3evidence import _vllm_extract
    from kk3evidence.model import FORMAT_IDS

    assert FORMAT_IDS["vllm-args"] == _vllm_extract.SCHEMA
