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
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
hc() {  # hc NPROC ARGS...: torchrun the CLI with a hard time limit
  local n=$1; shift
  timeout -k 5 "${HC_TIMEOUT:-240}" torchrun --nproc-per-node "$n" --master-port $((29500 + RANDOM % 1000)) -m hiercoll "$@"
}
