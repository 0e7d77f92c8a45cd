"""Families added after blind set 24's first draw (corpus/HELDOUT24.md); real lines from the
corpus cases named."""

from __future__ import annotations

from first_failure import first_failure as _first


def test_a_tt_metal_fatal_check_is_the_failure_and_its_info_names_the_family() -> None:
    # b24-ttxla5494: tt-metal's allocator under vLLM's tt-xla backend
    ff = _first(
        "TT_FATAL @ /project/third_party/tt-mlir/src/tt-mlir/third_party/tt-metal/src/tt-metal/"
        "tt_metal/impl/allocator/bank_manager.cpp:462: false\n"
        "info:\n"
        "Out of Memory: Not enough space to allocate 1050673152 B DRAM buffer across 12 banks, "
        "where each bank needs to store 87556096 B, but bank size is 1070773184 B\n"
    )
    assert ff is not None and (ff.line_no, ff.rule, ff.category) == (1, "ACC048", "oom")


def test_words_of_unknown_failures_name_hang_cuda_init_and_compile() -> None:
    cases = {
        # b24-omni7257
        "(APIServer pid=519) ERROR 09-05 12:19:40 [async_omni_engine.py:2087] [AsyncOmniEngine] "
        "Orchestrator did not stop within 30.0 seconds; continuing cleanup": "hang",
        # b24-vllm9419
        "NotImplementedError: Error in calling custom op cutlass_scaled_mm: No compiled "
        "cutlass_scaled_mm for a compute capability less than CUDA device capability: 75": (
            "cuda_init"
        ),
        # b24-sparkrun280
        "(EngineCore_DP0 pid=481) FileNotFoundError: [Errno 2] No such file or directory: "
        "'/usr/local/lib/python3.12/dist-packages/flashinfer/data/csrc/nv_internal/"
        "tensorrt_llm/cutlass_instantiations/120_mxfp4min'": "compile",
    }
    for line, category in cases.items():
        ff = _first(line + "\n")
        assert ff is not None and ff.category == category, (line, ff)


def test_a_cuda_invalid_argument_is_no_nccl_failure_by_the_rule_sets_words() -> None:
    # b24-vllm12873 / b22-xinference1220: NCCL005's anchor no longer stands for every
    # "invalid argument"
    ff = _first("RuntimeError: CUDA driver error: invalid argument\n")
    assert ff is not None and ff.category != "nccl"
    ff = _first(
        "RuntimeError: NCCL error: invalid argument (run with NCCL_DEBUG=WARN for details)\n"
    )
    assert ff is not None and (ff.rule, ff.category) == ("NCCL005", "nccl")


def test_a_model_without_pipeline_parallel_support_is_a_config_failure() -> None:
    # b24-vllm7474
    ff = _first(
        "(VllmWorkerProcess pid=138) ERROR 08-13 15:22:52 multiproc_worker_utils.py:226] "
        "AttributeError: 'MixtralForCausalLM' object has no attribute "
        "'make_empty_intermediate_tensors'\n"
    )
    assert ff is not None and ff.category == "config"


def test_a_dotted_exception_class_without_error_suffix_ends_a_traceback() -> None:
    # b24-vllm7987: anyio's WouldBlock is the first exception of the ASGI chain
    ff = _first(
        "Exception in ASGI application\n"
        "Traceback (most recent call last):\n"
        '  File "/x/anyio/streams/memory.py", line 81, in receive\n'
        "    return self.receive_nowait()\n"
        "anyio.WouldBlock\n"
    )
    assert ff is not None and (ff.line_no, ff.rule) == (5, "EXC001")
    # outside a traceback the same words are no exception line
    assert _first("see anyio.WouldBlock in the docs\n") is None
