"""Formats and failure families added after blind set 22 (corpus/HELDOUT22.md); real lines
from the corpus cases named."""

from __future__ import annotations

from first_failure import first_failure as _first

from kk3evidence.analysis.grammar import parse_line


def test_a_date_colon_stamp_before_a_process_tag_is_envelope() -> None:
    # b22-omni5554: vLLM-Omni's stage engine, each line stamped by the launcher that relays it
    p = (
        "026-07-29 11:18:04: (StageEngineCoreProc_stage0_replica0 pid=707) ERROR 07-29 11:18:04 "
        "[stage_engine_core_proc.py:185] "
    )
    line = parse_line(1, (p + "TimeoutError").encode())
    assert (line.body, line.level) == ("TimeoutError", "ERROR")
    ff = _first(
        p + "Traceback (most recent call last):\n"
        + p + '  File "/v/vllm_omni/engine/stage_engine_core_proc.py", line 176, in run\n'
        + p + "    raise TimeoutError\n"
        + p + "TimeoutError\n"
    )
    assert ff is not None and ff.line_no == 4 and ff.category == "hang"


def test_a_vineyard_ipc_socket_that_is_not_there_is_the_failure() -> None:
    # b22-aibrix874
    ff = _first(
        "[info] Connection to IPC socket failed for pathname /var/run/vineyard.sock with ret = "
        "IOError: Cannot connect to /var/run/vineyard.sock: No such file or directory, retrying "
        "10 more times.\n"
    )
    assert ff is not None and ff.rule == "ENG027"


def test_transformers_undocumented_kwarg_at_error_level_is_noise() -> None:
    # b22-file-muraiqwen38rtx5090-v0271-…-clean
    assert _first(
        "(APIServer pid=363) [ERROR] `min_frames` is part of Qwen3VLVideoProcessorInitKwargs, but "
        "not documented. Make sure to add it to the docstring of the function in /v/transformers/"
        "processing_utils.py.\n"
    ) is None


def test_pytorch_saying_the_gpu_is_not_in_its_build_is_the_first_cuda_init_line() -> None:
    # b22-13306
    ff = _first(
        "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current "
        "PyTorch installation.\n"
        "The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 "
        "sm_86 sm_90.\n"
        "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
    )
    assert ff is not None and (ff.line_no, ff.rule, ff.category) == (1, "CUDA005", "cuda_init")
