#!/usr/bin/env bash
# Second batch of GPU scenarios (compile / CUDA graph / NCCL timeout under torchrun).
# Same conventions as run_all.sh: $OUT/gpu_logs2/<name>.log|.rc|.cmd, packed into $OUT/gpu_logs2.tar.
set -u
BATCH=gpu_logs2
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"
cd "$HERE"
run cuda_graph_capture_sync 60 "$PY compile_errors.py graph-sync"
run cuda_graph_capture_oom 60 "$PY compile_errors.py graph-oom"
run dynamo_fullgraph_break 90 "$PY compile_errors.py dynamo-break"
run triton_compile_error 90 "$PY compile_errors.py triton-error"
run torchrun_rank1_raise 60 "NCCL_DEBUG=WARN TIMEOUT_S=15 $TR --master_port 29521 nccl_job.py rank1-raise"
echo "all done"
