"""One rank of a torch.distributed Gloo job whose other rank never starts.

usage: gloo_rank.py PORT [WORLD_SIZE] — rank 0 of WORLD_SIZE (default 2) at 127.0.0.1:PORT;
it blocks in init_process_group waiting for the missing rank(s) (timeout one hour).
"""

from __future__ import annotations

import datetime
import sys

import torch.distributed as dist


def main() -> int:
    port = int(sys.argv[1])
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    print(
        f"INFO gloo_rank.py world_size={world} rank=0 "
        f"distributed_init_method=tcp://127.0.0.1:{port} backend=gloo",
        flush=True,
    )
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=world,
        timeout=datetime.timedelta(hours=1),
    )
    print("group ready", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
