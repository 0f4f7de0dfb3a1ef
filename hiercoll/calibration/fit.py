"""Fit the topology's cost parameters to measured times: least squares on log-time residuals.

Log residuals make a 10 us miss on a 20 us call weigh like a 10 ms miss on a 20 ms one, which is
what users mean by "the prediction is 2x off". Parameters are fitted in log space inside their
bounds. A held-out share of the rows (every k-th size of each plan, so each plan keeps its small
and large sizes on both sides) is never seen by the fit and reports the error a user should
expect on new sizes. A parameter whose column of the Jacobian is (near) zero at the solution is
one the data cannot see: it keeps its prior value and the report says "not constrained", unless
going back to the prior would move the fit (a cap the fit raised past binding): then it stays.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from hiercoll.calibration.parallel import RowPredictor
from hiercoll.calibration.params import START, FitParam, applicable, with_values
from hiercoll.calibration.predict import Case
from hiercoll.errors import HiercollError
from hiercoll.schedule import LIBRARY_ALGORITHM
from hiercoll.topology import Topology

# |d log(time) / d log(param)| summed over rows below this: the data does not see the parameter
UNCONSTRAINED_SENSITIVITY = 1e-3
FIT_TOL = 1e-6
# steps per parameter (scipy's nfev: Jacobian evaluations not counted) before the fit stops
# where it is: the 2-GPU fit of 11 costs converged in 170 simulations; a fit still moving
# after this many crawls along kinks of the max() terms (a 4-GPU fit ran 7600 simulations
# without meeting the tolerances)
MAX_NFEV_PER_PARAM = 10
# an unconstrained parameter goes back to its prior only if that moves the fit's cost by less
REVERT_TOL = 1e-3


@dataclass(frozen=True)
class RowError:
    case: Case
    predicted_us: float
    held_out: bool

    @property
    def measured_us(self) -> float:
        return self.case.measurement.time_us

    @property
    def ratio(self) -> float:
        return self.predicted_us / self.measured_us

    @property
    def error(self) -> float:
        """|pred/meas - 1|, the issue's definition."""
        return abs(self.ratio - 1.0)


@dataclass(frozen=True)
class FitResult:
    topology: Topology                   # the base topology with the fitted values
    fitted: dict[str, float]             # every parameter the data constrains
    unconstrained: dict[str, float | None]   # kept at their prior values (None: unset)
    rows: list[RowError]
    evaluations: int

    def ratios(self, held_out: bool | None = None) -> list[float]:
        return [r.ratio for r in self.rows if held_out is None or r.held_out == held_out]


def geomean_error(ratios: Sequence[float]) -> float:
    """The typical factor a prediction is off, minus one: exp(mean |log(pred/meas)|) - 1, the
    geometric mean of max(r, 1/r) - 1. Unlike a mean of |r - 1| it treats 2x too fast and 2x too
    slow alike, and unlike a geomean of |r - 1| one exact row cannot zero it."""
    if not ratios:
        return float("nan")
    return float(math.exp(np.mean([abs(math.log(r)) for r in ratios])) - 1.0)


def worst_error(ratios: Sequence[float]) -> float:
    """max |pred/meas - 1|."""
    return max((abs(r - 1.0) for r in ratios), default=float("nan"))


def split_holdout(cases: Sequence[Case], holdout: float) -> list[bool]:
    """True for held-out rows: per (plan, mode), sizes sorted, every round(1/holdout)-th one,
    starting from the second so the smallest size is always fitted."""
    if holdout <= 0:
        return [False] * len(cases)
    if holdout >= 1:
        raise HiercollError(f"--holdout: {holdout} must be in [0, 1)")
    step = max(2, round(1 / holdout))
    return [k % step == 1 for k in size_ranks(cases)]


def size_ranks(cases: Sequence[Case]) -> list[int]:
    """Each row's place among the sizes of its (collective, plan, mode): what held-out rows and
    cross-validation folds are drawn by, so every plan keeps small and large sizes on both sides."""
    out = [0] * len(cases)
    groups: dict[tuple[str, str, str], list[int]] = {}
    for i, c in enumerate(cases):
        m = c.measurement
        groups.setdefault((m.collective.value, c.plan_label, m.mode), []).append(i)
    for idx in groups.values():
        idx.sort(key=lambda i: cases[i].measurement.nbytes)
        for k, i in enumerate(idx):
            out[i] = k
    return out


def fit(cases: Sequence[Case], base: Topology, holdout: float = 0.3,
        only: Sequence[str] | None = None,
        progress: Callable[[int], None] | None = None,
        held: Sequence[bool] | None = None, fixed: Sequence[str] = (),
        jobs: int = 1) -> FitResult:
    """Fit `base`'s applicable parameters (or `only` those paths) to `cases`.

    With both eager and graph rows the fit has two stages: the device's costs from the graph
    rows (a replayed call has no host in it), then the host's eager costs from the eager rows
    with the device held. One joint fit would let host noise (one Python thread launching every
    rank, one-GPU runs) bend the device's numbers. `fixed` parameters keep `base`'s values (a
    user's knowledge the rows cannot add to, or a term the rows would bend to stand in for
    another). `jobs`: worker processes predicting the rows (the same result for any number)."""
    if not cases:
        raise HiercollError("calibrate: no measurement rows to fit")
    held = list(held) if held is not None else split_holdout(cases, holdout)
    train = [c for c, h in zip(cases, held, strict=True) if not h]
    params = [p for p in applicable(base)
              if (only is None or p.path in only) and p.path not in fixed]
    if not _both_kinds(train):       # NCCL's own costs only where they can differ from ours
        params = [p for p in params if not p.path.startswith("costs.library.")]
    by_mode = {mode: [c for c in train if c.measurement.mode == mode] for mode in ("graph", "eager")}
    if by_mode["graph"] and by_mode["eager"]:
        stages = [(by_mode["graph"], [p for p in params if _mode_of(p) != "eager"]),
                  (by_mode["eager"], [p for p in params if _mode_of(p) == "eager"])]
    else:
        modes = {c.measurement.mode for c in train}
        stages = [(train, [p for p in params if _mode_of(p) in (None, *modes)])]
    fitted: dict[str, float] = {}
    evaluations = 0
    for rows, stage_params in stages:
        if not rows or not stage_params:
            continue
        with RowPredictor(rows, base, jobs) as predict:
            found, n = _solve(rows, with_values(base, fitted), stage_params, evaluations,
                              progress, predict)
        fitted |= found
        evaluations = n
    unconstrained = {p.path: p.get(base) for p in applicable(base)
                     if p.path not in fitted and p.path not in fixed}
    topo = with_values(base, fitted)
    with RowPredictor(cases, base, jobs) as predict:
        times = predict(topo)
    result = [RowError(c, t, h) for c, t, h in zip(cases, times, held, strict=True)]
    return FitResult(topo, fitted, unconstrained, result, evaluations)


def _both_kinds(rows: Sequence[Case]) -> bool:
    """Rows of the library and rows of hiercoll's plans: only then can NCCL's own costs be told
    apart from the plans' (on NCCL rows alone, `costs.launch_us` is NCCL's)."""
    library = {c.measurement.algorithm == LIBRARY_ALGORITHM for c in rows}
    return library == {True, False}


def _solve(train: Sequence[Case], start: Topology, params: Sequence[FitParam], calls: int,
           progress: Callable[[int], None] | None,
           predict: RowPredictor) -> tuple[dict[str, float], int]:
    """Least squares over `params` from `start`; the values the rows constrain, and the running
    count of simulations."""
    starts = _data_starts(train)
    x0 = np.array([_to_x(p, min(max(starts.get(p.path, _start(p, start)), p.lo), p.hi))
                   for p in params])
    lo = np.array([_to_x(p, p.lo) for p in params])
    hi = np.array([_to_x(p, p.hi) for p in params])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
    measured = np.log([c.measurement.time_us for c in train])

    def residuals(x: np.ndarray) -> np.ndarray:
        nonlocal calls
        calls += 1
        if progress is not None:
            progress(calls)
        topo = with_values(start, _values(params, x))
        return np.log(predict(topo)) - measured

    # tolerances of 1e-6 on log-times: predictions moving by a millionth are what the reports
    # round away (what bounds a crawling fit is MAX_NFEV_PER_PARAM)
    sol = least_squares(residuals, x0, bounds=(lo, hi), method="trf", x_scale="jac",
                        diff_step=1e-3, ftol=FIT_TOL, xtol=FIT_TOL,
                        max_nfev=MAX_NFEV_PER_PARAM * max(1, len(params)))
    sensitivity = np.abs(sol.jac).sum(axis=0) if sol.jac is not None else np.zeros(len(params))
    solved = {p.path: _round(v) for p, v in zip(params, _values(params, sol.x).values(),
                                                strict=True)}
    seen = {p.path for p, s in zip(params, sensitivity, strict=True)
            if s > UNCONSTRAINED_SENSITIVITY}
    found = {k: v for k, v in solved.items() if k in seen}
    if len(found) < len(solved):
        # flat at the solution is not flat everywhere: a cap the fit raised past binding has no
        # gradient there, while its prior may bind (freeing sm_op_gbps on 4 x H200 raised it,
        # reported it unconstrained, and the prior 401 GB/s kept ring rows 17-19 % off). Back to
        # the prior only where that leaves the fit where it was.
        calls += 1
        reverted = np.log(predict(with_values(start, found))) - measured
        if 0.5 * float(reverted @ reverted) > sol.cost * (1 + REVERT_TOL) + 1e-12:
            found = solved
    return found, calls


def _data_starts(train: Sequence[Case]) -> dict[str, float]:
    """Starting points the data suggests where the topology's own value would leave the fit on
    a flat stretch: an eager call takes the longer of host and device work, so with no host
    cost at all the host term never binds and its gradient is zero. The fastest eager row is a
    fair first guess of the host's per-call work."""
    eager = [c.measurement.time_us for c in train if c.measurement.mode == "eager"]
    if not eager:
        return {}
    # likewise the per-launch terms: at their floor the host term never binds where they act
    return {"costs.eager.call_us": 0.9 * min(eager), "costs.eager.issue_us": 0.02 * min(eager),
            "costs.eager.ce_issue_us": 0.05 * min(eager)}


def _start(p: FitParam, base: Topology) -> float:
    value = p.get(base)
    if value is None or (value == 0.0 and p.path in START):     # unset, or a term left off
        return START.get(p.path, p.lo)
    return value


def _mode_of(p: FitParam) -> str | None:
    """eager/graph for a mode's own cost, else None (both modes see it)."""
    for mode in ("eager", "graph"):
        if p.path.startswith((f"costs.{mode}.", f"costs.library.{mode}_")):
            return mode
    return None


def _round(value: float, digits: int = 5) -> float:
    """Five significant digits: what the data supports, and a file a person can read."""
    return float(f"{value:.{digits}g}")


def _to_x(p: FitParam, value: float) -> float:
    return math.log(value) if p.log_scale else value


def _values(params: Sequence[FitParam], x: np.ndarray) -> dict[str, float]:
    return {p.path: float(math.exp(v) if p.log_scale else v) for p, v in zip(params, x, strict=True)}
