"""Verify preflight's GPU paths against real NVML on an NVIDIA machine (no vLLM needed).

Usage: python3 scripts/gpu/preflight_gpu.py OUT_DIR

Builds model folders whose safetensors files are sparse (the header declares the size; no disk
is used), a fake `vllm` script run by this Python (so the CUDA of its PyTorch is known), and
runs `kk3evidence.preflight` on several commands: weights that fit, weights too big, another
process holding GPU memory, more ranks than GPUs, CUDA_VISIBLE_DEVICES hiding the GPUs. Writes
one JSON per case and a summary to OUT_DIR.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from kk3evidence.capture.preflight_host import run_preflight  # noqa: E402

GiB = 1 << 30
CONFIG = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 64,
          "num_key_value_heads": 8, "hidden_size": 8192, "num_hidden_layers": 80,
          "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


def model(root: Path, name: str, weight_bytes: int) -> Path:
    m = root / name
    m.mkdir(parents=True)
    (m / "config.json").write_text(json.dumps(CONFIG))
    (m / "tokenizer.json").write_text("{}")
    header = json.dumps({"w": {"dtype": "BF16", "shape": [weight_bytes // 2],
                               "data_offsets": [0, weight_bytes]}}).encode()
    with (m / "model.safetensors").open("wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(8 + len(header) + weight_bytes)  # sparse: no blocks written
    return m


HOLD = """
import sys, time, torch
x = torch.empty(int(sys.argv[1]) * (1 << 30), dtype=torch.uint8, device="cuda:0")
print("holding", flush=True)
time.sleep(600)
"""


def case(out: Path, name: str, argv: list[str], env: dict[str, str]) -> dict[str, object]:
    t0 = time.monotonic()
    result = run_preflight(argv, env=env)
    doc = result.to_json()
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2))
    picked = {c.id: f"{c.status}: {c.summary}" for c in result.checks
              if c.id.startswith(("memory.weights-fit", "memory.kv-cache", "flags.world-size",
                                  "host.gpu-jobs", "host.CUDA", "host.shm"))}
    row = {"case": name, "exit": result.exit_code, "seconds": round(time.monotonic() - t0, 3),
           "fails": [c.id for c in result.failed], "checks": picked,
           "gpu_evidence": [e for c in result.checks if c.id == "memory.weights-fit"
                            for e in c.evidence]}
    print(json.dumps(row, indent=1), flush=True)
    return row


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    root = out / "models"
    vllm = out / "bin" / "vllm"
    vllm.parent.mkdir(parents=True, exist_ok=True)
    vllm.write_text(f"#!{sys.executable}\nraise SystemExit('fake vllm')\n")
    vllm.chmod(0o755)
    env = dict(os.environ)
    small, big = model(root, "m60", 60 * GiB), model(root, "m140", 140 * GiB)
    mid = model(root, "m100", 100 * GiB)
    base = [str(vllm), "serve"]
    rows = [
        case(out, "fits", [*base, str(small), "--max-model-len", "8192", "--port", "18540"], env),
        case(out, "too-big", [*base, str(big), "--port", "18540"], env),
        case(out, "tp2-one-gpu", [*base, str(small), "-tp", "2", "--port", "18540"], env),
        case(out, "no-visible-gpu", [*base, str(small), "--port", "18540"],
             {**env, "CUDA_VISIBLE_DEVICES": ""}),
    ]
    rows.append(case(out, "100GiB-alone", [*base, str(mid), "--port", "18540"], env))
    for held, weights, name in ((40, mid, "100GiB-while-another-job-holds-40GiB"),
                                (100, small, "60GiB-while-another-job-holds-100GiB")):
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(held)], stdout=subprocess.PIPE)
        try:
            assert holder.stdout is not None
            holder.stdout.readline()  # "holding": the memory is allocated
            rows.append(case(out, name, [*base, str(weights), "--port", "18540"], env))
        finally:
            holder.kill()
            holder.wait(60)
            holder.stdout.close()
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
