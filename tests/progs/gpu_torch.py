"""A tiny PyTorch CUDA program for the GPU verification run (docs/gpu-verification.md).

usage: gpu_torch.py [HOLD_SECONDS]

Starts one process per visible GPU (torch.multiprocessing, spawn), each of which initialises
CUDA, runs a matrix product (cuBLAS) and an NCCL all-reduce across the processes, so libcudart,
libcublas and libnccl are mapped; then holds them for HOLD_SECONDS (default 6) so that
capture's /proc maps scan (every 2 s) sees them. Not used by the CPU-only test suite.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, world: int, port: int, hold: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    x = torch.ones(1024, device="cuda") * (rank + 1)
    dist.all_reduce(x)
    a = torch.randn(1024, 1024, device="cuda")
    b = a @ a
    torch.cuda.synchronize()
    print(
        f"rank {rank}: all_reduce sum {x[0].item():g} (expected {world * (world + 1) // 2}), "
        f"matmul {tuple(b.shape)} ok, pid {os.getpid()}",
        flush=True,
    )
    time.sleep(hold)
    dist.destroy_process_group()


def main() -> int:
    hold = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0
    world = torch.cuda.device_count()
    print(
        f"torch {torch.__version__} cuda {torch.version.cuda} devices {world} "
        f"nccl {torch.cuda.nccl.version()}",
        flush=True,
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(world, port, hold), nprocs=world)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
