"""Fresh inputs and the independent reference for distributed runs (imports torch).

Two references: `numpy` (every rank draws all ranks' inputs from one seed and compares with
`collectives.reference`, exact tolerance per element; for CPU and small GPU shapes) and
`library` (device-side random inputs, the same collective through the `nccl` pseudo-backend;
a bound from the dtype and world size; for large GPU shapes where numpy would dominate).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch

from hiercoll.collectives import (
    REDUCING,
    WIDE_EXPONENTS,
    CollectiveSpec,
    ReduceOp,
    initial_outputs,
    random_inputs,
    reference,
    tolerance,
)
from hiercoll.executor.torch_dtypes import float64_of, tensor_of, torch_dtype


class RefKind(StrEnum):
    NUMPY = "numpy"         # every rank draws every rank's input in numpy, float64 reference
    LIBRARY = "library"     # the library's own call on the same inputs (NCCL)
    DEVICE = "device"       # every rank draws every rank's input on its GPU (same seeds),
    #                         float64 reference there (`device_reference`)


@dataclass(frozen=True)
class Check:
    """Result of comparing one rank's output: worst |error| and the bound it must stay under."""

    max_abs_error: float
    bound: float
    ok: bool
    first_bad_index: int | None


@dataclass
class NumpyCase:
    """All ranks' inputs/expected outputs for one iteration (identical on every rank)."""

    spec: CollectiveSpec
    inputs: list[np.ndarray]
    outputs_before: list[np.ndarray]
    expected: object

    @staticmethod
    def draw(spec: CollectiveSpec, seed: int) -> NumpyCase:
        rng = np.random.default_rng(seed)
        inputs = random_inputs(spec, rng)
        before = initial_outputs(spec, rng)
        return NumpyCase(spec, inputs, before, reference(spec, inputs, before))

    def tensors(self, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        dt = self.spec.dtype
        return (tensor_of(self.inputs[rank], dt, device),
                tensor_of(self.outputs_before[rank], dt, device))

    def check(self, rank: int, output: torch.Tensor) -> Check:
        got = float64_of(output)
        want = self.expected.outputs[rank]  # type: ignore[attr-defined]
        err = np.abs(got - want)
        tol = tolerance(self.spec, self.expected, rank)  # type: ignore[arg-type]
        bad = ~(err <= tol)
        worst = float(np.max(err)) if err.size else 0.0
        if err.size and np.isnan(err).any():
            worst = float("inf")
        first = int(np.argmax(bad)) if bad.any() else None
        return Check(worst, float(np.max(tol)) if tol.size else 0.0, first is None, first)


def device_inputs(spec: CollectiveSpec, rank: int, device: torch.device,
                  generator: torch.Generator) -> torch.Tensor:
    """Values in +-[0.25, 1) rounded to the dtype: never zeros."""
    n = spec.input_count(rank)
    mag = torch.rand(n, device=device, generator=generator) * 0.75 + 0.25
    sign = torch.randint(0, 2, (n,), device=device, generator=generator) * 2 - 1
    return (mag * sign).to(torch_dtype(spec.dtype))


def device_initial_output(spec: CollectiveSpec, rank: int, device: torch.device,
                          generator: torch.Generator) -> torch.Tensor:
    """`collectives.initial_outputs` of one rank, drawn on the device: NaN where the collective
    overwrites (an element nobody wrote cannot pass), values in [-1, 1) where it accumulates.
    The host version fills every rank's outputs in numpy: at 16384 x 4096 rows on 4 ranks, 1 GB
    and a copy to the device per iteration (those shapes' stress ran 6 cases x 200 iterations in
    a 140 s limit on 4 x H200, about 0.1 s an iteration:
    results/gpu/nvshmem/w4-2x2-graph/stress-tp-large.log; not re-timed since)."""
    n = spec.output_count(rank)
    dt = torch_dtype(spec.dtype)
    if spec.accumulates_output:
        return (torch.rand(n, device=device, generator=generator) * 2 - 1).to(dt)
    return torch.full((n,), float("nan"), dtype=dt, device=device)


def device_wide_inputs(spec: CollectiveSpec, rank: int, device: torch.device,
                       generator: torch.Generator) -> torch.Tensor:
    """`collectives.wide_inputs` drawn on the device: sums that round in fp32, so a second
    summation order shows in the bits (for the ranks-identical check, not for error bounds)."""
    n = spec.input_count(rank)
    lo, hi = WIDE_EXPONENTS
    mag = (torch.rand(n, device=device, generator=generator, dtype=torch.float64) + 1.0) * torch.exp2(
        torch.randint(lo, hi + 1, (n,), device=device, generator=generator).to(torch.float64))
    sign = torch.randint(0, 2, (n,), device=device, generator=generator) * 2 - 1
    return (mag * sign).to(torch_dtype(spec.dtype))


def library_bound(spec: CollectiveSpec) -> float:
    """|ours - library| bound for inputs of magnitude < 1: both round at most W+1 times."""
    if spec.kind not in REDUCING or spec.reduce_op in (ReduceOp.MAX, ReduceOp.MIN):
        return 0.0
    w = spec.world_size
    return 2.0 * spec.dtype.eps * (w + 1) * w


def compare_tensors(got: torch.Tensor, want: torch.Tensor, bound: float | torch.Tensor) -> Check:
    """`bound`: one number, or one per element (reported as its largest)."""
    err = (got.double() - want.double()).abs()
    if isinstance(bound, torch.Tensor):
        top = float(bound.max()) if bound.numel() else 0.0
    else:
        top = float(bound)
    if err.numel() == 0:
        return Check(0.0, top, True, None)
    nan = torch.isnan(err)
    bad = nan | (err > bound)
    worst = float("inf") if bool(nan.any()) else float(err.max())
    first = int(torch.nonzero(bad)[0, 0]) if bool(bad.any()) else None
    return Check(worst, top, first is None, first)
