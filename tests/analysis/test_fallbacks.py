"""An answer for every failing log: fallbacks ranked by evidence (basis "fallback"), the
category from the failure's context, timeouts as `hang`, and the frame-run fast path giving
the same analysis as the line-by-line path."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kk3evidence.analysis.engine as engine
from kk3evidence.analysis.engine import analyze
from kk3evidence.analysis.rules import load_rules
from kk3evidence.handoff.report.analysis import basis_note

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "corpus"


def _an(text: str):  # type: ignore[no-untyped-def]
    return analyze(text.encode())


def test_unknown_uncaught_exception_is_a_fallback_first_failure() -> None:
    a = _an(
        "INFO 01-01 00:00:00 [loader.py:1] Starting to load model /m\n"
        "Traceback (most recent call last):\n"
        '  File "/x/frobnicate.py", line 3, in frob\n'
        "    raise FrobnicationError('the frobnicator is jammed')\n"
        "FrobnicationError: the frobnicator is jammed\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.rule == "EXC001" and ff.basis == "fallback"
    assert ff.line_no == 5 and ff.stage == "weights_access"  # the stage in progress
    assert a.to_json()["first_failure"]["basis"] == "fallback"


def test_a_known_failure_has_basis_rule() -> None:
    a = _an("RuntimeError: No CUDA GPUs are available\n")
    assert a.first_failure is not None and a.first_failure.basis == "rule"


def test_stronger_fallback_evidence_wins_over_an_earlier_exit_status() -> None:
    a = _an(
        "Oct 13 07:39:49 k3s-1 systemd[1]: vllm.service: Main process exited, code=exited, "
        "status=1/FAILURE\n"
        "Traceback (most recent call last):\n"
        '  File "/x/a.py", line 3, in f\n'
        "FrobnicationError: jammed\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.rule == "EXC001" and ff.line_no == 4
    # the weaker evidence stays listed as a failure, it is not the first one
    assert [f.rule for f in a.findings if f.kind == "failure"] == ["EXC007", "EXC001"]


def test_an_exit_status_alone_is_reported_not_silence() -> None:
    a = _an("  srun: error: node7: task 0: Exited with exit code 1\n")
    ff = a.first_failure
    assert ff is not None and ff.rule == "EXC007" and ff.basis == "fallback"


def test_an_exit_status_of_zero_is_not_a_failure() -> None:
    assert _an("vllm exited with code 0\n").first_failure is None


def test_fatal_python_error_at_interpreter_shutdown_is_noise() -> None:
    a = _an(
        "Fatal Python error: _enter_buffered_busy: could not acquire lock for "
        "<_io.BufferedWriter name='<stdout>'> at interpreter shutdown, possibly due to daemon "
        "threads\n"
    )
    assert a.first_failure is None


def test_fatal_signal_without_other_evidence_is_a_fallback() -> None:
    a = _an("(pid=5477) *** SIGABRT received at time=1762938208 on cpu 11 ***\n")
    ff = a.first_failure
    assert ff is not None and ff.rule == "EXC006" and ff.basis == "fallback"


def test_assertion_inside_prefix_cache_code_takes_the_prefix_cache_category() -> None:
    a = analyze(CORPUS / "issue-4171-prefix-prefill-assert-serving" / "output.log")
    ff = a.first_failure
    assert ff is not None and (ff.category, ff.stage) == ("prefix_cache", "serving")


def test_unknown_timeout_takes_the_hang_category() -> None:
    a = _an("TimeoutError: Timed out waiting for the frobnicator to answer\n")
    ff = a.first_failure
    assert ff is not None and ff.category == "hang" and ff.basis == "fallback"


def test_a_timeout_after_a_stated_failure_is_its_consequence() -> None:
    a = _an(
        "[rank1]: RuntimeError: No CUDA GPUs are available\n"
        "[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=600000) ran for 600086 milliseconds before timing out.\n"
    )
    assert a.first_failure is not None and a.first_failure.line_no == 1
    assert [c.line_no for c in a.consequences] == [2]


def test_a_timeout_with_no_earlier_cause_is_a_hang() -> None:
    a = analyze(CORPUS / "issue-5458-warmup-allreduce-timeout" / "output.log")
    assert a.first_failure is not None and a.first_failure.category == "hang"


# -- the frame-run fast path is only faster -----------------------------------------------------


def _both(data: bytes) -> tuple[dict[str, object], dict[str, object]]:
    try:
        engine.FRAME_RUNS = True
        fast = analyze(data).to_json()
        engine.FRAME_RUNS = False
        slow = analyze(data).to_json()
    finally:
        engine.FRAME_RUNS = True
    return fast, slow


@pytest.mark.parametrize(
    "case",
    [
        "realrun-fail-headdim16-first-request",
        "realrun-fail-kv-cache-too-small",
        "issue-4171-prefix-prefill-assert-serving",
        "issue-pr34367-prefix-cache-fatal-tqdm-glued",
        "gpu-torchrun-rank1-oom",
    ],
)
def test_frame_runs_give_the_same_analysis_as_line_by_line(case: str) -> None:
    data = (CORPUS / case / "output.log").read_bytes()
    fast, slow = _both(data * 3)  # a small crash loop
    assert fast == slow


_FRAME_LINES = st.sampled_from(
    [
        '  File "/v/vllm/v1/worker/gpu_worker.py", line 9, in load_model',
        '  File "/v/vllm/v1/core/kv_cache_manager.py", line 3, in allocate_slots',
        "    x = a | b",
        "    [e for e in y]",
        "    ^^^^^^^^^",
        "",
        "  \x1b[31mred\x1b[0m",
        "   INFO 01-01 00:00:00 [x.py:1] not a frame",
        "Traceback (most recent call last):",
        "RuntimeError: boom",
        '  File "/x.py", line 1, in step',
    ]
)
_PREFIXES = st.sampled_from(
    [
        "",
        "(Worker pid=7) ERROR 11-30 01:56:46 [m.py:1] ",
        "(Worker pid=7) ERROR 11-30 01:56:47 [m.py:1] ",  # the clock moved on
        "(Worker pid=8) ERROR 11-30 01:56:46 [m.py:1] ",  # another process, same shape
        "(Worker pid=7) ERROR 11-30 01:56:46 [m.py:12] ",  # another source line
        "[rank1]: ",
        "[rank2]: ",
        "(EngineCore pid=8) ",
    ]
)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_PREFIXES, _FRAME_LINES), min_size=1, max_size=40))
def test_frame_runs_match_line_by_line_on_any_mix(lines: list[tuple[str, str]]) -> None:
    head = "(Worker pid=7) ERROR 11-30 01:56:46 [m.py:1] Traceback (most recent call last):\n"
    body = "".join(p + t + "\n" for p, t in lines)
    fast, slow = _both((head + body + "RuntimeError: end\n").encode())
    assert fast == slow


def test_an_unknown_error_in_a_tool_parser_while_serving_is_a_serving_failure() -> None:
    a = _an(
        "(APIServer pid=1) INFO 01-01 00:00:00 [launcher.py:1] Application startup complete.\n"
        "(APIServer pid=1) ERROR 01-01 00:00:09 [serving_chat.py:1] Error in chat completion\n"
        "Traceback (most recent call last):\n"
        '  File "/v/vllm/entrypoints/openai/tool_parsers/kimi_k2_tool_parser.py", line 9, '
        "in extract_tool_calls\n"
        "    raise FrobError('bad section')\n"
        "FrobError: bad section\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.rule == "EXC001" and ff.stage == "serving"


def test_an_unknown_c10d_error_is_a_comm_group_failure() -> None:
    a = _an(
        "Traceback (most recent call last):\n"
        '  File "/v/torch/distributed/distributed_c10d.py", line 9, in init_process_group\n'
        "    store = TCPStore(host, port)\n"
        "FrobError: the store went away\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.stage == "comm_group"


def test_an_assertion_in_the_v1_kv_cache_manager_is_a_prefix_cache_failure() -> None:
    a = _an(
        "Traceback (most recent call last):\n"
        '  File "/v/vllm/v1/core/sched/scheduler.py", line 9, in schedule\n'
        '  File "/v/vllm/v1/core/kv_cache_manager.py", line 3, in allocate_slots\n'
        "    assert num_computed_tokens <= len(blocks)\n"
        "AssertionError\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.category == "prefix_cache" and ff.basis == "fallback"


def test_a_specific_rule_keeps_its_category_whatever_the_frames_say() -> None:
    a = _an(
        "Traceback (most recent call last):\n"
        '  File "/v/vllm/v1/core/kv_cache_manager.py", line 3, in allocate_slots\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
        "total capacity of 79.19 GiB of which 1.00 MiB is free.\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.category == "oom" and ff.basis == "rule"


def test_a_fallback_takes_the_category_its_words_share_with_specific_rules() -> None:
    # No rule's grammar matches this wording, but "Address already in use" is an anchor only
    # port rules use: the rule set's own words name the family (issue 13, category from context).
    a = _an(
        "Traceback (most recent call last):\n"
        '  File "/x/frob.py", line 3, in frob\n'
        "FrobError: bind failed: Address already in use (port 29500)\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.rule == "EXC001" and ff.basis == "fallback"
    assert ff.category == "port"


def test_words_of_several_categories_leave_a_fallback_other() -> None:
    from kk3evidence.analysis.classify import Classifier
    from kk3evidence.analysis.rules import load_rules

    c = Classifier(load_rules())
    assert c.word_category("bind failed: Address already in use") == "port"
    assert c.word_category("the frobnicator is jammed") is None
    cats = load_rules().anchor_categories
    assert "other" not in cats and len(cats) == len(load_rules().anchors)


def test_an_exception_whose_superseding_traceback_is_cut_stays_the_first_failure() -> None:
    # A slice that starts inside the frames, then "During handling…" and a second traceback
    # the excerpt cuts before its exception: the only stated failure is the first exception
    # (pr36634's shape). Before, the inner exception was dropped as superseded and the log
    # answered "no failure".
    a = _an(
        '  File "/x/frob.py", line 3, in frob\n'
        "    self.frob()\n"
        "FrobError: the frobnicator is jammed\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/x/multiprocessing/process.py", line 314, in _bootstrap\n'
        "    self.run()\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.line_no == 3 and ff.basis == "fallback"


def test_a_superseded_fallback_exception_is_still_dropped_when_the_outer_one_is_shown() -> None:
    a = _an(
        "Traceback (most recent call last):\n"
        '  File "/x/frob.py", line 3, in frob\n'
        "FrobError: the frobnicator is jammed\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/x/frob.py", line 9, in unfrob\n'
        "UnfrobError: could not unjam the frobnicator\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.line_no == 9


def test_a_bare_base_exception_line_is_a_fallback_but_a_bare_error_prefix_is_not() -> None:
    a = _an("INFO starting\nException: Capture cuda graph failed: frob went wrong\nINFO bye\n")
    ff = a.first_failure
    assert ff is not None and ff.rule == "EXC003" and ff.line_no == 2
    assert _an("INFO starting\nError: see the frob manual for details\n").first_failure is None


def test_an_excerpt_of_frames_only_answers_its_first_line() -> None:
    # A paste that starts inside a traceback (source and caret lines, then frames) and ends
    # before the exception line (blind set 10: 12 such slices answered "no failure"): the
    # traceback's earliest line in the log is the first statement of the failure (EXC011).
    a = _an(
        "INFO 01-01 00:00:00 [loader.py:1] Starting to load model /m\n"
        "[rank0]:     model_output = self.model(input_ids, positions)\n"
        "[rank0]:                    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        '[rank0]:   File "/v/torch/nn/modules/module.py", line 1751, in _wrapped_call_impl\n'
        "[rank0]:     return self._call_impl(*args, **kwargs)\n"
        '[rank0]:   File "/v/torch/_inductor/compile_fx.py", line 9, in fw_compiler_base\n'
        "[rank0]:     return inner_compile(\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.rule == "EXC011" and ff.basis == "fallback"
    assert ff.line_no == 2 and ff.category == "compile"  # inductor frames


def test_a_blank_line_of_the_process_stops_the_walk_back_to_the_first_frame() -> None:
    a = _an(
        "(Worker_TP0 pid=624) \n"
        '(Worker_TP0 pid=624)   File "/v/vllm/models/gpt_oss.py", line 1225, in load_weights\n'
        "(Worker_TP0 pid=624)     return loader.load_weights(weights)\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.line_no == 2 and ff.rule == "EXC011"


def test_a_frames_only_excerpt_gives_the_same_answer_in_any_block_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    head = "".join(f"INFO 01-01 00:00:{i % 60:02d} [x.py:1] filler line {i}\n" for i in range(300))
    log = (
        head
        + "ERROR 03-22 09:50:04 [core.py:340]     compiled_fn, _ = create_aot_dispatcher(\n"
        + 'ERROR 03-22 09:50:04 [core.py:340]   File "/v/torch/_functorch/aot.py", line 5, in f\n'
        + "ERROR 03-22 09:50:04 [core.py:340]     return g(\n"
    ).encode()
    import io

    ref = analyze(io.BytesIO(log)).to_json()
    monkeypatch.setattr(engine, "BLOCK_SIZE", 64)
    small = analyze(io.BytesIO(log)).to_json()
    assert small == ref and ref["first_failure"]["line_no"] == 301


@pytest.mark.parametrize(
    ("message", "category"),
    [
        ("the collective ran for 600000 milliseconds before timing out", "hang"),
        ("frob saw an odd display and cuda driver combination", "driver_mismatch"),
        ("HIP said hipErrorNoBinaryForGpu for gfx1101", "cuda_init"),
        ("kernel hit an illegal memory access at 0x7f", "illegal_memory"),
        ("level zero: UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", "oom"),
        ("the frob needs more KV cache memory than it has", "kv_cache"),
        ("frob op is not permitted during graph capture", "compile"),
        ("frob listener: [Errno 98] taken", "port"),
        ("oneCCL: the frob ring broke", "nccl"),
        ("frob heads (12) must be divisible by tp (8)", "config"),
        ("Cannot access gated repo for frob", "weights"),
        ("frob needs a chat template if the tokenizer does not define one", "config"),
        ("frob's watchdog got stuck for 480 seconds", "hang"),
        ("the frob workers were killed due to memory pressure", "oom"),
        ("frob.so: undefined symbol: cuTensorMapEncodeTiled", "driver_mismatch"),
    ],
)
def test_a_fallback_takes_the_category_of_its_family_words(message: str, category: str) -> None:
    # A wording no rule knows still names its family in the words every error of that family
    # uses (rules/stage-hints.toml, "Family words"): the CUDA runtime's, the driver's, the
    # collective libraries', vLLM's own.
    a = _an(
        "Traceback (most recent call last):\n"
        '  File "/x/frob.py", line 3, in frob\n'
        f"FrobError: {message}\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.basis == "fallback" and ff.line_no == 3
    assert ff.category == category


def test_a_config_dump_in_a_failure_line_does_not_name_a_family() -> None:
    # vLLM's step-error dump prints the whole engine config (`trust_remote_code=…`,
    # `load_format=fastsafetensors`, …): those keys are not the failure's words.
    a = _an(
        "(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [dump_input.py:72] Dumping input data for "
        "V1 LLM engine (v0.11.0) with config: model='m', trust_remote_code=True, "
        "load_format=fastsafetensors, tensor_parallel_size=2\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.category == "other"


def test_a_last_resort_line_takes_the_category_of_the_component_that_printed_it() -> None:
    # CANN's log prefix names the module (`HCCL(pid,proc)`); the envelope parser peels it off,
    # and the message alone names no family: the component still says which library failed.
    a = _an(
        "[ERROR] HCCL(36035,frob):2025-05-13-02:25:58.068.817 [op_base.cc:974][36818][Init]"
        "[FrobConfig]errNo[0x0000000005000002]FrobInit failed.\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.basis == "fallback" and ff.category == "nccl"


def test_a_response_models_validation_error_is_a_serving_failure() -> None:
    # pydantic's ValidationError for a `…Response` model: the server could not serialise what
    # the engine gave it (a 500), not a configuration error (ENG021 before CFG001).
    a = _an(
        "(APIServer pid=11) ERROR 07-15 01:39:25 [serving.py:1007] pydantic_core._pydantic_core"
        ".ValidationError: 2 validation errors for ChatCompletionStreamResponse\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.rule == "ENG021"
    assert (ff.stage, ff.category) == ("serving", "other")


def test_an_exception_repr_logged_before_its_traceback_is_the_first_failure() -> None:
    # vLLM's V0 engine loop logs `repr(e)` first; the traceback after it is cut here.
    a = _an(
        "INFO 11-20 19:56:18 engine.py:267] Added request embd-1.\n"
        "CRITICAL 11-20 19:56:18 launcher.py:99] MQLLMEngine is already dead, terminating "
        "server process\n"
        "ERROR 11-20 19:56:18 engine.py:135] RuntimeError('stack expects each tensor to be "
        "equal size')\n"
        "ERROR 11-20 19:56:18 engine.py:135] Traceback (most recent call last):\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.line_no == 3 and ff.rule == "EXC003"


def test_family_words_come_after_the_failing_tracebacks_frames() -> None:
    # "does not support" is a config family word, but an exception raised inside Triton's
    # compiler is a compile failure: the frame decides first.
    a = _an(
        "Traceback (most recent call last):\n"
        '  File "/x/triton/compiler/compiler.py", line 3, in compile\n'
        "FrobError: this GPU does not support frob\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.category == "compile"


def test_a_wrappers_name_does_not_give_a_category() -> None:
    # a compose service called `vllm-nccl-1` says nothing about the failure in its line
    a = _an("vllm-nccl-1  | ERROR 01-01 00:00:00 [x.py:1] FrobError: frob went away\n")
    ff = a.first_failure
    assert ff is not None and ff.category == "other"


def test_a_kv_preemption_warning_explains_no_exception_after_it() -> None:
    a = _an(
        "WARNING 11-27 02:04:48 scheduler.py:1481] Sequence group cmpl-1 is preempted by "
        "PreemptionMode.SWAP mode because there is not enough KV cache space. This can affect "
        "the end-to-end performance.\n"
        "ERROR 11-27 02:04:48 engine.py:135] AssertionError()\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.line_no == 2 and ff.rule == "EXC003"


def test_a_warning_that_announces_a_crash_still_explains_it() -> None:
    a = _an(
        "(APIServer pid=1) WARNING 09-03 10:00:00 [arg_utils.py:3034] This model does not "
        "officially support prefix caching. Enabling this manually may cause the engine to "
        "crash.\n"
        "Traceback (most recent call last):\n"
        '  File "/v/x.py", line 1, in f\n'
        "AssertionError\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.rule == "PFX006"


_READY = (
    "(APIServer pid=1) INFO 01-01 00:00:00 [api_server.py:1] Starting vLLM API server 0 on "
    "http://0.0.0.0:8000\n"
    '(APIServer pid=1) INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n'
)


@pytest.mark.parametrize(
    "line",
    [
        # NVSHMEM tries its transports in turn (NCCL029)
        "WARN: init failed for remote transport: ibrc",
        # Ray at the end of a job (CSQ022)
        "Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): ray::X.f() (pid=1)",
        # a library file that could not be loaded, in a run that still became ready (EXC014)
        "rocblaslt error: Could not load /x/TensileLibrary_lazy_gfx942.dat",
    ],
)
def test_notices_that_healthy_runs_print_too_count_only_before_ready(line: str) -> None:
    assert _an(f"{line}\n").first_failure is not None
    assert _an(f"{_READY}{line}\n").first_failure is None


def test_an_nvshmem_transport_notice_does_not_hide_a_later_failure() -> None:
    a = _an(
        "WARN: init failed for remote transport: ibrc\n"
        "(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] torch.OutOfMemoryError: CUDA "
        "out of memory. Tried to allocate 2.00 GiB.\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.line_no == 2 and ff.category == "oom"


def test_an_echoed_log_level_flag_is_no_error_line() -> None:
    a = _an(
        "INFO 01-01 00:00:00 [x.py:1] start\n"
        "+ exec vllm serve m --uvicorn-log-level=ERROR\n"
    )
    assert a.first_failure is None
    b = _an('time=2025-06-14T12:45:06.871+01:00 level=ERROR source=server.go:4 msg="runner died"\n')
    assert b.first_failure is not None and b.first_failure.rule == "EXC010"


def test_a_traceback_logged_as_a_warning_yields_to_a_later_failure() -> None:
    """vLLM logs an optional import's traceback at WARNING and goes on (corpus
    b17-file-voiceagent-…: FlashInfer's `assert cuda_home is not None`); the error that stops
    the engine later is the answer. Alone, the warning still is (label rule 4)."""
    w = "(EngineCore pid=7) WARNING 06-23 15:43:18 [import_utils.py:408] "
    e = "(EngineCore pid=7) ERROR 06-23 15:43:19 [core.py:1195] "
    warned = [
        w + "Traceback (most recent call last):",
        w + '  File "/x/flashinfer/jit/cpp_ext.py", line 61, in get_cuda_path',
        w + "    assert cuda_home is not None",
        w + "AssertionError",
    ]
    failed = [
        e + "EngineCore failed to start.",
        e + "Traceback (most recent call last):",
        e + '  File "/x/flashinfer/jit/cpp_ext.py", line 61, in get_cuda_path',
        e + "    raise RuntimeError(",
        e + "RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't "
        "exist",
    ]
    ff = analyze([ln + "\n" for ln in warned + failed]).first_failure
    assert ff is not None and ff.line_no == 9 and "Could not find nvcc" in ff.text
    alone = analyze([ln + "\n" for ln in warned]).first_failure
    assert alone is not None and alone.line_no == 4


def test_an_error_that_says_it_will_retry_yields_to_a_later_failure() -> None:
    """A committed run log (corpus b18-file-nucleus-…): the hub lookup fails at ERROR and says
    `retrying 1 of 2`; the engine dies later of its free-memory check, the answer."""
    log = [
        "(APIServer pid=1) ERROR 04-22 21:14:59 [repo_utils.py:47] Error retrieving file list: "
        "[Errno -3] Temporary failure in name resolution, retrying 1 of 2\n",
        "(EngineCore pid=80) ERROR 04-22 21:15:19 [core.py:1108] ValueError: Free memory on "
        "device cuda:0 (3.22/4.0 GiB) on startup is less than desired GPU memory utilization "
        "(0.9, 3.6 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
        "processes.\n",
    ]
    ff = analyze(log).first_failure
    assert ff is not None and (ff.line_no, ff.rule, ff.category) == (2, "OOM004", "oom")
    alone = analyze(log[:1]).first_failure
    assert alone is not None and alone.line_no == 1


def test_libcxx_terminate_takes_its_family_from_the_message() -> None:
    """vLLM on Metal (vllm-project/vllm-metal#274): libc++'s terminate line carries the
    exception's message; the engine's death that follows is its consequence."""
    log = [
        "libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] "
        "Command buffer execution failed: Insufficient Memory "
        "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)\n",
        "(APIServer pid=26468) ERROR 04-15 07:22:58 [core_client.py:667] Engine core proc "
        "EngineCore died unexpectedly, shutting down client.\n",
    ]
    ff = analyze(log).first_failure
    assert ff is not None and (ff.line_no, ff.rule, ff.category) == (1, "ENG026", "oom")


def test_a_consequence_standing_in_says_so_in_the_report() -> None:
    """A log holding only `Engine core initialization failed` (its cause cut away): the
    human report says that only a line accompanying the failure is there."""
    log = [
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
        "proc(s): {}\n"
    ]
    ff = analyze(log).first_failure
    assert ff is not None and ff.basis == "fallback" and ff.rule == "CSQ001"
    note = basis_note(ff, None)
    assert note is not None and note.startswith("Only a line that accompanies a failure")
    exc = analyze(["ValueError: bad\n"]).first_failure
    assert exc is not None and load_rules().get(exc.rule).kind == "failure"
    assert (basis_note(exc, None) or "").startswith("The rule set did not know this failure")
