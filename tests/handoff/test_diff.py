"""diff: which variables changed between two runs (the seed's one-variable-per-round rule)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from _handoff_fixtures import BASE_ARGV, CPU_FINGERPRINT, gpu_fingerprint, run, write
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.cli import main
from kk3evidence.handoff.diff import diff

K3 = ["vllm", "serve", "moonshotai/Kimi-K3", "--tensor-parallel-size", "8",
      "--trust-remote-code"]


def labels(result) -> list[str]:  # type: ignore[no-untyped-def]
    return [c.label for c in result.variables]


def test_one_flag_changed_is_named_and_exits_0(tmp_path: Path) -> None:
    a = write(run("a"), tmp_path / "a.tar")
    b = write(run("b", argv=[*BASE_ARGV, "--max-num-seqs", "8"]), tmp_path / "b.tar")
    result = CliRunner().invoke(main, ["diff", str(a), str(b)])
    assert result.exit_code == 0, result.output
    assert "exactly one variable changed: --max-num-seqs" in result.output


def test_two_flags_changed_exit_5_naming_both(tmp_path: Path) -> None:
    a = write(run("a"), tmp_path / "a.tar")
    c = write(run("c", argv=[*BASE_ARGV, "--max-num-seqs", "8", "--enable-prefix-caching"]),
              tmp_path / "c.tar")
    result = CliRunner().invoke(main, ["diff", str(a), str(c)])
    assert result.exit_code == 5, result.output
    assert "2 variables changed: --enable-prefix-caching, --max-num-seqs" in result.output


def test_json_output_lists_variables_and_verdict(tmp_path: Path) -> None:
    a = write(run("a"), tmp_path / "a.tar")
    b = write(run("b", argv=[*BASE_ARGV, "--dtype", "bfloat16"]), tmp_path / "b.tar")
    result = CliRunner().invoke(main, ["diff", "--json", str(a), str(b)])
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert doc["schema"] == "kk3evidence/diff/v1"
    assert doc["verdict"] == "one"
    assert doc["variables"] == ["--dtype"]
    change = doc["changes"][0]
    assert (change["a"], change["b"]) == ("float32", "bfloat16")


def test_noise_is_not_a_variable() -> None:
    a = run("a", pid=100, port=8011)
    fp = copy.deepcopy(gpu_fingerprint())
    fp_b = copy.deepcopy(fp)
    fp_b["collected_at"] = "2026-12-01T00:00:00Z"
    fp_b["host"]["hostname"] = "f3a9c1d2e4b5"  # a container hostname
    fp_b["gpus"]["devices"][0]["memory_used_bytes"] = 77 * 2**30
    fp_b["gpus"]["devices"][1]["processes"] = [{"pid": 9, "name": "x", "used_memory_bytes": 1}]
    a = run("a", argv=K3, fingerprint=fp, pid=100, port=8011)
    b = run("b", argv=K3, fingerprint=fp_b, pid=200, port=34567)
    result = diff(a, b)
    assert result.verdict == "none"
    ignored = {i.what for i in result.ignored}
    assert {"launch pid", "fingerprint collected_at", "fingerprint host.hostname",
            "GPU memory in use and GPU processes"} <= ignored


def test_random_port_flag_is_noise() -> None:
    result = diff(run("a", port=8011), run("b", port=40123))
    assert result.verdict == "none"
    assert any(i.what == "--port" for i in result.ignored)


def test_flag_spelling_alias_and_order_are_the_same_variable() -> None:
    a = run("a", argv=["vllm", "serve", "m", "--tensor-parallel-size", "2", "--max-num-seqs=8",
                       "--gpu-memory-utilization", "0.95"])
    b = run("b", argv=["vllm", "serve", "m", "--gpu-memory-utilization=0.95", "-tp", "2",
                       "--max_num_seqs", "8"])
    result = diff(a, b)
    assert result.verdict == "none"
    assert result.equivalences


def test_flag_given_with_vllm_default_equals_absent_flag() -> None:
    a = run("a", argv=["vllm", "serve", "m"])
    b = run("b", argv=["vllm", "serve", "m", "--tensor-parallel-size", "1"])
    result = diff(a, b)
    assert result.verdict == "none"
    assert any("default" in e for e in result.equivalences)


def test_new_image_counts_once_and_explains_python_side() -> None:
    a = run("a", argv=K3, fingerprint=gpu_fingerprint())
    b = run("b", argv=K3, fingerprint=gpu_fingerprint(image_id="sha256:" + "cd" * 32,
                                                       vllm="0.28.0", torch_cuda="13.1"))
    result = diff(a, b)
    assert labels(result) == ["image id"]
    follow = {c.label: c.explained_by for c in result.changes if not c.counted}
    assert follow["vLLM version"] == "image id"
    assert follow["torch.version.cuda"] == "image id"


def test_moved_tag_is_reported_as_image_id_change() -> None:
    a = run("a", argv=K3, fingerprint=gpu_fingerprint(image_id="sha256:" + "11" * 32))
    b = run("b", argv=K3, fingerprint=gpu_fingerprint(image_id="sha256:" + "22" * 32))
    (change,) = diff(a, b).variables
    assert change.label == "image id"
    assert change.detail is not None and "moved" in change.detail


def test_driver_upgrade_counts_once() -> None:
    a = run("a", argv=K3, fingerprint=gpu_fingerprint(driver="575.57.08", cuda_driver="12.9"))
    b = run("b", argv=K3, fingerprint=gpu_fingerprint(driver="580.82.07", cuda_driver="13.0"))
    result = diff(a, b)
    assert labels(result) == ["NVIDIA driver"]


def test_driver_and_image_together_are_two_variables() -> None:
    a = run("a", argv=K3, fingerprint=gpu_fingerprint(driver="575.57.08"))
    b = run("b", argv=K3, fingerprint=gpu_fingerprint(driver="580.82.07",
                                                       image_id="sha256:" + "ef" * 32))
    result = diff(a, b)
    assert result.verdict == "several"
    assert set(labels(result)) == {"NVIDIA driver", "image id"}
    assert result.exit_code == 5


def test_redacted_values_compare_by_placeholder() -> None:
    fa = copy.deepcopy(CPU_FINGERPRINT)
    fa["env"]["HF_TOKEN"] = "<redacted:env:1>"
    fb = copy.deepcopy(fa)
    assert diff(run("a", fingerprint=fa), run("b", fingerprint=fb)).verdict == "none"
    fb["env"]["HF_TOKEN"] = "<redacted:env:2>"
    assert labels(diff(run("a", fingerprint=fa), run("b", fingerprint=fb))) == ["env HF_TOKEN"]


def test_outcome_differences_are_reported_but_not_counted() -> None:
    a = run("a")
    b = run("b", failed=True)
    result = diff(a, b)
    assert result.verdict == "none"
    outcome = {c.label: (c.a, c.b) for c in result.outcome}
    assert outcome["first failure (stage/category)"] == (None, "weights_access/weights")
    assert outcome["last stage reached"] == ("serving", "weights_access")
    # no request in the failed run: not a request variable
    assert not [c for c in result.changes if c.group == "request"]


def test_request_output_cap_and_input_are_variables() -> None:
    from _handoff_fixtures import fixed_request

    a = run("a", request=fixed_request(max_tokens=128))
    b = run("b", request=fixed_request(max_tokens=512, content="a much longer input " * 20))
    assert set(labels(diff(a, b))) == {"request output cap (max_tokens)", "request input"}


def test_unreadable_bundle_is_one_line_exit_4(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar")
    good = write(run("a"), tmp_path / "a.tar")
    result = CliRunner().invoke(main, ["diff", str(good), str(bad)])
    assert result.exit_code == 4
    assert result.output.strip().count("\n") == 0
    assert "kk3evidence: error:" in result.output


_FLAGS = {
    "--max-num-seqs": ["4", "8", "16"],
    "--max-model-len": ["512", "1024"],
    "--dtype": ["float32", "bfloat16"],
    "--gpu-memory-utilization": ["0.8", "0.95"],
    "--tensor-parallel-size": ["1", "2"],
}


@settings(max_examples=60, deadline=None)
@given(
    picks=st.dictionaries(st.sampled_from(sorted(_FLAGS)), st.integers(0, 2), min_size=1),
    order=st.randoms(use_true_random=False),
    equals_form=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_same_flags_in_any_order_and_spelling_change_nothing(picks, order, equals_form) -> None:  # type: ignore[no-untyped-def]
    items = [(k, _FLAGS[k][i % len(_FLAGS[k])]) for k, i in picks.items()]

    def argv(items: list[tuple[str, str]], eq: list[bool]) -> list[str]:
        out = ["vllm", "serve", "m"]
        for (k, v), use_eq in zip(items, eq, strict=False):
            out += [f"{k}={v}"] if use_eq else [k, v]
        return out

    shuffled = list(items)
    order.shuffle(shuffled)
    a = run("a", argv=argv(items, [False] * 5))
    b = run("b", argv=argv(shuffled, equals_form))
    assert diff(a, b).verdict == "none"


@settings(max_examples=40, deadline=None)
@given(k=st.sampled_from(sorted(_FLAGS)), i=st.integers(0, 2), j=st.integers(0, 2))
def test_changing_exactly_one_flag_names_exactly_that_flag(k: str, i: int, j: int) -> None:
    vals = _FLAGS[k]
    va, vb = vals[i % len(vals)], vals[j % len(vals)]
    result = diff(run("a", argv=["vllm", "serve", "m", k, va]),
                  run("b", argv=["vllm", "serve", "m", k, vb]))
    if va == vb:
        assert result.verdict == "none"
    else:
        # a flag set to vLLM's default on one side may equal "absent"; here both are given
        assert labels(result) == [k]


def test_redacted_argv_values_compare_by_placeholder() -> None:
    a = run("a", argv=[*BASE_ARGV, "--api-key", "<redacted:argv:1>"])
    b = run("b", argv=[*BASE_ARGV, "--api-key", "<redacted:argv:1>"])
    assert diff(a, b).verdict == "none"
    c = run("c", argv=[*BASE_ARGV, "--api-key", "<redacted:argv:2>"])
    assert labels(diff(a, c)) == ["--api-key"]


def test_non_vllm_commands_compare_token_by_token() -> None:
    a = run("a", argv=["torchrun", "--nproc-per-node", "8", "train.py"])
    b = run("b", argv=["torchrun", "--nproc-per-node", "4", "train.py"])
    (change,) = diff(a, b).variables
    assert change.label == "launch command"


@settings(max_examples=150, deadline=None)
@given(tokens=st.lists(st.one_of(
    st.sampled_from(["--max-num-seqs", "-tp", "--enable-prefix-caching",
                     "--no-enable-prefix-caching", "--compilation-config.mode", "-O3",
                     "--model", "--", "=", "--x=", "-"]),
    st.text(max_size=12)), max_size=12))
def test_any_argv_after_vllm_serve_diffs_without_crashing(tokens: list[str]) -> None:
    a = run("a", argv=["vllm", "serve", *tokens])
    b = run("b", argv=["vllm", "serve", "m", *reversed(tokens)])
    result = diff(a, b)
    assert result.verdict in ("none", "one", "several")
    json.dumps(result.to_json())
    from kk3evidence.handoff.compat import check
    from kk3evidence.handoff.report.markdown import render_report

    assert check(a).exit_code in (0, 6)
    assert render_report(b, baseline=a, fmt="html").startswith("<!DOCTYPE html>")


def test_a_field_missing_on_one_side_is_unknown_not_a_change() -> None:
    fa = gpu_fingerprint()
    fb = copy.deepcopy(fa)
    fb["python"]["vllm_version"] = None  # the Python probe timed out in B
    fb["libraries"] = []  # the library scan found nothing in B
    result = diff(run("a", argv=K3, fingerprint=fa), run("b", argv=K3, fingerprint=fb))
    assert result.verdict == "none"
    assert {"vLLM version", "loaded libraries"} <= {i.what for i in result.ignored}


def test_cpu_to_gpu_host_counts_the_gpus_once() -> None:
    gpu = gpu_fingerprint()
    cpu = copy.deepcopy(CPU_FINGERPRINT)
    cpu["container"] = gpu["container"]
    cpu["python"] = gpu["python"] | {"cuda_device_count": 0}
    cpu["env"] = gpu["env"]
    cpu["libraries"] = gpu["libraries"]
    result = diff(run("a", argv=K3, fingerprint=cpu), run("b", argv=K3, fingerprint=gpu))
    assert "GPUs" in labels(result)
    follow = {c.label: c.explained_by for c in result.changes if not c.counted}
    assert follow["NVIDIA driver"] == "GPUs"


def test_leaving_the_container_counts_once() -> None:
    inside = gpu_fingerprint()
    outside = copy.deepcopy(inside)
    outside["container"] = dict.fromkeys(inside["container"])
    result = diff(run("a", argv=K3, fingerprint=inside), run("b", argv=K3, fingerprint=outside))
    assert labels(result) == ["container runtime"]
