"""Ring reduce-scatter / all-gather / all-reduce (the bandwidth-optimal flat baseline).

Each channel runs its own ring over its own slice of every block (pieces = chunks x channels,
piece p on channel p % channels). On several nodes the rings are rail-rotated like NCCL's: the
ring of channel ch visits each node's GPUs starting at local rank ch*L/channels, so it leaves
every node from a different GPU and therefore through a different NIC; with channels = L every
NIC carries one ring.

Reduce-scatter step s: the rank at ring position q folds block (q-s-1) into what it received
and pushes the partial into its successor's receive slot; after W-1 steps each block is
complete on its owner. Two receive slots per piece, reused with a credit dependency (the writer
waits until the reader consumed the slot's previous content), so scratch stays 2 shards.
"""

from __future__ import annotations

from hiercoll.collectives import Kind
from hiercoll.planner.builder import Dep, RankBuilder, avg_scale, ceil_div, chunk_bounds
from hiercoll.planner.context import Algorithm, BaseParams, PlanContext, node_period
from hiercoll.planner.labels import Label, RingAgLabel, RingOwnLabel, RingRsFinalLabel, RingRsLabel
from hiercoll.schedule import Region

RECV = "ring_recv"


class RingOrder:
    """Ring positions of one channel: rank <-> position, rail-rotated inside each node."""

    def __init__(self, ctx: PlanContext[BaseParams], channel: int):
        t = ctx.topology
        self.world, self.gpus = ctx.world, t.gpus_per_node
        self.start = (channel * self.gpus) // ctx.params.channels if t.num_nodes > 1 else 0

    def rank_at(self, pos: int) -> int:
        pos %= self.world
        node, j = divmod(pos, self.gpus)
        return node * self.gpus + (self.start + j) % self.gpus

    def pos_of(self, rank: int) -> int:
        node, lr = divmod(rank, self.gpus)
        return node * self.gpus + (lr - self.start) % self.gpus


class Ring(Algorithm[BaseParams]):
    name = "ring"
    kinds = frozenset({Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_REDUCE})
    Params = BaseParams
    channels_carry_chunks = False

    def symmetry_period(self, ctx: PlanContext[BaseParams]) -> int | None:
        return node_period(ctx)  # rail-rotated rings are invariant under a shift by one node

    def build_rank(self, ctx: PlanContext[BaseParams], b: RankBuilder) -> None:
        if ctx.spec.kind in (Kind.REDUCE_SCATTER, Kind.ALL_REDUCE):
            self._reduce_scatter(ctx, b)
        if ctx.spec.kind in (Kind.ALL_GATHER, Kind.ALL_REDUCE):
            self._all_gather(ctx, b)

    @staticmethod
    def pieces(ctx: PlanContext[BaseParams]) -> int:
        return ctx.params.chunks * ctx.params.channels

    # index layout: RS steps (W-1)*k, RS finals k, AG own copies k (all_gather only), AG steps
    def index_of(self, ctx: PlanContext[BaseParams], rank: int, label: Label) -> int:
        w, k = ctx.world, self.pieces(ctx)
        if isinstance(label, RingRsLabel):
            return label.step * k + label.piece
        if isinstance(label, RingRsFinalLabel):
            return (w - 1) * k + label.piece
        if isinstance(label, RingOwnLabel):
            return label.piece
        if isinstance(label, RingAgLabel):
            rs_len = w * k if ctx.spec.kind in (Kind.REDUCE_SCATTER, Kind.ALL_REDUCE) else 0
            own = 0 if ctx.spec.kind == Kind.ALL_REDUCE else k
            return rs_len + own + label.step * k + label.piece
        raise KeyError(label)

    def _piece(self, ctx: PlanContext[BaseParams], owner: int, c: int) -> tuple[int, int]:
        off, n = ctx.spec.shard(owner)
        coff, cn = chunk_bounds(n, self.pieces(ctx), c)
        return off + coff, cn

    def _slot(self, ctx: PlanContext[BaseParams], ring: RingOrder, rank: int, step: int, c: int) -> Region:
        k = self.pieces(ctx)
        width = ceil_div(ceil_div(ctx.spec.count, ctx.world), k)   # cheap: count is cached
        owner = ring.rank_at(ring.pos_of(rank) - step - 2)   # block received at `step`
        _, n = self._piece(ctx, owner, c)
        return Region(rank, RECV, ((step % 2) * k + c) * width, n)

    def _reduce_scatter(self, ctx: PlanContext[BaseParams], b: RankBuilder) -> None:
        r, w, k, chans = b.rank, ctx.world, self.pieces(ctx), ctx.params.channels
        width = ceil_div(ceil_div(ctx.spec.count, w), k)
        scale = avg_scale(ctx.spec, w)
        rings = [RingOrder(ctx, ch) for ch in range(chans)]
        if w > 1:
            b.alloc(RECV, 2 * k * width)
        for s in range(w - 1):
            for c in range(k):
                ring = rings[c % chans]
                pos = ring.pos_of(r)
                nxt, prv = ring.rank_at(pos + 1), ring.rank_at(pos - 1)
                off, n = self._piece(ctx, ring.rank_at(pos - s - 1), c)
                dst = self._slot(ctx, ring, nxt, s, c)
                deps: list[Dep | int] = [Dep(nxt, RingRsLabel(s - 1, c))] if s >= 2 else []
                if s == 0:
                    b.copy(ctx.input(r, off, n), dst, channel=c % chans, deps=deps, label=RingRsLabel(s, c))
                else:
                    deps.append(Dep(prv, RingRsLabel(s - 1, c)))
                    b.reduce([ctx.input(r, off, n), self._slot(ctx, ring, r, s - 1, c)], dst,
                             channel=c % chans, deps=deps, label=RingRsLabel(s, c))
        shard_off = ctx.spec.shard(r)[0] if ctx.spec.kind == Kind.ALL_REDUCE else 0
        for c in range(k):
            ring = rings[c % chans]
            off, n = self._piece(ctx, r, c)
            srcs = [ctx.input(r, off, n)]
            deps = []
            if w > 1:
                srcs.append(self._slot(ctx, ring, r, w - 2, c))
                deps.append(Dep(ring.rank_at(ring.pos_of(r) - 1), RingRsLabel(w - 2, c)))
            b.reduce(srcs, ctx.output(r, off - ctx.spec.shard(r)[0] + shard_off, n), scale=scale,
                     channel=c % chans, deps=deps, label=RingRsFinalLabel(c))

    def _all_gather(self, ctx: PlanContext[BaseParams], b: RankBuilder) -> None:
        r, w, k, chans = b.rank, ctx.world, self.pieces(ctx), ctx.params.channels
        gather_only = ctx.spec.kind == Kind.ALL_GATHER
        my_off = ctx.spec.shard(r)[0]
        rings = [RingOrder(ctx, ch) for ch in range(chans)]
        if gather_only:
            for c in range(k):
                off, n = self._piece(ctx, r, c)
                b.copy(ctx.input(r, off - my_off, n), ctx.output(r, off, n),
                       channel=c % chans, label=RingOwnLabel(c))
        for s in range(w - 1):
            for c in range(k):
                ring = rings[c % chans]
                pos = ring.pos_of(r)
                nxt, prv = ring.rank_at(pos + 1), ring.rank_at(pos - 1)
                off, n = self._piece(ctx, ring.rank_at(pos - s), c)
                if s == 0:
                    src = ctx.input(r, off - my_off, n) if gather_only else ctx.output(r, off, n)
                    deps: list[Dep | int] = [] if gather_only else [Dep(r, RingRsFinalLabel(c))]
                else:
                    src = ctx.output(r, off, n)
                    deps = [Dep(prv, RingAgLabel(s - 1, c))]
                b.copy(src, ctx.output(nxt, off, n), channel=c % chans, deps=deps,
                       label=RingAgLabel(s, c))
