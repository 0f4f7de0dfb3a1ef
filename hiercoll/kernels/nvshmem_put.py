"""The put of `--inter-transport nvshmem` (lowering.PutLaunch): NVSHMEM put-with-signal by the
sender (on its net stream, or inline on its one stream in graph mode), the inter-node step of a
plan with no work on the receiving rank.

Why a kernel of its own: NVSHMEM device calls need the binary linked with NVSHMEM's device library
and its module registered with NVSHMEM after the JIT built it (torch's `requires_nvshmem` does
both); the row kernels stay free of that, so every other transport runs without NVSHMEM.

Memory ordering. Each CTA first waits for the put's dependencies the way a row does
(`program.wait_row`: every thread polls the slots, then takes its own system-scope acquire), so
the threads that read the source are the ones that acquired it, in the same kernel (no wait
kernel before it: one launch fewer). Each CTA then puts one contiguous chunk with
`nvshmemx_putmem_signal_block`: NVSHMEM delivers the chunk before it adds 1 to the receiver's
64-bit signal (on NVLink a store loop, a system-scope fence, then the atomic; over RDMA the NIC
orders them). Consumers poll the whole 64-bit signal word with relaxed system-scope loads (a
wide wait: a 32-bit read of half a 64-bit atomic is not morally strong with it) and then take
an acquire fence in every consuming thread, the same rule as every other signal of the plan.
Third parties (a consumer that reads the data through the receiver's mapping, or this rank's
channel successor) hear of the put only after `nvshmem_quiet`, which completes every chunk the
CTA put at its target: a zero-byte put-with-signal then carries their signal.

`SIGNAL_ADD` is NVSHMEM's `nvshmemx_signal_op_t` value. torch 2.11's binding docstrings give 5
(SET 0, CMP_GE 3); those are other operations (CMP 3 is LE): on the device, with them a wait for
a slot at 0 returned at once and a wait on a signalled slot never returned
(results/gpu/nvshmem-probe/README.md).
"""

from __future__ import annotations

import functools
from typing import Any

import triton
import triton.language as tl

from hiercoll.kernels.program import wait_row

SIGNAL_ADD = tl.constexpr(10)
NUM_WARPS = 4
LANES = tl.constexpr(32 * NUM_WARPS)
_nvs: Any = None      # torch's NVSHMEM Triton bindings, bound by `put_kernel` (a Triton global)


# one binary for every put: Triton would otherwise build a variant per argument value class (a
# count of 1, a multiple of 16), and a variant first met by a call is built while its consumers
# wait (a 2-GPU run's debug timeouts: the warm-up had built the one-signal variant only)
@triton.jit(do_not_specialize=["dst", "src", "nbytes", "chunk", "n_sig", "n_wait", "spin_limit",
                                "put_row"])
def hiercoll_nvshmem_put(dst, src, nbytes, chunk, sigs, pes, n_sig, sig, waits, n_wait, epoch_ptr,
                         spin_limit, err_ptr, put_row, LANES: tl.constexpr):
    # waits: int64 (slot, per_epoch | wide << 32) pairs, the row table's wait format; a debug
    # timeout records `put_row` (negative: the backend names the put) in the error record
    if n_wait > 0:
        wait_row(waits, sig, 0, n_wait, tl.load(epoch_ptr), spin_limit, err_ptr, put_row, 1,
                 LANES, True)
    lo = tl.program_id(0).to(tl.int64) * chunk
    size = tl.maximum(tl.minimum(chunk, nbytes - lo), 0)
    _nvs.putmem_signal_block(dst + lo, src + lo, size, tl.load(sigs), 1, SIGNAL_ADD,
                             tl.load(pes))
    if n_sig > 1:
        _nvs.quiet()
        for i in range(1, n_sig):
            _nvs.putmem_signal_block(dst, src, lo * 0, tl.load(sigs + i), 1, SIGNAL_ADD,
                                     tl.load(pes + i))


@functools.cache
def put_kernel() -> Any:
    """The put kernel, registered with NVSHMEM (raises where torch has no NVSHMEM device
    library: callers check `symm.use_nvshmem` first)."""
    global _nvs
    from torch.distributed._symmetric_memory import _nvshmem_triton
    _nvs = _nvshmem_triton
    return _nvshmem_triton.requires_nvshmem(hiercoll_nvshmem_put)
