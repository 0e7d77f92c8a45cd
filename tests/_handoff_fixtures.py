"""Realistic evidence for the diff/check/report/compare tests, shaped like real captures.

The argv, env and log lines follow the real vLLM 0.32.0 CPU runs described in
``tests/data/realruns/RECIPE.md``; GPU fingerprints follow an H200 node's NVML answers.
"""

from __future__ import annotations

import copy
from typing import Any

from kk3evidence.handoff.evidence import Evidence, from_dicts

BASE_ARGV = [
    "vllm", "serve", "/models/tinyllama", "--served-model-name", "tiny", "--port", "8011",
    "--host", "127.0.0.1", "--max-model-len", "512", "--dtype", "float32",
]

CPU_FINGERPRINT: dict[str, Any] = {
    "schema": "kk3evidence/fingerprint/v1",
    "collected_at": "2026-11-30T01:47:47Z",
    "host": {"hostname": "runner-1", "kernel": "6.1.0-27-cloud-amd64", "os": "Debian GNU/Linux 12",
             "arch": "x86_64", "cpu_count": 2, "mem_total_bytes": 25769803776},
    "gpus": {"source": "none", "driver_version": None, "cuda_driver_version": None,
             "nvml_version": None, "devices": []},
    "container": {"runtime": None, "runtime_source": None, "image_ref": None,
                  "image_ref_source": None, "image_id": None, "image_id_source": None},
    "python": {"interpreter": "/opt/venv/bin/python3", "python_version": "3.11.7",
               "vllm_version": "0.32.0+cpu", "torch_version": "2.13.0+cpu", "torch_cuda": None,
               "cuda_device_count": 0, "nccl_version": None, "source": "import"},
    "env": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1"},
    "libraries": [{"name": "libtorch_cpu.so", "path": "/opt/venv/lib/libtorch_cpu.so",
                   "version": "2.13.0", "pids": [15538]}],
    "probes": [{"name": "python", "ok": True, "seconds": 3.1, "error": None, "truncated": False}],
}


def gpu_fingerprint(*, n_gpus: int = 8, driver: str = "580.82.07", cuda_driver: str = "13.0",
                    image_ref: str = "vllm/vllm-openai:kimi-k3",
                    image_id: str = "sha256:" + "ab" * 32, torch_cuda: str = "13.0",
                    vllm: str = "0.27.1", gpu_name: str = "NVIDIA H200",
                    other_jobs: int = 0, hostname: str = "gpu-node-07") -> dict[str, Any]:
    fp = copy.deepcopy(CPU_FINGERPRINT)
    fp["host"]["hostname"] = hostname
    fp["gpus"] = {
        "source": "nvml", "driver_version": driver, "cuda_driver_version": cuda_driver,
        "nvml_version": "13." + driver, "devices": [
            {"index": i, "name": gpu_name, "uuid": f"GPU-{i:08d}-aaaa-bbbb-cccc-0000000000{i:02d}",
             "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0", "memory_total_bytes": 150754820096,
             "memory_used_bytes": 512 * 2**20, "compute_capability": "9.0", "mig_mode": None,
             "ecc_mode": "enabled",
             "processes": ([{"pid": 4242 + i, "name": "python3 train.py",
                             "used_memory_bytes": 40 * 2**30}] if i < other_jobs else [])}
            for i in range(n_gpus)
        ]}
    fp["container"] = {"runtime": "docker", "runtime_source": "/.dockerenv",
                       "image_ref": image_ref, "image_ref_source": "env KK3_IMAGE",
                       "image_id": image_id, "image_id_source": "env KK3_IMAGE_ID"}
    fp["python"].update({"interpreter": "/usr/bin/python3", "vllm_version": vllm,
                         "torch_version": "2.9.0+cu130", "torch_cuda": torch_cuda,
                         "cuda_device_count": n_gpus, "nccl_version": "2.27.7"})
    fp["env"] = {"VLLM_ENGINE_READY_TIMEOUT_S": "3600", "NCCL_DEBUG": "WARN"}
    fp["libraries"] = [
        {"name": "libcuda.so.1", "path": "/usr/lib/x86_64-linux-gnu/libcuda.so." + driver,
         "version": driver, "pids": [101]},
        {"name": "libcudart.so." + torch_cuda.split(".", maxsplit=1)[0],
         "path": "/usr/local/lib/python3.12/dist-packages/nvidia/cuda_runtime/lib/libcudart.so",
         "version": torch_cuda + ".48", "pids": [101]},
    ]
    return fp


def launch(argv: list[str], *, exit_code: int | None = 0, pid: int = 15538,
           stages: tuple[str, ...] = ("device_discovery", "weights_access", "engine_init",
                                       "api_ready", "serving")) -> dict[str, Any]:
    return {
        "schema": "kk3evidence/launch/v1", "argv": argv, "cwd": "/work", "pid": pid,
        "started_at": "2026-11-30T01:47:47.100Z", "ended_at": "2026-11-30T01:48:24.400Z",
        "exit_code": exit_code, "signal": None, "exit_status": exit_code or 0,
        "ready_seconds": 25.7, "api": {"host": "127.0.0.1", "port": 8011,
                                       "base_url": "http://127.0.0.1:8011"},
        "served_model": "tiny", "stages_reached": list(stages), "interrupted_by": "SIGINT",
    }


def fixed_request(*, max_tokens: int = 128, status: int | None = 200,
                  content: str = "고정된 짧은 테스트 문장에 답하세요.") -> dict[str, Any]:
    return {
        "schema": "kk3evidence/request/v1", "name": "fixed", "kind": "fixed", "method": "POST",
        "url": "http://127.0.0.1:8011/v1/chat/completions",
        "request_headers": {"Content-Type": "application/json"},
        "request_body": {"model": "tiny", "messages": [{"role": "user", "content": content}],
                         "max_tokens": max_tokens, "temperature": 0},
        "sent_at": "2026-11-30T01:48:13Z", "status": status, "error": None, "latency_s": 0.41,
        "response_body": {"choices": [{"message": {"role": "assistant",
                                                   "content": "leri fox rightprovin"},
                                       "finish_reason": "length"}],
                          "usage": {"prompt_tokens": 14, "completion_tokens": 16}},
        "usage": {"prompt_tokens": 14, "total_tokens": 30, "completion_tokens": 16},
        "cached_tokens": None,
    }


OK_ANALYSIS: dict[str, Any] = {
    "schema": "kk3evidence/analysis/v1", "source": "x", "lines_total": 120,
    "last_stage_reached": "serving",
    "stages": [
        {"stage": "device_discovery", "status": "completed", "first_line": 9, "last_line": 12},
        {"stage": "weights_access", "status": "completed", "first_line": 30, "last_line": 41},
        {"stage": "engine_init", "status": "completed", "first_line": 42, "last_line": 80},
        {"stage": "api_ready", "status": "completed", "first_line": 81, "last_line": 95},
        {"stage": "serving", "status": "completed", "first_line": 96, "last_line": 110},
    ],
    "first_failure": None, "consequences": [], "findings": [],
}

FAIL_LOG = [
    "(APIServer pid=15538) INFO 11-30 01:50:01 [model.py:733] Resolved architecture: "
    "LlamaForCausalLM",
    "(EngineCore pid=15613) INFO 11-30 01:50:08 [core.py:96] Initializing a V1 LLM engine",
    "(Worker pid=15700) INFO 11-30 01:50:12 [gpu_model_runner.py:2010] Starting to load model "
    "/models/tinyllama...",
    "(Worker pid=15700) ERROR 11-30 01:50:13 [multiproc_executor.py:596] WorkerProc failed to "
    "start.",
    "(Worker pid=15700) ERROR 11-30 01:50:13 [multiproc_executor.py:596] RuntimeError: Cannot "
    "find any model weights with `/models/tinyllama`",
    "(EngineCore pid=15613) ERROR 11-30 01:50:14 [core.py:1510] EngineCore failed to start.",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
    "{'EngineCore': 1}",
]

FAIL_ANALYSIS: dict[str, Any] = {
    "schema": "kk3evidence/analysis/v1", "source": "x", "lines_total": 7,
    "last_stage_reached": "weights_access",
    "stages": [
        {"stage": "engine_init", "status": "started", "first_line": 2, "last_line": 2},
        {"stage": "weights_access", "status": "failed", "first_line": 3, "last_line": 5},
    ],
    "first_failure": {"stage": "weights_access", "category": "weights", "rule": "WGT001",
                      "line_no": 5, "text": FAIL_LOG[4], "process": "Worker pid=15700"},
    "consequences": [{"line_no": 6, "rule": "ENG010", "text": FAIL_LOG[5]},
                     {"line_no": 7, "rule": "ENG011", "text": FAIL_LOG[6]}],
    "findings": [],
}


def run(source: str = "a.tar", *, argv: list[str] | None = None,
        fingerprint: dict[str, Any] | None = None, request: dict[str, Any] | None = None,
        failed: bool = False, pid: int = 15538, notes: dict[str, Any] | None = None,
        port: int = 8011) -> Evidence:
    argv = list(argv if argv is not None else BASE_ARGV)
    if "--port" in argv:
        argv[argv.index("--port") + 1] = str(port)
    lau = launch(argv, exit_code=1 if failed else 0, pid=pid,
                 stages=("engine_init", "weights_access") if failed else
                 ("device_discovery", "weights_access", "engine_init", "api_ready", "serving"))
    lau["api"]["port"] = port
    return from_dicts(
        source,
        fingerprint=fingerprint if fingerprint is not None else copy.deepcopy(CPU_FINGERPRINT),
        launch=lau,
        notes=notes or {"schema": "kk3evidence/notes/v1", "notes": [], "changes": [],
                        "cluster": {"gpu_processes": [], "text": None}},
        analysis=FAIL_ANALYSIS if failed else OK_ANALYSIS,
        requests=[] if failed else [request or fixed_request()],
        log_lines=FAIL_LOG if failed else None,
    )


def write(ev: Evidence, path: Any, *, log_lines: list[str] | None = None,
          with_analysis: bool = True, bundle_id: str = "handoff-test") -> Any:
    """Write ``ev`` as a real bundle through BundleWriter (schema-validated) and return the path.

    Without ``analysis.json`` the reader runs the real analyzer on the log.
    """
    from kk3evidence.bundle.archive import BundleWriter

    staging = path.with_name(path.name + ".staging")
    writer = BundleWriter(staging, bundle_id=bundle_id)
    writer.write_json("fingerprint.json", dict(ev.fingerprint.raw))
    writer.write_json("launch.json", dict(ev.launch.raw))
    writer.write_json("notes.json", dict(ev.notes.raw) or {
        "schema": "kk3evidence/notes/v1", "notes": [], "changes": [],
        "cluster": {"gpu_processes": [], "text": None}})
    if with_analysis and ev.analysis is not None:
        writer.write_json("analysis.json", dict(ev.analysis))
    for i, req in enumerate(ev.requests):
        writer.write_json(f"requests/{i:02d}-{req.name or 'r'}.json", dict(req.raw))
    lines = log_lines if log_lines is not None else (
        FAIL_LOG if ev.first_failure is not None else OK_LOG)
    with writer.open_stream("logs/combined.log") as fp:
        fp.write("".join(line + "\n" for line in lines).encode())
    for label, text_ in ev.metrics.items():
        writer.add_bytes(f"metrics/{label}.prom", text_.encode())
    return writer.finalize(path)


OK_LOG = [
    "(APIServer pid=15538) INFO 11-30 01:47:53 [api_utils.py:286] non-default args: "
    "{'model_tag': '/models/tinyllama', 'host': '127.0.0.1', 'port': 8011}",
    "(APIServer pid=15538) INFO 11-30 01:47:53 [model.py:733] Resolved architecture: "
    "LlamaForCausalLM",
    "(EngineCore pid=15613) INFO 11-30 01:48:00 [core.py:96] Initializing a V1 LLM engine "
    "(v0.32.0) with config: model='/models/tinyllama'",
    "(Worker pid=15614) INFO 11-30 01:48:02 [cpu_model_runner.py:71] Starting to load model "
    "/models/tinyllama...",
    "(Worker pid=15614) INFO 11-30 01:48:03 [default_loader.py:291] Loading weights took "
    "0.01 seconds",
    "(EngineCore pid=15613) INFO 11-30 01:48:12 [core.py:250] init engine (profile, create kv "
    "cache, warmup model) took 9.77 seconds",
    "(APIServer pid=15538) INFO 11-30 01:48:13 [api_server.py:1380] Starting vLLM API server 0 "
    "on http://127.0.0.1:8011",
    "(APIServer pid=15538) INFO:     Application startup complete.",
    '(APIServer pid=15538) INFO:     127.0.0.1:51236 - "POST /v1/chat/completions HTTP/1.1" 200 '
    "OK",
]
