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

from collections.abc import Sequence

import numpy as np

from hiercoll.collectives import Kind
from hiercoll.planner.builder import Dep, RankBuilder, avg_scale, ceil_div, chunk_bounds
from hiercoll.planner.context import Algorithm, BaseParams, PlanContext, node_period
from hiercoll.planner.labels import Label, RingAgLabel, RingOwnLabel, RingRsFinalLabel, RingRsLabel
from hiercoll.schedule import OpKind, Region
from hiercoll.schedule_arrays import I64, OpArrays, Proto, gather

ARRAY_BLOCK_OPS = 1 << 20     # op_arrays builds this many ops at a time (bounds its temporaries)

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

    # ---- the array form (schedule_arrays): the ops above without an Op per op ----------------
    def op_arrays(self, ctx: PlanContext[BaseParams], ranks: Sequence[int]) -> OpArrays | None:
        """`ranks`' ops as arrays, by the index layout above: what `build_rank` emits, op for
        op (tests/test_sim_compiled_build.py compares them). A world of one rank (its final
        reduce is a copy) is left to the built ops."""
        if ctx.world < 2 or not ranks:
            return None
        per_rank = self._ops_per_rank(ctx)
        block = max(1, ARRAY_BLOCK_OPS // per_rank)
        n = per_rank * len(ranks)            # an op has at most two deps
        return gather((self._arrays_block(ctx, list(ranks[i:i + block])) for i in range(0, len(ranks), block)),
                      n, 2 * n)

    def _ops_per_rank(self, ctx: PlanContext[BaseParams]) -> int:
        w, k, kind = ctx.world, self.pieces(ctx), ctx.spec.kind
        rs = w * k if kind in (Kind.REDUCE_SCATTER, Kind.ALL_REDUCE) else 0
        ag = ((w - 1) * k + (k if kind == Kind.ALL_GATHER else 0)
              if kind in (Kind.ALL_GATHER, Kind.ALL_REDUCE) else 0)
        return rs + ag

    def _arrays_block(self, ctx: PlanContext[BaseParams], ranks: list[int]) -> OpArrays:
        """One block of ranks: every op a (rank, step, piece) cell of a few 3-d arrays."""
        w, k, chans, kind = ctx.world, self.pieces(ctx), ctx.params.channels, ctx.spec.kind
        g = ctx.topology.gpus_per_node
        do_rs = kind in (Kind.REDUCE_SCATTER, Kind.ALL_REDUCE)
        do_ag = kind in (Kind.ALL_GATHER, Kind.ALL_REDUCE)
        gather_only = kind == Kind.ALL_GATHER
        nr = len(ranks)
        rk = np.array(ranks, np.int64)
        # RingOrder of every channel as tables: rank_at[ch, pos], pos_of[ch, rank]
        starts = [RingOrder(ctx, ch).start for ch in range(chans)]
        node, j = np.divmod(np.arange(w, dtype=np.int64), g)
        rank_at = np.stack([node * g + (st + j) % g for st in starts])
        pos_of = np.stack([node * g + (j - st) % g for st in starts])
        # _piece's count: chunk c of the owner's shard
        shard_n = np.array([ctx.spec.shard(o)[1] for o in range(w)], np.int64)
        cvec = np.arange(k, dtype=np.int64)
        base, extra = np.divmod(shard_n, k)
        piece_n = base[:, None] + (cvec[None, :] < extra[:, None])          # (owner, piece)
        ch_c = cvec % chans                                                  # piece -> channel
        pos = pos_of[ch_c[None, :], rk[:, None]]                             # (rank, piece)
        nxt = rank_at[ch_c[None, :], (pos + 1) % w]
        prv = rank_at[ch_c[None, :], (pos - 1) % w]
        steps = np.arange(w - 1, dtype=np.int64)[None, :, None]             # (1, step, 1)

        def owner_counts(back: int) -> I64:   # (rank, step, piece): the piece of pos - s - back
            owner = rank_at[ch_c[None, None, :], (pos[:, None, :] - steps - back) % w]
            out: I64 = piece_n[owner, cvec[None, None, :]]
            return out

        shape3 = (nr, w - 1, k)

        def bc(v: object) -> I64:           # broadcast onto every (rank, step, piece)
            out: I64 = np.broadcast_to(np.asarray(v, np.int64), shape3)
            return out

        first, later = steps == 0, steps >= 2
        idx_prev = (steps - 1) * k + cvec                                   # (1, step, piece)
        # blocks in index order, each (rank, rows, piece) arrays: (prototype type, count, dep 0
        # rank, dep 0 index, dep 1 rank, dep 1 index), rank -1 for no dependency. Types: 0 copy
        # to the ring successor, 1 reduce into it, 2 reduce into my output, 3 copy into it
        blocks: list[tuple[I64, ...]] = []
        fin = (nr, 1, k)
        no_dep = np.full(fin, -1, np.int64)
        mine = np.broadcast_to(piece_n[rk][:, None, :], fin)
        if do_rs:
            blocks.append((bc(np.where(first, 0, 1)), owner_counts(1),
                           bc(np.where(later, nxt[:, None, :], -1)), bc(np.where(later, idx_prev, -1)),
                           bc(np.where(first, -1, prv[:, None, :])), bc(np.where(first, -1, idx_prev))))
            blocks.append((np.full(fin, 2, np.int64), mine, no_dep, no_dep,
                           prv[:, None, :], np.broadcast_to((w - 2) * k + cvec, fin)))
        if do_ag:
            if gather_only:
                blocks.append((np.full(fin, 3, np.int64), mine, no_dep, no_dep, no_dep, no_dep))
            ag_base = k if gather_only else w * k
            own_r = -1 if gather_only else rk[:, None, None]
            own_i = -1 if gather_only else (w - 1) * k + cvec
            blocks.append((bc(0), owner_counts(0), bc(-1), bc(-1),
                           bc(np.where(first, own_r, prv[:, None, :])),
                           bc(np.where(first, own_i, ag_base + idx_prev))))
        cols = [np.concatenate([b[i].reshape(nr, -1) for b in blocks], axis=1) for i in range(6)]
        ptype, count, d0r, d0i, d1r, d1i = cols
        per_rank = ptype.shape[1]
        rows_ch = np.tile(np.concatenate([ch_c] * (per_rank // k)), nr)
        # a prototype per (rank, ring channel, type): ring channel of piece c is c % chans
        proto = ((np.arange(nr, dtype=np.int64)[:, None] * chans + rows_ch.reshape(nr, -1)) * 4
                 + ptype).reshape(-1)
        protos: list[Proto] = []
        for r in ranks:
            for ch in range(chans):
                nx = int(rank_at[ch, (pos_of[ch, r] + 1) % w])
                protos += [Proto(OpKind.COPY, r, nx, (r,), False), Proto(OpKind.REDUCE, r, nx, (r, r), False),
                           Proto(OpKind.REDUCE, r, r, (r, r), False), Proto(OpKind.COPY, r, r, (r,), False)]
        dep_r = np.stack([d0r.reshape(-1), d1r.reshape(-1)], axis=1)
        dep_i = np.stack([d0i.reshape(-1), d1i.reshape(-1)], axis=1)
        has = dep_r >= 0
        dep_ptr = np.zeros(len(proto) + 1, np.int64)
        np.cumsum(has.sum(axis=1), out=dep_ptr[1:])
        i32 = np.int32
        return OpArrays(ranks=ranks, lens=np.full(nr, per_rank, np.int64), protos=protos, proto=proto.astype(i32),
                        channel=rows_ch.astype(i32), count=count.reshape(-1), dep_ptr=dep_ptr,
                        dep_rank=dep_r[has].astype(i32), dep_index=dep_i[has].astype(i32))
