"""How far a set of runs reproduces itself, and so how close any model can come to it.

Where two rows of one point (collective, size, dtype, ranks, mode) ran the same program (equal
`program.program_key`: `direct` and `hier` on one node lower to the same ops; or one plan in
two runs), their times differ only by the measurement's own noise. A model gives a program one
time p, so on such rows it cannot beat that noise: for two draws X, Y of one program's (log)
time, E|X - Y| <= E|X - p| + E|Y - p|, so no p is nearer on average than half the mean gap,
whatever the noise's shape (`floor`; for Gaussian noise a perfect model sits at 1/sqrt(2) of
the gap). A held-out error is read against it: issue 28 found eager calls on 4 GPUs measured
bimodally (one program 45.7 and 59.2 us at reduce_scatter 32 KiB, up to 3x apart), where a 10 %
target is below what the run repeats to."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from hiercoll.calibration.crossval import BANDS
from hiercoll.calibration.measurement import Measurement
from hiercoll.calibration.predict import Case
from hiercoll.calibration.program import program_key
from hiercoll.schedule import LIBRARY_ALGORITHM


@dataclass(frozen=True)
class Spread:
    """One mode and size band: pairs of rows that ran one program, how far apart they are, and
    the error a perfect model would still show on such rows."""

    label: str
    pairs: int
    spread: float          # geomean of max/min over the pairs, minus one
    worst: float           # the widest pair, max/min minus one
    floor: float           # exp(mean |log gap| / 2) - 1: no model is nearer on average

    def text(self) -> str:
        return (f"{self.label}: {100 * self.spread:.1f} % apart (worst {100 * self.worst:.1f} %, "
                f"{self.pairs} pairs), floor {100 * self.floor:.1f} %")


class Sample(NamedTuple):
    """One measured row as the spread sees it: rows with equal `key` ran one program at one
    point (the mode and size are part of it; its last item is the program, 'nccl' for the
    library)."""

    mode: str
    nbytes: int
    key: tuple[object, ...]
    time_us: float


def spreads(cases: Sequence[Case]) -> list[Spread]:
    """Per mode and size band (`crossval.BANDS`), where any program was measured twice."""
    return spreads_of(Sample(c.measurement.mode, c.measurement.nbytes,
                             (*point_of(c.measurement), program_key(c)), c.measurement.time_us)
                      for c in cases)


def point_of(m: Measurement) -> tuple[object, ...]:
    """What makes two rows the same call: collective, size, dtype, ranks, mode, in place."""
    return (m.collective, m.nbytes, m.dtype, m.world_size, m.mode, m.in_place)


def spreads_of(samples: Iterable[Sample]) -> list[Spread]:
    """`spreads` over samples whose program keys the caller has (regret's timed candidates),
    hiercoll's plans and NCCL's library calls (measured twice: the bench's library row and its
    `nccl` peer) apart, as cross-validation reports them."""
    groups: dict[tuple[str, int, tuple[object, ...]], list[float]] = {}
    for s in samples:
        groups.setdefault((s.mode, s.nbytes, s.key), []).append(math.log(s.time_us))
    out = []
    for owner, library in (("", False), ("NCCL, ", True)):
        for mode in ("graph", "eager"):
            for name, lo, hi in BANDS:
                sel = [logs for (m, n, key), logs in groups.items()
                       if len(logs) > 1 and (key[-1] == LIBRARY_ALGORITHM) == library
                       and m == mode and lo <= n < hi]
                if sel:
                    out.append(_spread(f"{owner}{mode}, {name}", sel))
    return out


def _spread(label: str, groups: list[list[float]]) -> Spread:
    gaps = [abs(a - b) for logs in groups for a, b in itertools.combinations(logs, 2)]
    mean = sum(gaps) / len(gaps)
    return Spread(label, len(gaps), math.exp(mean) - 1, math.exp(max(gaps)) - 1,
                  math.exp(mean / 2) - 1)
