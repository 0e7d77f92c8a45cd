# Shared by run_all.sh and run_more.sh (sourced, not run): set BATCH (the log folder's name)
# first. Gives HERE, OUT, LOGDIR, PY, TR, pack and run; each scenario's combined stdout+stderr
# goes to $LOGDIR/<name>.log (never rewritten), its exit status to <name>.rc, its command to
# <name>.cmd, and the folder is packed into $OUT/$BATCH.tar after every scenario.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-/tmp/gpu-out}
LOGDIR=$OUT/$BATCH
mkdir -p "$LOGDIR"
# Required on this workplace's machines: NVLink multicast stays off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
TR="$PY -m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1"
pack() { tar -C "$OUT" -cf "$OUT/$BATCH.tar.tmp" "$BATCH" && mv "$OUT/$BATCH.tar.tmp" "$OUT/$BATCH.tar"; }

# run NAME TIMEOUT_S COMMAND (a shell string, run by bash -c)
run() {
  local name=$1 t=$2 cmd=$3
  echo "$cmd" > "$LOGDIR/$name.cmd"
  local t0=$SECONDS
  timeout -k 5 "$t" bash -c "$cmd" > "$LOGDIR/$name.log" 2>&1
  echo $? > "$LOGDIR/$name.rc"
  echo "== $name rc=$(cat "$LOGDIR/$name.rc") $((SECONDS - t0))s lines=$(wc -l < "$LOGDIR/$name.log")"
  pack
}
