"""The row-walking kernel of the cuda backend: wait on signals, copy or reduce, signal.

Three layers: `_program_kernel` (private, @triton.jit), `launch_rows` (validates and launches), and
the backend that calls it. Memory ordering follows the AITER fix:
- producer: data stores -> CTA barrier -> release at system scope on every target slot (one lane
  per target, all targets at once);
- consumer: *every* thread reads every slot it waits on at system scope and spins until all are
  satisfied, then acquires at system scope itself (a block barrier after one polling thread is
  not enough); only then does it read peer data.
- signals that order no store of this kernel that a peer reads (the start arrival, and the end
  arrival of a rank that stores only into its own memory: `Row.relaxed`, the lowering decides)
  are relaxed adds: the CTA barrier before them still waits for the row's loads.
- a launch's last row that moves nothing (the end barrier's wait, a copy-engine fence) polls
  without the acquire fence: no thread of the kernel reads after it; the next reader on the
  stream starts behind the kernel boundary.
Slots count up forever (epoch * CTAs), so graph replay needs no reset.

Why it is shaped this way (a row's cost is its chain of dependent memory round trips, and on
NVLink each is a microsecond): a row's waits are loaded together (one round trip, not one per
wait), and its signals go out together as fire-and-forget reductions (`red.release.sys`): the
CTA does not stall for each remote atomic's reply. On CUDA a thread's acquire is relaxed
system-scope loads (independent, so one poll costs one round trip however many slots) and one
`fence.acq_rel.sys` once all are satisfied: an acquire load would order each poll after the
previous one. Elsewhere (HIP, Triton's interpreter) each read is an atomic add of 0 with acquire
semantics (`PTX=False`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from hiercoll.kernels import abi as _t
from hiercoll.kernels.abi import RowSpan
from hiercoll.kernels.rows import (
    CTA_MASK,
    CTA_SHIFT,
    ERR_WORDS,
    F_ACC,
    F_ALSO,
    F_COUNT,
    F_CTAS,
    F_DST,
    F_NALSO,
    F_NSIG,
    F_NSRC,
    F_NWAIT,
    F_REDUCE,
    F_RELAXED,
    F_SCALE,
    F_SIG,
    F_SRC,
    F_WAIT,
    ROW_WORDS,
    TRACE_CALLS,
    TRACE_ROWS,
    TRACE_STRIDE,
    WAIT_WORDS,
    combine,
)

REDUCE_CODES = {"sum": 0, "avg": 0, "max": 1, "min": 2}
NUM_WARPS = _t.sweep_knob("HIERCOLL_NUM_WARPS", 8)
BLOCK = _t.STEP_ELEMENTS     # elements per CTA per step


WAIT_BLOCK = tl.constexpr(8)    # waits a row loads at once (more: WAIT_BLOCK at a time)
WIDE_SHIFT = tl.constexpr(_t.WAIT_WIDE_SHIFT)
PER_EPOCH_MASK = tl.constexpr((1 << _t.WAIT_WIDE_SHIFT) - 1)


@triton.jit
def _poll(ptrs, how, need, PTX: tl.constexpr):
    """Each lane's slot, read at system scope (`how`: 0 dead, reads as `need`; 1 an int32 slot;
    2 the low word of an NVSHMEM 64-bit signal, read as the whole 64-bit word: a 32-bit read of
    half a 64-bit atomic is not morally strong with it in the PTX model). CUDA: a relaxed load
    (strong, so it observes a release), made an acquire by `_acquire_fence` once every slot is
    satisfied; the loads of one poll are independent and overlap. Elsewhere: an atomic add of 0
    with acquire semantics per load (the low word: the count never reaches 2**31).
    `how` must be int32: the asm compares it with 1 and 2, and a boolean lane mask handed in
    its place read as neither on the GPU, so every poll returned `need` and no wait waited
    (the fused kernel, 11e15ad to 2026-11-28: wrong sums from the first call on 4 H100s)."""
    tl.static_assert(how.dtype == tl.int32, "_poll: `how` is int32 (0 dead, 1 int32, 2 64-bit)")
    if PTX:
        return tl.inline_asm_elementwise(
            "{\n\t.reg .pred p, q;\n\t.reg .b64 t;\n\tsetp.eq.b32 p, $2, 1;\n\t"
            "setp.eq.b32 q, $2, 2;\n\tmov.b32 $0, $3;\n\t"
            "@p ld.relaxed.sys.global.b32 $0, [$1];\n\t"
            "@q ld.relaxed.sys.global.b64 t, [$1];\n\t@q cvt.u32.u64 $0, t;\n\t}", "=r,l,r,r",
            [ptrs, how, need], dtype=tl.int32, is_pure=False, pack=1)
    else:
        live = how != 0
        return tl.where(live, tl.atomic_add(ptrs, 0, mask=live, sem="acquire", scope="sys"), need)


@triton.jit
def _acquire_fence(lanes, PTX: tl.constexpr):
    """fence.acq_rel.sys in every thread: with the relaxed reads before it that saw the
    signals, each thread's own acquire (the atomics of the portable path already were)."""
    if PTX:
        tl.inline_asm_elementwise("fence.acq_rel.sys;\n\tmov.b32 $0, 0;", "=r,r", [lanes],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _signal(ptrs, active, relaxed, PTX: tl.constexpr):
    """Add 1 to each active slot at system scope without waiting for the reply (a
    fire-and-forget reduction on CUDA): with release semantics, or relaxed where the row stored
    nothing a peer reads (`relaxed`, the lowering says which: `Row.relaxed`)."""
    if PTX:
        how = active.to(tl.int32) * (1 + (relaxed != 0).to(tl.int32))   # 0 off, 1 release, 2 relaxed
        tl.inline_asm_elementwise(
            "{\n\t.reg .pred p, q;\n\tsetp.eq.b32 p, $2, 1;\n\tsetp.eq.b32 q, $2, 2;\n\t"
            "@p red.release.sys.global.add.s32 [$1], 1;\n\t"
            "@q red.relaxed.sys.global.add.s32 [$1], 1;\n\tmov.b32 $0, 0;\n\t}",
            "=r,l,r", [ptrs, how], dtype=tl.int32, is_pure=False, pack=1)
    elif relaxed != 0:
        tl.atomic_add(ptrs, 1, mask=active, sem="relaxed", scope="sys")
    else:
        tl.atomic_add(ptrs, 1, mask=active, sem="release", scope="sys")


@triton.jit
def _poll_all(ptrs, how2, need2, k, spin_limit, N: tl.constexpr, PTX: tl.constexpr):
    """Every thread polls every live slot of [N, LANES] (`how2`: `_poll`'s) until each reaches
    its need (one round trip per poll however many slots), or until `spin_limit` polls (> 0)
    have passed. Returns, having given up, the first short slot's index and value (N and -1 when
    every slot was satisfied)."""
    seen = _poll(ptrs, how2, need2, PTX)
    pending = tl.sum(tl.sum((seen < need2).to(tl.int32), axis=1), axis=0)
    spins = 0
    first = pending * 0 + N
    low = pending * 0 - 1
    while pending > 0:
        seen = _poll(ptrs, how2, need2, PTX)
        pending = tl.sum(tl.sum((seen < need2).to(tl.int32), axis=1), axis=0)
        spins += 1
        if spin_limit > 0:
            if spins > spin_limit:
                first = tl.min(tl.where(tl.sum(seen < need2, axis=1) > 0, k, N), axis=0)
                low = tl.min(tl.where(k == first, tl.min(seen, axis=1), 2**31 - 1), axis=0)
                pending = 0
    return first, low


@triton.jit
def wait_row(table, sig, wstart, nwait, epoch, spin_limit, err_ptr, row, acquire,
              LANES: tl.constexpr, PTX: tl.constexpr):
    """Every thread spins until each of the row's `nwait` slots reaches per_epoch * epoch, then
    acquires (where `acquire`): reads of peer data after this see what the signalling ranks
    wrote before their release."""
    k = tl.arange(0, WAIT_BLOCK)
    lanes = tl.arange(0, LANES)
    for k0 in range(0, nwait, WAIT_BLOCK):
        live = (k0 + k) < nwait
        entry = table + wstart + WAIT_WORDS * (k0 + k)
        slot = tl.load(entry, mask=live, other=0)
        word = tl.load(entry + 1, mask=live, other=0)      # per_epoch | wide << WIDE_SHIFT
        need = ((word & PER_EPOCH_MASK) * epoch).to(tl.int32)
        how = tl.where(live, 1 + (word >> WIDE_SHIFT).to(tl.int32), 0)
        # [WAIT_BLOCK, LANES]: every thread reads every slot itself
        ptrs = sig + tl.broadcast_to(slot[:, None], (WAIT_BLOCK, LANES))
        how2 = tl.broadcast_to(how[:, None], (WAIT_BLOCK, LANES))
        need2 = tl.broadcast_to(need[:, None], (WAIT_BLOCK, LANES))
        first, low = _poll_all(ptrs, how2, need2, k, spin_limit, WAIT_BLOCK, PTX)
        if first < WAIT_BLOCK:       # the spin limit passed: record the first short slot
            want = tl.max(tl.where(k == first, need, 0), axis=0)
            tl.atomic_xchg(err_ptr + 1, tl.cast(row, tl.int64))
            tl.atomic_xchg(err_ptr + 2, tl.cast(k0 + first, tl.int64))
            tl.atomic_xchg(err_ptr + 3, low.to(tl.int64))
            tl.atomic_xchg(err_ptr + 4, want.to(tl.int64))
            tl.atomic_xchg(err_ptr + 0, 1)
        if acquire != 0:
            _acquire_fence(lanes, PTX)   # in the loop: after it, Triton dropped the unused asm


@triton.jit
def _stamp(ptr, after, TRACE: tl.constexpr):
    """Trace mode: store %globaltimer (ns) at `ptr`, read once `after` (an int32 that the point
    being timed produced) is in a register: the predicate makes the read wait for it."""
    if TRACE:
        v = tl.full([1], 0, tl.int32) + after
        t = tl.inline_asm_elementwise(
            "{\n\t.reg .pred p;\n\tsetp.ne.s32 p, $1, -2147483647;\n\t"
            "@p mov.u64 $0, %globaltimer;\n\t@!p mov.u64 $0, 0;\n\t}", "=l,r", [v],
            dtype=tl.int64, is_pure=False, pack=1)
        tl.store(ptr + tl.arange(0, 1), t)


@triton.jit
def _header(table, r, live, ALSO: tl.constexpr):
    """Row `r`'s header words but count and destination (zeros where not `live`), as
    independent loads: waits, sources, reduce, accumulate, scale, signals, relaxed, CTAs, and
    (the ALSO variant) the more destinations (`Row.also`)."""
    row = table + r * ROW_WORDS
    if ALSO:
        nalso = tl.load(row + F_NALSO, mask=live, other=0)
        astart = tl.load(row + F_ALSO, mask=live, other=0)
    else:
        nalso = 0
        astart = 0
    return (tl.load(row + F_NWAIT, mask=live, other=0), tl.load(row + F_WAIT, mask=live, other=0),
            tl.load(row + F_NSRC, mask=live, other=0), tl.load(row + F_SRC, mask=live, other=0),
            tl.load(row + F_REDUCE, mask=live, other=0), tl.load(row + F_ACC, mask=live, other=0),
            tl.load(row + F_SCALE, mask=live, other=0), tl.load(row + F_NSIG, mask=live, other=0),
            tl.load(row + F_SIG, mask=live, other=0), tl.load(row + F_RELAXED, mask=live, other=0),
            tl.load(row + F_CTAS, mask=live, other=0), nalso, astart)


@triton.jit
def _store_also(table, data, astart, nalso, offs, x, mask, ALIGNED: tl.constexpr,
                VEC: tl.constexpr):
    """The row's more destinations (`Row.also`: merged copies of its result) get the values
    just stored to its destination, from the same thread, as each step is computed."""
    for a in range(0, nalso):
        a_off = tl.load(table + astart + a)
        if ALIGNED:
            a_off = tl.multiple_of(a_off, VEC)
        tl.store(data + a_off + offs, x, mask=mask)


SRC_UNROLL = tl.constexpr(8)   # a reduce's sources loaded together (more: one at a time)


@triton.jit(do_not_specialize=["first_row", "num_rows", "spin_limit"])
def _program_kernel(table, data, sig, epoch_ptr, err_ptr, first_row, num_rows, spin_limit,
                    REDUCE: tl.constexpr, ACC: tl.constexpr, ALIGNED: tl.constexpr, VEC: tl.constexpr,
                    BLOCK: tl.constexpr, LANES: tl.constexpr, BUMP_EPOCH: tl.constexpr = False,
                    FUSED: tl.constexpr = False, PTX: tl.constexpr = False,
                    TRACE: tl.constexpr = False, ALSO: tl.constexpr = False):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tl.load(epoch_ptr)
    if BUMP_EPOCH and num_rows > 0:   # the call's first launch (one CTA) starts the new epoch
        epoch = epoch + 1
        tl.store(epoch_ptr, epoch)
    if FUSED:     # the call's only launch: every CTA works in the next epoch (stored at the end)
        epoch = epoch + 1
    lanes = tl.arange(0, LANES)
    trace = err_ptr + ERR_WORDS + (epoch % TRACE_CALLS) * TRACE_STRIDE
    tracing = (pid == 0) & (num_rows > 0)     # trace mode: CTA 0 of a launch with rows
    if TRACE:
        if tracing:
            _stamp(trace, epoch, TRACE)
    (h_nwait, h_wstart, h_nsrc, h_src, h_red, h_acc, h_scale, h_nsig, h_sig,
     h_rel, h_ctas, h_nalso, h_also) = _header(table, first_row, num_rows > 0, ALSO)
    for r in range(first_row, first_row + num_rows):
        at = trace + 1 + 4 * (r - first_row)
        traced = tracing & ((r - first_row) < TRACE_ROWS)
        # rows of one CTA are in channel order without a signal between them (the lowering
        # drops it for one-CTA launches): this barrier orders every thread's accesses of the
        # previous row before this row's
        tl.debug_barrier()
        # this row's header came with the previous row (a round trip less per row); the next
        # row's header loads now, with everything this header points to (independent loads: one
        # round trip); the table is written before the first launch, so reading it ahead of the
        # row's acquire is safe
        # (count and dst_off load with the words it points to: values carried round the loop lose
        # the divisibility that makes aligned rows 16-byte accesses)
        nwait, wstart, nsrc, sstart = h_nwait, h_wstart, h_nsrc, h_src
        is_reduce, acc_flag, scale_bits, nsig, sstart2, relaxed = h_red, h_acc, h_scale, h_nsig, h_sig, h_rel
        nalso, astart = h_nalso, h_also
        # the CTAs that run this row (abi.F_CTAS): rows of one level split the grid and run side
        # by side; a CTA outside the range skips the row (its waits, data and signals)
        lo = h_ctas & CTA_MASK
        hi = h_ctas >> CTA_SHIFT
        hi = tl.where(hi == 0, nprog, hi)
        mine = (pid >= lo) & (pid < hi)
        scale = scale_bits.to(tl.int32).to(tl.float32, bitcast=True)
        count = tl.load(table + r * ROW_WORDS + F_COUNT)
        dst_off = tl.load(table + r * ROW_WORDS + F_DST)
        (h_nwait, h_wstart, h_nsrc, h_src, h_red, h_acc, h_scale, h_nsig, h_sig,
         h_rel, h_ctas, h_nalso, h_also) = _header(table, r + 1, r + 1 < first_row + num_rows,
                                                   ALSO)
        sig_live = lanes < nsig
        sig_slots = tl.load(table + sstart2 + lanes, mask=sig_live, other=0)
        src0_off = tl.load(table + sstart, mask=nsrc > 0, other=0)
        if TRACE:
            if traced:
                _stamp(at, (nwait + nsig + count + sstart).to(tl.int32), TRACE)
        if (nwait > 0) & mine:
            # the launch's last row, moving nothing (an end barrier, a copy-engine fence): no
            # thread of this kernel reads after it, and what follows on the stream starts behind
            # the kernel boundary; its acquire fence would only wait for this CTA's own
            # outstanding stores and signals to land (about a microsecond on an H200)
            last_empty = (r == first_row + num_rows - 1) & (count == 0)
            wait_row(table, sig, wstart, nwait, epoch, spin_limit, err_ptr, r,
                      tl.where(last_empty, 0, 1), LANES, PTX)
        if TRACE:
            if traced:
                _stamp(at + 1, epoch, TRACE)
        if (count > 0) & mine:
            if ALIGNED:
                dst_off = tl.multiple_of(dst_off, VEC)
                src0_off = tl.multiple_of(src0_off, VEC)
                count = tl.multiple_of(count, VEC)
            dst = data + dst_off
            src0 = data + src0_off
            for start in range((pid - lo) * BLOCK, count, (hi - lo) * BLOCK):
                offs = start + tl.arange(0, BLOCK)
                if ALIGNED:
                    offs = tl.max_contiguous(tl.multiple_of(offs, BLOCK), BLOCK)
                mask = offs < count
                x = tl.load(src0 + offs, mask=mask)
                if is_reduce != 0:
                    acc = x.to(ACC)
                    # the first sources unrolled, loaded before any is added: their loads
                    # (over NVLink for a pull) overlap instead of costing one round trip each;
                    # added in row order all the same (ranks get the same bits)
                    for s in tl.static_range(1, SRC_UNROLL):
                        take = s < nsrc
                        s_off = tl.load(table + sstart + s, mask=take, other=0)
                        if ALIGNED:
                            s_off = tl.multiple_of(s_off, VEC)
                        upto = tl.where(take, count, 0)     # masked off past nsrc
                        y = tl.load(data + s_off + offs, mask=offs < upto, other=0).to(ACC)
                        acc = tl.where(take, combine(acc, y, REDUCE), acc)
                    for s in range(SRC_UNROLL, nsrc):
                        s_off = tl.load(table + sstart + s)
                        if ALIGNED:
                            s_off = tl.multiple_of(s_off, VEC)
                        y = tl.load(data + s_off + offs, mask=mask).to(ACC)
                        acc = combine(acc, y, REDUCE)
                    acc = acc * scale.to(ACC)
                    if acc_flag != 0:
                        acc = acc + tl.load(dst + offs, mask=mask).to(ACC)
                    x = acc.to(dst.dtype.element_ty)
                tl.store(dst + offs, x, mask=mask)
                if ALSO:
                    _store_also(table, data, astart, nalso, offs, x, mask, ALIGNED, VEC)
        if TRACE:
            if traced:
                tl.debug_barrier()   # every thread's loads are in (its stores issued)
                _stamp(at + 2, epoch, TRACE)
        if (nsig > 0) & mine:
            tl.debug_barrier()   # all of this CTA's stores happen before the release below
            _signal(sig + sig_slots, sig_live, relaxed, PTX)    # one lane per target, all at once
            for k0 in range(LANES, nsig, LANES):   # rows with more targets than lanes
                live = (k0 + lanes) < nsig
                slot = tl.load(table + sstart2 + k0 + lanes, mask=live, other=0)
                _signal(sig + slot, live, relaxed, PTX)
        if TRACE:
            if traced:
                _stamp(at + 3, epoch, TRACE)
    if TRACE:
        if tracing:
            _stamp(trace + TRACE_STRIDE - 1, epoch, TRACE)
    if FUSED and num_rows > 0:
        # CTA 0 is past the end barrier, which every CTA of this rank reached after reading the
        # epoch at its start: storing it now cannot change what any CTA of this call uses
        if pid == 0:
            tl.store(epoch_ptr, epoch)


@dataclass(frozen=True)
class KernelState:
    """One rank's device state every launch reads: the encoded table (int64 words), its
    symmetric data allocation (1-D, the spec's dtype), its int32 signal slots, the int32[1] call
    counter (epoch) and the int64[ERR_WORDS] error record of debug timeouts (followed by the
    trace stamps when `trace`)."""

    table: torch.Tensor
    data: torch.Tensor
    sig: torch.Tensor
    epoch: torch.Tensor
    err: torch.Tensor
    trace: bool = False      # err also holds TRACE_WORDS of timer stamps (abi.TRACE_*)
    ll_half: int = 0         # an LL program (kernels/ll.py): int32 slots of one parity of its area
    # LL programs: where this call's input and output start, in elements from `data` (the
    # symmetric buffers' offsets by default; a caller's tensors for a zero-copy call)
    in_delta: int = 0
    out_delta: int = 0


def _kernel_args(state: KernelState, span: RowSpan, reduce_op: str, spin_limit: int,
                 bump_epoch: bool, fused: bool) -> tuple[Any, ...]:
    """`_program_kernel`'s arguments in its signature order, constexprs included (what the JIT
    binds and hands Triton's launcher): the one list both launch paths use."""
    assert not bump_epoch or span.grid == 1, "only a one-CTA launch may start the epoch"
    assert not (bump_epoch and fused)
    data = state.data
    assert state.table.dtype == torch.int64 and state.sig.dtype == torch.int32
    assert state.epoch.dtype == torch.int32
    interpret = os.environ.get("TRITON_INTERPRET") == "1"   # CPU tests run the interpreter
    assert (data.is_cuda or interpret) and data.is_contiguous() and data.dim() == 1
    assert data.data_ptr() % 16 == 0, "the symmetric allocation must be 16-byte aligned"
    vec = max(1, 16 // data.element_size())
    return (state.table, data, state.sig, state.epoch, state.err, span.first_row, span.num_rows,
            spin_limit, REDUCE_CODES[reduce_op],
            tl.float64 if data.dtype == torch.float64 else tl.float32, span.aligned, vec, BLOCK,
            32 * NUM_WARPS, bump_epoch, fused, uses_ptx(interpret),
            state.trace and uses_ptx(interpret), span.also)


def _ll_args(state: KernelState, span: RowSpan, reduce_op: str,
             spin_limit: int) -> tuple[Any, ...]:
    """`ll_kernel`'s arguments in its signature order (kernels/ll.py)."""
    from hiercoll.kernels.ll import BLOCK_WORDS, SOURCES
    data = state.data
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    assert (data.is_cuda or interpret) and data.is_contiguous() and data.dim() == 1
    assert state.epoch.numel() > span.grid, "an LL launch keeps one counter per CTA"
    fmt = {torch.bfloat16: 1, torch.float16: 2}.get(data.dtype, 0)
    assert data.element_size() in (2, 4) and state.sig.data_ptr() % 16 == 0
    return (state.table, data, state.sig, state.epoch, state.err, span.first_row, span.num_rows,
            spin_limit, state.ll_half, state.in_delta, state.out_delta, REDUCE_CODES[reduce_op],
            fmt, 4 // data.element_size(),
            BLOCK_WORDS, SOURCES, uses_ptx(interpret))


def uses_ptx(interpret: bool) -> bool:
    """NVIDIA's PTX for acquire loads and fire-and-forget releases; HIP and Triton's CPU
    interpreter take the portable atomics (same semantics, slower)."""
    return not interpret and torch.version.hip is None


def launch_rows(state: KernelState, span: RowSpan, *, reduce_op: str, spin_limit: int = 0,
                bump_epoch: bool = False, fused: bool = False) -> Any:
    """Run `span`'s rows of the table on its grid (current stream), through Triton's JIT
    dispatch; returns the compiled kernel (None in the interpreter).

    bump_epoch: increment the call counter first (only for a one-CTA launch that every later
    launch of the call is stream-ordered after: the start barrier).
    fused: the call's only launch (its rows start and end with the barriers): every CTA uses the
    counter + 1, CTA 0 stores it at the end.
    """
    if state.ll_half:
        from hiercoll.kernels.ll import ll_kernel
        return ll_kernel[(span.grid,)](*_ll_args(state, span, reduce_op, spin_limit),
                                       num_warps=NUM_WARPS)
    args = _kernel_args(state, span, reduce_op, spin_limit, bump_epoch, fused)
    return _program_kernel[(span.grid,)](*args, num_warps=NUM_WARPS)


Variant = tuple[bool, bool, bool, bool]   # (aligned, bump_epoch, fused, also): a binary each
LL_VARIANT: Variant = (True, True, True, True)   # never a simple variant (bump and fused exclude)


@dataclass(frozen=True)
class CompiledBinary:
    """A binary the JIT compiled, launched without its dispatch: one call of Triton's C
    launcher (triton 3.6's argument order: grid, stream, function, packed metadata, launch
    metadata and hooks, then the kernel's arguments, constexprs included)."""

    launcher: Any          # the compiled kernel's `run` (a CudaLauncher)
    function: Any
    packed_metadata: Any

    @staticmethod
    def of(kernel: Any) -> CompiledBinary | None:
        """The binary of a JIT launch's return value; None in the interpreter (no binary)."""
        if kernel is None or not hasattr(kernel, "packed_metadata"):
            return None
        return CompiledBinary(kernel.run, kernel.function, kernel.packed_metadata)

    def launch(self, grid: int, stream: int, args: tuple[Any, ...]) -> None:
        self.launcher(grid, 1, 1, stream, self.function, self.packed_metadata, None, None, None,
                      *args)


@dataclass(frozen=True)
class BoundLaunch:
    """One launch with everything bound at prepare time: calling it is one call of Triton's C
    launcher on a given stream.

    Why: the JIT's dispatch (bind and specialise 16 arguments, build the cache key, read its
    knobs, look up the current device and stream) runs on every `kernel[grid](...)` call, and
    with every rank's launches issued from one host thread it was most of an eager call's time
    (bench/host_launch.py measures both paths). The arguments are fixed per launch (the table,
    the allocations, the row span), so they are bound once; the binary is the one the JIT
    compiled for the same arguments (`warm_up`)."""

    binary: CompiledBinary
    grid: int
    args: tuple[Any, ...]
    io_at: int = -1        # an LL launch: where its per-call (in_delta, out_delta) sit in `args`

    def __call__(self, stream: int, io: tuple[int, int] | None = None) -> None:
        """io: an LL launch's (in_delta, out_delta) for this call (a caller's own tensors)."""
        assert io is None or self.io_at >= 0, "only an LL launch takes per-call bases"
        args = self.args if io is None else (*self.args[:self.io_at], *io,
                                             *self.args[self.io_at + 2:])
        self.binary.launch(self.grid, stream, args)


JIT_LAUNCH_ENV = "HIERCOLL_JIT_LAUNCH"


def launch_hook_set() -> bool:
    """Launches must go through the JIT: a launch hook is set (a profiler such as proton, which
    the JIT hands its launch metadata; a bound launch would skip it), or HIERCOLL_JIT_LAUNCH=1
    asks for it (to tell a fault of the bound launches from one of the kernels)."""
    if os.environ.get(JIT_LAUNCH_ENV, "") not in ("", "0"):
        return True
    hooks = triton.knobs.runtime.launch_enter_hook   # a HookChain (empty) in triton 3.6
    return hooks is not None and bool(getattr(hooks, "calls", True))


def bind_launch(state: KernelState, span: RowSpan, compiled: dict[Variant, Any], *,
                reduce_op: str, spin_limit: int = 0, bump_epoch: bool = False,
                fused: bool = False) -> BoundLaunch | None:
    """`span` bound for direct launches, or None where the JIT must dispatch: no compiled
    variant (the interpreter), or a launch hook is set (a profiler such as proton needs the
    JIT's launch metadata)."""
    binary = CompiledBinary.of(compiled.get(LL_VARIANT if state.ll_half
                                            else (span.aligned, bump_epoch, fused, span.also)))
    if binary is None or launch_hook_set():
        return None
    args = (_ll_args(state, span, reduce_op, spin_limit) if state.ll_half
            else _kernel_args(state, span, reduce_op, spin_limit, bump_epoch, fused))
    io_at = -1
    if state.ll_half:
        from hiercoll.kernels.ll import ll_kernel
        io_at = ll_kernel.arg_names.index("in_delta")     # out_delta follows it
    return BoundLaunch(binary, span.grid, args, io_at)


def warm_up(state: KernelState, reduce_op: str, spin_limit: int = 0,
            variants: Iterable[Variant] | None = None) -> dict[Variant, Any]:
    """Compile every variant a call can launch, with no rows (no waits, nothing moves), so the
    first real call does not spend seconds in the JIT while its peers spin (and trip debug
    timeouts). Returns the compiled kernel of each variant, for `bind_launch` (empty in the
    interpreter). `spin_limit` as the calls pass it (its integer type is part of the binary);
    `variants`: the ones the program launches (default: every variant without ALSO; each
    compile is about a second on the device's host)."""
    if state.ll_half:      # an LL program launches one binary
        kernel = launch_rows(state, RowSpan(0, 0, 1, True), reduce_op=reduce_op,
                             spin_limit=spin_limit)
        return {LL_VARIANT: kernel} if kernel is not None else {}
    if variants is None:
        variants = [(aligned, bump, fused, False) for aligned in (False, True)
                    for bump, fused in ((False, False), (True, False), (False, True))]
    compiled: dict[Variant, Any] = {}
    for aligned, bump, fused, more in sorted(set(variants)):
        kernel = launch_rows(state, RowSpan(0, 0, 1, aligned, more), reduce_op=reduce_op,
                             spin_limit=spin_limit, bump_epoch=bump, fused=fused)
        if kernel is not None:
            compiled[(aligned, bump, fused, more)] = kernel
    return compiled
