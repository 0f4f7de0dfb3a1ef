"""Cost model of the fused all-reduce + residual add + RMSNorm kernels, and the stage choice.

Pure Python, no torch: the executor asks it which stage to launch, the planner/simulator side can
price the op, and `bench/fused_norm.py --fit` refits it from measured rows.

Per rank, with S = rows x hidden x itemsize (the bytes of x) and W ranks:
- 1-stage: every rank reduces every row, reading W x S (one sync): t1 = a1 + b1 * W * S;
- 2-stage: a rank reduces its 1/W of the rows from W ranks (S) and gathers the other rows'
  sums ((W-1)/W S), with two syncs: t2 = a2 + b2 * (1 + (W-1)/W) * S;
- unfused (stage 0, the fallback where fusion cannot win): NCCL's all-reduce of x, then torch's
  add and RMSNorm: t0 = a0 + b0 * S. Fitted on the same run's unfused rows; without them
  (a0 = inf) the fallback is never picked.
- LL (stage 3, `fused_norm_abi.LL_STAGE`): 1-stage's rows pushed as flagged words, no signal and
  no barrier: t3 = a3 + b3 * W * S, only where the LL form applies (`ll_applies`: 16-bit, even
  hidden, small x); never picked without a fit of it (a3 = inf).
The fixed terms (a: launch + syncs) favour 1-stage for small S, the volume terms 2-stage for large
S. The constants are fitted on measured per-call times of both stages forced (p50 of CUDA-event
times); `CALIBRATED` names where they came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The LL form's stage number (the kernels' `fused_norm_abi.LL_STAGE`: the simulator may not import
# the kernels, a test keeps the two equal).
LL_STAGE = 3


@dataclass(frozen=True)
class FusedNormCosts:
    a1_us: float        # 1-stage fixed cost (launch, one signal round)
    b1_us_per_mb: float  # 1-stage: microseconds per MB (1e6 bytes) of reduced volume W*S
    a2_us: float        # 2-stage fixed cost (launch, two signal rounds)
    b2_us_per_mb: float  # 2-stage: microseconds per MB of (1 + (W-1)/W) * S
    source: str         # provenance: machine, command, date
    a0_us: float = float("inf")   # unfused fixed cost (NCCL all-reduce + add + norm launches)
    b0_us_per_mb: float = 0.0     # unfused: microseconds per MB of S
    measured_up_to: int | None = None   # bytes of x of the largest measured shape (None: any)
    a3_us: float = float("inf")   # LL fixed cost (launch, one link crossing; no signal round)
    b3_us_per_mb: float = 0.0     # LL: microseconds per MB of W*S (twice the bytes on the wire)

    def unfused_us(self, nbytes: int, world: int) -> float:
        return self.a0_us + self.b0_us_per_mb * nbytes / 1e6

    def one_stage_us(self, nbytes: int, world: int) -> float:
        return self.a1_us + self.b1_us_per_mb * world * nbytes / 1e6

    def two_stage_us(self, nbytes: int, world: int) -> float:
        return self.a2_us + self.b2_us_per_mb * (1 + (world - 1) / world) * nbytes / 1e6

    def ll_us(self, nbytes: int, world: int) -> float:
        return self.a3_us + self.b3_us_per_mb * world * nbytes / 1e6

    def predict_us(self, stages: int, nbytes: int, world: int) -> float:
        how = {0: self.unfused_us, 1: self.one_stage_us, 2: self.two_stage_us,
               LL_STAGE: self.ll_us}[stages]
        return how(nbytes, world)


# Uncalibrated guesses (what picked the stages of the committed bench and stress runs).
DEFAULT = FusedNormCosts(8.0, 2.0, 14.0, 2.0, "uncalibrated default")
# `python bench/fused_norm.py --refit bench/results/fused_norm/fused_norm.json`: every rank on one
# H200 (the ranks share its SMs and HBM, so this is the kernels' cost there, not NVLink's); median
# relative error 0.10, max 0.34 (hidden 2880 rows cost more per byte than the model says: a row is
# padded to 4096 lanes); picks the faster stage for 26/26 shapes (crossover ~0.5-1 MB at W=4).
# Multi-GPU worlds: refit from a torchrun bench before trusting the crossover there.
CALIBRATED = FusedNormCosts(
    a1_us=12.61, b1_us_per_mb=7.939, a2_us=20.99, b2_us_per_mb=7.896,
    source="relative least-squares fit of the p50 of both stages forced, 26 shapes, world 4, "
           "every rank on one NVIDIA H200 (torch 2.11.0+cu130, triton 3.6), "
           "bench/results/fused_norm/fused_norm.json, 2026-11-25")


def costs_for(world: int) -> FusedNormCosts:
    """The constants measured at this many GPUs (one process per GPU), else the one-GPU fit."""
    return CALIBRATED_BY_WORLD.get(world, CALIBRATED)


def choose_stage(rows: int, hidden: int, world: int, itemsize: int,
                 costs: FusedNormCosts | None = None, ll: bool = False) -> int:
    """0 (unfused), 1, 2 or 3 (LL): the path the model says is fastest for one call (the fused
    stages win ties; 1 for one rank); LL only where `ll` says the LL form can run the call
    (`executor/cuda/fused_norm.stage_choice` asks the kernels' rule); 0 above the largest measured
    size when the fit has an unfused line (a line fitted on small calls says little about
    large ones). Deterministic in its arguments, so every rank picks the same."""
    if world <= 1:
        return 1
    c = costs or costs_for(world)
    nbytes = rows * hidden * itemsize
    if c.measured_up_to is not None and nbytes > c.measured_up_to and c.a0_us < float("inf"):
        return 0    # the fused kernel was never timed this large here: run what users run
    times = {1: c.one_stage_us(nbytes, world), 2: c.two_stage_us(nbytes, world),
             0: c.unfused_us(nbytes, world)}
    if ll:
        times[LL_STAGE] = c.ll_us(nbytes, world)
    return min(times, key=lambda k: (times[k], k == 0, k))


def fit(rows: Sequence[tuple[int, int, int, float]], source: str) -> FusedNormCosts:
    """Fit both lines from (stages, nbytes, world, measured_us) rows (at least two distinct
    volumes per stage), least squares on the *relative* error (weights 1/t^2): sizes span five
    decades, and a plain fit lets the largest rows set the fixed terms, which decide the small
    sizes and the crossover. Negative slopes or intercepts are clamped at 0."""
    out: dict[int, tuple[float, float]] = {}
    for stages in (0, 1, 2, LL_STAGE):
        pts = [(_volume(stages, n, w), t) for s, n, w, t in rows if s == stages and t > 0]
        if stages in (0, LL_STAGE) and not pts:
            out[stages] = (float("inf"), 0.0)      # not measured: never picked
            continue
        if len({v for v, _ in pts}) < 2:
            raise ValueError(f"fit: need two distinct sizes measured for stage {stages}")
        ws = [1 / t ** 2 for _, t in pts]
        sw = sum(ws)
        mx = sum(w * v for w, (v, _) in zip(ws, pts, strict=True)) / sw
        my = sum(w * t for w, (_, t) in zip(ws, pts, strict=True)) / sw
        sxx = sum(w * (v - mx) ** 2 for w, (v, _) in zip(ws, pts, strict=True))
        sxy = sum(w * (v - mx) * (t - my) for w, (v, t) in zip(ws, pts, strict=True))
        slope = max(0.0, sxy / sxx)
        out[stages] = (max(0.0, my - slope * mx), slope)
    return FusedNormCosts(out[1][0], out[1][1], out[2][0], out[2][1], source, out[0][0],
                          out[0][1], max(n for _, n, _, _ in rows), out[LL_STAGE][0],
                          out[LL_STAGE][1])


def _volume(stages: int, nbytes: int, world: int) -> float:
    """MB of the model's volume term for one call."""
    return {0: 1.0, 1: world, 2: 1 + (world - 1) / world,
            LL_STAGE: world}[stages] * nbytes / 1e6


# Across GPUs (one process per GPU), by world size: `bench/fused_norm.py --group --fit` on the
# lent H200s (bench/results/gpu/fused_norm_multi/, NVLS off, torch 2.11.0+cu130, triton 3.6).
def _fitted_on_h200(world: int, a1: float, b1: float, a2: float, b2: float, a0: float,
                    b0: float, up_to: int, run: str, what: str, commit: str,
                    date: str, a3: float = float("inf"), b3: float = 0.0) -> FusedNormCosts:
    """One across-GPU fit of the lent H200s (relative least squares of the p50 of each path:
    the fused forms forced, NCCL all-reduce + add + RMSNorm; the kernel of `commit`)."""
    return FusedNormCosts(a1, b1, a2, b2, f"fit of {what}, one process per GPU, {world} x NVIDIA "
                          f"H200, commit {commit}, bench/results/gpu/fused_norm_multi/{run}, "
                          f"{date}", a0, b0, up_to, a3, b3)


CALIBRATED_BY_WORLD: dict[int, FusedNormCosts] = {
    # the first run with the LL form (stage 3, M <= 16 measured): LL for decode shapes, 1-stage
    # at M = 64-128, NCCL + add + norm from M = 512 (where the fused stages measured slower)
    4: _fitted_on_h200(4, 12.863, 2.7239, 23.533, 3.9382, 20.563, 6.3450, 134217728,
                       "ll-w4/fused_norm_multi", "26 shapes (picks the measured fastest path for "
                       "23, worst pick 1.03x)", "93a2cfc", "2026-11-28", a3=8.7601, b3=6.4656),
    # the same with the LL form at 2 GPUs: fused at every shape (LL for decode shapes, 1-stage
    # to M = 2048 of 4096, 2-stage above)
    2: _fitted_on_h200(2, 9.5326, 1.9296, 15.389, 2.4785, 15.479, 5.3263, 134217728,
                       "ll-w2/fused_norm_multi", "26 shapes (picks the faster path for 25/26)",
                       "4b849d5", "2026-11-28", a3=5.7192, b3=7.1968),
}
