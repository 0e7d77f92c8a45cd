"""A tiny torch.distributed NCCL job used to provoke real communication failures.

Run under torchrun (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* from the environment) or launched by
hand with those variables set. Usage: python3 nccl_job.py MODE
Modes:
  clean        init, all_reduce, barrier, destroy: a healthy job
  rank1-oom    rank 1 tries to allocate 400 GiB after the first all_reduce
  rank1-raise  rank 1 raises after the first all_reduce; rank 0 blocks in the next one
               until the process-group watchdog times out (TIMEOUT_S, default 20)
  plain        init + all_reduce only (for env/port/world-size misconfiguration runs)
"""

from __future__ import annotations

import datetime
import os
import sys
import time


def log(msg: str) -> None:
    rank = os.environ.get("RANK", "?")
    print(f"{time.strftime('%m-%d %H:%M:%S')} [nccl_job.py rank={rank}] {msg}", flush=True)


def main() -> None:
    mode = sys.argv[1]
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    timeout = datetime.timedelta(seconds=float(os.environ.get("TIMEOUT_S", "20")))
    torch.cuda.set_device(local)
    log(f"torch {torch.__version__} nccl {torch.cuda.nccl.version()} world={world} mode={mode}")
    dist.init_process_group(
        "nccl", timeout=timeout, device_id=torch.device("cuda", local)
    )  # fmt: skip  (kept as run: the logs in corpus/ quote this file's line numbers)
    log("process group initialized")
    x = torch.full((1 << 20,), float(rank + 1), device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    log(f"all_reduce #1 ok: {x[0].item()}")
    if mode == "rank1-oom" and rank == 1:
        log("allocating KV cache blocks")
        y = torch.empty(400 * 1024**3, dtype=torch.uint8, device="cuda")
        log(f"unexpected success {y.shape}")
    if mode == "rank1-raise" and rank == 1:
        raise RuntimeError("simulated worker crash on rank 1 before all_reduce #2")
    if mode in ("rank1-oom", "rank1-raise", "clean"):
        dist.all_reduce(x)
        torch.cuda.synchronize()
        log(f"all_reduce #2 ok: {x[0].item()}")
        dist.barrier()
    dist.destroy_process_group()
    log("done")


if __name__ == "__main__":
    main()
