"""Fused all-reduce + residual add + RMSNorm (1-stage and 2-stage) as one Triton kernel per call.

The protocol and the layouts are in `fused_norm_abi` (shared with the host side and the CPU
emulator). Memory ordering follows the AITER fix (ROCm PR 2890):
- producer: stores to the peer-visible buffer -> CTA barrier -> release at system scope of the
  call number into every peer's slot (RELEASE; on CUDA one lane per peer, all at once, as
  fire-and-forget `red.release.sys.max`: a CTA used to stall for each remote atomic's reply);
- consumer: every thread reads every peer's slot (relaxed system-scope loads, independent, so a
  poll is one round trip) until all are satisfied, then does its own `fence.acq_rel.sys`
  (ACQUIRE, ACQUIRE_ALL_THREADS): a block barrier after one polling thread's acquire does not
  extend it to the others. With ACQUIRE_ALL_THREADS off the kernel takes the old form (one
  thread polls with acquire atomics, a CTA barrier, no per-thread acquire), which is exactly
  the variant the negatives need; HIP and Triton's interpreter take portable atomics (PTX off).
The three flags default on; tests turn them off to show the emulator (and the GPU stress) catch
the missing ordering. ACQUIRE=False removes every acquire (the poll and the per-thread ones).

Why a CTA with no rows sits a call out: the grid is fixed (per-CTA call counters) and large, so
that big calls have enough loads in flight; a small call then runs on the few CTAs that have
rows (`fused_norm_abi.cta_active`) instead of making every CTA signal and wait.

Sums run over ranks 0..W-1 in that order in fp32 (rank-identical bits): the all-reduced row is
rounded to the input dtype once, then residual add (rounded: the new residual) and RMSNorm in
fp32, rounded once. FIRST_PART/LAST_PART run only some phases (0: stage + signal, 1: wait +
reduce (+ publish), 2: wait + gather): Triton's CPU interpreter runs every rank's part 0, then
every rank's part 1, ... since it cannot run ranks side by side.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.driver import driver

from hiercoll.kernels.fused_norm_abi import (
    ERR_WORDS,
    LL_STAGE,
    LL_WORDS,
    PHASES,
    REGIONS,
    SAFE,
    Ordering,
    ll_applies,
    ll_area_words,
)
from hiercoll.kernels.ll import _pack, _store_word, _unpack, poll_words
from hiercoll.kernels.program import (
    CompiledBinary,
    _acquire_fence,
    _poll_all,
    launch_hook_set,
    uses_ptx,
)

_PHASES = tl.constexpr(PHASES)
LL_STAGE_ = tl.constexpr(LL_STAGE)
NUM_WARPS = 8


@triton.jit
def _split(lo, n, parts, i):
    return lo + n * i // parts, lo + n * (i + 1) // parts


def _red_asm(sem: str) -> tl.constexpr:
    """A predicated system-scope `red.<sem>.max` of $3 into [$1] where $2 is set."""
    return tl.constexpr("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $2, 0;\n\t"
                        f"@p red.{sem}.sys.global.max.s32 [$1], $3;\n\tmov.b32 $0, 0;\n\t}}")


_RED_RELEASE = _red_asm("release")
_RED_RELAXED = _red_asm("relaxed")


@triton.jit
def _red_max(ptrs, live, values, ASM: tl.constexpr):
    tl.inline_asm_elementwise(ASM, "=r,l,r,r", [ptrs, live.to(tl.int32), values], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _signal(sig_ptr, sig_deltas, slot_base, rank, e, lanes, W: tl.constexpr,
            RELEASE: tl.constexpr, PTX: tl.constexpr):
    """Every thread's stores of this CTA are done (barrier), then e goes to every peer's slot.
    CUDA: one lane per peer, all at once, as fire-and-forget `red.max` (release, or relaxed with
    RELEASE off): the CTA does not stall for each remote atomic's reply. Elsewhere: one atomic
    exchange per peer."""
    tl.debug_barrier()
    if PTX:
        live = (lanes < W) & (lanes != rank)
        peer = sig_ptr + tl.load(sig_deltas + lanes, mask=live, other=0) + slot_base + rank
        _red_max(peer, live, e + lanes * 0, _RED_RELEASE if RELEASE else _RED_RELAXED)
    else:
        for q in tl.static_range(W):
            if q != rank:
                peer = sig_ptr + tl.load(sig_deltas + q) + slot_base + rank
                if RELEASE:
                    tl.atomic_xchg(peer, e, sem="release", scope="sys")
                else:
                    tl.atomic_xchg(peer, e, sem="relaxed", scope="sys")


@triton.jit
def _timed_out(err_ptr, cta, phase, q, seen, e):
    tl.atomic_xchg(err_ptr + 1, tl.cast(cta, tl.int64))
    tl.atomic_xchg(err_ptr + 2, tl.cast(phase, tl.int64))
    tl.atomic_xchg(err_ptr + 3, tl.cast(q, tl.int64))
    tl.atomic_xchg(err_ptr + 4, tl.cast(seen, tl.int64))
    tl.atomic_xchg(err_ptr + 5, tl.cast(e, tl.int64))
    tl.atomic_xchg(err_ptr + 0, 1)


@triton.jit
def _wait(sig_ptr, slot_base, rank, e, spin_limit, err_ptr, cta, phase, lanes,
          W: tl.constexpr, WP: tl.constexpr, LANES: tl.constexpr, ACQUIRE: tl.constexpr,
          ACQUIRE_ALL_THREADS: tl.constexpr, PTX: tl.constexpr):
    """Until every peer's slot holds >= e, then acquire.
    CUDA, every thread acquiring: every thread reads every peer's slot with relaxed
    system-scope loads (independent: one round trip per poll) and, once all are satisfied, does
    its own `fence.acq_rel.sys`. Otherwise (the portable path, and the single-thread-acquire
    variant the tests need): one thread polls peer by peer with acquire atomics, then after a
    CTA barrier every thread acquires every slot itself (ACQUIRE_ALL_THREADS)."""
    if PTX and (ACQUIRE_ALL_THREADS or not ACQUIRE):
        k = tl.arange(0, WP)
        live = (k < W) & (k != rank)
        ptrs = tl.broadcast_to((sig_ptr + slot_base + k)[:, None], (WP, LANES))
        how2 = tl.broadcast_to(tl.where(live, 1, 0)[:, None], (WP, LANES))   # 1: an int32 slot
        need2 = tl.broadcast_to((e + k * 0)[:, None], (WP, LANES))
        first, low = _poll_all(ptrs, how2, need2, k, spin_limit, WP, PTX)
        if first < WP:               # the spin limit passed
            _timed_out(err_ptr, cta, phase, first, low, e)
        if ACQUIRE:
            _acquire_fence(lanes, PTX)
    else:
        for q in tl.static_range(W):
            if q != rank:
                ptr = sig_ptr + slot_base + q
                if ACQUIRE:
                    seen = tl.atomic_add(ptr, 0, sem="acquire", scope="sys")
                else:
                    seen = tl.atomic_add(ptr, 0, sem="relaxed", scope="sys")
                spins = 0
                while seen < e:
                    if ACQUIRE:
                        seen = tl.atomic_add(ptr, 0, sem="acquire", scope="sys")
                    else:
                        seen = tl.atomic_add(ptr, 0, sem="relaxed", scope="sys")
                    spins += 1
                    if spin_limit > 0:
                        if spins > spin_limit:
                            _timed_out(err_ptr, cta, phase, q, seen, e)
                            seen = e
        tl.debug_barrier()
        if ACQUIRE and ACQUIRE_ALL_THREADS:
            for q in tl.static_range(W):
                if q != rank:
                    tl.atomic_add(sig_ptr + slot_base + q + lanes * 0, lanes * 0, sem="acquire",
                                  scope="sys")


@triton.jit
def _tile(row0, r1, H64, cols, cmask, R: tl.constexpr):
    """Offsets and mask of rows [row0, min(row0 + R, r1)) x the row's columns: a CTA moves R rows
    per step, so more loads are in flight per round trip (one row per step left large calls
    latency-bound at a third of NVLink)."""
    rows_ = row0 + tl.arange(0, R)
    offs = rows_.to(tl.int64)[:, None] * H64 + cols[None, :]
    return offs, (rows_ < r1)[:, None] & cmask[None, :]


@triton.jit
def _copy_rows(src, dst, r0, r1, H64, cols, cmask, R: tl.constexpr):
    for row0 in range(r0, r1, R):
        offs, mask = _tile(row0, r1, H64, cols, cmask, R)
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def _finish_rows(s, res_ptr, out_ptr, res_out_ptr, w, offs, mask, H, eps):
    """Rows' residual add (rounded: the new residual) and RMSNorm in fp32 (rounded) from their
    all-reduced sums `s` (already rounded to the input dtype): the owner's rows and the gathered
    ones take this same code on the same tiles (CTA c of every rank starts its rows of an owner
    at the same row), so every rank gets the same bits."""
    r = (s.to(tl.float32) + tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32))
    r = r.to(res_out_ptr.dtype.element_ty)
    rf = r.to(tl.float32)
    var = tl.sum(rf * rf, axis=1) / H
    n = (rf * tl.rsqrt(var + eps)[:, None] * w[None, :]).to(out_ptr.dtype.element_ty)
    tl.store(res_out_ptr + offs, r, mask=mask)
    tl.store(out_ptr + offs, n, mask=mask)


@triton.jit
def _reduce_rows(x_ptr, res_ptr, w, out_ptr, res_out_ptr, buf_ptr, buf_deltas, rank, r0, r1,
                 H, H64, eps, cols, cmask, xoff, soff, PUBLISH: tl.constexpr, W: tl.constexpr,
                 R: tl.constexpr):
    """Rows [r0, r1), R at a time: sum over ranks in order 0..W-1 (mine from x, peers' from their
    staged X), round, then `_finish_rows`; PUBLISH (2-stage) also stores the rounded sums in my
    buffer's S region for the peers to gather."""
    for row0 in range(r0, r1, R):
        offs, mask = _tile(row0, r1, H64, cols, cmask, R)
        acc = tl.zeros(offs.shape, dtype=tl.float32)
        for q in tl.static_range(W):
            if q == rank:
                v = tl.load(x_ptr + offs, mask=mask, other=0.0)
            else:
                d = tl.load(buf_deltas + q)
                v = tl.load(buf_ptr + d + xoff + offs, mask=mask, other=0.0)
            acc += v.to(tl.float32)
        s = acc.to(x_ptr.dtype.element_ty)
        if PUBLISH:
            tl.store(buf_ptr + soff + offs, s, mask=mask)
        _finish_rows(s, res_ptr, out_ptr, res_out_ptr, w, offs, mask, H, eps)


@triton.jit
def _poll_peers(ptrs, live, e, spin_limit, err_ptr, cta, WP: tl.constexpr, PTX: tl.constexpr):
    """LL: every live lane's word once each carries call number `e` (`ll.poll_words`); giving
    up under a spin limit records (cta, phase 0, the first late peer, the epoch it had)."""
    v, short = poll_words(ptrs, live, e, spin_limit, PTX)
    if spin_limit > 0:
        if tl.sum(tl.sum(short.to(tl.int32), axis=1), axis=0) > 0:
            q = tl.min(tl.min(tl.where(short, tl.arange(0, WP)[:, None], 2**30), axis=1), axis=0)
            seen = tl.min(tl.min(tl.where(short, (v >> 32).to(tl.int32), 2**31 - 1), axis=1),
                          axis=0)
            _timed_out(err_ptr, cta, 0, q, seen, e)
    return v


@triton.jit
def _rounded(x, FMT: tl.constexpr):
    """fp32 values rounded to the 16-bit data type (to nearest even), back in fp32."""
    if FMT == 1:
        return x.to(tl.bfloat16).to(tl.float32)
    else:
        return x.to(tl.float16).to(tl.float32)


@triton.jit
def _ll_push(x_ptr, ll_ptr, ll_deltas, rank, e, p, r0, r1, HW, ll_words, wcols, wmask,
             W: tl.constexpr, WP: tl.constexpr, PTX: tl.constexpr):
    """LL: this CTA's rows of x, as 32-bit data words each stored with the call number in its
    high half (one 8-byte relaxed store: data and flag land together), into region
    (parity, me) of every peer's LL area; no release, no signal."""
    xw = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    k = tl.arange(0, WP)
    peer = (k < W) & (k != rank)
    d = tl.load(ll_deltas + k, mask=peer, other=0)
    base = d + (p * W + rank) * ll_words
    for r in range(r0, r1):
        offs = r * HW + wcols
        v = tl.load(xw + offs, mask=wmask, other=0)
        word = (e.to(tl.int64) << 32) | (v.to(tl.int64) & 4294967295)
        live = peer[:, None] & wmask[None, :]
        _store_word(ll_ptr + base[:, None] + offs[None, :], tl.broadcast_to(word[None, :], live.shape),
                    live, PTX)


@triton.jit
def _ll_reduce(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, ll_ptr, rank, e, p, r0, r1, H, HW,
               eps, ll_words, wcols, wmask, spin_limit, err_ptr, cta, W: tl.constexpr,
               WP: tl.constexpr, FMT: tl.constexpr, PTX: tl.constexpr):
    """LL: this CTA's rows: every peer's words polled from my own LL area at once (the poll is
    the wait: the word checked is the data used, so no acquire), summed with my own x over
    ranks in one fixed order (every rank the same bits), rounded, + residual (rounded), RMSNorm
    (rounded), as `_finish_rows` does on elements (here on the even / odd elements of words)."""
    i32 = tl.pointer_type(tl.int32)
    xw = x_ptr.to(i32, bitcast=True)
    rw = res_ptr.to(i32, bitcast=True)
    ow = out_ptr.to(i32, bitcast=True)
    qw = res_out_ptr.to(i32, bitcast=True)
    k = tl.arange(0, WP)
    peer = (k < W) & (k != rank)
    src = ((p * W + k) * ll_words).to(tl.int64)
    w_lo, w_hi = _unpack(tl.load(w_ptr.to(i32, bitcast=True) + wcols, mask=wmask, other=0), FMT)
    for r in range(r0, r1):
        offs = r * HW + wcols
        live = peer[:, None] & wmask[None, :]
        v = _poll_peers(ll_ptr + src[:, None] + offs[None, :], live, e, spin_limit, err_ptr, cta,
                        WP, PTX)
        mine = tl.load(xw + offs, mask=wmask, other=0)
        words = tl.where((k == rank)[:, None], mine[None, :], v.to(tl.int32))
        lo2, hi2 = _unpack(words, FMT)
        used = ((k < W)[:, None] & wmask[None, :])
        s_lo = _rounded(tl.sum(tl.where(used, lo2, 0.0), axis=0), FMT)
        s_hi = _rounded(tl.sum(tl.where(used, hi2, 0.0), axis=0), FMT)
        res_lo, res_hi = _unpack(tl.load(rw + offs, mask=wmask, other=0), FMT)
        r_lo = _rounded(s_lo + res_lo, FMT)
        r_hi = _rounded(s_hi + res_hi, FMT)
        r_lo = tl.where(wmask, r_lo, 0.0)
        r_hi = tl.where(wmask, r_hi, 0.0)
        var = (tl.sum(r_lo * r_lo, axis=0) + tl.sum(r_hi * r_hi, axis=0)) / H
        inv = tl.rsqrt(var + eps)
        tl.store(qw + offs, _pack(r_lo, r_hi, FMT), mask=wmask)
        tl.store(ow + offs, _pack(r_lo * inv * w_lo, r_hi * inv * w_hi, FMT), mask=wmask)


@triton.jit(do_not_specialize=["rank", "rows", "stride", "spin_limit", "ll_words"])
def _fused_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, buf_ptr, buf_deltas, sig_ptr,
                       sig_deltas, epoch_ptr, err_ptr, ll_ptr, ll_deltas, rank, rows, H, stride,
                       eps, spin_limit, ll_words,
                       W: tl.constexpr, G: tl.constexpr, STAGES: tl.constexpr,
                       BLOCK_H: tl.constexpr, LANES: tl.constexpr, WP: tl.constexpr,
                       RB: tl.constexpr, RBG: tl.constexpr, RELEASE: tl.constexpr = True, ACQUIRE: tl.constexpr = True,
                       ACQUIRE_ALL_THREADS: tl.constexpr = True,
                       FIRST_PART: tl.constexpr = 0, LAST_PART: tl.constexpr = 2,
                       PTX: tl.constexpr = False, FMT: tl.constexpr = 0):
    c = tl.program_id(0)
    e = tl.load(epoch_ptr + c) + 1          # this CTA's call number (every rank's CTA c agrees)
    p = e % 2
    if STAGES == LL_STAGE_:
        # LL (fused_norm_abi): 1-stage's rows, moved as flagged words; no signal, no barrier
        HW = stride.to(tl.int64) * 0 + H // 2     # words per row, int64 (offsets may pass 2**31)
        wcols = tl.arange(0, BLOCK_H // 2)
        wmask = wcols < HW
        r0, r1 = _split(0, rows, G, c)
        if FIRST_PART <= 0:
            _ll_push(x_ptr, ll_ptr, ll_deltas, rank, e, p, r0, r1, HW, ll_words, wcols, wmask,
                     W, WP, PTX)
        if LAST_PART >= 1:
            if FIRST_PART <= 1:
                _ll_reduce(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, ll_ptr, rank, e, p, r0,
                           r1, H, HW, eps, ll_words, wcols, wmask, spin_limit, err_ptr, c, W,
                           WP, FMT, PTX)
            tl.store(epoch_ptr + c, e)
        return
    lanes = tl.arange(0, LANES)
    cols = tl.arange(0, BLOCK_H)
    cmask = cols < H
    stride = stride.to(tl.int64)     # elements per staged region (fixed per buffer)
    H64 = stride * 0 + H             # row offsets in int64 (rows x hidden may pass 2**31)
    xoff = p * stride                # X[p]: staged inputs
    soff = (2 + p) * stride          # S[p]: 2-stage, the rounded sums of my rows
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    slot0 = ((p * _PHASES + 0) * G + c) * W
    slot1 = ((p * _PHASES + 1) * G + c) * W
    # a CTA with no rows on any rank sits the call out (fused_norm_abi.cta_active: every rank
    # computes the same answer; CTA 0 always takes part, so every call still waits on every peer)
    if STAGES == 1:
        r0, r1 = _split(0, rows, G, c)
        active = (r1 > r0) | (c == 0)
    else:
        o0, o1 = _split(0, rows, W, rank)
        r0, r1 = _split(o0, o1 - o0, G, c)
        active = c == 0
        for q in tl.static_range(W):
            q0, q1 = _split(0, rows, W, q)
            a0, a1 = _split(q0, q1 - q0, G, c)
            active = active | (a1 > a0)
    if active:
        if FIRST_PART <= 0:
            # part 0: stage the rows peers will read, then publish them
            if STAGES == 1:
                _copy_rows(x_ptr, buf_ptr + xoff, r0, r1, H64, cols, cmask, RBG)
            else:
                for q in tl.static_range(W):
                    if q != rank:
                        q0, q1 = _split(0, rows, W, q)
                        a0, a1 = _split(q0, q1 - q0, G, c)
                        _copy_rows(x_ptr, buf_ptr + xoff, a0, a1, H64, cols, cmask, RBG)
            _signal(sig_ptr, sig_deltas, slot0, rank, e, lanes, W, RELEASE, PTX)
        if FIRST_PART <= 1 and LAST_PART >= 1:
            _wait(sig_ptr, slot0, rank, e, spin_limit, err_ptr, c, 0, lanes, W, WP, LANES,
                  ACQUIRE, ACQUIRE_ALL_THREADS, PTX)
            _reduce_rows(x_ptr, res_ptr, w, out_ptr, res_out_ptr, buf_ptr, buf_deltas, rank,
                         r0, r1, H, H64, eps, cols, cmask, xoff, soff, STAGES == 2, W, RB)
            if STAGES == 2:
                _signal(sig_ptr, sig_deltas, slot1, rank, e, lanes, W, RELEASE, PTX)
        if STAGES == 2 and LAST_PART >= 2:
            _wait(sig_ptr, slot1, rank, e, spin_limit, err_ptr, c, 1, lanes, W, WP, LANES,
                  ACQUIRE, ACQUIRE_ALL_THREADS, PTX)
            for q in tl.static_range(W):
                if q != rank:
                    d = tl.load(buf_deltas + q)
                    q0, q1 = _split(0, rows, W, q)
                    a0, a1 = _split(q0, q1 - q0, G, c)
                    for row0 in range(a0, a1, RB):
                        offs, mask = _tile(row0, a1, H64, cols, cmask, RB)
                        sq = tl.load(buf_ptr + d + soff + offs, mask=mask, other=0.0)
                        _finish_rows(sq, res_ptr, out_ptr, res_out_ptr, w, offs, mask, H, eps)
    if LAST_PART >= STAGES:
        tl.store(epoch_ptr + c, e)     # only this CTA reads its counter


REDUCE_TILE = 8192    # elements a CTA reduces per step (W sources in registers)
COPY_TILE = 16384     # elements a CTA stages per step


def rows_per_step(hidden: int, tile: int) -> int:
    """Rows per tile step: as many whole padded rows as fit `tile` elements (at least one)."""
    return max(1, tile // triton.next_power_of_2(hidden))


@dataclass(frozen=True)
class FusedNormState:
    """One rank's device state: its symmetric data buffer (1-D, the tensors' dtype, regions per
    `BufferLayout`), element deltas to every rank's buffer, its int32 signal slots and deltas, the
    per-CTA int32[G] call counters, the int64 error record of debug timeouts; `stride`: elements
    per staged region (fixed for the buffer's life, whatever the call's shape)."""

    buf: torch.Tensor
    buf_deltas: torch.Tensor
    sig: torch.Tensor
    sig_deltas: torch.Tensor
    epoch: torch.Tensor
    err: torch.Tensor
    rank: int
    world: int
    grid: int
    stride: int
    ll: torch.Tensor            # int64: this rank's LL area (`fused_norm_abi.ll_area_words`)
    ll_deltas: torch.Tensor     # int64: every rank's LL area, in 8-byte words from mine



def launch(state: FusedNormState, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
           out: torch.Tensor, res_out: torch.Tensor, eps: float, stages: int,
           spin_limit: int = 0, ordering: Ordering = SAFE,
           parts: tuple[int, int] = (0, 2)) -> None:
    """Enqueue one call of this rank on the current stream (x, residual, out, res_out: [rows,
    hidden] contiguous; weight: [hidden])."""
    assert stages in (1, 2, LL_STAGE)
    rows, hidden = x.shape
    ll = stages == LL_STAGE
    assert not ll or (ll_applies(rows, hidden, x.element_size())
                      and state.ll.numel() >= ll_area_words(state.world))
    assert rows * hidden <= state.stride and x.is_contiguous() and residual.is_contiguous()
    assert out.is_contiguous() and res_out.is_contiguous() and weight.numel() == hidden
    assert state.buf.numel() >= REGIONS * state.stride and state.buf.dtype == x.dtype
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    assert x.is_cuda or interpret
    assert state.err.numel() >= ERR_WORDS
    block_h, wp, rb, rbg = _shape_constants(hidden, state.world)
    ptx = uses_ptx(interpret)
    args = (x, residual, weight, out, res_out, state.buf, state.buf_deltas, state.sig,
            state.sig_deltas, state.epoch, state.err, state.ll, state.ll_deltas, state.rank, rows,
            hidden, state.stride, float(eps), spin_limit, LL_WORDS, state.world, state.grid,
            stages, block_h, 32 * NUM_WARPS, wp, rb, rbg, ordering.release, ordering.acquire,
            ordering.acquire_all_threads, parts[0], parts[1], ptx,
            _FMT.get(x.dtype, 0) if ll else 0)
    key = _binary_key(args)
    binary = _BOUND.get(key)
    if binary is not None and not launch_hook_set():
        active = driver.active      # the stream the JIT would launch on: the current device's
        binary.launch(state.grid, active.get_current_stream(active.get_current_device()), args)
        return
    binary = CompiledBinary.of(_fused_norm_kernel[(state.grid,)](*args, num_warps=NUM_WARPS))
    if binary is not None:          # not in the interpreter
        _BOUND[key] = binary


# The compiled binary of each specialisation the JIT chose, bound for direct launches: every
# eager fused call paid Triton's dispatch (bind and specialise 31 arguments, build its cache key,
# look up the device and stream), as the row kernel's did before its BoundLaunch. Host Python per
# call, fake launcher, 2-core CPU (bench/results/host_launch.md): 17.7 us through the JIT, 7.2
# bound. The key holds what the JIT specialises on (`_binary_key`).
_BOUND: dict[tuple[object, ...], CompiledBinary] = {}
_TENSORS = 13                # the kernel's first thirteen arguments are tensors
_FMT = {torch.bfloat16: 1, torch.float16: 2}     # LL: how a word holds elements (kernels/ll.py)
_INT32 = range(-2**31, 2**31)


@functools.cache
def _shape_constants(hidden: int, world: int) -> tuple[int, int, int, int]:
    """BLOCK_H, WP, RB, RBG of a call: computed once per shape (each is a Python call through
    Triton's constexpr wrapper, a few microseconds together per call)."""
    return (triton.next_power_of_2(hidden), triton.next_power_of_2(world),
            rows_per_step(hidden, REDUCE_TILE), rows_per_step(hidden, COPY_TILE))


def _binary_key(args: tuple[Any, ...]) -> tuple[object, ...]:
    """What the JIT specialises `args` on (`launch`'s argument order): every tensor's device,
    dtype and 16-byte alignment, the do-not-specialise integers' width (int32 or int64), and by
    value `hidden` and everything after `ll_words` (world, grid and the constexprs); `eps` is
    a float the JIT does not specialise."""
    tensors = args[:_TENSORS]
    rank, rows, hidden, stride, _eps, spin, ll_words = args[_TENSORS:_TENSORS + 7]
    x = tensors[0]      # the binary's device (the JIT compiles for the current one)
    return (torch.cuda.current_device() if x.is_cuda else -1,
            tuple((t.device, t.dtype, t.data_ptr() % 16 == 0) for t in tensors),
            rank in _INT32, rows in _INT32, stride in _INT32, spin in _INT32,
            ll_words in _INT32, hidden, *args[_TENSORS + 7:])
