"""Context-parallel causal attention: which KV ranges each rank must receive.

The sequence is split over W ranks. With the contiguous layout rank r holds tokens
[r*T, (r+1)*T); with the zigzag (llama3-style load-balanced) layout it holds chunks r and
2W-1-r of 2W. A causal query chunk q attends to every KV chunk <= q, so a rank needs every
earlier chunk it does not hold. That is a group_cast: a KV chunk's split lists every rank that
needs it, and a rank needing the same chunk on another node is what RDMA de-duplication saves.
"""

from __future__ import annotations

from typing import Literal

from hiercoll.collectives import GroupSplits, RankSplits, Split

Layout = Literal["contiguous", "zigzag"]


def _chunks_of(rank: int, world: int, layout: Layout) -> list[int]:
    return [rank] if layout == "contiguous" else [rank, 2 * world - 1 - rank]


def causal_kv_group_cast(world: int, kv_per_chunk: int, layout: Layout = "contiguous") -> GroupSplits:
    """Splits for gathering the KV each rank's causal queries need (elements per chunk)."""
    owner = {c: r for r in range(world) for c in _chunks_of(r, world, layout)}
    needs: dict[int, list[int]] = {}
    for r in range(world):
        mine = _chunks_of(r, world, layout)
        needs[r] = sorted(c for c in owner if c < max(mine) and c not in mine)
    ranks = []
    for r in range(world):
        # every local chunk stays in the input (a chunk nobody needs goes nowhere: no peers), so
        # a rank's input is exactly its KV block
        inputs = [Split(size=kv_per_chunk, peers=sorted(d for d in range(world) if c in needs[d]))
                  for c in sorted(_chunks_of(r, world, layout))]
        outputs = [Split(size=kv_per_chunk, peers=[owner[c]]) for c in needs[r]]
        ranks.append(RankSplits(input=inputs, output=outputs))
    return GroupSplits(ranks=ranks)
