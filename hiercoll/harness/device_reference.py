"""The naive reference of the four flat collectives on the device, in float64, with the same
per-element bound as `collectives.tolerance`.

Why a second reference: a one-GPU stress run holds every rank's input in one process, and at
tens of MiB per rank the numpy reference (float64 on one CPU core) costs seconds per iteration,
so large shapes would get a handful of iterations. Small shapes keep the numpy reference; a test
checks that both agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hiercoll.collectives import CollectiveSpec, Kind, combine

COVERED = (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_TO_ALL)


@dataclass(frozen=True)
class DeviceExpected:
    outputs: list[torch.Tensor]      # float64, per rank
    bounds: list[torch.Tensor]       # float64, per element: |result - exact| must stay below


def device_expected(spec: CollectiveSpec, inputs: list[torch.Tensor]) -> DeviceExpected:
    """Every rank's expected output from every rank's input (all on one device)."""
    if spec.kind not in COVERED:
        raise ValueError(f"device reference: {spec.kind.value} is not covered; use numpy")
    w = spec.world_size
    x = [t.to(torch.float64) for t in inputs]
    if spec.kind in (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER):
        stack = torch.stack(x)
        full, absum, terms = combine(spec.reduce_op, stack, torch), stack.abs().sum(dim=0), w
        if spec.kind == Kind.ALL_REDUCE:
            outs, sums = [full] * w, [absum] * w
        else:
            parts = [spec.shard(r) for r in range(w)]
            outs = [full[o:o + n] for o, n in parts]
            sums = [absum[o:o + n] for o, n in parts]
    elif spec.kind == Kind.ALL_GATHER:
        full, terms = torch.cat(x), 1
        outs, sums = [full] * w, [full.abs()] * w
    else:
        blk, terms = spec.count // w, 1
        outs = [torch.cat([x[s][d * blk:(d + 1) * blk] for s in range(w)]) for d in range(w)]
        sums = [o.abs() for o in outs]
    bounds = [spec.dtype.eps * (terms + 1) * s + 1e-300 for s in sums]
    return DeviceExpected(outs, bounds)
