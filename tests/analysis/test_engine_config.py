"""engine_config: what vLLM itself reports at start, read from real vLLM 0.32 CPU logs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kk3evidence.analysis.engine import analyze
from kk3evidence.analysis.engine_config import (
    EngineConfig,
    EngineConfigCollector,
    engine_config_of_lines,
)

REAL = Path(__file__).resolve().parents[1] / "data" / "realruns"


def test_default_prefix_caching_is_read_from_the_engine_line_not_argv() -> None:
    # ok_baseline passed no --enable-prefix-caching; vLLM 0.32's V1 engine turned it on.
    cfg = analyze(REAL / "ok_baseline" / "output.log").engine_config
    assert cfg is not None
    assert cfg["enable_prefix_caching"] is True
    assert "enable_prefix_caching" not in cfg["non_default_args"]
    assert cfg["max_model_len"] == 512
    assert cfg["vllm_version"] == "0.32.0"
    assert cfg["device"] == "cpu"
    assert cfg["served_model_name"] == "tiny"
    assert cfg["kv_cache_tokens"] == 1_048_576
    assert cfg["max_concurrency"] == 2048.0
    assert cfg["max_concurrency_tokens_per_request"] == 512
    assert cfg["kv_cache_memory_gib"] == 1.0
    assert cfg["lines"]["enable_prefix_caching"] == 17


def test_flag_given_is_in_the_non_default_args() -> None:
    cfg = analyze(REAL / "ok_prefix_caching" / "output.log").engine_config
    assert cfg is not None
    assert cfg["non_default_args"]["enable_prefix_caching"] is True
    assert cfg["enable_prefix_caching"] is True


def test_estimated_maximum_model_length_is_kept_in_full() -> None:
    cfg = analyze(REAL / "fail_kv_cache_too_small" / "output.log").engine_config
    assert cfg is not None
    assert cfg["estimated_max_model_len"] == 896
    assert cfg["max_model_len"] == 2048
    # vLLM printed "0.0" GiB: kept as stated, not turned into 0 bytes
    assert cfg["kv_cache_memory_gib"] == 0.0


def test_a_run_that_failed_before_the_engine_has_only_what_it_printed() -> None:
    cfg = analyze(REAL / "fail_max_model_len_too_large" / "output.log").engine_config
    assert cfg is not None
    assert "enable_prefix_caching" not in cfg
    assert cfg["non_default_args"]["max_model_len"] == 1_000_000
    assert EngineConfig.from_json(cfg) is not None
    assert EngineConfig.from_json(cfg).enable_prefix_caching is None  # type: ignore[union-attr]


def test_gpu_sizing_lines() -> None:
    cfg = engine_config_of_lines([
        "(EngineCore_DP0 pid=7) INFO 01-02 03:04:05 [gpu_worker.py:298] Available KV cache "
        "memory: 61.42 GiB",
        "(EngineCore_DP0 pid=7) INFO 01-02 03:04:05 [kv_cache_utils.py:1087] GPU KV cache "
        "size: 1,234,560 tokens",
        "(EngineCore_DP0 pid=7) INFO 01-02 03:04:05 [kv_cache_utils.py:1091] Maximum "
        "concurrency for 8,192 tokens per request: 150.70x",
    ])
    assert cfg is not None
    assert cfg["kv_cache_memory_gib"] == 61.42
    assert cfg["kv_cache_tokens"] == 1_234_560
    assert cfg["max_concurrency"] == 150.70
    assert cfg["max_concurrency_tokens_per_request"] == 8192


def test_no_engine_lines_gives_none() -> None:
    assert analyze(b"hello\nworld\n").engine_config is None
    assert EngineConfig.from_json(None) is None


def test_the_first_statement_wins_and_kv_dtype_is_not_dtype() -> None:
    cfg = engine_config_of_lines([
        "Initializing a V1 LLM engine (v0.9.1) with config: model='m', kv_cache_dtype=fp8, "
        "dtype=torch.bfloat16, enable_prefix_caching=False, max_seq_len=4096",
        "Initializing a V1 LLM engine (v0.9.1) with config: enable_prefix_caching=True",
    ])
    assert cfg is not None
    assert cfg["enable_prefix_caching"] is False
    assert cfg["dtype"] == "torch.bfloat16"
    assert cfg["kv_cache_dtype"] == "fp8"


def test_a_non_literal_dict_is_ignored_not_evaluated() -> None:
    cfg = engine_config_of_lines(["non-default args: {'a': __import__('os').getpid()}"])
    assert cfg is None


@given(st.binary(max_size=400), st.integers(min_value=1, max_value=64))
def test_chunking_does_not_change_the_result(data: bytes, cut: int) -> None:
    text = (REAL / "ok_baseline" / "output.log").read_bytes()[:6000] + data
    whole = analyze(text).engine_config
    eng_blocks = [text[i:i + 64 * cut] for i in range(0, len(text), 64 * cut)]
    from kk3evidence.analysis.engine import AnalysisEngine

    eng = AnalysisEngine("x")
    for b in eng_blocks:
        eng.feed(b)
    assert eng.finish().engine_config == whole


@pytest.mark.parametrize(
    "case", sorted(p.name for p in REAL.iterdir() if (p / "output.log").is_file())
)
def test_every_real_run_parses_without_error(case: str) -> None:
    cfg = analyze(REAL / case / "output.log").engine_config
    if cfg is not None:
        assert EngineConfig.from_json(cfg) is not None
    col = EngineConfigCollector()
    col.scan(b"", 0, 0, 0)
    assert col.result() is None
