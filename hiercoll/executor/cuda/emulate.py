"""Run every rank's lowered cuda program in one process, with numpy, at CTA granularity.

This checks the lowering itself on CPU (CI): signals, epochs, barriers, stream forks/joins and
channel order. Each step of the emulation is one CTA doing one row (wait, its share of the data,
signal), one copy-engine copy, or one host-ordered action of a rank's main stream; a seeded random
scheduler picks among the steps that can run, so a missing signal or barrier shows up as a wrong
output, stale data from the previous call, or a reported deadlock. Several calls run back to back
with fresh inputs, so slot reuse across calls (epochs) is exercised as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hiercoll.collectives import reduce_values
from hiercoll.errors import VerificationError
from hiercoll.executor.cuda.lowering import (
    CallStep,
    CopyLaunch,
    CudaOptions,
    KernelLaunch,
    Launch,
    PutLaunch,
    RankProgram,
    RecvLaunch,
    Row,
    SendLaunch,
    SymmetricLayout,
    Wait,
    call_steps,
    fused_launch,
    lower,
)
from hiercoll.schedule import INPUT, OUTPUT, Schedule

LL_PARITIES = 2  # the LL area's copies (the kernel's; a test sets 1 to see the hazard it removes)
EMU_BLOCK = 3   # elements per CTA step: small and odd, so CTAs interleave inside every region
NET = -1        # stream key of the net stream (channels are >= 0)


class _Memory:
    """A rank's data allocation. In place, the output region's cells are the input's (the
    caller's one tensor, as `Communicator` runs a `comm.empty` tensor without copies): every
    access goes through the layout-offset -> cell map."""

    def __init__(self, layout: SymmetricLayout, in_place: bool) -> None:
        self.cells = np.full(layout.total, np.nan)
        self.index: np.ndarray | None = None
        if in_place:
            self.index = np.arange(layout.total)
            n, o = layout.sizes.get(OUTPUT, 0), layout.offsets[OUTPUT]
            self.index[o:o + n] = np.arange(layout.offsets[INPUT], layout.offsets[INPUT] + n)

    def __getitem__(self, key: Any) -> np.ndarray:
        return self.cells[key] if self.index is None else self.cells[self.index[key]]

    def __setitem__(self, key: Any, value: Any) -> None:
        if self.index is None:
            self.cells[key] = value
        else:
            self.cells[self.index[key]] = value


@dataclass
class _Rank:
    program: RankProgram
    data: _Memory
    sig: np.ndarray
    epoch: int = 0
    main_pc: int = 0             # index into the main-stream action list of the current call
    call: int = 0
    forked_call: int = -1        # the last call whose channel streams may start
    stream_pos: dict[int, int] = field(default_factory=dict)     # launch index per channel
    stream_call: dict[int, int] = field(default_factory=dict)    # call each channel is on
    ctas: dict[int, list[int]] = field(default_factory=dict)     # channel -> row pc per CTA
    cta_epoch: dict[int, int] = field(default_factory=dict)
    main_ctas: list[int] | None = None
    main_epoch: int = 0
    # the LL area (ll.py), per parity: each element's value and the epoch its word carries
    ll_val: np.ndarray = field(default_factory=lambda: np.zeros((LL_PARITIES, 0)))
    ll_flag: np.ndarray = field(default_factory=lambda: np.zeros((LL_PARITIES, 0), np.int64))


class _Emulator:
    def __init__(self, schedule: Schedule, opts: CudaOptions, calls: Sequence[Sequence[np.ndarray]],
                 outputs_before: Sequence[Sequence[np.ndarray]], seed: int,
                 in_place: bool = False) -> None:
        self.schedule, self.spec = schedule, schedule.spec
        self.calls, self.before = calls, outputs_before
        self.rng = np.random.default_rng(seed)
        self.ranks = []
        for r in range(schedule.world_size):
            p = lower(schedule, r, opts)
            keys = self._streams_of(p)
            self.ranks.append(_Rank(p, _Memory(p.layout, in_place), np.zeros(p.num_slots, np.int64),
                                    stream_pos={ch: 0 for ch in keys},
                                    stream_call={ch: 0 for ch in keys},
                                    ctas={},
                                    ll_val=np.full((LL_PARITIES, p.ll_elements), np.nan),
                                    ll_flag=np.zeros((LL_PARITIES, p.ll_elements), np.int64)))
        self.results: list[list[np.ndarray | None]] = [[None] * schedule.world_size for _ in calls]

    @staticmethod
    def _streams_of(p: RankProgram) -> dict[int, tuple[Launch, ...]]:
        """Channel streams (none for a fused program: its kernel is a main-stream step) and the
        net stream."""
        return ({} if p.fused else dict(p.streams)) | ({NET: p.net} if p.net else {})

    # ---- main stream: the call protocol (lowering.call_steps) ----------------------------------
    def _main_step(self, r: int, rk: _Rank) -> bool:
        """Advance rank r's main stream by one step if it can; True if it did."""
        if rk.call >= len(self.calls):
            return False
        steps = call_steps(rk.program)
        act = steps[rk.main_pc]
        p, lay = rk.program, rk.program.layout
        if act == CallStep.COPY_IN:
            n = self.spec.input_count(r)
            rk.data[lay.offsets[INPUT]:lay.offsets[INPUT] + n] = self.calls[rk.call][r]
            if p.copy_in_output:
                m = self.spec.output_count(r)
                rk.data[lay.offsets[OUTPUT]:lay.offsets[OUTPUT] + m] = self.before[rk.call][r]
        elif act == CallStep.EPOCH:
            rk.epoch += 1
        elif act in (CallStep.START_BARRIER, CallStep.FUSED, CallStep.END_BARRIER):
            launch = (p.start_barrier if act == CallStep.START_BARRIER else fused_launch(p)
                      if act == CallStep.FUSED else p.end_barrier)
            assert launch is not None
            if rk.main_ctas is None:
                if act != CallStep.END_BARRIER:     # these kernels start the call's epoch
                    rk.epoch += 1
                rk.main_ctas, rk.main_epoch = [0] * launch.grid, rk.epoch
            if not self._cta_steps(r, rk, launch, rk.main_ctas, rk.main_epoch):
                return False
            if any(pc < len(launch.rows) for pc in rk.main_ctas):
                return True
            rk.main_ctas = None
        elif act == CallStep.FORK:
            rk.forked_call = rk.call
        elif act == CallStep.JOIN:
            if any(rk.stream_call[ch] <= rk.call for ch in rk.stream_call):
                return False
        elif act == CallStep.COPY_OUT:
            m = self.spec.output_count(r)
            self.results[rk.call][r] = rk.data[lay.offsets[OUTPUT]:lay.offsets[OUTPUT] + m].copy()
        rk.main_pc += 1
        if rk.main_pc == len(steps):
            rk.main_pc, rk.call = 0, rk.call + 1
        return True

    # ---- channel streams ---------------------------------------------------------------------
    def _stream_step(self, r: int, rk: _Rank, ch: int) -> bool:
        items = self._streams_of(rk.program)[ch]
        if rk.stream_call[ch] > rk.forked_call or rk.stream_call[ch] >= len(self.calls):
            return False
        if rk.stream_pos[ch] == len(items):
            rk.stream_pos[ch], rk.stream_call[ch] = 0, rk.stream_call[ch] + 1
            return True
        item = items[rk.stream_pos[ch]]
        if isinstance(item, (SendLaunch, RecvLaunch)):
            return self._net_step(r, rk, item)
        if isinstance(item, CopyLaunch):
            src = self.ranks[item.src.rank].data[item.src.offset:item.src.offset + item.count]
            self.ranks[item.dst.rank].data[item.dst.offset:item.dst.offset + item.count] = src
            rk.stream_pos[ch] += 1
            return True
        if isinstance(item, PutLaunch):
            # the put kernel waits first (the call's epoch: the net stream runs in the call the
            # main stream forked)
            if not _waits_met(rk, item.waits, rk.epoch):
                return False
            self._put(r, item)
            rk.stream_pos[ch] += 1
            return True
        if ch not in rk.ctas:
            rk.ctas[ch], rk.cta_epoch[ch] = [0] * item.grid, rk.epoch
        if not self._cta_steps(r, rk, item, rk.ctas[ch], rk.cta_epoch[ch]):
            return False
        if all(pc == len(item.rows) for pc in rk.ctas[ch]):
            del rk.ctas[ch]
            rk.stream_pos[ch] += 1
        return True

    def _net_step(self, r: int, rk: _Rank, item: SendLaunch | RecvLaunch) -> bool:
        """A send and its receive complete together, when both are at the head of their net
        streams in the same call (NCCL pairs p2p operations in posting order)."""
        peer = self.ranks[item.peer]
        if NET not in peer.stream_call or peer.stream_call[NET] != rk.stream_call[NET] \
                or peer.stream_call[NET] > peer.forked_call:
            return False
        pos = peer.stream_pos[NET]
        if pos >= len(peer.program.net):
            return False
        other = peer.program.net[pos]
        want = RecvLaunch if isinstance(item, SendLaunch) else SendLaunch
        if not isinstance(other, want) or other.op != item.op:
            return False
        send, recv = (item, other) if isinstance(item, SendLaunch) else (other, item)
        assert isinstance(send, SendLaunch) and isinstance(recv, RecvLaunch)
        src_rank = r if isinstance(item, SendLaunch) else item.peer
        dst_rank = item.peer if isinstance(item, SendLaunch) else r
        src = self.ranks[src_rank].data[send.src.offset:send.src.offset + send.count]
        self.ranks[dst_rank].data[recv.dst.offset:recv.dst.offset + recv.count] = src
        rk.stream_pos[NET] += 1
        peer.stream_pos[NET] += 1
        return True

    def _put(self, r: int, item: PutLaunch) -> None:
        """An NVSHMEM put: the data lands in the peer's allocation, then every target's 64-bit
        slot gains one per CTA (its low int32 word, which waits read; the high word stays 0)."""
        src = self.ranks[r].data[item.src.offset:item.src.offset + item.count]
        self.ranks[item.peer].data[item.dst.offset:item.dst.offset + item.count] = src
        for s in item.signals:
            if s.slot % 2:
                raise VerificationError(f"nvshmem put {item.op}: slot {s.slot} is not the low "
                                        "word of a 64-bit signal")
            self.ranks[s.rank].sig[s.slot] += item.ctas

    def _cta_steps(self, r: int, rk: _Rank, launch: KernelLaunch, pcs: list[int], epoch: int) -> bool:
        """One random CTA of `launch` that can run its next row does so; False if none can."""
        ready = [c for c, pc in enumerate(pcs) if pc < len(launch.rows)
                 and (not self._mine(launch.rows[pc], c)
                      or _waits_met(rk, launch.rows[pc].waits, epoch))
                 and self._ll_ready(rk, launch.rows[pc], c, launch.grid, epoch)]
        if not ready:
            return False
        c = ready[int(self.rng.integers(len(ready)))]
        self._do_row(launch.rows[pcs[c]], c, launch.grid, epoch)
        pcs[c] += 1
        return True

    @staticmethod
    def _mine(row: Row, cta: int) -> bool:
        """Does CTA `cta` run the row (the kernel's F_CTAS range)? Others skip it whole."""
        return row.ctas is None or row.ctas[0] <= cta < row.ctas[1]

    @classmethod
    def _share(cls, row: Row, cta: int, grid: int) -> np.ndarray:
        idx = np.arange(row.count)
        if not cls._mine(row, cta):
            return idx[:0]
        if row.ctas is not None:      # the row's own CTAs stride over it
            cta, grid = cta - row.ctas[0], row.ctas[1] - row.ctas[0]
        return idx[(idx // EMU_BLOCK) % grid == cta]

    def _ll_ready(self, rk: _Rank, row: Row, cta: int, grid: int, epoch: int) -> bool:
        """An LL row's CTA runs once every word of its share of each LL source carries this
        call's epoch (the kernel's poll)."""
        if not row.ll >> 1:
            return True
        idx = self._share(row, cta, grid)
        flags = rk.ll_flag[epoch % LL_PARITIES]
        return all(bool(np.all(flags[s.offset + idx] == epoch))
                   for i, s in enumerate(row.srcs) if row.ll >> (1 + i) & 1)

    def _do_row(self, row: Row, cta: int, grid: int, epoch: int = 0) -> None:
        if row.count and row.dst is not None:
            idx = self._share(row, cta, grid)
            par = epoch % LL_PARITIES
            srcs = [self.ranks[s.rank].ll_val[par, s.offset + idx] if row.ll >> (1 + i) & 1
                    else self.ranks[s.rank].data[s.offset + idx] for i, s in enumerate(row.srcs)]
            dst = self.ranks[row.dst.rank].data
            if not row.reduce:
                value = srcs[0]
            else:   # the kernel's arithmetic (fp32, sources in row order), bit for bit
                old = dst[row.dst.offset + idx] if row.accumulate else None
                value = reduce_values(self.spec.reduce_op, self.spec.dtype, srcs, row.scale, old)
            if row.ll & 1:      # a push: flagged words into the receiver's LL area
                peer = self.ranks[row.dst.rank]
                peer.ll_val[par, row.dst.offset + idx] = value
                peer.ll_flag[par, row.dst.offset + idx] = epoch
            else:
                dst[row.dst.offset + idx] = value
            for a in row.also:      # the row's result, stored again where merged copies put it
                self.ranks[a.rank].data[a.offset + idx] = value
        if not self._mine(row, cta):
            return
        for s in row.signals:
            self.ranks[s.rank].sig[s.slot] += 1

    def run(self) -> list[list[np.ndarray]]:
        while True:
            steps: list[tuple[int, int | None]] = []
            for r, rk in enumerate(self.ranks):
                steps.append((r, None))
                steps.extend((r, ch) for ch in rk.stream_call)
            self.rng.shuffle(steps)
            progressed = False
            for r, ch in steps:
                rk = self.ranks[r]
                if (self._main_step(r, rk) if ch is None else self._stream_step(r, rk, ch)):
                    progressed = True
                    break
            if not progressed:
                break
        if any(rk.call < len(self.calls) for rk in self.ranks):
            stuck = [f"rank {r} call {rk.call} step {call_steps(rk.program)[rk.main_pc].value}"
                     for r, rk in enumerate(self.ranks) if rk.call < len(self.calls)]
            raise VerificationError("lowered program deadlocks: " + "; ".join(stuck))
        return [[o for o in call] for call in self.results]  # type: ignore[misc]


def emulate(schedule: Schedule, calls: Sequence[Sequence[np.ndarray]],
            outputs_before: Sequence[Sequence[np.ndarray]], opts: CudaOptions | None = None,
            seed: int = 0, in_place: bool = False) -> list[list[np.ndarray]]:
    """Outputs of every rank for every call (`calls[k][r]`: rank r's input of call k).
    `in_place`: each rank's output region is its input region (sim.check.in_place_problems says
    which plans may run so)."""
    return _Emulator(schedule, opts or CudaOptions(), calls, outputs_before, seed,
                     in_place).run()


def _waits_met(rk: _Rank, waits: Sequence[Wait], epoch: int) -> bool:
    """Every wait's slot has reached per_epoch * epoch (the kernels' spin condition)."""
    return all(rk.sig[w.slot] >= w.per_epoch * epoch for w in waits)
