"""NCCL jobs that stop moving, to verify stall snapshots on a GPU (issue 11).

Two ways (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_*`` from torchrun or set by hand):

* two GPUs, ``torchrun --nproc-per-node 2 nccl_hang.py``: both ranks join the process group
  (the TCPStore rendezvous completes); the NCCL communicator is created lazily at the first
  collective, which rank 1 never calls (it sleeps for an hour), so rank 0 waits in the
  communicator's set-up for ever;
* one GPU, ``RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=P python3
  nccl_hang.py``: rank 0 alone holds a CUDA context and 4 GiB on its GPU, then waits in the
  rendezvous for rank 1, which never starts.
"""

from __future__ import annotations

import os
import time


def log(msg: str) -> None:
    rank = os.environ.get("RANK", "?")
    print(f"{time.strftime('%m-%d %H:%M:%S')} [nccl_hang.py rank={rank}] {msg}", flush=True)


def main() -> None:
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    held = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")  # visible in NVML
    log(f"world_size={world} rank={rank} backend=nccl torch {torch.__version__}")
    dist.init_process_group("nccl")
    log("process group initialized")
    if rank == 1:
        time.sleep(3600)  # never joins the first collective
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    log(f"all_reduce ok: {x[0].item()} ({held.numel()} bytes held)")


if __name__ == "__main__":
    main()
