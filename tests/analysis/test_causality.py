"""First causal failure vs consequences, on small synthetic logs and a self-contained rule set."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.analysis.engine import analyze
from kk3evidence.analysis.rules import RuleSet, load_rule_files

RULES = r"""
schema = "kk3evidence/rules/v1"

[[rule]]
id = "TNCCL001"
name = "nccl-system-error"
kind = "failure"
status = "stable"
stage = "comm_group"
category = "nccl"
severity = "fatal"
summary = "NCCL system error."
anchors = ["unhandled system error"]
match = ["RuntimeError: NCCL error: unhandled system error"]

[[rule]]
id = "TOOM001"
name = "cuda-oom"
kind = "failure"
status = "stable"
stage = "engine_init"
category = "oom"
severity = "fatal"
summary = "OOM."
anchors = ["CUDA out of memory"]
match = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]

[[rule]]
id = "TKV001"
name = "kv-too-small"
kind = "failure"
status = "stable"
stage = "engine_init"
category = "kv_cache"
severity = "fatal"
summary = "KV cache too small."
anchors = ["larger than the available KV cache memory"]
match = ["ValueError: ... larger than the available KV cache memory (0.0 GiB)"]

[[rule]]
id = "TWARN001"
name = "slow-thing"
kind = "failure"
status = "stable"
stage = "engine_init"
category = "other"
severity = "warning"
summary = "A warning-level condition."
anchors = ["is slow today"]
match = ["WARNING 05-10 12:00:00 [x.py:1] the disk is slow today"]

[[rule]]
id = "TNEG001"
name = "negative-kv-memory"
kind = "failure"
status = "stable"
stage = "engine_init"
category = "kv_cache"
severity = "error"
summary = "Negative KV memory."
anchors = ["Available KV cache memory: -"]
pattern = "Available KV cache memory: {size:kv}"
match = ["INFO 05-10 12:00:00 [w.py:1] Available KV cache memory: -2.77 GiB"]

[[rule]]
id = "TCONS001"
name = "engine-core-init-failed"
kind = "consequence"
status = "stable"
stage = "engine_init"
category = "other"
severity = "error"
summary = "See root cause above."
anchors = ["Engine core initialization failed", "EngineCore failed to start"]
match = ["RuntimeError: Engine core initialization failed. See root cause above."]

[[rule]]
id = "TCONS002"
name = "engine-dead"
kind = "consequence"
status = "stable"
stage = "serving"
category = "other"
severity = "error"
summary = "Engine dead."
anchors = ["EngineDeadError"]
match = ["vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."]

[[rule]]
id = "TMS001"
name = "weights-loaded"
kind = "milestone"
status = "stable"
stage = "weights_access"
summary = "Weights loaded."
anchors = ["Loading weights took"]
pattern = "Loading weights took {float}"
marks = "complete"
match = ["Loading weights took 0.5 seconds"]

[[rule]]
id = "TMS002"
name = "startup-complete"
kind = "milestone"
status = "stable"
stage = "api_ready"
summary = "Ready."
anchors = ["Application startup complete"]
pattern = "Application startup complete"
marks = "complete"
match = ["INFO:     Application startup complete."]

[[rule]]
id = "TMS003"
name = "shutdown"
kind = "milestone"
status = "stable"
stage = "serving"
summary = "Stop requested."
anchors = ["shutdown triggered"]
pattern = "shutdown triggered"
marks = "shutdown"
match = ["[shutdown] API server: shutdown triggered"]

[[rule]]
id = "TMS004"
name = "dist-init"
kind = "milestone"
status = "stable"
stage = "comm_group"
summary = "Distributed init."
anchors = ["distributed_init_method="]
match = ["world_size=1 rank=0 distributed_init_method=file:///tmp/x backend=gloo"]

[[rule]]
id = "TMS005"
name = "load-start"
kind = "milestone"
status = "stable"
stage = "weights_access"
summary = "Loading starts."
anchors = ["Starting to load model"]
match = ["Starting to load model /m"]

[[rule]]
id = "TMS006"
name = "health-ok"
kind = "milestone"
status = "stable"
stage = "api_ready"
summary = "Health 200."
anchors = ["GET /health HTTP/1.1\" 200"]
marks = "ready"
match = ["INFO:     127.0.0.1:1 - \"GET /health HTTP/1.1\" 200 OK"]

[[rule]]
id = "TPORT001"
name = "bind-failed"
kind = "failure"
status = "stable"
stage = "api_ready"
category = "port"
severity = "fatal"
summary = "Address in use."
anchors = ["address already in use"]
match = ["ERROR:    [Errno 98] error while attempting to bind on address: address already in use"]

[[rule]]
id = "TNOISE001"
name = "shutdown-engine-dead"
kind = "noise"
status = "stable"
summary = "Clean stop."
anchors = ["EngineDeadError", "output_handler failed"]
when = "shutdown"
match = ["vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."]

[[rule]]
id = "TEXC001"
name = "uncaught-exception"
kind = "failure"
status = "stable"
stage = "engine_init"
category = "other"
severity = "error"
summary = "Unrecognised exception."
anchors = []
scope = "exception"
fallback = true
pattern = "^{pyexc}"
match = ["OSError: boom"]
"""


@pytest.fixture(scope="module")
def rs(tmp_path_factory: pytest.TempPathFactory) -> RuleSet:
    d: Path = tmp_path_factory.mktemp("rules")
    (d / "t.toml").write_text(RULES, encoding="utf-8")
    return load_rule_files([d])


def run(rs: RuleSet, text: str):  # type: ignore[no-untyped-def]
    return analyze(text.encode(), ruleset=rs)


def test_same_cause_repeated_by_another_rank_is_one_finding_with_the_rank_list(
    rs: RuleSet,
) -> None:
    a = run(
        rs,
        "(Worker_TP0 pid=1) ERROR 05-10 12:00:00 [w.py:1] "
        "RuntimeError: NCCL error: unhandled system error\n"
        "(Worker_TP1 pid=2) ERROR 05-10 12:00:01 [w.py:1] "
        "RuntimeError: NCCL error: unhandled system error\n",
    )
    ff = a.first_failure
    assert ff is not None and ff.line_no == 1
    assert ff.ranks == ("rank0", "rank1") and ff.folded == (2,)
    assert a.consequences == () and [f.line_no for f in a.findings] == [1]
    assert a.to_json()["first_failure"]["ranks"] == ["rank0", "rank1"]


def test_same_line_repeated_by_one_process_is_not_folded(rs: RuleSet) -> None:
    a = run(
        rs,
        "(Worker_TP0 pid=1) ERROR 05-10 12:00:00 [w.py:1] "
        "RuntimeError: NCCL error: unhandled system error\n"
        "(Worker_TP0 pid=1) ERROR 05-10 12:00:01 [w.py:1] "
        "RuntimeError: NCCL error: unhandled system error\n",
    )
    assert a.first_failure is not None and a.first_failure.ranks == ()
    assert [c.line_no for c in a.consequences] == [2]
    assert a.consequences[0].caused_by == 1


def test_consequence_printed_before_its_cause_is_never_first(rs: RuleSet) -> None:
    a = run(
        rs,
        "(EngineCore pid=1) ERROR 05-10 12:00:00 [core.py:1] EngineCore failed to start.\n"
        "(EngineCore pid=1) ERROR 05-10 12:00:00 [core.py:1] Traceback (most recent call last):\n"
        '(EngineCore pid=1) ERROR 05-10 12:00:00 [core.py:1]   File "/x.py", line 1, in f\n'
        "(EngineCore pid=1) ERROR 05-10 12:00:00 [core.py:1] ValueError: To serve ... larger than "
        "the available KV cache memory (0.0 GiB)\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n",
    )
    assert a.first_failure is not None and a.first_failure.rule == "TKV001"
    assert a.first_failure.line_no == 4
    assert {c.line_no for c in a.consequences} == {1, 5}
    assert all(c.caused_by == 4 for c in a.consequences)


def test_oom_after_nccl_failure_is_a_consequence(rs: RuleSet) -> None:
    a = run(
        rs,
        "[rank0]: RuntimeError: NCCL error: unhandled system error\n"
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
    )
    assert a.first_failure is not None and a.first_failure.category == "nccl"
    assert [c.rule for c in a.consequences] == ["TOOM001"]


def test_inner_exception_of_direct_cause_chain_is_the_cause(rs: RuleSet) -> None:
    a = run(
        rs,
        "Traceback (most recent call last):\n"
        '  File "/x.py", line 1, in f\n'
        "ConnectionRefusedError: [Errno 111] Connection refused\n"
        "\n"
        "The above exception was the direct cause of the following exception:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/y.py", line 2, in g\n'
        "RuntimeError: NCCL error: unhandled system error\n",
    )
    assert a.first_failure is not None and a.first_failure.line_no == 3
    assert a.first_failure.rule == "TEXC001"
    assert [c.line_no for c in a.consequences] == [9]


def test_handled_inner_exception_yields_to_the_one_that_propagated(rs: RuleSet) -> None:
    a = run(
        rs,
        "Traceback (most recent call last):\n"
        '  File "/x.py", line 1, in f\n'
        "KeyError: 'x'\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/y.py", line 2, in g\n'
        "OSError: config file is not valid\n",
    )
    assert a.first_failure is not None and a.first_failure.line_no == 9


def test_frames_and_source_lines_are_never_classified(rs: RuleSet) -> None:
    a = run(
        rs,
        "Traceback (most recent call last):\n"
        '  File "/x.py", line 1, in f\n'
        '    raise RuntimeError("NCCL error: unhandled system error")\n'
        "KeyError: 'x'\n",
    )
    assert a.first_failure is not None and a.first_failure.line_no == 4


def test_cause_stated_below_error_level_counts(rs: RuleSet) -> None:
    a = run(
        rs,
        "INFO 05-10 12:00:00 [w.py:1] Available KV cache memory: -2.77 GiB\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n",
    )
    assert a.first_failure is not None and a.first_failure.rule == "TNEG001"
    assert dict(a.extra.captures) == {"kv": "-2.77 GiB"}


def test_warning_only_run_has_no_first_failure(rs: RuleSet) -> None:
    a = run(rs, "WARNING 05-10 12:00:00 [x.py:1] the disk is slow today\n")
    assert a.first_failure is None
    assert [f.rule for f in a.findings] == ["TWARN001"]


def test_clean_shutdown_engine_dead_is_not_a_failure(rs: RuleSet) -> None:
    a = run(
        rs,
        "INFO:     Application startup complete.\n"
        "(APIServer pid=1) INFO 05-10 12:00:00 [l.py:1] [shutdown] API server: shutdown triggered\n"
        "(APIServer pid=1) ERROR 05-10 12:00:00 [a.py:1] AsyncLLM output_handler failed.\n"
        "(APIServer pid=1) ERROR 05-10 12:00:00 [a.py:1] "
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n",
    )
    assert a.first_failure is None and a.findings == ()
    # A requested stop is not evidence of serving: no request was served here.
    assert [s.stage for s in a.stages] == ["api_ready"]
    assert a.last_stage_reached == "api_ready"


def test_engine_dead_without_requested_stop_is_reported(rs: RuleSet) -> None:
    a = run(
        rs,
        "INFO:     Application startup complete.\n"
        "(APIServer pid=1) ERROR 05-10 12:00:00 [a.py:1] "
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n",
    )
    assert a.first_failure is not None and a.first_failure.rule == "TCONS002"
    assert a.extra.notes


def test_stage_timeline_and_last_stage_reached(rs: RuleSet) -> None:
    a = run(
        rs,
        "world_size=1 rank=0 distributed_init_method=file:///tmp/x backend=gloo\n"
        "Loading weights took 0.5 seconds\n"
        "ValueError: ... larger than the available KV cache memory (0.0 GiB)\n",
    )
    by = {s.stage: s for s in a.stages}
    assert by["comm_group"].status == "completed"
    assert by["weights_access"].status == "completed"
    assert by["engine_init"].status == "failed"
    assert (by["engine_init"].first_line, by["engine_init"].last_line) == (3, 3)
    assert a.last_stage_reached == "engine_init"
    assert [s.stage for s in a.stages] == ["weights_access", "engine_init", "comm_group"]


def test_failure_after_startup_complete_but_before_ready_is_not_serving(rs: RuleSet) -> None:
    a = run(
        rs,
        "INFO:     Application startup complete.\n"
        "ERROR:    [Errno 98] error while attempting to bind on address: address already in use\n",
    )
    assert a.first_failure is not None and a.first_failure.stage == "api_ready"


def test_failure_after_health_200_is_a_serving_failure(rs: RuleSet) -> None:
    a = run(
        rs,
        'INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n'
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
    )
    assert a.first_failure is not None and a.first_failure.stage == "serving"
    assert a.extra.ready_line == 1


def test_failure_while_weights_load_belongs_to_weights_access(rs: RuleSet) -> None:
    a = run(
        rs,
        "Starting to load model /m\n"
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
    )
    assert a.first_failure is not None
    assert (a.first_failure.stage, a.first_failure.category) == ("weights_access", "oom")
    b = run(
        rs,
        "Starting to load model /m\nLoading weights took 0.5 seconds\n"
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
    )
    assert b.first_failure is not None and b.first_failure.stage == "engine_init"


def test_fallback_stage_is_the_stage_in_progress(rs: RuleSet) -> None:
    a = run(
        rs,
        "INFO:     Application startup complete.\n"
        "Traceback (most recent call last):\n"
        '  File "/x.py", line 1, in f\n'
        "RuntimeError: Unsupported CPU attention configuration: head_dim=16\n",
    )
    assert a.first_failure is not None
    assert (a.first_failure.stage, a.first_failure.rule) == ("serving", "TEXC001")


# -- invariants over random mixes of real-looking lines -----------------------------------------

_LINES = [
    "(Worker_TP0 pid=1) ERROR 05-10 12:00:00 [w.py:1] "
    "RuntimeError: NCCL error: unhandled system error",
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "ValueError: ... larger than the available KV cache memory (0.0 GiB)",
    "WARNING 05-10 12:00:00 [x.py:1] the disk is slow today",
    "INFO 05-10 12:00:00 [w.py:1] Available KV cache memory: -2.77 GiB",
    "RuntimeError: Engine core initialization failed. See root cause above.",
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
    "Loading weights took 0.5 seconds",
    "INFO:     Application startup complete.",
    "[shutdown] API server: shutdown triggered",
    "world_size=1 rank=0 distributed_init_method=file:///tmp/x backend=gloo",
    "Traceback (most recent call last):",
    '  File "/x.py", line 1, in f',
    "    code()",
    "OSError: boom",
    "",
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
    "plain line",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_LINES), max_size=40))
def test_causality_invariants_hold_for_any_mix(rs: RuleSet, lines: list[str]) -> None:
    a = run(rs, "".join(x + "\n" for x in lines))
    nos = [f.line_no for f in a.findings]
    assert nos == sorted(nos) and len(set(nos)) == len(nos)
    kinds = {f.line_no: f.kind for f in a.findings}
    ff = a.first_failure
    if ff is None:
        assert all(f.severity not in ("fatal", "error") for f in a.findings if f.kind == "failure")
        assert not a.consequences
    else:
        assert ff.line_no in kinds
        if kinds[ff.line_no] == "consequence":
            assert "failure" not in kinds.values()
        for c in a.consequences:
            assert c.kind == "consequence" and c.caused_by is not None
            assert c.line_no != ff.line_no
        assert a.last_stage_reached is not None
        assert any(s.stage == ff.stage and s.status == "failed" for s in a.stages)
    for s in a.stages:
        assert 1 <= s.first_line <= s.last_line <= max(a.lines_total, 1)
