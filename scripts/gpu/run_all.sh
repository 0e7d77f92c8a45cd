#!/usr/bin/env bash
# Run every GPU failure scenario once; each scenario's combined stdout+stderr goes to
# $LOGDIR/<name>.log (never rewritten), its exit status to <name>.rc, its command to <name>.cmd.
# Usage (on a machine with 2 NVIDIA GPUs, PyTorch, NCCL, CuPy):
#   OUT=/some/dir bash scripts/gpu/run_all.sh        -> $OUT/gpu_logs.tar
set -u
BATCH=gpu_logs
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"

{
  date -u; hostname; uname -a; nvidia-smi; nvidia-smi topo -m
  $PY -c 'import torch,cupy;print("torch",torch.__version__,"cuda",torch.version.cuda,"nccl",torch.cuda.nccl.version(),"gpus",torch.cuda.device_count(),"cupy",cupy.__version__)'
} > "$LOGDIR/environment.txt" 2>&1
pack

cd "$HERE"
run clean_nccl_allreduce 60 "NCCL_DEBUG=INFO $TR --master_port 29511 nccl_job.py clean"
run torch_oom_single 45 "$PY cuda_errors.py oom"
run torch_oom_other_process 60 "export HOLD_READY_FILE=\$(mktemp -u); $PY cuda_errors.py oom-hold 25 & for i in \$(seq 200); do [ -e \$HOLD_READY_FILE ] && break; sleep 0.2; done; $PY cuda_errors.py oom-victim; rc=\$?; kill %1; wait; exit \$rc"
run no_cuda_gpus 45 "CUDA_VISIBLE_DEVICES= $PY cuda_errors.py touch"
run invalid_device_ordinal 45 "$PY cuda_errors.py ordinal"
run device_side_assert 45 "$PY cuda_errors.py assert"
run illegal_memory_cupy 45 "$PY cuda_errors.py illegal"
run illegal_memory_torch 45 "$PY cuda_errors.py illegal torch"
run torchrun_rank1_oom 60 "NCCL_DEBUG=INFO $TR --master_port 29512 nccl_job.py rank1-oom"
run nccl_peer_crash_watchdog 75 "export MASTER_ADDR=127.0.0.1 MASTER_PORT=29513 WORLD_SIZE=2 TIMEOUT_S=15 NCCL_DEBUG=INFO; RANK=0 LOCAL_RANK=0 $PY nccl_job.py rank1-raise & RANK=1 LOCAL_RANK=1 $PY nccl_job.py rank1-raise & wait -n; wait"
run nccl_world_size_mismatch 50 "export MASTER_ADDR=127.0.0.1 MASTER_PORT=29514 TIMEOUT_S=15 NCCL_DEBUG=WARN; RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 $PY nccl_job.py plain & RANK=1 LOCAL_RANK=1 WORLD_SIZE=3 $PY nccl_job.py plain & wait"
run tcpstore_port_in_use 50 "$PY hold_port.py 29515 40 & sleep 1; export MASTER_ADDR=127.0.0.1 MASTER_PORT=29515 WORLD_SIZE=2 TIMEOUT_S=15; RANK=0 LOCAL_RANK=0 $PY nccl_job.py plain & RANK=1 LOCAL_RANK=1 $PY nccl_job.py plain & wait %2 %3; kill %1"
run torchrun_master_port_in_use 45 "$PY hold_port.py 29516 30 & sleep 1; $TR --master_port 29516 nccl_job.py plain; rc=\$?; kill %1; exit \$rc"
run nccl_bad_socket_ifname 60 "NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=doesnotexist0 $TR --master_port 29517 nccl_job.py plain"
run nccl_algo_invalid 60 "NCCL_DEBUG=INFO NCCL_ALGO=Bogus $TR --master_port 29518 nccl_job.py plain"
run nccl_p2p_level_junk 60 "NCCL_DEBUG=INFO NCCL_P2P_LEVEL=junk $TR --master_port 29519 nccl_job.py plain"
echo "all done"
