"""preflight's pure checks, judged on hand-made host facts (GPU paths included)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kk3evidence.errors import UsageError
from kk3evidence.handoff.preflight import (
    FileFact,
    GpuDevice,
    GpuFacts,
    HostFacts,
    ModelFacts,
    PortFacts,
    PreflightResult,
    VllmFacts,
    judge,
    load_facts,
)

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30
LLAMA = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 32,
         "num_key_value_heads": 8, "hidden_size": 4096, "num_hidden_layers": 32,
         "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
GPU_VLLM = VllmFacts("/venv/bin/python3", "shebang", version="0.32.0",
                     dists={"vllm": "0.32.0", "torch": "2.9.0+cu130"}, site_packages="/venv/sp",
                     registry_archs=frozenset({"LlamaForCausalLM", "DeepseekV3ForCausalLM"}))


def h200(index: int, used: int = 0, procs: tuple[tuple[int, str, int | None], ...] = ()
         ) -> GpuDevice:
    return GpuDevice(index, "NVIDIA H200", 141 * GiB, used, procs)


def facts(config: dict[str, Any] | None = None, *, weights: int = 16 * GiB,
          gpus: GpuFacts | None = None, **kw: Any) -> HostFacts:
    files = (FileFact("model.safetensors", weights, expected_size=weights),
             FileFact("tokenizer.json", 1000), FileFact("config.json", 500))
    model = ModelFacts("/m", "/m", "local directory", config=LLAMA if config is None else config,
                       files=files)
    base = HostFacts(
        collected_at="2026-12-01T00:00:00+00:00", env={}, vllm=GPU_VLLM, model=model,
        gpus=gpus or GpuFacts("nvml", None, "580.65.06", "13.0", tuple(h200(i) for i in range(8))),
        port=PortFacts("0.0.0.0", 8000, True, "bind succeeded"), numa_nodes=(0, 1),
        mem_available_bytes=500 * GiB, shm_bytes=64 * GiB, nofile=(1 << 20, 1 << 20),
        cache_dir="/home/user/.cache/vllm", cache_free_bytes=500 * GiB)
    return dataclasses.replace(base, **kw)


def status(result: PreflightResult, check_id: str) -> str:
    return next(c.status for c in result.checks if c.id == check_id)


def serve(*extra: str, model: str = "/m") -> list[str]:
    return ["vllm", "serve", model, *extra]


def test_a_sound_gpu_launch_fails_nothing_and_exits_0() -> None:
    result = judge(serve("--tensor-parallel-size", "8"), facts())
    assert result.failed == ()
    assert result.exit_code == 0
    assert status(result, "memory.weights-fit") == "pass"
    assert status(result, "host.CUDA-001") == "pass"  # cu130 torch on an r580 driver


def test_without_nvml_gpu_memory_stays_unknown_never_pass() -> None:
    result = judge(serve("--tensor-parallel-size", "2"),
                   facts(gpus=GpuFacts("none", "NVML Shared Library Not Found")))
    for check_id in ("memory.weights-fit", "flags.world-size", "host.gpu-jobs", "host.CUDA-001"):
        assert status(result, check_id) == "unknown", check_id
    assert result.exit_code == 0


def test_weights_larger_than_the_gpu_budget_fail() -> None:
    result = judge(serve(), facts(weights=200 * GiB))
    check = next(c for c in result.checks if c.id == "memory.weights-fit")
    assert check.status == "fail"
    assert check.next_step and check.source and check.source_date


def test_memory_other_processes_hold_counts_against_the_budget() -> None:
    busy = GpuFacts("nvml", None, "580.65.06", "13.0",
                    (h200(0, used=120 * GiB, procs=((4242, "python3", 120 * GiB),)),))
    result = judge(serve(), facts(gpus=busy))
    assert status(result, "memory.weights-fit") == "fail"
    assert status(result, "host.gpu-jobs") == "warn"
    assert any("pid 4242" in e for c in result.checks if c.id == "host.gpu-jobs"
               for e in c.evidence)


def test_world_size_counts_only_cuda_visible_devices() -> None:
    result = judge(serve("-tp", "4"), facts(env={"CUDA_VISIBLE_DEVICES": "0,1"}))
    assert status(result, "flags.world-size") == "fail"


def test_heads_not_divisible_by_tensor_parallel_fail() -> None:
    result = judge(serve("--tensor-parallel-size", "3"), facts())
    assert status(result, "memory.heads-divisible") == "fail"


def test_context_longer_than_the_model_fails_unless_allowed() -> None:
    argv = serve("--max-model-len", "100000")
    assert status(judge(argv, facts()), "memory.context-length") == "fail"
    allowed = facts(env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert status(judge(argv, allowed), "memory.context-length") == "warn"


def test_rope_scaling_factor_extends_the_derived_length() -> None:
    cfg = {**LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    assert status(judge(serve("--max-model-len", "32768"), facts(cfg)),
                  "memory.context-length") == "pass"


def test_explicit_kv_budget_smaller_than_one_request_fails() -> None:
    result = judge(serve("--max-model-len", "8192", "--kv-cache-memory-bytes", "1M"), facts())
    assert status(result, "memory.kv-cache") == "fail"


def test_remote_code_without_the_flag_fails() -> None:
    cfg = {**LLAMA, "auto_map": {"AutoConfig": "configuration_x.XConfig"}}
    assert status(judge(serve(), facts(cfg)), "model.remote-code") == "fail"


def test_unknown_flag_and_parser_names_fail() -> None:
    result = judge(serve("--no-such-flag", "--tool-call-parser", "kimi_k9",
                         "--enable-auto-tool-choice"), facts())
    assert status(result, "flags.unknown") == "fail"
    assert status(result, "flags.parsers") == "fail"


def test_a_choice_vllm_rejects_fails() -> None:
    assert status(judge(serve("--dtype", "float8"), facts()), "flags.choices") == "fail"


def test_docker_default_shm_fails_tensor_parallel() -> None:
    result = judge(serve("-tp", "2"), facts(shm_bytes=64 << 20))
    assert status(result, "host.shm") == "fail"
    assert status(judge(serve(), facts(shm_bytes=64 << 20)), "host.shm") == "pass"


def test_port_taken_names_the_holder() -> None:
    taken = PortFacts("0.0.0.0", 8000, False, "address already in use", ("pid 7 (python3 x)",))
    result = judge(serve(), facts(port=taken))
    check = next(c for c in result.checks if c.id == "host.port")
    assert check.status == "fail" and "pid 7" in check.summary


def test_incomplete_multi_node_flags_fail() -> None:
    assert status(judge(serve("--nnodes", "2", "--node-rank", "1"), facts()),
                  "flags.multi-node") == "fail"
    ok = serve("--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1")
    assert status(judge(ok, facts()), "flags.multi-node") == "pass"


def test_lfs_pointer_and_missing_shards_fail_the_weights() -> None:
    pointer = ModelFacts("/m", "/m", "local", config=LLAMA,
                         files=(FileFact("model.safetensors", 130, lfs_pointer=True),))
    assert status(judge(serve(), facts(model=pointer)), "model.weights") == "fail"
    gone = ModelFacts("/m", "/m", "local", config=LLAMA,
                      files=(FileFact("a.safetensors", 10),),
                      index_shards=("a.safetensors", "b.safetensors"))
    assert status(judge(serve(), facts(model=gone)), "model.weights") == "fail"


def test_kimi_k3_disagreements_name_every_source() -> None:
    result = judge(serve("-tp", "8", "--trust-remote-code", model="moonshotai/Kimi-K3"),
                   facts(gpus=GpuFacts("nvml", None, "580.65.06", "13.0",
                                       tuple(h200(i) for i in range(16)))),
                   recipe="kimi-k3")
    gpus = next(c for c in result.checks if c.id == "recipe.K3-D01")
    assert gpus.status == "warn" and "disagree" in gpus.summary
    text = " ".join(gpus.evidence)
    for who in ("vLLM recipe", "SGLang cookbook", "NVIDIA Dynamo"):
        assert who in text
    assert all(c.source_date for c in result.checks if c.area == "recipe")


def test_unknown_recipe_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        judge(serve(), facts(), recipe="no-such-recipe")


def test_json_matches_its_schema_and_humans_read_fails_first() -> None:
    result = judge(serve("--tensor-parallel-size", "3"), facts())
    schema = json.loads((REPO / "schemas" / "preflight.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(result.to_json())
    ordered = [c.status for c in result.ordered()]
    assert ordered[0] == "fail" and ordered == sorted(
        ordered, key=("fail", "warn", "unknown", "pass").index)


def test_every_shipped_fact_has_a_source_and_date() -> None:
    for fact in load_facts().values():
        assert fact.source and len(fact.source_date) == 10


def test_checks_that_need_unreadable_model_files_are_listed_unknown() -> None:
    remote = ModelFacts("org/model", None, "not cached", remote=True)
    result = judge(serve("--max-model-len", "4096", model="org/model"), facts(model=remote))
    assert status(result, "model.location") == "unknown"
    for check_id in ("memory.context-length", "memory.heads-divisible", "model.weights"):
        assert status(result, check_id) == "unknown", check_id


def test_cuda_of_a_pypi_torch_comes_from_its_runtime_wheel() -> None:
    v = VllmFacts("/p", "x", version="0.32.0",
                  dists={"torch": "2.9.0", "nvidia-cuda-runtime-cu12": "12.8.90"})
    assert v.torch_cuda == "12.8"
    assert dataclasses.replace(v, dists={"torch": "2.9.0+cu130"}).torch_cuda == "13.0"
