"""`hier`'s reduce-scatter / all-gather / all-reduce written straight as arrays (schedule_arrays).

An unfolded 4096-GPU `hier` all-reduce has ~8.7k ops a rank (35M ops); building an `Op` per op
(~15 us each) alone ran past a minute. Here every op is a cell of a few numpy grids over a block
of ranks, placed at the index the label formulas (`rs_index`, `ag_index`) give it, so the arrays
are what `build_rank` emits op for op (tests/test_hier_op_arrays.py compares them).

Covered: all of it (either swizzle, one-level or multi-level node orders, rails staged through
gateways when NICs are fewer than GPUs, any chunks / channels / size); other kinds (all_to_all,
group ops) return None and build their ops.

Per rank, a prototype *slot* names what an op's links depend on (gw: the rank's gateway local
rank): local copy to local rank q (slot q), copy from gateway (a, gw) to (t, gw) (slot g + t),
the node reduce into (a, gw) (g + n), the final reduce (g + n + 1), a copy from the gateway to
local rank q (g + n + 2 + q: a staged rank's distribution); only the slots a block uses become
`Proto`s.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from hiercoll.collectives import Kind
from hiercoll.planner.context import PlanContext
from hiercoll.planner.hier.common import HierParams, Place, node_radices
from hiercoll.schedule import OpKind
from hiercoll.schedule_arrays import I64, OpArrays, Proto, gather

ARRAY_BLOCK_OPS = 1 << 20     # ops written per block of ranks (bounds the temporaries)
KINDS = (Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_REDUCE)
Mask = npt.NDArray[np.bool_]
ScalarT = TypeVar("ScalarT", bound=np.generic)


def np_level_add(radices: tuple[int, ...], a: I64, k: I64 | int, sign: int) -> I64:
    """`common.level_add` over arrays: node a with k's mixed-radix digits added or subtracted."""
    out = np.zeros(np.broadcast_shapes(np.shape(a), np.shape(k)), np.int64)
    stride = 1
    for m in radices:
        out += ((a // stride) % m + sign * ((k // stride) % m)) % m * stride
        stride *= m
    return out


@dataclass(frozen=True)
class Layout:
    """The plan's numbers every block reads: sizes, visiting orders by formula, shard counts;
    per local rank (arrays of g) what its gateway staging adds."""

    n: int                     # nodes
    g: int                     # GPUs per node
    k: int                     # chunks
    chans: int
    kind: Kind
    node_swizzle: bool
    rank_swizzle: bool
    radices: tuple[int, ...]
    piece_n: I64               # (rank, chunk) -> elements of chunk c of that rank's shard
    gw: I64                    # local rank -> its gateway's local rank
    staged: I64                # local rank -> 1 when its inter-node traffic is staged (gw != it)

    @staticmethod
    def of(ctx: PlanContext[HierParams]) -> Layout:
        t, p, spec = ctx.topology, ctx.params, ctx.spec
        w, k, g = ctx.world, p.chunks, t.gpus_per_node
        base, extra = divmod(spec.count, w)
        shard = base + (np.arange(w, dtype=np.int64) < extra)
        cb, ce = np.divmod(shard, k)
        piece_n = cb[:, None] + (np.arange(k, dtype=np.int64)[None, :] < ce[:, None])
        pl = Place.of(ctx, 0)
        gw = np.array([pl.gateway_of(x) for x in range(g)], np.int64)
        staged = ((gw != np.arange(g)) & (t.num_nodes > 1)).astype(np.int64)
        return Layout(t.num_nodes, g, k, p.channels, spec.kind, p.node_swizzle, p.rank_swizzle,
                      node_radices(ctx), piece_n, gw, staged)

    # ---- op counts (rs_length, the all-gather's prologue), per local rank -----------------------
    @property
    def extra(self) -> int:
        return 2 if self.g > 1 else 1          # per remote target: node reduce (if L > 1) + send

    @property
    def per_target(self) -> int:
        return self.g - 1 + self.extra

    @property
    def rs_len(self) -> int:
        if self.kind == Kind.ALL_GATHER:
            return 0
        return self.k * ((self.n - 1) * self.per_target + (self.g - 1)) + self.k

    @property
    def gathering(self) -> bool:
        return self.kind == Kind.ALL_GATHER

    @property
    def prologue(self) -> I64:
        """Per local rank: ops per chunk before the sends (own copy, stage, local copies)."""
        out: I64 = int(self.gathering) + self.staged + self.g - 1
        return out

    @property
    def lens(self) -> I64:
        """Per local rank: ops a rank emits."""
        n, g, k = self.n, self.g, self.k
        ag = k * (self.prologue + (n - 1) + (n - 1) * (g - 1 + self.staged))
        out: I64 = np.full(g, self.rs_len, np.int64)
        return out if self.kind == Kind.REDUCE_SCATTER else out + ag

    @property
    def deps(self) -> I64:
        """Per local rank: dependencies of a rank's ops, in all."""
        n, g, k, st = self.n, self.g, self.k, self.staged
        out = np.zeros(g, np.int64)
        if self.kind != Kind.ALL_GATHER:
            out += (n - 1) * k * ((g - 1) + int(g > 1)) + k * (g - 1 + n - 1)
        if self.kind != Kind.REDUCE_SCATTER:
            waits = int(not self.gathering)
            out += (k * (g - 1 + st) * waits + (n - 1) * k * np.maximum(st, waits)
                    + (n - 1) * k * (g - 1 + st))
        return out

    @property
    def slots(self) -> int:
        return 2 * self.g + self.n + 2

    # ---- visiting orders (Place's, by formula, over arrays) ------------------------------------
    def targets(self, a: I64) -> I64:
        """(rank, i): node a's i-th target node, own node included (`target_nodes`)."""
        n = self.n
        i = np.arange(n, dtype=np.int64)[None, :]
        if not self.node_swizzle:
            return np.broadcast_to(i, (len(a), n))
        if len(self.radices) == 1:
            out: I64 = (a[:, None] + i + 1) % n
            return out
        return np_level_add(self.radices, a[:, None], (i + 1) % n, 1)

    def sources(self, a: I64) -> I64:
        """(rank, j): node a's j-th source node (`source_nodes`)."""
        n = self.n
        j = np.arange(n - 1, dtype=np.int64)[None, :]
        if not self.node_swizzle:
            out: I64 = j + (j >= a[:, None])
            return out
        if len(self.radices) == 1:
            out = (a[:, None] - j - 1) % n
            return out
        return np_level_add(self.radices, a[:, None], j + 1, -1)

    def target_position(self, frm: I64, t: I64, include_own: bool = True) -> I64:
        """Position of target t in node frm's order (`Place.target_position`)."""
        n = self.n
        if self.node_swizzle:
            if len(self.radices) == 1:
                out: I64 = (t - frm - 1) % n
                return out
            out = (np_level_add(self.radices, t, frm, -1) - 1) % n
            return out
        if include_own:
            return t
        out = t - (t > frm)
        return out

    def peers(self, lr: I64) -> I64:
        """(rank, m): local rank lr's m-th local peer (`local_peers`)."""
        g = self.g
        m = np.arange(g - 1, dtype=np.int64)[None, :]
        if self.rank_swizzle:
            out: I64 = (lr[:, None] + m + 1) % g
            return out
        out = m + (m >= lr[:, None])
        return out

    def peer_position(self, me: I64, q: I64) -> I64:
        """Position of local peer q in local rank me's order (`Place.peer_position`)."""
        if self.rank_swizzle:
            out: I64 = (q - me) % self.g - 1
            return out
        out = q - (q > me)
        return out

    def rs_base(self, a: I64, pos: I64, t: I64, c: I64) -> I64:
        """Index of the first op of (target at `pos`, chunk c) in the reduce-scatter (rs_index)."""
        k, e, g = self.k, self.extra, self.g
        own_before = 0 if self.node_swizzle else (a < t)
        remote = t != a
        out: I64 = pos * k * self.per_target - own_before * k * e + c * (g - 1 + e * remote)
        return out


class Block:
    """One block of ranks being written: per-op columns as (rank, index) grids as wide as the
    longest rank (a staged rank has more ops), and the deps each op category adds, written into
    CSR order once every op's dep count is known."""

    def __init__(self, lay: Layout, ranks: list[int]):
        self.lay, self.ranks = lay, ranks
        self.rk = np.array(ranks, np.int64)
        self.a, self.lr = np.divmod(self.rk, lay.g)
        self.lens = lay.lens[self.lr]
        nr, width = len(ranks), int(self.lens.max())
        self.slot = np.full((nr, width), -1, np.int64)
        self.channel = np.empty((nr, width), np.int32)
        self.count = np.empty((nr, width), np.int64)
        self.ndeps = np.zeros((nr, width), np.int64)
        self.deps: list[tuple[I64, I64, I64, I64]] = []   # (rows, indices, dep ranks, dep indices)

    def put(self, index: I64, slot: I64 | int, channel: I64 | int, count: I64,
            dep_rank: I64 | None = None, dep_index: I64 | None = None, valid: Mask | None = None) -> None:
        """Ops at `index` (a (rank, ...) grid) where `valid`, their fields broadcast onto it;
        their deps in order along the last axis of `dep_rank` / `dep_index`."""
        rows = np.arange(len(self.ranks), dtype=np.int64).reshape((-1,) + (1,) * (index.ndim - 1))
        shape = np.broadcast_shapes(index.shape, rows.shape, () if valid is None else valid.shape)
        sel = None if valid is None else np.broadcast_to(valid, shape)
        size = int(np.prod(shape))

        def flat(v: I64 | int, tail: tuple[int, ...] = ()) -> I64:
            full = np.broadcast_to(v, shape + tail)
            out: I64 = full.reshape((size,) + tail) if sel is None else full[sel]
            return out
        r, i = flat(rows), flat(index)
        self.slot[r, i] = flat(slot)
        self.channel[r, i] = flat(channel)
        self.count[r, i] = flat(count)
        if dep_rank is not None and dep_index is not None:
            nd = np.broadcast_shapes(dep_rank.shape, dep_index.shape)[-1]
            self.ndeps[r, i] = nd
            self.deps.append((r, i, flat(dep_rank, (nd,)), flat(dep_index, (nd,))))

    def arrays(self) -> OpArrays:
        lay, nr, width = self.lay, len(self.ranks), self.slot.shape[1]
        keep = self.slot >= 0
        assert np.array_equal(keep.sum(axis=1), self.lens), "hier op arrays: an op left unwritten"
        uniform = bool((self.lens == width).all())
        row_of = None if uniform else (np.cumsum(keep.reshape(-1)) - 1).reshape(nr, width)

        def rows(r: I64, i: I64) -> I64:          # output row of the op at grid cell (r, i)
            out: I64 = r * width + i if row_of is None else row_of[r, i]
            return out

        def col(v: npt.NDArray[ScalarT]) -> npt.NDArray[ScalarT]:
            out: npt.NDArray[ScalarT] = v.reshape(-1) if uniform else v[keep]
            return out
        dep_ptr = np.zeros(int(self.lens.sum()) + 1, np.int64)
        np.cumsum(col(self.ndeps), out=dep_ptr[1:])
        total = int(dep_ptr[-1])
        dep_rank, dep_index = np.empty(total, np.int32), np.empty(total, np.int32)
        for r, i, dr, di in self.deps:
            at = dep_ptr[rows(r, i)][:, None] + np.arange(dr.shape[-1], dtype=np.int64)
            dep_rank[at], dep_index[at] = dr, di
        self.deps.clear()
        # prototypes: the slots used, numbered in (rank, slot) order
        flat = col(np.arange(nr, dtype=np.int64)[:, None] * lay.slots + self.slot)
        used = np.zeros(nr * lay.slots, bool)
        used[flat] = True
        number = (np.cumsum(used) - 1).astype(np.int32)
        return OpArrays(ranks=self.ranks, lens=self.lens.copy(), protos=self._protos(used),
                        proto=number[flat], channel=col(self.channel), count=col(self.count),
                        dep_ptr=dep_ptr, dep_rank=dep_rank, dep_index=dep_index)

    def _protos(self, used: Mask) -> list[Proto]:
        """A `Proto` per used slot (see the module doc for the slot numbering), made column by
        column: a 4096-GPU all-reduce has two million of them."""
        g, n = self.lay.g, self.lay.n
        j, sl = np.divmod(np.flatnonzero(used), self.lay.slots)
        r = self.rk[j]
        node0, lr = r - r % g, r % g
        gwr = node0 + self.lay.gw[lr]                        # the rank's gateway
        local, remote, fwd = sl < g, (sl >= g) & (sl < g + n), sl >= g + n + 2
        copy = local | remote | fwd
        dst = np.select([local, remote, sl == g + n, fwd],
                        [node0 + sl, (sl - g) * g + self.lay.gw[lr], gwr, node0 + sl - (g + n + 2)], r)
        srcs: list[tuple[int, ...]] = [(x,) for x in np.where(remote | fwd, gwr, r).tolist()]   # copies
        for i in np.flatnonzero(~copy).tolist():             # the reduces: a few a rank
            srcs[i] = (int(r[i]),) * g + (int(gwr[i]),) * ((n - 1) * int(sl[i] == g + n + 1))
        kinds = [OpKind.REDUCE, OpKind.COPY]
        return list(map(Proto, map(kinds.__getitem__, copy.tolist()), r.tolist(), dst.tolist(), srcs,
                        itertools.repeat(False)))


def _remote_targets(lay: Layout, a: I64) -> I64:
    """(rank, i): node a's i-th remote target (`target_nodes(include_own=False)`)."""
    if lay.node_swizzle:
        return lay.targets(a)[:, :lay.n - 1]        # own node last
    j = np.arange(lay.n - 1, dtype=np.int64)[None, :]
    out: I64 = j + (j >= a[:, None])
    return out


def _others(lay: Layout, lr: I64) -> I64:
    """(rank, j): the local ranks other than lr in plain order (`node_pieces`' sources)."""
    j = np.arange(lay.g - 1, dtype=np.int64)[None, :]
    out: I64 = j + (j >= lr[:, None])
    return out


def write_reduce_scatter(b: Block) -> None:
    """`build_reduce_scatter`'s ops: scatter copies per (target, chunk, peer), node reduce
    (into the gateway's send slot) and send per (remote target, chunk), final reduce per chunk."""
    lay = b.lay
    n, g, k, ch = lay.n, lay.g, lay.k, lay.chans
    a, lr, rk = b.a, b.lr, b.rk
    c = np.arange(k, dtype=np.int64)
    a3, c3 = a[:, None, None], c[None, None, :]
    pn = lay.piece_n
    if g > 1:
        tg = lay.targets(a)[:, :, None]                                  # (rank, pos, 1)
        pos = np.arange(n, dtype=np.int64)[None, :, None]
        base = lay.rs_base(a3, pos, tg, c3)                              # (rank, pos, chunk)
        q = lay.peers(lr)[:, None, None, :]                              # (rank, 1, 1, peer)
        b.put(base[..., None] + np.arange(g - 1, dtype=np.int64), q, c3[..., None] % ch,
              pn[tg[..., None] * g + q, c3[..., None]])
    others = _others(lay, lr)                                             # (rank, peer)
    if n > 1:
        tr = _remote_targets(lay, a)[:, :, None]                          # (rank, i, 1)
        base = lay.rs_base(a3, lay.target_position(a3, tr), tr, c3)     # (rank, i, chunk)
        cnt = pn[tr * g + lr[:, None, None], c3]
        sends = base + lay.per_target - 1
        if g > 1:
            ob = others[:, None, None, :]
            b.put(base + g - 1, g + n, ch + c3 % ch, cnt,
                  a3[..., None] * g + ob, base[..., None] + lay.peer_position(ob, lr[:, None, None, None]))
            b.put(sends, g + tr, ch + c3 % ch, cnt, rk[:, None, None, None], (base + g - 1)[..., None])
        else:
            b.put(sends, g + tr, ch + c3 % ch, cnt)
    # final reduce per chunk: own node's pieces (scatter slots) then the remote partials
    a2, c2 = a[:, None], c[None, :]
    nr = len(rk)
    own_base = lay.rs_base(a2, lay.target_position(a2, a2), a2, c2)     # (rank, chunk)
    src = lay.sources(a)[:, None, :]                                      # (rank, 1, source)
    send_on_src = lay.rs_base(src, lay.target_position(src, a3), a3, c[None, :, None]) + lay.per_target - 1
    o3 = others[:, None, :]
    dr = np.concatenate([np.broadcast_to(a3 * g + o3, (nr, k, g - 1)),
                         np.broadcast_to(src * g + lr[:, None, None], (nr, k, n - 1))], axis=2)
    di = np.concatenate([np.broadcast_to(own_base[..., None] + lay.peer_position(o3, lr[:, None, None]),
                                         (nr, k, g - 1)),
                         np.broadcast_to(send_on_src, (nr, k, n - 1))], axis=2)
    slot = g + n + 1 if g + n - 1 > 1 else lr[:, None]       # a lone source is a copy
    b.put(np.broadcast_to(lay.rs_len - k + c2, (nr, k)), slot, ch + c2 % ch, pn[rk[:, None], c2], dr, di)


def write_all_gather(b: Block) -> None:
    """`build_all_gather`'s ops: per chunk the prologue (own copy for all_gather, the copy to
    the gateway when staged, L-1 local copies), per (remote target, chunk) a send, per (source
    node, chunk, local rank) a distribution of what arrived (from the gateway when staged)."""
    lay = b.lay
    n, g, k, ch = lay.n, lay.g, lay.k, lay.chans
    a, lr, rk = b.a, b.lr, b.rk
    c = np.arange(k, dtype=np.int64)
    c2 = c[None, :]
    base, gathering = lay.rs_len, lay.gathering
    pro, st = lay.prologue[lr][:, None], lay.staged[lr][:, None]          # (rank, 1)
    mine = lay.piece_n[rk[:, None], c2]                                   # (rank, chunk)
    ready_r = ready_i = None
    if not gathering:                    # all_reduce: after the final reduce of the chunk
        ready_r = rk[:, None, None]
        ready_i = (lay.rs_len - k + c2)[..., None]
    first = base + c2 * pro                                               # (rank, chunk)
    if gathering:
        b.put(first, lr[:, None], c2 % ch, mine)
    stage_at = first + int(gathering)
    b.put(stage_at, lay.gw[lr][:, None], c2 % ch, mine, ready_r, ready_i, valid=st == 1)
    if g > 1:
        q = lay.peers(lr)[:, None, :]                                    # (rank, 1, peer)
        idx = (stage_at + st)[..., None] + np.arange(g - 1, dtype=np.int64)
        b.put(idx, q, ch + c2[..., None] % ch, mine[..., None],
              None if ready_r is None else ready_r[..., None], None if ready_i is None else ready_i[..., None])
    if n == 1:
        return
    sends = base + k * pro[:, :, None]                                    # (rank, 1, 1)
    tr = _remote_targets(lay, a)[:, :, None]                              # (rank, i, 1)
    i3 = np.arange(n - 1, dtype=np.int64)[None, :, None]
    c3 = c[None, None, :]
    idx3 = sends + i3 * k + c3
    m3 = mine[:, None, :]
    # unstaged sends wait for the chunk (all_reduce), staged ones for its copy to the gateway
    b.put(idx3, g + tr, c3 % ch, m3, None if ready_r is None else ready_r[..., None],
          None if ready_i is None else ready_i[None], valid=st[..., None] == 0)
    b.put(idx3, g + tr, c3 % ch, m3, rk[:, None, None, None], stage_at[:, None, :, None],
          valid=st[..., None] == 1)
    # distributions: local peers (from my output), or every local rank (from the gateway)
    width = g - 1 + int(lay.staged.max())
    if width == 0:
        return
    m = np.arange(width, dtype=np.int64)
    peers = lay.peers(lr)
    q = np.where(st == 1, _take(np.concatenate([lr[:, None], peers], axis=1), m), _take(peers, m))
    src = lay.sources(a)[:, :, None, None]                                 # (rank, j, 1, 1)
    c4 = c3[..., None]
    sent_at = sends[..., None] + lay.target_position(src, a[:, None, None, None], include_own=False) * k + c4
    per = (g - 1 + st)[:, :, None, None]                                   # distributions a chunk
    q4 = q[:, None, None, :]
    slot = np.where(st[:, :, None, None] == 1, g + n + 2 + q4, q4)
    b.put(sends[..., None] + (n - 1) * k + (i3[..., None] * k + c4) * per + m, slot, ch + c4 % ch,
          lay.piece_n[src * g + lr[:, None, None, None], c4],
          (src * g + lr[:, None, None, None])[..., None], sent_at[..., None], valid=m < per)


def _take(table: I64, m: I64) -> I64:
    """table[rank, m] for every rank (m one row of columns, clipped to the table)."""
    if table.shape[1] == 0:
        return np.zeros((table.shape[0], len(m)), np.int64)
    out: I64 = table[:, np.minimum(m, table.shape[1] - 1)]
    return out


def _blocks(lay: Layout, ranks: Sequence[int]) -> Iterator[OpArrays]:
    step = max(1, ARRAY_BLOCK_OPS // max(int(lay.lens.max()), 1))
    for i in range(0, len(ranks), step):
        b = Block(lay, list(ranks[i:i + step]))
        if lay.kind != Kind.ALL_GATHER:
            write_reduce_scatter(b)
        if lay.kind != Kind.REDUCE_SCATTER:
            write_all_gather(b)
        yield b.arrays()


def hier_op_arrays(ctx: PlanContext[HierParams], ranks: Sequence[int]) -> OpArrays | None:
    """`ranks`' ops of a `hier` reduce-scatter / all-gather / all-reduce as arrays, or None
    for the kinds this form does not cover (all_to_all, group ops)."""
    if ctx.spec.kind not in KINDS or not ranks:
        return None
    lay = Layout.of(ctx)
    lr = np.array(ranks, np.int64) % lay.g
    return gather(_blocks(lay, ranks), int(lay.lens[lr].sum()), int(lay.deps[lr].sum()))
