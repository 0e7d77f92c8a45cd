"""Formats and failure families added after blind set 23 (corpus/HELDOUT23.md); real lines
from the corpus cases named."""

from __future__ import annotations

from first_failure import first_failure as _first

from kk3evidence.analysis.grammar import parse_line


def test_torch_npu_prefix_inside_a_vllm_line_is_peeled_and_acl_failure_is_stated() -> None:
    # b23-ascend2117: torch_npu's report relayed by a worker's logger, then the engine's
    # "EngineCore failed to start." (a consequence)
    first = (
        "(VllmWorker rank=10 pid=5568) ERROR 07-30 10:15:05 [multiproc_executor.py:487] [ERROR] "
        "2025-07-30-10:15:05 (PID:5568, Device:10, RankID:-1) ERR01100 OPS call acl api failed"
    )
    line = parse_line(1, first)
    assert (line.level, line.body, line.rank) == (
        "ERROR",
        "ERR01100 OPS call acl api failed",
        10,
    )
    ff = _first(first + "\nERROR 07-30 10:15:09 [core.py:586] EngineCore failed to start.\n")
    assert ff is not None and (ff.line_no, ff.rule) == (1, "ACC047")


def test_the_npu_runtime_error_before_torch_npu_summary_is_first() -> None:
    # b21-ascend13482 (shape): the CANN op runner's own [ERROR] report, then ERR00100
    ff = _first(
        "[ERROR] OP(2817,):2026-08-04-06:53:21.444.313 [rts_arg.cpp:871][NNOP][LaunchKernel"
        "FromCache][3165] errno[361001] OpName:[aclnnMatmul_193426_MatMulCommon] "
        "aclrtLaunchKernelWithHostArgs failed: 507018\n"
        "[ERROR] 2026-08-04-06:53:21 (PID:2817, Device:3, RankID:-1) ERR00100 PTA call acl api "
        "failed\n"
    )
    assert ff is not None and ff.line_no == 1


def test_a_data_record_or_echoed_source_is_no_message_before_an_orphan_consequence() -> None:
    # b5-20440 / b16-ascend2763 (shapes): dump_input's record and a source line without its
    # indentation stay behind "EngineCore encountered a fatal error."
    for above in (
        "ERROR 07-03 20:47:11 [dump_input.py:82] SchedulerStats(num_running_reqs=0, "
        "num_waiting_reqs=1)",
        "(EngineCore_0 pid=702) ERROR 09-04 09:50:12 [core.py:702] (output, ) = "
        "self.collective_rpc(",
    ):
        ff = _first(
            above + "\nERROR 07-03 20:47:11 [core.py:517] EngineCore encountered a fatal error.\n"
        )
        assert ff is not None and ff.line_no == 2, above


def test_a_terminate_before_the_abort_is_the_statement() -> None:
    # b23-ipexllm12809: a C++ exception escapes, then the shell's abort line
    ff = _first(
        "terminate called after throwing an instance of 'sycl::_V1::exception'\n"
        "  what():  The current device architecture is not supported by "
        "sycl_ext_oneapi_device_architecture.\n"
        "Aborted (core dumped)\n"
    )
    assert ff is not None and ff.line_no == 1


def test_a_relayed_sidecar_line_is_unwrapped_and_the_mq_engine_death_is_known() -> None:
    # b23-vllmpr9818
    p = "[VllmSidecar kooEr8Ccal1cqylW5f5cz]: 2024-11-13T03:15:08.672Z 1 stdout: "
    ff = _first(
        p + "CRITICAL 11-12 19:15:08 launcher.py:99] MQLLMEngine is already dead, terminating "
        "server process\n"
        + p + 'INFO:     127.0.0.1:41034 - "POST /v1/chat/completions HTTP/1.1" 500 Internal '
        "Server Error\n"
    )
    assert ff is not None and (ff.line_no, ff.rule) == (1, "CSQ027")


def test_any_per_argument_parser_error_is_a_config_failure() -> None:
    # b23-vectorinference157
    ff = _first(
        "vllm serve: error: argument --compilation-config/-O: 1 validation error for "
        "CompilationConfig\n"
    )
    assert ff is not None and (ff.rule, ff.category) == ("CFG013", "config")


def test_an_exception_logged_as_its_repr_is_the_first_printing() -> None:
    # b23-vllm9175: V0's MQ client logs repr(e), then the traceback ending in the same error
    p = "ERROR 10-09 02:13:55 client.py:250] "
    ff = _first(
        p + "RuntimeError('Engine loop has died')\n"
        + p + "Traceback (most recent call last):\n"
        + p + '  File "/v/vllm/engine/multiprocessing/client.py", line 150, in run_heartbeat_loop\n'
        + p + "    await self._check_success(\n"
        + p + "RuntimeError: Engine loop has died\n"
    )
    assert ff is not None and ff.line_no == 1


def test_a_segfault_in_nccls_proxy_is_an_nccl_failure() -> None:
    # b23-vllm6918: the crash handler names the faulting function
    ff = _first(
        "(RayWorkerWrapper pid=5993) *** SIGSEGV received at time=1722289279 on cpu 61 ***\n"
        "(RayWorkerWrapper pid=5993) PC: @     0x7f0c73d2944a  (unknown)  addProxyOpIfNeeded()\n"
    )
    assert ff is not None and (ff.line_no, ff.category) == (1, "nccl")
