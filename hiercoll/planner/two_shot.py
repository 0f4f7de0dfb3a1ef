"""Two-shot all-reduce: direct reduce-scatter into each owner's slice of the output, then a
direct all-gather of the slices. Moves 2(W-1)/W of S per rank like the ring, in 2 steps."""

from __future__ import annotations

from hiercoll.collectives import Kind
from hiercoll.planner.builder import Dep, RankBuilder, chunk_bounds, swizzled_peers
from hiercoll.planner.context import Algorithm, PlanContext, node_period
from hiercoll.planner.direct import DirectParams, put_index, reduce_into_owners
from hiercoll.planner.labels import Label, OwnerReduceLabel, PutLabel, TwoShotGatherLabel


class TwoShot(Algorithm[DirectParams]):
    name = "two_shot"
    kinds = frozenset({Kind.ALL_REDUCE})
    Params = DirectParams

    def symmetry_period(self, ctx: PlanContext[DirectParams]) -> int | None:
        return node_period(ctx, ctx.params.swizzle)

    def index_of(self, ctx: PlanContext[DirectParams], rank: int, label: Label) -> int:
        if isinstance(label, PutLabel):
            return put_index(ctx, rank, label)
        return super().index_of(ctx, rank, label)

    def build_rank(self, ctx: PlanContext[DirectParams], b: RankBuilder) -> None:
        reduce_into_owners(ctx, b, ctx.spec.shard, at_block_offset=True)
        p = ctx.params
        r = b.rank
        off, n = ctx.spec.shard(r)
        for c in range(p.chunks):
            coff, cn = chunk_bounds(n, p.chunks, c)
            for q in swizzled_peers(r, ctx.world, p.swizzle, gpus=ctx.topology.gpus_per_node):
                b.copy(ctx.output(r, off + coff, cn), ctx.output(q, off + coff, cn),
                       channel=c % p.channels, deps=[Dep(r, OwnerReduceLabel(c))],
                       label=TwoShotGatherLabel(c, q))
