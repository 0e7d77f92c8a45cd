"""The last "no failure" corpus logs (2026-12-02, issue 13): real lines from the corpus cases named.

vLLM's `Failed to import from vllm._C` warning states a broken install on CUDA, ROCm, CPU and
Windows builds, and is expected on TPU, XPU and out-of-tree platforms (their builds have no CUDA
extension): the platform lines before it decide. A start-up the operator stopped with Ctrl-C
before it became ready is a stall at the interrupt; a KV-cache service that cannot be reached
and Dynamo's lost response streams are failures of their own.
"""

from __future__ import annotations

from first_failure import first_failure as _first

_C_MISSING = (
    "WARNING 10-21 18:27:11 _custom_ops.py:18] Failed to import from vllm._C with "
    "ModuleNotFoundError(\"No module named 'vllm._C'\")\n"
)



def test_vllm_c_missing_on_a_cuda_less_windows_install_is_a_broken_install() -> None:
    # b17-llamafactory5767: LLaMA-Factory on Windows with a CPU-only torch
    ff = _first("PS C:\\LLaMA-Factory> llamafactory-cli version\n" + _C_MISSING + "-" * 40 + "\n")
    assert ff is not None and (ff.line_no, ff.rule) == (2, "CTR017")
    assert (ff.stage, ff.category) == ("container_init", "other")


def test_vllm_c_missing_in_collect_env_output_is_a_broken_install() -> None:
    # b14-7951: collect_env on an MI300X ROCm host (ROCm builds ship vllm._C too)
    ff = _first(
        "Collecting environment information...\n"
        "Failed to import from vllm._C with No module named 'vllm._C'\n"
        "PyTorch version: 2.3.0a0+git96dd291\n"
    )
    assert ff is not None and (ff.line_no, ff.rule) == (2, "CTR017")


def test_vllm_c_missing_after_a_tpu_intel_gpu_or_plugin_platform_line_is_expected() -> None:
    tpu = (  # b7-tpuinference898 (clean)
        "INFO 10-20 00:02:12 [__init__.py:22] TPU info: node_name=kevin-dev | tpu_type=v4-8 | "
        "worker_id=0 | num_chips=4 | num_cores_per_chip=2\n"
        "WARNING 10-20 00:02:14 [interface.py:176] Failed to import from vllm._C: "
        "ModuleNotFoundError(\"No module named 'vllm._C'\")\n"
    )
    xpu = "[WARNING] Failed to create Level Zero tracer: 2013265921\n" + _C_MISSING  # b6-10109
    detected = "INFO 10-01 07:57:54 [__init__.py:216] Automatically detected platform tpu.\n"
    plugin = "INFO 12-17 09:30:19 [__init__.py:235] Platform plugin ascend is activated\n"
    for log in (tpu, xpu, detected + _C_MISSING, plugin + _C_MISSING):
        assert _first(log) is None, log


def test_a_rocm_or_cuda_platform_line_does_not_make_vllm_c_missing_expected() -> None:
    rocm = "INFO 04-03 05:48:54 [__init__.py:239] Automatically detected platform rocm.\n"
    ff = _first(rocm + _C_MISSING)
    assert ff is not None and ff.rule == "CTR017"


def test_a_macos_symbol_not_found_is_an_extension_built_for_another_torch() -> None:
    # b15-15066: a source build on macOS
    ff = _first(
        "INFO 03-19 00:20:57 [cpu.py:40] Using Torch SDPA backend.\n"
        "WARNING 03-19 00:20:58 [_custom_ops.py:21] Failed to import from vllm._C with "
        "ImportError('dlopen(/Users/q/vllm/vllm/_C.abi3.so, 0x0002): Symbol not found: "
        "__ZNK3c1011StorageImpl27throw_data_ptr_access_errorEv')\n"
    )
    assert ff is not None and (ff.line_no, ff.rule) == (2, "CTR008")


_INTERRUPTED = (  # b12-ipexllm12733: an XPU api_server stopped with Ctrl-C before it served
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.11/dist-packages/uvloop/__init__.py", line 105, in run\n'
    "    return runner.run(wrapper())\n"
    '  File "/usr/lib/python3.11/asyncio/runners.py", line 123, in run\n'
    "    raise KeyboardInterrupt()\n"
    "KeyboardInterrupt\n"
    "^C\n"
)


def test_a_start_up_interrupted_before_ready_is_a_stall_at_the_interrupt() -> None:
    ff = _first(_INTERRUPTED)
    assert ff is not None and (ff.line_no, ff.rule, ff.basis) == (6, "STALL004", "stall")
    assert ff.category == "hang"


def test_an_interrupt_after_ready_or_without_a_traceback_is_no_failure() -> None:
    ready = "INFO:     Application startup complete.\n"
    assert _first(ready + _INTERRUPTED) is None
    assert _first("INFO 01-01 00:00:00 [x.py:1] hello\nKeyboardInterrupt\n^C\n") is None


def test_a_log_that_ends_in_process_group_init_is_a_stall_when_the_user_says_it_stopped() -> None:
    # b10-50430: eight workers' distributed init, then nothing (the thread: it hangs there)
    log = "".join(
        f"(Worker pid={359272 + r}) INFO 07-30 12:25:09 [parallel_state.py:1615] world_size=8 "
        f"rank={r} local_rank={r} distributed_init_method=tcp://127.0.0.1:33015 backend=nccl\n"
        for r in range(8)
    )
    assert _first(log) is None  # a slice cut early looks the same
    ff = _first(log, stopped=True)
    assert ff is not None and (ff.line_no, ff.stage, ff.category) == (8, "comm_group", "hang")


def test_a_kv_cache_service_that_does_not_resolve_is_the_failure_until_ready() -> None:
    # b20-aibrix696: AIBrix's Vineyard KV cache client retrying an unresolvable endpoint
    retry = (
        "[info] Connection to RPC socket failed for endpoint kvcache-rpc:9600 with ret = IOError: "
        "getaddrinfo() failed for endpoint kvcache-rpc:9600, retrying {n} more times.\n"
    )
    head = (
        "INFO 02-17 17:03:44 model_runner.py:1041] Loading model weights took 12.5708 GB\n"
        "No RDMA endpoint provided. Fall back to TCP.\n"
    )
    ff = _first(head + retry.format(n=10) + retry.format(n=9))
    assert ff is not None and (ff.line_no, ff.rule) == (3, "ENG027")
    assert (ff.stage, ff.category) == ("engine_init", "other")
    ready = 'INFO:     127.0.0.1:60006 - "GET /health HTTP/1.1" 200 OK\n'
    assert _first(head + retry.format(n=10) + ready) is None


def test_dynamo_failing_to_publish_a_response_stream_is_a_serving_failure() -> None:
    # b20-dynamo5012
    ff = _first(
        "2026-03-18T06:21:30.893722Z  WARN handle_payload: dynamo_runtime::pipeline::network::"
        "ingress::push_handler: Failed to publish response for stream 3bb4e44d component="
        '"backend" endpoint="generate"\n'
    )
    assert ff is not None and (ff.rule, ff.stage, ff.category) == ("ENG028", "serving", "other")
