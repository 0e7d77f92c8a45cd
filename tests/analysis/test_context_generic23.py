"""Generic changes made while blind set 23 was being collected (no line of set 23 was seen):
more envelope formats, an empty error record's message above it, the message a bare
consequence continues, more family words. Real lines from the corpus cases named."""

from __future__ import annotations

from first_failure import first_failure as _first

from kk3evidence.analysis.grammar import parse_line


def test_xinference_logger_line_gives_level_and_pid_and_its_message_is_the_failure() -> None:
    # b22-xinference1220: Xinference logs the error, PyTorch's continuation lines follow
    log = (
        "2024-03-29 18:28:51,875 xinference.api.restful_api 8 ERROR    [address=0.0.0.0:43266, "
        "pid=897] CUDA error: invalid argument\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the "
        "stacktrace below might be incorrect.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.\n"
    )
    line = parse_line(1, log.splitlines()[0])
    assert (line.level, line.pid, line.body) == ("ERROR", 897, "CUDA error: invalid argument")
    ff = _first(log)
    assert ff is not None and ff.line_no == 1 and ff.basis == "fallback"


def test_a_consequence_with_an_envelope_of_its_own_keeps_its_place() -> None:
    # b5-20440 (shape): vLLM's dump_input record above "EngineCore encountered a fatal error."
    ff = _first(
        "ERROR 07-03 20:47:11 [dump_input.py:82] SchedulerStats(num_running_reqs=0, "
        "num_waiting_reqs=1, gpu_cache_usage=0.005255023183925789)\n"
        "ERROR 07-03 20:47:11 [core.py:517] EngineCore encountered a fatal error.\n"
    )
    assert ff is not None and ff.line_no == 2


def test_an_empty_error_record_answers_with_the_message_printed_above_it() -> None:
    # b11-ipexllm13003: ipex-llm prints a banner and the message, then logs an empty ERROR
    ff = _first(
        "****************************Usage Error************************\n"
        "Currently, ipex-vllm does not support linear layers with skip_bias_add argument\n"
        "2025-03-24 21:45:11,347 - ERROR - \n"
    )
    assert ff is not None and ff.line_no == 2 and ff.basis == "fallback"


def test_glog_and_ray_core_lines_give_their_level() -> None:
    line = parse_line(
        1,
        "E1115 02:58:51.162611 1 backend_model.cc:634] ERROR: Failed to create instance: "
        "TypeError: 'NoneType' object is not subscriptable",
    )
    assert (line.level, line.source_file) == ("ERROR", "backend_model.cc:634")
    line = parse_line(
        1,
        "[2021-02-15 19:27:20,308 I 41335 11188325] gcs_placement_group_scheduler.cc:150: "
        "Failed to schedule placement group _tune__a2e7e1c2",
    )
    assert (line.level, line.pid) == ("INFO", 41335)
    # Ray's Python logging after its timestamp; a vLLM line is still vLLM's
    line = parse_line(1, "2024-03-29 18:28:51,875\tERROR worker.py:409 -- Unhandled error")
    assert (line.level, line.body) == ("ERROR", "Unhandled error")
    line = parse_line(1, "INFO 05-10 12:00:00 llm_engine.py:176] Initializing an LLM engine")
    assert (line.level, line.source_file) == ("INFO", "llm_engine.py:176")


def test_family_words_name_the_category_of_an_unknown_failure_line() -> None:
    # wordings no rule has: an out-of-memory statement, a checkpoint tensor name, a LoRA load
    cases = {
        "RuntimeError: Worker ran out of memory while loading the draft model": "oom",
        "KeyError: 'layers.0.mlp.experts.w2_weight'": "weights",
        "RuntimeError: Loading lora /data/lora/ckpt-57 failed": "weights",
        "RuntimeError: the provided PTX was compiled with an unsupported toolchain.": (
            "driver_mismatch"
        ),
    }
    for line, category in cases.items():
        ff = _first(line + "\n")
        assert ff is not None and ff.category == category, (line, ff)


def test_a_message_tail_yields_to_the_first_line_of_its_message() -> None:
    # b11-rocm5264 (shape): ROCm's HIP error, then PyTorch's tail; and vLLM's own envelope on
    # both lines (b19-16307 shape), and a tail whose process differs keeps its place
    hip = _first(
        "HIP error: invalid device function\n"
        "HIP kernel errors might be asynchronously reported at some other API call, so the "
        "stacktrace below might be incorrect.\n"
    )
    assert hip is not None and (hip.line_no, hip.category) == (1, "cuda_init")
    p = "(EngineCore_DP0 pid=7) ERROR 04-08 19:59:10 [core.py:400] "
    same = _first(
        p + "CUDA error: the launch timed out and was terminated\n"
        + p + "CUDA kernel errors might be asynchronously reported at some other API call, so "
        "the stacktrace below might be incorrect.\n"
    )
    assert same is not None and same.line_no == 1
    other = _first(
        "(APIServer pid=1) INFO 04-08 19:59:10 [api_server.py:1] Serving a request\n"
        + p + "CUDA kernel errors might be asynchronously reported at some other API call, so "
        "the stacktrace below might be incorrect.\n"
    )
    assert other is not None and other.line_no == 2


def test_an_unknown_error_its_process_keeps_repeating_yields_to_a_later_fatal_one() -> None:
    # b21-file-lilacrllm-v0110: a reward client's refused connection, logged again and again
    # while the job runs on; then a rollout server's watchdog dies on a CUDA error
    client = (
        "(TaskRunner pid=673617) [HybridClient] calculate_reward_like_kernel error_message: "
        "[Errno 111] Connection refused\n"
    )
    fatal = (
        "(vLLMHttpServer pid=678390) [rank0]:[E425 02:18:32.941475337 ProcessGroupNCCL.cpp:2068] "
        "[PG ID 2 PG GUID 3 Rank 0] Process group watchdog thread terminated with exception: CUDA "
        "error: Invalid access of peer GPU memory over nvlink or a hardware error\n"
    )
    ff = _first(client * 8 + fatal)
    assert ff is not None and (ff.line_no, ff.category) == (9, "illegal_memory")
    # said only a few times, the unknown error stays first (the earliest root)
    ff = _first(client * 2 + fatal)
    assert ff is not None and ff.line_no == 1


def test_an_embedded_exception_after_failed_to_is_the_failure_at_any_level() -> None:
    # b22-triton6578: Triton's Python stub reports the exception at INFO, then as errors
    ff = _first(
        "I1115 02:58:49.477216 1 pb_stub.cc:325] Failed to initialize Python stub: TypeError: "
        "'NoneType' object is not subscriptable\n"
        "E1115 02:58:51.162611 1 backend_model.cc:634] ERROR: Failed to create instance: "
        "TypeError: 'NoneType' object is not subscriptable\n"
    )
    assert ff is not None and (ff.line_no, ff.rule) == (1, "EXC016")
