"""Do ranks that must hold the same output hold the same bits? (collectives.SHARED_OUTPUT)

The numeric side of the rank-identical property (sim/reduction_order.py proves it of a plan;
this checks what a backend actually produced). All ranks in one process (one-GPU runs) compare
their outputs directly; processes compare a 48-bit fingerprint of each rank's output bytes with
one all-gather (a false "identical" needs a hash collision: about 2^-48 per call).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist

from hiercoll.collectives import SHARED_OUTPUT, CollectiveSpec


def shares_outputs(spec: CollectiveSpec) -> bool:
    """Whether the property applies: ranks hold the same output elements."""
    return spec.kind in SHARED_OUTPUT and spec.world_size > 1


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals NaN, -0.0 differs from +0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def fingerprint(t: torch.Tensor) -> int:
    """48 bits of a hash of `t`'s bytes (exact in a float64, so one all-reduce compares it)."""
    raw = t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=6).digest(), "little")


def first_differing_rank(t: torch.Tensor, device: torch.device, group: Any = None) -> int | None:
    """Collective over the group: the lowest rank whose `t` has other bytes than rank 0's, or
    None when every rank holds the same (48-bit fingerprints, one all-gather)."""
    world = dist.get_world_size(group)
    mine = torch.tensor([float(fingerprint(t))], dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    first = every[0].item()
    return next((r for r in range(1, world) if every[r].item() != first), None)
