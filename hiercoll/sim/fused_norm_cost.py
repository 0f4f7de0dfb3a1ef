"""Cost model of the fused all-reduce + residual add + RMSNorm kernels, and the stage choice.

Pure Python, no torch: the executor asks it which stage to launch, the planner/simulator side can
price the op, and `bench/fused_norm.py --fit` refits it from measured rows.

Per rank, with S = rows x hidden x itemsize (the bytes of x) and W ranks:
- 1-stage: every rank reduces every row, reading W x S (one sync): t1 = a1 + b1 * W * S;
- 2-stage: a rank reduces its 1/W of the rows from W ranks (S) and gathers the two outputs of
  the other rows (2 (W-1)/W S), with two syncs: t2 = a2 + b2 * (1 + 2 (W-1)/W) * S.
The fixed terms (a: launch + syncs) favour 1-stage for small S, the volume terms 2-stage for large
S. The constants are fitted on measured per-call times of both stages forced (p50 of CUDA-event
times); `CALIBRATED` names where they came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FusedNormCosts:
    a1_us: float        # 1-stage fixed cost (launch, one signal round)
    b1_us_per_mb: float  # 1-stage: microseconds per MB (1e6 bytes) of reduced volume W*S
    a2_us: float        # 2-stage fixed cost (launch, two signal rounds)
    b2_us_per_mb: float  # 2-stage: microseconds per MB of (1 + 2(W-1)/W) * S
    source: str         # provenance: machine, command, date

    def one_stage_us(self, nbytes: int, world: int) -> float:
        return self.a1_us + self.b1_us_per_mb * world * nbytes / 1e6

    def two_stage_us(self, nbytes: int, world: int) -> float:
        return self.a2_us + self.b2_us_per_mb * (1 + 2 * (world - 1) / world) * nbytes / 1e6

    def predict_us(self, stages: int, nbytes: int, world: int) -> float:
        return (self.one_stage_us if stages == 1 else self.two_stage_us)(nbytes, world)


# Uncalibrated guesses (used only if nothing better is given); see CALIBRATED.
DEFAULT = FusedNormCosts(8.0, 2.0, 14.0, 2.0, "uncalibrated default")
CALIBRATED = DEFAULT


def choose_stage(rows: int, hidden: int, world: int, itemsize: int,
                 costs: FusedNormCosts | None = None) -> int:
    """1 or 2: the stage the model says is faster for one call (1 on ties and for one rank).
    Deterministic in its arguments, so every rank picks the same stage."""
    if world <= 1:
        return 1
    c = costs or CALIBRATED
    nbytes = rows * hidden * itemsize
    return 1 if c.one_stage_us(nbytes, world) <= c.two_stage_us(nbytes, world) else 2


def fit(rows: Sequence[tuple[int, int, int, float]], source: str) -> FusedNormCosts:
    """Least-squares fit of both lines from (stages, nbytes, world, measured_us) rows (at least
    two distinct volumes per stage); negative slopes or intercepts are clamped at 0."""
    out: dict[int, tuple[float, float]] = {}
    for stages in (1, 2):
        pts = [(_volume(stages, n, w), t) for s, n, w, t in rows if s == stages]
        if len({v for v, _ in pts}) < 2:
            raise ValueError(f"fit: need two distinct sizes measured for stage {stages}")
        k = len(pts)
        mx = sum(v for v, _ in pts) / k
        my = sum(t for _, t in pts) / k
        sxx = sum((v - mx) ** 2 for v, _ in pts)
        slope = max(0.0, sum((v - mx) * (t - my) for v, t in pts) / sxx)
        out[stages] = (max(0.0, my - slope * mx), slope)
    return FusedNormCosts(out[1][0], out[1][1], out[2][0], out[2][1], source)


def _volume(stages: int, nbytes: int, world: int) -> float:
    """MB of the model's volume term for one call."""
    return (world if stages == 1 else 1 + 2 * (world - 1) / world) * nbytes / 1e6
