"""Formats and failure families added after blind set 21 (corpus/HELDOUT21.md).

Each test feeds real lines (quoted from the corpus case named, paths shortened) through the
whole analyzer.
"""

from __future__ import annotations

from first_failure import first_failure as _first

from kk3evidence.analysis.grammar import parse_line


def test_a_ray_serve_replica_tag_and_an_inline_code_backtick_are_envelope() -> None:
    # b21-ray50275: Ray Serve's `(ServeReplica:app:Deployment pid=N)`, pasted in inline code
    tag = "(ServeReplica:default:VLLMDeployment pid=1328933)"
    line = parse_line(1, f"`{tag}     return any(x)".encode())
    assert line.process == "ServeReplica:default:VLLMDeployment pid=1328933"
    assert line.body == "    return any(x)"
    ff = _first(
        f'`{tag}   File "/v/vllm/entrypoints/openai/serving_engine.py", line 665, in <genexpr>\n'
        f"{tag}     return any(model.name == model_name for model in self.base_model_paths)\n"
        f"{tag} AttributeError: 'str' object has no attribute 'name'`\n"
    )
    assert ff is not None and ff.line_no == 3 and ff.basis == "fallback"


def test_a_bus_error_is_shared_memory_under_nccl() -> None:
    # b21-1091: Ray's abseil handler, then Python's fatal-error report
    ff = _first(
        "(RayWorker pid=1451) *** SIGBUS received at time=1695144916 on cpu 3 ***\n"
        "(RayWorker pid=1451) PC: @     0x7f7984381bba  (unknown)  (unknown)\n"
        "(RayWorker pid=1451) Fatal Python error: Bus error\n"
    )
    assert ff is not None and (ff.line_no, ff.rule) == (1, "NCCL033")
    assert (ff.stage, ff.category) == ("comm_group", "nccl")


def test_nccl_refusing_graph_capture_is_a_compile_failure() -> None:
    # b21-6201
    ff = _first(
        "hostname:116024:116024 [0] misc/strongstream.cc:53 NCCL WARN NCCL cannot be captured in "
        "a graph if either it wasn't built with CUDA runtime >= 11.3 or if the installed CUDA "
        "driver < R465.\n"
        "hostname:116024:116024 [0] NCCL INFO enqueue.cc:1935 -> 5\n"
    )
    assert ff is not None and (ff.rule, ff.stage, ff.category) == (
        "NCCL034", "engine_init", "compile"
    )


def test_a_cutlass_op_not_implemented_on_this_gpu_is_a_kernel_fault() -> None:
    # b21-12769 (signature shortened)
    ff = _first(
        "void cutlass::arch::Mma<cutlass::gemm::GemmShape<16, 8, 32>, 32, "
        "cutlass::float_e4m3_t>::operator()(cutlass::Array<float, 4, true> &) const "
        "[with Operator_ = cutlass::arch::OpMultiplyAddFastAccum] not implemented\n"
        "WARNING 02-04 23:28:20 model_runner_base.py:143] Failed to pickle inputs of failed "
        "execution: CUDA error: unspecified launch failure\n"
    )
    assert ff is not None and (ff.line_no, ff.rule, ff.category) == (1, "IMA011", "illegal_memory")


def test_a_not_implemented_method_is_no_kernel_fault() -> None:
    # b7-dynamo331: the word "not implemented" alone names no family
    ff = _first(
        "(VllmWorkerProcess pid=765974) ERROR 03-21 05:31:41 multiproc_worker_utils.py:242] "
        "Traceback (most recent call last):\n"
        "(VllmWorkerProcess pid=765974) ERROR 03-21 05:31:41 multiproc_worker_utils.py:242] "
        "NotImplementedError: Method 'initialize_nixl' is not implemented.\n"
    )
    assert ff is not None and ff.category != "illegal_memory"


def test_a_line_in_a_k9s_box_is_read_and_a_rich_traceback_panel_is_left_alone() -> None:
    # b21-8016: the server stops after its engine died; the 500 is its consequence
    box = "│ CRITICAL 08-30 19:24:28 launcher.py:82] AsyncLLMEngine has failed, terminating " \
        "server process        │\n"
    http = '│ INFO:     10.94.91.181:55960 - "POST /v1/completions HTTP/1.1" 500 Internal ' \
        "Server Error     │\n"
    ff = _first(box + http)
    assert ff is not None and (ff.line_no, ff.rule) == (1, "CSQ027")
    panel = "│ /workdir/vllm/transformers_utils/tokenizer.py:36 in get_tokenizer  │"
    rich = parse_line(1, panel.encode())
    assert rich.body.startswith("│ /workdir/")


def test_no_free_kv_blocks_is_a_kv_cache_failure() -> None:
    # b21-11168
    ff = _first(
        "ERROR 12-13 08:58:11 engine.py:165] NoFreeBlocksError()\n"
        "ERROR 12-13 08:58:11 engine.py:165] Traceback (most recent call last):\n"
    )
    assert ff is not None and (ff.rule, ff.stage, ff.category) == ("KV008", "serving", "kv_cache")


def test_an_ascend_operator_tiling_failure_is_the_cause_not_the_checks_after_it() -> None:
    # b21-ascend7160
    p = "(Worker_TP0 pid=85) ERROR 03-11 08:33:36 [multiproc_executor.py:863] "
    ff = _first(
        p + "        TraceBack (most recent call last):\n"
        + p + "       MoeGatingTopK do tiling failed, ret is -1.\n"
        + p + "       Check NnopbaseExecutorDoTiling(executor) failed\n"
    )
    assert ff is not None and (ff.line_no, ff.rule) == (2, "ACC046")


def test_an_rdma_retry_counter_exceeded_is_a_transport_failure() -> None:
    # b21-pr10884 (Mooncake) and b14-uccl799 (UCCL) report the same ibverbs status
    ff = _first(
        "E1213 02:57:10.528410  5811 worker_pool.cpp:274] Worker: Process failed for slice "
        "(opcode: 0, local_nic: mlx5_1, retry_cnt: 0): transport retry counter exceeded\n"
    )
    assert ff is not None and (ff.rule, ff.category) == ("NCCL035", "nccl")


def test_a_jax_lowering_error_is_a_compile_failure() -> None:
    # b21-tpupr1136
    ff = _first(
        "(EngineCore_DP0 pid=439628) ERROR 11-20 23:44:40 [core.py:843] Traceback (most recent "
        "call last):\n"
        "(EngineCore_DP0 pid=439628) ERROR 11-20 23:44:40 [core.py:843] "
        "jax._src.source_info_util.JaxStackTraceBeforeTransformation: NotImplementedError: "
        "Unsupported cast: uint16 -> uint32\n"
    )
    assert ff is not None and ff.category == "compile"


def test_acl_allocation_error_207001_is_an_npu_oom() -> None:
    # b21-file-lilacrllm-ascend: vllm-ascend's sleep-mode allocator waking the KV cache
    ff = _first(
        "terminate called after throwing an instance of 'std::runtime_error'\n"
        "  what():  aclrtMallocPhysical failed with acl error code: 207001(OOM: Out of Memory, "
        "allocation failed) /v/vllm-ascend/csrc/camem_allocator.cpp:67\n"
    )
    assert ff is not None and (ff.rule, ff.category) == ("ACC012", "oom")


def test_a_peer_gpu_memory_fault_over_nvlink_is_an_illegal_access() -> None:
    # b21-file-lilacrllm-v0110
    ff = _first(
        "[rank0]:[E425 02:18:32.941475337 ProcessGroupNCCL.cpp:2068] [PG ID 2 PG GUID 3 Rank 0] "
        "Process group watchdog thread terminated with exception: CUDA error: Invalid access of "
        "peer GPU memory over nvlink or a hardware error\n"
    )
    assert ff is not None and (ff.rule, ff.category) == ("IMA012", "illegal_memory")
