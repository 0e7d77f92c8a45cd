#!/usr/bin/env bash
# Second batch of GPU scenarios (compile / CUDA graph / NCCL timeout under torchrun).
# Same conventions as run_all.sh: $OUT/gpu_logs2/<name>.log|.rc|.cmd, packed into $OUT/gpu_logs2.tar.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-out}
LOGDIR=$OUT/gpu_logs2
mkdir -p "$LOGDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
TR="$PY -m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1"
pack() { tar -C "$OUT" -cf "$OUT/gpu_logs2.tar.tmp" gpu_logs2 && mv "$OUT/gpu_logs2.tar.tmp" "$OUT/gpu_logs2.tar"; }
run() {
  local name=$1 t=$2 cmd=$3
  echo "$cmd" > "$LOGDIR/$name.cmd"
  local t0=$SECONDS
  timeout -k 5 "$t" bash -c "$cmd" > "$LOGDIR/$name.log" 2>&1
  echo $? > "$LOGDIR/$name.rc"
  echo "== $name rc=$(cat "$LOGDIR/$name.rc") $((SECONDS - t0))s lines=$(wc -l < "$LOGDIR/$name.log")"
  pack
}
cd "$HERE"
run cuda_graph_capture_sync 60 "$PY compile_errors.py graph-sync"
run cuda_graph_capture_oom 60 "$PY compile_errors.py graph-oom"
run dynamo_fullgraph_break 90 "$PY compile_errors.py dynamo-break"
run triton_compile_error 90 "$PY compile_errors.py triton-error"
run torchrun_rank1_raise 60 "NCCL_DEBUG=WARN TIMEOUT_S=15 $TR --master_port 29521 nccl_job.py rank1-raise"
echo "all done"
