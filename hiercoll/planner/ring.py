"""Ring reduce-scatter / all-gather / all-reduce (the bandwidth-optimal flat baseline).

Rank r sends to r+1. Reduce-scatter step s: r folds its block (r-s-1) into what it received and
pushes the partial into r+1's receive slot; after W-1 steps shard r is complete on rank r. Two
receive slots per chunk, reused with a credit dependency (the writer waits until the reader
consumed the slot's previous content), so scratch stays 2 shards whatever the world size.
"""

from __future__ import annotations

from hiercoll.collectives import Kind, ReduceOp
from hiercoll.planner.builder import Dep, Label, RankBuilder, ceil_div, chunk_bounds
from hiercoll.planner.context import Algorithm, PlanContext, node_period
from hiercoll.schedule import Region

RECV = "ring_recv"


class Ring(Algorithm):
    name = "ring"
    kinds = frozenset({Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_REDUCE})

    def symmetry_period(self, ctx: PlanContext) -> int | None:
        return node_period(ctx)  # the ring is rotation-invariant

    def build_rank(self, ctx: PlanContext, b: RankBuilder) -> None:
        if ctx.spec.kind in (Kind.REDUCE_SCATTER, Kind.ALL_REDUCE):
            self._reduce_scatter(ctx, b)
        if ctx.spec.kind in (Kind.ALL_GATHER, Kind.ALL_REDUCE):
            self._all_gather(ctx, b)

    # index layout: RS steps (W-1)*chunks, RS finals chunks, AG own copies, AG steps
    def index_of(self, ctx: PlanContext, rank: int, label: Label) -> int:
        w, k = ctx.world, ctx.params.chunks
        phase, *rest = label  # type: ignore[misc]
        rs = ctx.spec.kind in (Kind.REDUCE_SCATTER, Kind.ALL_REDUCE)
        rs_len = (w * k) if rs else 0
        if phase == "rs":
            return rest[0] * k + rest[1]
        if phase == "rsf":
            return (w - 1) * k + rest[0]
        own = 0 if ctx.spec.kind == Kind.ALL_REDUCE else k
        if phase == "own":
            return rest[0]
        if phase == "ag":
            return rs_len + own + rest[0] * k + rest[1]
        raise KeyError(label)

    def _piece(self, ctx: PlanContext, block: int, c: int) -> tuple[int, int]:
        off, n = ctx.spec.shard(block % ctx.world)
        coff, cn = chunk_bounds(n, ctx.params.chunks, c)
        return off + coff, cn

    def _slot(self, ctx: PlanContext, rank: int, step: int, c: int) -> Region:
        k = ctx.params.chunks
        width = ceil_div(ceil_div(ctx.spec.count, ctx.world), k)
        _, n = self._piece(ctx, rank - step - 2, c)  # block received at `step` by `rank`
        return Region(rank, RECV, ((step % 2) * k + c) * width, n)

    def _reduce_scatter(self, ctx: PlanContext, b: RankBuilder) -> None:
        r, w, k = b.rank, ctx.world, ctx.params.chunks
        nxt, prv = (r + 1) % w, (r - 1) % w
        width = ceil_div(ceil_div(ctx.spec.count, w), k)
        scale = 1.0 / w if ctx.spec.reduce_op == ReduceOp.AVG else 1.0
        if w > 1:
            b.alloc(RECV, 2 * k * width)
        for s in range(w - 1):
            for c in range(k):
                off, n = self._piece(ctx, r - s - 1, c)
                dst = self._slot(ctx, nxt, s, c)
                deps: list[Dep | int] = [Dep(nxt, ("rs", s - 1, c))] if s >= 2 else []
                ch = c % ctx.params.channels
                if s == 0:
                    b.copy(ctx.input(r, off, n), dst, channel=ch, deps=deps, label=("rs", s, c))
                else:
                    deps.append(Dep(prv, ("rs", s - 1, c)))
                    b.reduce([ctx.input(r, off, n), self._slot(ctx, r, s - 1, c)], dst,
                             channel=ch, deps=deps, label=("rs", s, c))
        shard_off = ctx.spec.shard(r)[0] if ctx.spec.kind == Kind.ALL_REDUCE else 0
        for c in range(k):
            off, n = self._piece(ctx, r, c)
            out = ctx.output(r, off - ctx.spec.shard(r)[0] + shard_off, n)
            srcs = [ctx.input(r, off, n)]
            deps = []
            if w > 1:
                srcs.append(self._slot(ctx, r, w - 2, c))
                deps.append(Dep(prv, ("rs", w - 2, c)))
            b.reduce(srcs, out, scale=scale, channel=c % ctx.params.channels, deps=deps,
                     label=("rsf", c))

    def _all_gather(self, ctx: PlanContext, b: RankBuilder) -> None:
        r, w, k = b.rank, ctx.world, ctx.params.chunks
        nxt, prv = (r + 1) % w, (r - 1) % w
        gather_only = ctx.spec.kind == Kind.ALL_GATHER
        if gather_only:
            for c in range(k):
                off, n = self._piece(ctx, r, c)
                b.copy(ctx.input(r, off - ctx.spec.shard(r)[0], n), ctx.output(r, off, n),
                       channel=c % ctx.params.channels, label=("own", c))
        for s in range(w - 1):
            for c in range(k):
                off, n = self._piece(ctx, r - s, c)
                ch = c % ctx.params.channels
                if s == 0:
                    src = (ctx.input(r, off - ctx.spec.shard(r)[0], n) if gather_only
                           else ctx.output(r, off, n))
                    deps: list[Dep | int] = [] if gather_only else [Dep(r, ("rsf", c))]
                else:
                    src = ctx.output(r, off, n)
                    deps = [Dep(prv, ("ag", s - 1, c))]
                b.copy(src, ctx.output(nxt, off, n), channel=ch, deps=deps, label=("ag", s, c))
