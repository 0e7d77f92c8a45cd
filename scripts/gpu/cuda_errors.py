"""Provoke real single-process CUDA failures through PyTorch (or CuPy) on an NVIDIA GPU.

Usage: python3 cuda_errors.py MODE
Modes:
  oom                 allocate far more than the GPU holds -> torch.OutOfMemoryError
  oom-hold SECONDS    allocate most of GPU 0 and hold it (helper for oom-victim)
  oom-victim          allocate a few GiB on a GPU another process has filled
  touch               create a tensor on cuda:0 (run with CUDA_VISIBLE_DEVICES="")
  ordinal             create a tensor on cuda:7 (invalid device ordinal on a 1-2 GPU host)
  assert              out-of-bounds index inside a CUDA kernel -> device-side assert
  illegal [torch]     CuPy RawKernel writing far out of bounds -> illegal memory access
                      (with 'torch': the error surfaces in the next PyTorch synchronize)
Each mode prints what it is about to do, like a real program's log would, then fails for real.
"""

from __future__ import annotations

import os
import sys
import time


def log(msg: str) -> None:
    print(f"{time.strftime('%m-%d %H:%M:%S')} [cuda_errors.py] {msg}", flush=True)


def main() -> None:
    mode = sys.argv[1]
    import torch

    log(f"torch {torch.__version__} cuda {torch.version.cuda} mode={mode}")
    if mode == "oom":
        log(f"devices: {torch.cuda.device_count()}; allocating a 400 GiB tensor on cuda:0")
        x = torch.empty(400 * 1024**3, dtype=torch.uint8, device="cuda:0")
        log(f"unexpected success {x.shape}")
    elif mode == "oom-hold":
        secs = float(sys.argv[2])
        free, total = torch.cuda.mem_get_info(0)
        n = free - 2 * 1024**3
        log(f"holder: filling {n / 1024**3:.1f} GiB of {total / 1024**3:.1f} GiB on cuda:0")
        x = torch.empty(n, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        open(os.environ["HOLD_READY_FILE"], "w").close()
        log("holder: memory held")
        time.sleep(secs)
        del x
    elif mode == "oom-victim":
        log("victim: loading a 16 GiB weight shard onto cuda:0")
        w = torch.empty(16 * 1024**3, dtype=torch.uint8, device="cuda:0")
        log(f"unexpected success {w.shape}")
    elif mode == "touch":
        log(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}")
        log(f"torch.cuda.is_available() = {torch.cuda.is_available()}")
        log(f"torch.cuda.device_count() = {torch.cuda.device_count()}")
        x = torch.zeros(4, device="cuda")
        log(f"unexpected success {x}")
    elif mode == "ordinal":
        log(f"torch.cuda.device_count() = {torch.cuda.device_count()}")
        log("placing tensor on cuda:7")
        x = torch.zeros(4, device="cuda:7")
        log(f"unexpected success {x}")
    elif mode == "assert":
        table = torch.randn(1000, 64, device="cuda:0")
        ids = torch.tensor([1, 5, 4000], device="cuda:0")
        log("embedding lookup with token id 4000 in a 1000-row table")
        out = table[ids]
        torch.cuda.synchronize()
        log(f"unexpected success {out.shape}")
    elif mode == "illegal":
        import cupy as cp

        src = r"""
        extern "C" __global__ void scatter(float* out, const long long* idx, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) out[idx[i]] = 1.0f;
        }
        """
        kern = cp.RawKernel(src, "scatter")
        out = cp.zeros(1024, dtype=cp.float32)
        idx = cp.arange(1024, dtype=cp.int64)
        idx[7] = 1 << 40  # far outside any allocation
        log("launching scatter kernel with a corrupt index table")
        kern((4,), (256,), (out, idx, cp.int32(1024)))
        if len(sys.argv) > 2 and sys.argv[2] == "torch":
            # the fault surfaces in the next PyTorch call that synchronizes, as in vLLM
            a = torch.randn(4096, 4096, device="cuda:0")
            log("running the next layer's matmul in PyTorch")
            b = a @ a
            torch.cuda.synchronize()
            log(f"unexpected success {b.shape}")
        cp.cuda.Device(0).synchronize()
        log("unexpected success")
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
