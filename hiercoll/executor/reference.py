"""The reference executor: runs a schedule on numpy buffers of every rank in one process.

Ops run one at a time in a random order that respects dependencies and channel order; several
different orders per check, so a missing dependency shows up as a wrong result. Reductions
accumulate in float64 and round once to the dtype, like the GPU kernels (fp32 accumulate).

Every trial runs twice on the same inputs and order: once rounded to the dtype (what the kernels
do; its error bound is loose, eps x (terms+1) x sum|x|, ~6.6% of sum|x| for bf16 at 16 ranks), and
once exactly (`exact=True`: float64 buffers, no rounding), compared with a bound of a few float64
ulps. The exact pass is what makes a systematic error visible: the inputs are dtype values in
[0.25, 1), multiples of 2^-10 (bf16) or 2^-26 (fp32), so every sum of them is exact in float64 and
only a scale multiply rounds; a reduce whose scale is 1% off, or a plan that averages what it
should sum, misses by ~1e-2 where the bound is ~1e-15. (Bounding the rounded pass per element by
that element's own terms would still have to allow one bf16 rounding per partial sum, several
tenths of a percent: a 1% error could hide behind a few of them.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hiercoll.collectives import (
    SHARED_OUTPUT,
    CollectiveSpec,
    first_rank_difference,
    initial_outputs,
    random_inputs,
    reduce_values,
    reference,
    storage_dtype,
    tolerance,
    wide_inputs,
)
from hiercoll.errors import HiercollError, ReferenceTooLarge, ScheduleError
from hiercoll.executor.shrink import common_factor, shrink
from hiercoll.schedule import INPUT, OUTPUT, Op, OpKind, Schedule, topological_order


@dataclass(frozen=True)
class Mismatch:
    rank: int
    offset: int
    got: float
    want: float
    last_writer: str | None   # op id, or None when no op wrote the element
    exact: bool = False       # found by the exact (float64, unrounded) pass

    def __str__(self) -> str:
        who = f"last written by op {self.last_writer}" if self.last_writer else "never written"
        how = "; exact float64 pass" if self.exact else ""
        return (f"rank {self.rank} output[{self.offset}] = {self.got!r}, expected {self.want!r} "
                f"({who}{how})")


@dataclass(frozen=True)
class VerifyReport:
    ok: bool
    trials: int
    max_abs_error: float
    mismatch: Mismatch | None
    trial: int | None          # the trial (0-based) that failed
    # > 1: the plan did not fit in memory and ran as its size-reduced copy (executor/shrink.py:
    # every count and offset divided by this; the same check, see there)
    reduced_by: int = 1
    # kinds whose ranks share outputs (collectives.SHARED_OUTPUT): every rank's output the same
    # bits in every trial (None: other kinds, or a wrong result stopped the trials first); a
    # difference fails the report
    ranks_identical: bool | None = None
    rank_difference: str | None = None

    @property
    def how(self) -> str:
        """Which plan ran, in words (what every report of a verification should say)."""
        if self.reduced_by == 1:
            return "on the plan itself"
        return (f"on a size-reduced copy (every count and offset / {self.reduced_by}: same ops, "
                "same dependencies)")

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "trials": self.trials, "max_abs_error": self.max_abs_error,
                "first_mismatch": str(self.mismatch) if self.mismatch else None,
                "failed_trial": self.trial, "reduced_by": self.reduced_by,
                "ranks_identical": self.ranks_identical, "rank_difference": self.rank_difference}


def _execution_order(schedule: Schedule, rng: np.random.Generator) -> list[Op]:
    """A random linear extension of (deps + channel order)."""
    try:
        return topological_order(schedule, lambda n: int(rng.integers(n)))
    except ScheduleError as exc:
        raise HiercollError(f"cannot execute: {exc}") from None


class _Memory:
    """Every rank's buffers, plus which op last wrote each element (for error reports)."""

    def __init__(self, schedule: Schedule, inputs: Sequence[np.ndarray],
                 outputs: Sequence[np.ndarray], exact: bool = False):
        spec = schedule.spec
        dt = np.dtype(np.float64) if exact else storage_dtype(spec.dtype)
        self.spec = spec
        self.exact = exact
        self.bufs: list[dict[str, np.ndarray]] = []
        self.writer: list[dict[str, np.ndarray]] = []
        for r in range(schedule.world_size):
            sizes = schedule.buffers(r)
            bufs = {name: np.full(n, np.nan, dtype=dt) for name, n in sizes.items()}
            bufs[INPUT] = np.array(inputs[r], dtype=dt, copy=True)
            bufs[OUTPUT] = np.array(outputs[r], dtype=dt, copy=True)
            self.bufs.append(bufs)
            self.writer.append({name: np.full(n, -1, dtype=np.int64) for name, n in sizes.items()})

    def view(self, region) -> np.ndarray:
        return self.bufs[region.rank][region.buffer][region.offset:region.offset + region.count]

    def run(self, op: Op) -> None:
        if op.kind == OpKind.COPY:
            value = self.view(op.srcs[0]).copy()
        else:   # the kernels' arithmetic: sources folded in order, in fp32 (or exactly)
            value = reduce_values(self.spec.reduce_op, self.spec.dtype,
                                  [self.view(s) for s in op.srcs], op.scale,
                                  self.view(op.dst) if op.accumulate else None, exact=self.exact)
        d = op.dst
        self.bufs[d.rank][d.buffer][d.offset:d.offset + d.count] = value
        self.writer[d.rank][d.buffer][d.offset:d.offset + d.count] = (op.rank << 32) | op.index


def run_order(schedule: Schedule, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
              order: Sequence[Op], exact: bool = False) -> _Memory:
    """Run the ops in `order`; `exact`: in float64 without rounding to the dtype."""
    mem = _Memory(schedule, inputs, outputs, exact)
    for op in order:
        mem.run(op)
    return mem


def execute(schedule: Schedule, inputs: Sequence[np.ndarray],
            outputs_before: Sequence[np.ndarray] | None = None, seed: int | None = None,
            ) -> list[np.ndarray]:
    """Run `schedule` on caller-given per-rank inputs; returns per-rank outputs (storage dtype).

    `outputs_before` matters for group_reduce (it accumulates); default NaN elsewhere, zeros for
    group_reduce.
    """
    spec = schedule.spec
    _check_shapes(spec, inputs, "inputs", spec.input_count)
    if outputs_before is None:
        fill = 0.0 if spec.accumulates_output else np.nan
        outputs_before = [np.full(spec.output_count(r), fill) for r in range(spec.world_size)]
    _check_shapes(spec, outputs_before, "outputs_before", spec.output_count)
    rng = np.random.default_rng(seed)
    mem = run_order(schedule, inputs, outputs_before, _execution_order(schedule, rng))
    return [mem.bufs[r][OUTPUT].copy() for r in range(spec.world_size)]


def _check_shapes(spec: CollectiveSpec, arrays: Sequence[np.ndarray], what: str, count) -> None:
    if len(arrays) != spec.world_size:
        raise HiercollError(f"{what}: {len(arrays)} arrays for world size {spec.world_size}")
    for r, a in enumerate(arrays):
        if np.asarray(a).shape != (count(r),):
            raise HiercollError(f"{what}[{r}]: shape {np.asarray(a).shape}, expected ({count(r)},)")


def compare(spec: CollectiveSpec, mem: _Memory, expected, ) -> tuple[float, Mismatch | None]:
    worst, first = 0.0, None
    for r in range(spec.world_size):
        got = mem.bufs[r][OUTPUT].astype(np.float64)
        want = expected.outputs[r]
        err = np.abs(got - want)
        bad = ~(err <= tolerance(spec, expected, r, exact=mem.exact))   # NaN counts as bad
        if err.size:
            worst = max(worst, float(np.nanmax(err)) if not np.all(np.isnan(err)) else np.inf)
        if first is None and bad.any():
            i = int(np.argmax(bad))
            w = int(mem.writer[r][OUTPUT][i])
            first = Mismatch(r, i, float(got[i]), float(want[i]),
                             None if w < 0 else f"{w >> 32}.{w & 0xFFFFFFFF}", mem.exact)
    if any(np.isnan(mem.bufs[r][OUTPUT]).any() for r in range(spec.world_size)):
        worst = float("inf")
    return worst, first


DEFAULT_MAX_MEMORY = 2 << 30


def memory_needed(schedule: Schedule) -> int:
    """Bytes the reference executor holds: every buffer of every rank in float64 (the exact pass;
    the rounded pass, in the storage dtype, runs first and is freed), a last-writer index per
    element, and float64 temporaries of the largest op."""
    per_elem = max(storage_dtype(schedule.spec.dtype).itemsize, 8) + 8
    elems = sum(n for r in range(schedule.world_size) for n in schedule.buffers(r).values())
    return elems * per_elem + 4 * 8 * schedule.spec.count


def verify(schedule: Schedule, trials: int = 3, seed: int | None = None,
           max_memory: int = DEFAULT_MAX_MEMORY) -> VerifyReport:
    """Run `trials` times, each with fresh random inputs and a different random op order, each
    twice: rounded to the dtype like the kernels, then exactly in float64 against a bound of a few
    float64 ulps (see the module doc: the rounded pass's bound is too loose to see a scale that is
    a few percent off; the exact pass is not). `max_abs_error` is the rounded pass's.

    A plan whose buffers would not fit in `max_memory` runs as its size-reduced copy
    (`executor/shrink.py`, the report's `reduced_by`); one that has none that fits is refused
    (HiercollError): the static check (hiercoll.sim.check) still proves it symbolically."""
    schedule.refuse_library_call("verify")
    schedule.check_walk("verifying it")
    schedule, reduced_by = fitting(schedule, max_memory)
    spec = schedule.spec
    rng = np.random.default_rng(seed)
    worst = 0.0
    shared = spec.kind in SHARED_OUTPUT
    for t in range(trials):
        inputs = random_inputs(spec, rng)
        before = initial_outputs(spec, rng)
        expected = reference(spec, inputs, before)
        order = _execution_order(schedule, rng)
        mem = run_order(schedule, inputs, before, order)
        err, bad = compare(spec, mem, expected)
        worst = max(worst, err)
        split = rank_difference(spec, mem)
        del mem
        if bad is None:
            _, bad = compare(spec, run_order(schedule, inputs, before, order, exact=True), expected)
        if bad is None and split is None and shared:
            # random_inputs' bf16 sums are exact in fp32 (any order, same bits): wide values
            # round, so a second summation order shows
            split = rank_difference(spec, run_order(schedule, wide_inputs(spec, rng), before, order))
        if bad is not None or split is not None:
            return VerifyReport(False, t + 1, worst, bad, t, reduced_by,
                                False if split is not None else None, split)
    return VerifyReport(True, trials, worst, None, None, reduced_by, True if shared else None)


def rank_difference(spec: CollectiveSpec, mem: _Memory) -> str | None:
    """Where ranks that share outputs ended with different bits, in words; None if they did
    not (or the kind has no shared outputs)."""
    at = first_rank_difference(spec, [mem.bufs[r][OUTPUT] for r in range(spec.world_size)])
    if at is None:
        return None
    r, i = at
    w = int(mem.writer[r][OUTPUT][i])
    w0 = int(mem.writer[0][OUTPUT][i])
    def op(x: int) -> str:
        return "no op" if x < 0 else f"op {x >> 32}.{x & 0xFFFFFFFF}"
    return (f"ranks differ: rank {r} output[{i}] = {float(mem.bufs[r][OUTPUT][i])!r} ({op(w)}), "
            f"rank 0 has {float(mem.bufs[0][OUTPUT][i])!r} ({op(w0)})")


def fitting(schedule: Schedule, max_memory: int) -> tuple[Schedule, int]:
    """The plan, or its size-reduced copy and the factor, whichever fits in `max_memory`; no
    copy that fits: HiercollError (one line, no CLI flag in it: the API says it too)."""
    need = memory_needed(schedule)
    if need <= max_memory:
        return schedule, 1
    factor = common_factor(schedule)
    small = shrink(schedule, factor) if factor > 1 else None
    if small is not None and memory_needed(small) <= max_memory:
        return small, factor
    why = ("no size-reduced copy fits either" if small is not None
           else "and it has no size-reduced copy (its sizes share no factor)")
    raise ReferenceTooLarge(f"the reference executor would need {need / 2**30:.1f} GiB for this plan "
                        f"(limit {max_memory / 2**30:.1f} GiB), {why}; plan it at a smaller size "
                        "or raise the limit (max_memory) to run it on data (the static check "
                        "still covers this size)")
