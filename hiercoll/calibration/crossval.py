"""k-fold cross-validation of the calibration: held-out error as a mean and spread over folds,
per size band and for hiercoll's plans and NCCL's library model apart.

Why: one fixed split's held-out figure depends on which rows it holds out (issue 28: shifting the
every-third rule by a row moved the NCCL figure from 12.3 % to 21.6 %). Here every row is held
out exactly once. Folds are drawn per (collective, plan, mode), sizes sorted, row k in fold
k mod K, so every fold holds small and large sizes of every plan.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hiercoll.calibration.fit import fit, geomean_error, size_ranks
from hiercoll.calibration.predict import Case
from hiercoll.errors import HiercollError
from hiercoll.schedule import LIBRARY_ALGORITHM
from hiercoll.topology import Topology

BANDS = (("< 1 MiB", 0, 1 << 20), ("1-64 MiB", 1 << 20, 64 << 20), (">= 64 MiB", 64 << 20, 1 << 62))


@dataclass(frozen=True)
class Figure:
    """Held-out geomean error of one group of rows: over all folds, and per fold."""

    label: str
    rows: int
    mean: float                   # mean over the folds that hold rows of the group
    low: float
    high: float

    def text(self) -> str:
        return (f"{self.label}: {100 * self.mean:.1f} % (folds {100 * self.low:.1f}-"
                f"{100 * self.high:.1f} %, {self.rows} rows)")


OWNERS = (("hiercoll plans", False), ("NCCL library model", True))


def cells(modes: Sequence[str] = ()) -> list[tuple[str, Callable[[Case], bool]]]:
    """The cells held-out errors are reported in, (label, membership): owner (hiercoll's plans,
    NCCL's library model) x size band, and x mode where `modes` are given (`compare`'s report,
    so a fresh run reads against the folds' figures)."""
    return [(", ".join(x for x in (owner, mode, name) if x), _member(library, lo, hi, mode))
            for owner, library in OWNERS for mode in (modes or (None,))
            for name, lo, hi in BANDS]


def _member(library: bool, lo: int, hi: int, mode: str | None) -> Callable[[Case], bool]:
    """Rows of NCCL's library model (or of hiercoll's plans) with sizes in [lo, hi), in `mode`
    (None: either)."""
    def member(c: Case) -> bool:
        m = c.measurement
        return ((m.algorithm == LIBRARY_ALGORITHM) == library and lo <= m.nbytes < hi
                and mode in (None, m.mode))
    return member


def fold_of(cases: Sequence[Case], folds: int) -> list[int]:
    """Each row's fold: per (collective, plan, mode), sizes sorted, row k in fold k mod K."""
    return [k % folds for k in size_ranks(cases)]


def cross_validate(cases: Sequence[Case], base: Topology, folds: int,
                   progress: Callable[[int], None] | None = None,
                   only: Sequence[str] | None = None, fixed: Sequence[str] = (),
                   jobs: int = 1) -> list[Figure]:
    """Fit K times, each on the rows outside one fold; every row predicted once, held out."""
    if folds < 2:
        raise HiercollError(f"--folds: {folds}; give at least 2")
    if len(cases) < 2 * folds:
        raise HiercollError(f"--folds: {folds} folds of {len(cases)} rows leave too few to fit; "
                            "give fewer folds or more rows")
    fold = fold_of(cases, folds)
    ratio: dict[int, tuple[int, float]] = {}       # row -> (its fold, pred/meas held out)
    for f in range(folds):
        held = [g == f for g in fold]
        result = fit(cases, base, only=only, progress=progress, held=held, fixed=fixed,
                     jobs=jobs)
        for i, (row, h) in enumerate(zip(result.rows, held, strict=True)):
            if h:
                ratio[i] = (f, row.ratio)
    groups: list[tuple[str, Callable[[Case], bool]]] = [("all rows", lambda c: True), *cells()]
    out = []
    for label, member in groups:
        rows = [i for i, c in enumerate(cases) if member(c)]
        per_fold = [geomean_error([ratio[i][1] for i in rows if ratio[i][0] == f])
                    for f in range(folds) if any(ratio[i][0] == f for i in rows)]
        if per_fold:
            out.append(Figure(label, len(rows), statistics.fmean(per_fold), min(per_fold),
                              max(per_fold)))
    return out
