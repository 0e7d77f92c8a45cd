"""HTTP helpers of capture: API target from CMD, Prometheus parsing, the probe prompt."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kk3evidence.capture import http as probe

METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 724.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny"} 6.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.796003328604629e+09
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 256.0
vllm:cache_config_info{block_size="128",enable_prefix_caching="True",engine="0"} 1.0
"""


def test_prom_value_sums_label_sets_and_ignores_lookalikes() -> None:
    assert probe.prom_value(METRICS, "vllm:prefix_cache_queries_total") == 730.0
    assert probe.prom_value(METRICS, "vllm:prefix_cache_hits_total") == 256.0
    assert probe.prom_value(METRICS, "vllm:prefix_cache_queries") is None
    assert probe.prom_value(None, "x") is None


def test_prom_label() -> None:
    assert probe.prom_label(METRICS, "vllm:cache_config_info", "block_size") == "128"
    assert probe.prom_label(METRICS, "vllm:cache_config_info", "enable_prefix_caching") == "True"
    assert probe.prom_label(METRICS, "vllm:cache_config_info", "nope") is None


@given(st.text(), st.text(min_size=1))
def test_prometheus_parsing_never_raises(text: str, metric: str) -> None:
    probe.prom_value(text, metric)
    probe.prom_label(text, metric, "block_size")


def test_api_target_from_vllm_serve_flags() -> None:
    t = probe.api_target(["vllm", "serve", "m", "--host", "0.0.0.0", "--port=8011"], {})
    assert (t.host, t.port, t.base_url, t.how) == (
        "127.0.0.1",
        8011,
        "http://127.0.0.1:8011",
        "CMD arguments",
    )
    d = probe.api_target(["vllm", "serve", "m"], {})
    assert (d.port, d.how) == (8000, "vLLM defaults")


def test_api_target_key_from_argv_or_env() -> None:
    assert probe.api_target(["vllm", "serve", "m", "--api-key", "k1"], {}).api_key == "k1"
    assert probe.api_target(["vllm", "serve", "m"], {"VLLM_API_KEY": "k2"}).api_key == "k2"


def test_api_target_for_another_server_and_explicit_url() -> None:
    t = probe.api_target(["python", "server.py", "--port", "9000"], {})
    assert (t.host, t.port) == ("127.0.0.1", 9000)
    u = probe.api_target(["x"], {}, url="http://10.1.2.3:8080/")
    assert (u.host, u.port, u.base_url, u.how) == (
        "10.1.2.3",
        8080,
        "http://10.1.2.3:8080",
        "option --url",
    )


@given(st.integers(1, 512), st.one_of(st.none(), st.integers(64, 100_000)))
def test_probe_prompt_exceeds_one_block_and_fits_the_model(block: int, max_len: int | None) -> None:
    words = probe.prefix_probe_prompt(block, max_len, 16).split(" ")
    assert len(words) > block  # every word is at least one token
    if max_len is not None and max_len - 16 - 64 > block + 8:
        assert len(words) <= max_len - 16 - 64


def test_default_request_is_the_guides() -> None:
    assert probe.default_request_body("tiny") == {
        "model": "tiny",
        "messages": [{"role": "user", "content": "고정된 짧은 테스트 문장에 답하세요."}],
        "max_tokens": 128,
        "temperature": 0,
    }
