# Sourced by every bench/gpu script: NVLS off (shared hosts), unbuffered output, wheels for the
# packages the device image lacks (pydantic, simpy), the repo on PYTHONPATH.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed"
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
# the device copy's .git is the session's first commit: results name the commit written here
# before the call (git rev-parse --short HEAD > .device_commit; untracked, so it travels)
if [ -f .device_commit ]; then export HIERCOLL_GIT_SHA=$(cat .device_commit); fi
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
hc() {  # hc NPROC ARGS...: torchrun the CLI with a hard time limit
  local n=$1; shift
  timeout -k 5 "${HC_TIMEOUT:-240}" torchrun --nproc-per-node "$n" --master-port $((29500 + RANDOM % 1000)) -m hiercoll "$@"
}
one_gpu() {  # one_gpu DIR TAG SECONDS ARGS...: one `stress --one-gpu` under a time limit, its JSON
             # and log in DIR, and a one-line summary (every rank in one process on one GPU)
  local dir=$1 tag=$2 limit=$3; shift 3
  CUDA_DEVICE_MAX_CONNECTIONS=32 timeout -k 5 "$limit" python3 -m hiercoll stress --one-gpu \
    --backend cuda --debug-timeout-ms 5000 --out "$dir/$tag.json" "$@" > "$dir/$tag.log" 2>&1
  echo "== $tag rc=$? $(grep -c '^ok' "$dir/$tag.log") ok $(grep -c '^FAIL' "$dir/$tag.log") FAIL"
}
