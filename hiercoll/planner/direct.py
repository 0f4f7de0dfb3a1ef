"""Direct (one-shot) schedules: every rank talks to every peer, in rank-swizzled order.

Reductions push each peer's piece into a per-source slot of the owner's scratch, then the owner
reduces all slots with its own piece on a separate channel, so chunk c's reduce overlaps chunk
c+1's copies. The owner sums the W pieces in rank order (0, 1, ..., W-1), its own among them: in
an all-reduce every rank sums the whole buffer, and one order is what makes the bits the same on
every rank (sim/reduction_order.py). Swizzle (default on): the node-aware rank-relative order of
builder.swizzled_peers (own node's l+1, l+2, ..., then remote nodes from n+1+l, each from its own
rail), so each step has one writer per destination port instead of everyone writing to rank 0
first, and a node's GPUs do not converge on one remote GPU. The send order is not the reduction
order: owners always sum in rank order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import Field

from hiercoll.collectives import Kind
from hiercoll.planner.builder import Dep, RankBuilder, avg_scale, ceil_div, chunk_bounds, peer_position, swizzled_peers
from hiercoll.planner.context import Algorithm, BaseParams, ParamsT, PlanContext, node_period
from hiercoll.planner.group import build_group_cast, build_group_reduce, group_cast_arrays
from hiercoll.planner.labels import Label, OwnerReduceLabel, PutLabel
from hiercoll.schedule import Region
from hiercoll.schedule_arrays import OpArrays

SLOTS = "direct_recv"


class DirectParams(BaseParams):
    swizzle: bool = Field(default=True, description="rank-relative, node-aware peer order "
                           "(local rank l starts on remote node n+1+l); off: 0, 1, 2, ...")


Block = Callable[[int], tuple[int, int]]


def whole(ctx: PlanContext[ParamsT]) -> Block:
    return lambda owner: (0, ctx.spec.count)


def reduce_into_owners(ctx: PlanContext[DirectParams], b: RankBuilder, block: Block,
                       at_block_offset: bool, root: int | None = None) -> None:
    """Push my piece of every owner's block into its slot, then reduce my own block.

    `block(owner)` is the input range `owner` reduces (its shard, or everything); the result
    lands at that range's offset in the output when `at_block_offset` (two-shot), else at 0.
    With `root`, only the root owns a block (reduce). Labels: PutLabel(c, owner),
    OwnerReduceLabel(c).
    """
    p = ctx.params
    r, w, k = b.rank, ctx.world, p.chunks
    width = ceil_div(block(0)[1], k)  # block 0 is the largest
    if root is None:
        owners = swizzled_peers(r, w, p.swizzle, gpus=ctx.topology.gpus_per_node)
    else:
        owners = [root] if r != root else []
    b.alloc(SLOTS, (w - 1) * k * width)
    scale = avg_scale(ctx.spec, w)
    for c in range(k):
        for q in owners:
            off, n = block(q)
            coff, cn = chunk_bounds(n, k, c)
            b.copy(ctx.input(r, off + coff, cn), _slot(ctx, q, r, c, count=cn, width=width),
                   channel=c % p.channels, label=PutLabel(c, q))
        if root is not None and r != root:
            continue
        off, n = block(r)
        coff, cn = chunk_bounds(n, k, c)
        # sources in rank order on every owner (never "mine first"): an all-reduce's owners all
        # sum the same block, so the same order gives every rank the same bits
        srcs = [ctx.input(r, off + coff, cn) if s == r else _slot(ctx, r, s, c, count=cn, width=width)
                for s in range(w)]
        out = ctx.output(r, (off if at_block_offset else 0) + coff, cn)
        b.reduce(srcs, out, scale=scale, channel=p.channels,
                 deps=[Dep(s, PutLabel(c, r)) for s in range(w) if s != r],
                 label=OwnerReduceLabel(c))


def _slot(ctx: PlanContext[DirectParams], owner: int, src: int, c: int, *, count: int,
          width: int) -> Region:
    slot = (src - owner) % ctx.world - 1
    return Region(owner, SLOTS, (slot * ctx.params.chunks + c) * width, count)


class Direct(Algorithm[DirectParams]):
    name = "direct"
    kinds = frozenset(Kind)
    Params = DirectParams

    def symmetry_period(self, ctx: PlanContext[DirectParams]) -> int | None:
        return node_period(ctx, ctx.params.swizzle)

    def build_rank(self, ctx: PlanContext[DirectParams], b: RankBuilder) -> None:
        kind = ctx.spec.kind
        if kind == Kind.REDUCE_SCATTER:
            reduce_into_owners(ctx, b, ctx.spec.shard, at_block_offset=False)
        elif kind == Kind.ALL_REDUCE:
            reduce_into_owners(ctx, b, whole(ctx), at_block_offset=False)
        elif kind == Kind.REDUCE:
            reduce_into_owners(ctx, b, whole(ctx), at_block_offset=False, root=ctx.spec.root)
        elif kind == Kind.GROUP_CAST:
            build_group_cast(ctx, b, ctx.params.swizzle)
        elif kind == Kind.GROUP_REDUCE:
            build_group_reduce(ctx, b, ctx.params.swizzle)
        else:
            scatter_blocks(ctx, b)

    def op_arrays(self, ctx: PlanContext[DirectParams], ranks: Sequence[int]) -> OpArrays | None:
        """group_cast's ops written as arrays (`group_cast_arrays`); other kinds build ops."""
        if ctx.spec.kind != Kind.GROUP_CAST or not ranks:
            return None
        return group_cast_arrays(ctx, ranks, ctx.params.swizzle)

    def index_of(self, ctx: PlanContext[DirectParams], rank: int, label: Label) -> int:
        if ctx.spec.kind in (Kind.REDUCE_SCATTER, Kind.ALL_REDUCE) and isinstance(label, PutLabel):
            return put_index(ctx, rank, label)
        return super().index_of(ctx, rank, label)


def put_index(ctx: PlanContext[DirectParams], rank: int, label: PutLabel) -> int:
    """Index of PutLabel(chunk, owner) in `reduce_into_owners`' layout: per chunk, W-1 puts in
    visiting order, then the reduce."""
    return label.chunk * ctx.world + peer_position(rank, label.peer, ctx.world, ctx.params.swizzle,
                                                    gpus=ctx.topology.gpus_per_node)


def scatter_blocks(ctx: PlanContext[DirectParams], b: RankBuilder) -> None:
    """all_gather, all_to_all, broadcast: copy a block straight into each peer's output."""
    p = ctx.params
    r, w, spec = b.rank, ctx.world, ctx.spec
    if spec.kind == Kind.BROADCAST and r != spec.root:
        return
    for c in range(p.chunks):
        for q in swizzled_peers(r, w, p.swizzle, include_self=True, gpus=ctx.topology.gpus_per_node):
            if spec.kind == Kind.ALL_GATHER:
                soff, n = 0, spec.shard(r)[1]
                doff = spec.shard(r)[0]
            elif spec.kind == Kind.ALL_TO_ALL:
                n = spec.count // w
                soff, doff = q * n, r * n
            else:  # broadcast
                soff, doff, n = 0, 0, spec.count
            coff, cn = chunk_bounds(n, p.chunks, c)
            # the copy into my own output crosses no link: on a channel of its own it runs
            # beside the pushes instead of before them
            b.copy(ctx.input(r, soff + coff, cn), ctx.output(q, doff + coff, cn),
                   channel=p.channels if q == r else c % p.channels, label=PutLabel(c, q))
