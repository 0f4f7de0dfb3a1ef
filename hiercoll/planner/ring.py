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
from hiercoll.schedule_arrays import I64, OpArrays, Proto

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
        reduce is a copy) is left to the built ops.

        Every rank runs the same rows: a row's type, piece, channel, dependency slots and the
        ring step back to its block's owner are one template; the rank adds its ring
        neighbours and the pieces' sizes. Blocks of ranks are written straight into the
        result's arrays (no per-block arrays joined afterwards)."""
        if ctx.world < 2 or not ranks:
            return None
        t = _RingTemplate(self, ctx)
        nr, per, nd = len(ranks), t.per_rank, len(t.dep_col)
        n = nr * per
        # one channel, pieces of one size: those columns are one value, read-only views of it
        # (a 4096-GPU ring's 33M rows: 400 MB not written, which is seconds of page faults)
        channel = np.broadcast_to(np.int32(0), (n,)) if t.chans == 1 else np.empty(n, np.int32)
        count = np.broadcast_to(np.int64(t.piece_size), (n,)) if t.same_size else np.empty(n, np.int64)
        out = OpArrays(ranks=list(ranks), lens=np.full(nr, per, np.int64), protos=t.protos(ranks),
                       proto=np.empty(n, np.int32), channel=channel, count=count,
                       dep_ptr=np.empty(n + 1, np.int64), dep_rank=np.empty(nr * nd, np.int32),
                       dep_index=np.empty(nr * nd, np.int32))
        out.dep_ptr[0] = 0
        block = max(1, ARRAY_BLOCK_OPS // per)
        for i in range(0, nr, block):
            t.write(out, i, np.asarray(ranks[i:i + block], np.int64))
        return out


# prototype types, per (rank, ring channel): copy to the ring successor, reduce into it, reduce
# into my output, copy into it
COPY_NEXT, REDUCE_NEXT, REDUCE_MINE, COPY_MINE = range(4)
# a dependency's rank, per row's channel: the ring successor, predecessor, or the rank itself
NEXT, PREV, SELF = range(3)


class _RingTemplate:
    """The rows every rank runs, rank-independent (`Ring.op_arrays`): per row its prototype
    type, piece, channel and how many ring steps back its block's owner is; per dependency
    slot which neighbour (NEXT / PREV / SELF on the row's channel) and which index."""

    def __init__(self, ring: Ring, ctx: PlanContext[BaseParams]):
        w, k, chans, kind = ctx.world, ring.pieces(ctx), ctx.params.channels, ctx.spec.kind
        self.w, self.k, self.chans = w, k, chans
        g = ctx.topology.gpus_per_node
        starts = [RingOrder(ctx, ch).start for ch in range(chans)]
        node, j = np.divmod(np.arange(w, dtype=np.int64), g)
        self.rank_at = np.stack([node * g + (st + j) % g for st in starts])    # [ch, pos]
        self.pos_of = np.stack([node * g + (j - st) % g for st in starts])     # [ch, rank]
        shard_n = np.array([ctx.spec.shard(o)[1] for o in range(w)], np.int64)
        base, extra = np.divmod(shard_n, k)
        piece_n = base[:, None] + (np.arange(k)[None, :] < extra[:, None])   # [owner, piece]
        # [ch, pos, piece]: the piece's size at the rank on ring position pos of channel ch
        self.piece_at = piece_n[self.rank_at]
        self.same_size = int(piece_n.min()) == int(piece_n.max())
        self.piece_size = int(piece_n[0, 0])
        rows: list[tuple[int, int, int, list[tuple[int, int]]]] = []    # type, piece, back, deps
        do_rs = kind in (Kind.REDUCE_SCATTER, Kind.ALL_REDUCE)
        gather_only = kind == Kind.ALL_GATHER
        if do_rs:
            for s in range(w - 1):
                for c in range(k):
                    prev = (s - 1) * k + c
                    deps = [(NEXT, prev), (PREV, prev)] if s >= 2 else [(PREV, prev)] if s == 1 else []
                    rows.append((COPY_NEXT if s == 0 else REDUCE_NEXT, c, s + 1, deps))
            rows += [(REDUCE_MINE, c, 0, [(PREV, (w - 2) * k + c)]) for c in range(k)]
        if kind in (Kind.ALL_GATHER, Kind.ALL_REDUCE):
            if gather_only:
                rows += [(COPY_MINE, c, 0, []) for c in range(k)]
            ag_base = k if gather_only else w * k
            for s in range(w - 1):
                for c in range(k):
                    deps = ([] if gather_only else [(SELF, (w - 1) * k + c)]) if s == 0 \
                        else [(PREV, ag_base + (s - 1) * k + c)]
                    rows.append((COPY_NEXT, c, s, deps))
        self.per_rank = len(rows)
        self.piece = np.array([r[1] for r in rows], np.int64)
        self.chan = self.piece % chans
        self.back = np.array([r[2] for r in rows], np.int64)
        # a row's prototype within its rank's 4 * chans: (ring channel, type)
        self.proto = (self.chan * 4 + np.array([r[0] for r in rows], np.int64)).astype(np.int32)
        self.dep_end = np.cumsum([len(r[3]) for r in rows], dtype=np.int64)     # per row
        slot_ch = np.repeat(self.chan, [len(r[3]) for r in rows])
        kinds = np.array([d[0] for r in rows for d in r[3]], np.int64)
        # column of a rank's neighbour table [next per channel, prev per channel, itself]
        self.dep_col = np.where(kinds == SELF, 2 * chans, kinds * chans + slot_ch)
        self.dep_index = np.array([d[1] for r in rows for d in r[3]], np.int32)

    def protos(self, ranks: Sequence[int]) -> list[Proto]:
        """Per rank, per ring channel, the four prototypes (by type)."""
        out: list[Proto] = []
        for r in ranks:
            for ch in range(self.chans):
                nx = int(self.rank_at[ch, (self.pos_of[ch, r] + 1) % self.w])
                out += [Proto(OpKind.COPY, r, nx, (r,), False), Proto(OpKind.REDUCE, r, nx, (r, r), False),
                        Proto(OpKind.REDUCE, r, r, (r, r), False), Proto(OpKind.COPY, r, r, (r,), False)]
        return out

    def write(self, out: OpArrays, first: int, rk: I64) -> None:
        """Rows of the ranks `rk` (the `first`-th onwards of out's ranks) into out's arrays."""
        per, nd, nr, w = self.per_rank, len(self.dep_col), len(rk), self.w
        lo, hi = first * per, (first + nr) * per
        grid = (nr, per)
        np.add((np.arange(first, first + nr, dtype=np.int32) * (4 * self.chans))[:, None], self.proto,
               out=out.proto[lo:hi].reshape(grid))
        if self.chans > 1:
            out.channel[lo:hi].reshape(grid)[:] = self.chan
        pos = self.pos_of[:, rk].T                                             # [rank, ch]
        if not self.same_size:
            at = (pos[:, self.chan] - self.back) % w                           # [rank, row]
            out.count[lo:hi].reshape(grid)[:] = self.piece_at[self.chan, at, self.piece]
        np.add((first * nd + np.arange(nr, dtype=np.int64) * nd)[:, None], self.dep_end,
               out=out.dep_ptr[lo + 1:hi + 1].reshape(grid))
        if nd:
            chans = np.arange(self.chans)
            nbr = np.concatenate([self.rank_at[chans, (pos + 1) % w], self.rank_at[chans, (pos - 1) % w],
                                  rk[:, None]], axis=1)                        # [rank, column]
            out.dep_rank[first * nd:(first + nr) * nd].reshape(nr, nd)[:] = nbr[:, self.dep_col]
            out.dep_index[first * nd:(first + nr) * nd].reshape(nr, nd)[:] = self.dep_index
