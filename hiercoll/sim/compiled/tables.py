"""A schedule and its network as flat tables, built once per simulation for the compiled loop.

Ops are numbered rank by rank (the simulated ranks, in order), so op (r, i) is row
`offset[r] + i`; a dependency is a row (folded onto its representative's like the Python
engine's), -1 for one that names no op (it never ends: the run reports a deadlock). An op's
links are those of its shape (`LinkCache`: ops that move data between the same ranks the same way
share one entry), so a ring's millions of ops index a handful of link lists.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hiercoll.errors import HiercollError
from hiercoll.schedule import OpKind, Schedule
from hiercoll.schedule_arrays import OpArrays, op_arrays_from_ops
from hiercoll.sim.engine import LinkCache, copy_links
from hiercoll.sim.links import Network
from hiercoll.sim.pair_links import copy_links_batch

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]

CHUNK_OPS = 1 << 21         # tables_from_arrays works on this many rows (whole ranks) at a time
# up to this many possible keys, a lookup table numbers them (no sort); a 4096-GPU `hier` has 8.5M,
# whose dict took more time and memory than the table's 0.1 GB (tables 15.4 -> 13.3 CPU s)
DENSE_KEYS = 1 << 24
INT32_ROWS = (1 << 31) - 1  # rows and deps are int32: a 2**31-op run would need ~100 GB anyway


@dataclass
class Tables:
    """Per-op fields are int32 rows and float64 bytes; what an op's links and launch cost are is
    per *key* (prototype, channel, engine): a handful of keys serve millions of ops, so the
    replay carries 4 bytes per op for them, not 17."""

    ranks: list[int]
    lens: list[int]            # ops per simulated rank
    op_key: I32                # row -> its key
    op_nbytes: F64             # bytes it moves
    dep_ptr: I32               # CSR: op rows of its dependencies
    dep_idx: I32
    ch_ptr: I32                # CSR: each (rank, channel)'s op rows in order, (rank, channel) order
    ch_ops: I32
    key_shape: I64             # key -> its shape (link list)
    key_delay: F64             # key -> launch + first byte's flight, us
    key_ce: B                  # key -> a copy engine runs it (host launches count these)
    sh_ptr: I64                # CSR: each shape's (link id, weight)
    sh_lid: I64
    sh_w: F64
    max_links: int             # most links of one shape
    ch_identity: bool = False  # ch_ops is every row in order (a channel's ops are consecutive rows)

    @property
    def num_ops(self) -> int:
        return len(self.op_key)

    @property
    def op_shape(self) -> I64:
        out: I64 = self.key_shape[self.op_key]
        return out

    @property
    def op_delay(self) -> F64:
        out: F64 = self.key_delay[self.op_key]
        return out

    @property
    def op_ce(self) -> B:
        out: B = self.key_ce[self.op_key]
        return out


class _Column:
    """An append-only column held as numpy chunks: a 4096-GPU `hier` all-reduce's shapes hold
    19 million (link, weight) entries, which as Python lists of ints and floats took ~1.4 GB
    (and as much again while converted) where the arrays take 0.3. Scalars appended one by one
    wait in a short list."""

    TAIL = 4096

    def __init__(self, dtype: type, first: Sequence[int] = ()) -> None:
        self.dtype = dtype
        self.chunks: list[npt.NDArray[np.generic]] = []
        self.tail: list[float | int | bool] = list(first)
        self.n = len(self.tail)
        self.last: float | int | bool = self.tail[-1] if self.tail else 0

    def __len__(self) -> int:
        return self.n

    def append(self, x: float | int | bool) -> None:
        self.tail.append(x)
        self.n += 1
        self.last = x
        if len(self.tail) >= self.TAIL:
            self._flush()

    def extend(self, xs: npt.ArrayLike) -> None:
        arr: npt.NDArray[Any] = np.asarray(xs, self.dtype)
        if not len(arr):
            return
        self._flush()
        self.chunks.append(arr)
        self.n += len(arr)
        self.last = arr[-1].item()

    def _flush(self) -> None:
        if self.tail:
            self.chunks.append(np.array(self.tail, self.dtype))
            self.tail = []

    def array(self) -> npt.NDArray[Any]:
        self._flush()
        out = np.concatenate(self.chunks) if self.chunks else np.zeros(0, self.dtype)
        self.chunks = [out]
        return out


class _PairShapes:
    """A pair copy's source * world + destination -> its shape row (-1: none yet): a table
    where world^2 is small enough (4096 GPUs: 16.8M entries, 67 MB, where a dict of 2.1M pairs
    took ~0.25 GB), else a dict."""

    DENSE = 1 << 25

    def __init__(self, world: int) -> None:
        n = world * world
        self.table = np.full(n, -1, np.int32) if n <= self.DENSE else None
        self.map: dict[int, int] = {}

    def get(self, code: int) -> int | None:
        if self.table is not None:
            v = int(self.table[code])
            return None if v < 0 else v
        return self.map.get(code)

    def set(self, code: int, sid: int) -> None:
        if self.table is not None:
            self.table[code] = sid
        else:
            self.map[code] = sid

    def lookup(self, codes: I64) -> I64:
        if self.table is not None:
            out: I64 = self.table[codes].astype(np.int64)
            return out
        return np.array([self.map.get(c, -1) for c in codes.tolist()], np.int64)

    def assign(self, codes: I64, sids: I64) -> None:
        if self.table is not None:
            self.table[codes] = sids
        else:
            self.map.update(zip(codes.tolist(), sids.tolist()))


def build_tables(schedule: Schedule, net: Network, ranks: Sequence[int]) -> Tables | None:
    """The tables, or None where the schedule is not laid out as the tables assume (an op's
    ref is not (its rank, its position)): the Python engine times that one."""
    arrays = op_arrays_from_ops([schedule.rank_ops(r) for r in ranks], ranks)
    return None if arrays is None else tables_from_arrays(arrays, net, schedule.spec.dtype.itemsize)


def _rank_chunks(lens: I64) -> list[tuple[int, int]]:
    """Runs of whole ranks [r0, r1) of about CHUNK_OPS rows (at least one rank each)."""
    out, r0, rows = [], 0, 0
    for r, k in enumerate(lens.tolist()):
        rows += k
        if rows >= CHUNK_OPS:
            out.append((r0, r + 1))
            r0, rows = r + 1, 0
    if r0 < len(lens):
        out.append((r0, len(lens)))
    return out


def _dep_rows(rank: I32, index: I32, fold: int | None, row_of: I32, len_of: I32, out: I32) -> None:
    """Dependencies (rank, index) as rows into `out`: the rank folded onto its representative,
    -1 for an op that does not exist. row_of / len_of end with a sentinel rank (no rows)."""
    top = len(row_of) - 1
    if fold is not None:
        rank = rank % fold
    bad = (rank < 0) | (rank >= top)
    if bad.any():
        rank = np.where(bad, top, rank)
    base = row_of[rank]
    ok = (base >= 0) & (index >= 0) & (index < len_of[rank])
    np.add(base, index, out=out)            # `out` may be `index` itself (consumed arrays)
    if not ok.all():
        out[~ok] = -1


def _channel_rows(lens: I64, channel: I32, nch: int, lo: int, out: I32) -> I64:
    """The rows lo.. of whole ranks (`lens` each) grouped by (rank, channel) in that order, each
    group in row order, into `out`; returns each group's first row. One channel: the rows as
    they are, a group per rank."""
    if nch == 1:
        out[:] = np.arange(lo, lo + len(out), dtype=np.int32)
        starts = np.concatenate([[0], np.cumsum(lens[:-1])])
        return (starts[lens > 0] + lo).astype(np.int64)
    rank_pos = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    group = rank_pos * nch + channel
    order = np.argsort(group, kind="stable")
    out[:] = order + lo
    return np.concatenate([[lo], np.flatnonzero(np.diff(group[order])) + 1 + lo]).astype(np.int64)


def _reuse(x: npt.NDArray[np.int32], consume: bool) -> npt.NDArray[np.int32]:
    """x's buffer for an int32 table of its length where the caller gives its arrays up (and
    x is a writeable int32 array of its own), else a new one."""
    if consume and x.dtype == np.int32 and x.flags.writeable and x.flags.c_contiguous:
        return x
    return np.empty(len(x), np.int32)


def tables_from_arrays(a: OpArrays, net: Network, itemsize: int, consume: bool = False) -> Tables:
    """The tables of ops in array form, over arrays: per-op work is numpy's, per-key work
    (links, latency) Python's through the same `LinkCache` the Python engine asks, in the same
    order (links a key creates get the same ids). Rows are done a chunk of whole ranks at a
    time, into arrays sized up front: a 33M-op ring's temporaries stay a chunk's, not the run's.

    `consume`: the caller drops `a` afterwards, so the keys are written over its prototype
    column and the dependency rows over its dependency indices, each chunk after it is read
    (fresh memory is costly: a 4096-GPU ring's tables are ~1 GB). `a` is garbage after."""
    n, ndeps = a.num_ops, int(a.dep_ptr[-1])
    if n >= INT32_ROWS or ndeps >= INT32_ROWS:
        raise HiercollError(f"simulate: {n} ops with {ndeps} dependencies: the compiled core "
                            "numbers both in int32")
    costs = net.topology.costs
    cached = LinkCache(net)
    npro = len(a.protos)
    # each prototype's kind, issuer, first source and destination, in one pass over them (a
    # 4096-GPU `hier` has 2.1M: a pass a column took ~1 s more)
    fields = np.array([(p.kind == OpKind.COPY, p.rank, p.srcs[0], p.dst) for p in a.protos],
                      np.int64).reshape(npro, 4)
    p_any_copy = fields[:, 0] == 1
    p_rank, p_src, p_dst = fields[:, 1], fields[:, 2], fields[:, 3]
    del fields
    # copies whose two GPUs decide their links (a relayed copy's issuer is on its path too)
    p_copy = p_any_copy & ((p_rank == p_src) | (p_rank == p_dst))
    p_remote = (p_dst != p_rank) | (p_src != p_rank)
    ce_min = max(costs.ce_threshold_bytes, 1)
    ce_min_count = -(-ce_min // itemsize)          # count * itemsize >= ce_min, in elements
    p_ce = p_any_copy & p_remote                   # a copy engine runs it, if large enough
    launch = (costs.op_launch_us(False), costs.op_launch_us(True))
    nch = int(a.channel.max()) + 1 if n else 1
    key_of: dict[int, int] = {}         # (prototype, channel, engine) -> key, in first-row order
    shape_of: dict[int, int] = {}       # id of a cached link tuple -> shape row
    world = net.topology.world_size
    pair_shape = _PairShapes(world)     # a pair copy's source * world + destination -> shape row
    key_shape, key_delay, key_ce = _Column(np.int64), _Column(np.float64), _Column(np.bool_)
    sh_ptr, sh_lid, sh_w = _Column(np.int64, [0]), _Column(np.int64), _Column(np.float64)
    # dependencies: rows of the (folded) ranks' ops, -1 for an op that does not exist
    fold = net.fold
    offsets = a.offsets()
    top_dep = int(a.dep_rank.max()) + 1 if ndeps else 0
    top = max(fold if fold is not None else top_dep, max(a.ranks, default=-1) + 1)
    row_of = np.full(top + 1, -1, np.int32)      # rank -> its first row; top: no such rank
    len_of = np.zeros(top + 1, np.int32)
    row_of[a.ranks], len_of[a.ranks] = offsets, a.lens
    op_key, op_nbytes = _reuse(a.proto, consume), np.empty(n, np.float64)
    nkeys = npro * nch * 2
    lut = np.full(nkeys, -1, np.int32) if nkeys <= DENSE_KEYS else None
    NONE = np.iinfo(np.int64).max
    first_row = np.full(nkeys, NONE, np.int64) if lut is not None else None    # per chunk, reset after

    asked: dict[int, tuple[tuple[tuple[int, float], ...], float]] = {}   # row -> its op's links

    def op_links(row: int) -> tuple[tuple[tuple[int, float], ...], float]:
        """The links and latency of `row`'s op, through a stand-in op (built once a row: one of a
        4096-GPU `hier`'s 519-source reduces took ~0.1 ms)."""
        got = asked.pop(row, None)
        if got is None:
            got = cached(a.protos[int(a.proto[row])].op(int(a.channel[row]), int(a.count[row])))
        return got

    def new_key(row: int, on_ce: bool) -> int:
        """A new key, first met at `row`: one stand-in op asks its links; returns its number."""
        proto = a.protos[int(a.proto[row])]
        pair = cached.pair_copy(proto.srcs[0], proto.dst) if p_copy[int(a.proto[row])] else None
        links, latency = pair if pair is not None else op_links(row)
        # a pair copy's shape is its pair's (`new_keys` makes them many at a time); any other's,
        # the cached link tuple's
        skey = proto.srcs[0] * world + proto.dst if pair is not None else id(links)
        sid = pair_shape.get(skey) if pair is not None else shape_of.get(skey)
        if sid is None:
            sid = len(sh_ptr) - 1
            if pair is not None:
                pair_shape.set(skey, sid)
            else:
                shape_of[skey] = sid
            for lid, w in links:
                sh_lid.append(lid)
                sh_w.append(w)
            sh_ptr.append(len(sh_lid))
        key_shape.append(sid)
        key_delay.append(launch[on_ce] + latency)       # as the Python engine sums them
        key_ce.append(on_ce)
        return len(key_shape) - 1

    def new_keys(rows: I64, on_ce: B) -> I64:
        """Keys first met at `rows` (in that order), numbered and shaped as `new_key` one by
        one would; copies between their own pairs of GPUs (a dense all-to-all-v, a hierarchical
        plan's sends: a key per pair) at once, through `copy_links_batch`, the other rows
        between them one by one."""
        proto = a.proto[rows]
        copy = p_copy[proto]
        if len(rows) > 1 and cached.pairs_decide and int(copy.sum()) > 1:
            src, dst = p_src[proto[copy]], p_dst[proto[copy]]
            # other rows among the copies: their links made in row order between the copies'
            ask = None if copy.all() else (
                lambda first: _links_in_row_order(rows, copy, src, dst, first))
            got = copy_links_batch(net, src, dst, ask)
            if got is not None:
                return _mixed_keys(rows, copy, got, src * world + dst, on_ce)
        return _keys_one_by_one(rows, on_ce)

    def _keys_one_by_one(rows: I64, on_ce: B) -> I64:
        return np.array([new_key(int(r), bool(c)) for r, c in zip(rows.tolist(), on_ce.tolist())],
                        np.int64)

    def _links_in_row_order(rows: I64, copy: B, src: I64, dst: I64, first: I64) -> None:
        """Make the links of `rows` as `new_key` row by row would: the copies that first use a
        link (`first`, among the copies) through `copy_links`, every other row's op through the
        cache (kept for `new_key`, which asks next)."""
        at = np.flatnonzero(copy)
        for r in np.sort(np.concatenate([at[first], np.flatnonzero(~copy)])).tolist():
            if copy[r]:
                i = int(np.searchsorted(at, r))
                copy_links(net, int(src[i]), int(dst[i]))
            else:
                row = int(rows[r])
                asked[row] = op_links(row)

    def _mixed_keys(rows: I64, copy: B, got: tuple[I64, I64, F64, F64], code: I64, on_ce: B) -> I64:
        """Keys of `rows` in order: each run of copies at once, the rows between one by one."""
        out = np.empty(len(rows), np.int64)
        cuts = [0, *(np.flatnonzero(np.diff(copy.astype(np.int8))) + 1).tolist(), len(rows)]
        done = 0                # copies keyed so far
        ptr, lids, ws, latency = got
        for lo, hi in itertools.pairwise(cuts):
            if not copy[lo]:
                out[lo:hi] = _keys_one_by_one(rows[lo:hi], on_ce[lo:hi])
                continue
            end = done + hi - lo
            p = ptr[done:end + 1]
            run = (p - p[0], lids[p[0]:p[-1]], ws[p[0]:p[-1]], latency[done:end])
            out[lo:hi] = _pair_keys(run, code[done:end], on_ce[lo:hi])
            done = end
        return out

    def _pair_keys(got: tuple[I64, I64, F64, F64], code: I64, on_ce: B) -> I64:
        ptr, lids, ws, latency = got
        first = np.sort(np.unique(code, return_index=True)[1])
        fresh = first[pair_shape.lookup(code[first]) < 0]
        # shapes in the order their first key meets them, each its pair's links
        pair_shape.assign(code[fresh], np.arange(len(sh_ptr) - 1, len(sh_ptr) - 1 + len(fresh),
                                                 dtype=np.int64))
        n = ptr[fresh + 1] - ptr[fresh]
        sh_ptr.extend(int(sh_ptr.last) + np.cumsum(n))
        take = np.repeat(ptr[fresh] - np.concatenate([[0], np.cumsum(n)[:-1]]), n) \
            + np.arange(int(n.sum()))
        sh_lid.extend(lids[take])
        sh_w.extend(ws[take])
        first_id = len(key_shape)
        key_shape.extend(pair_shape.lookup(code))
        key_delay.extend(np.where(on_ce, launch[1], launch[0]) + latency)
        key_ce.extend(on_ce)
        return np.arange(first_id, len(key_shape), dtype=np.int64)

    dep_idx, ch_ops = _reuse(a.dep_index[:ndeps], consume), np.empty(n, np.int32)
    ch_starts: list[I64] = []
    for r0, r1 in _rank_chunks(a.lens):
        lo, hi = int(offsets[r0]), int(offsets[r1 - 1] + a.lens[r1 - 1])
        if hi == lo:
            continue
        proto, channel, count = a.proto[lo:hi], a.channel[lo:hi], a.count[lo:hi]
        ce = p_ce[proto] & (count >= ce_min_count)                              # on_copy_engine
        # int32 where the keys index a table (at most DENSE_KEYS of them)
        wide: I64 | I32 = proto.astype(np.int64) if lut is None else proto.astype(np.int32)
        key = (wide * nch + channel) * 2 + ce
        if lut is not None:             # keys index a table: first rows without a sort
            assert first_row is not None
            np.minimum.at(first_row, key, np.arange(hi - lo, dtype=np.int64))
            present = np.flatnonzero(first_row < NONE)
            fresh = present[lut[present] < 0]
            fresh = fresh[np.argsort(first_row[fresh], kind="stable")]
            if len(fresh):
                rows = first_row[fresh]
                lut[fresh] = new_keys(lo + rows, ce[rows])
            first_row[present] = NONE
            op_key[lo:hi] = lut[key]
        else:
            uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            local = np.zeros(len(uniq), np.int32)
            order = np.argsort(first, kind="stable")
            known = np.array([key_of.get(int(v), -1) for v in uniq[order].tolist()], np.int64)
            new = order[known < 0]
            if len(new):
                ids = new_keys(lo + first[new], ce[first[new]])
                key_of.update(zip(uniq[new].tolist(), ids.tolist()))
                known[known < 0] = ids
            local[order] = known
            op_key[lo:hi] = local[inverse.reshape(-1)]
        np.multiply(count, float(itemsize), out=op_nbytes[lo:hi])     # exact below 2**53
        d0, d1 = int(a.dep_ptr[lo]), int(a.dep_ptr[hi])
        _dep_rows(a.dep_rank[d0:d1], a.dep_index[d0:d1], fold, row_of, len_of, dep_idx[d0:d1])
        ch_starts.append(_channel_rows(a.lens[r0:r1], channel, nch, lo, ch_ops[lo:hi]))
    ch_ptr = np.concatenate([*ch_starts, [n]]).astype(np.int32)
    sp = sh_ptr.array()
    return Tables(ranks=list(a.ranks), lens=a.lens.tolist(), op_key=op_key, op_nbytes=op_nbytes,
                  dep_ptr=a.dep_ptr.astype(np.int32), dep_idx=dep_idx, ch_ptr=ch_ptr, ch_ops=ch_ops,
                  key_shape=key_shape.array(), key_delay=key_delay.array(), key_ce=key_ce.array(),
                  sh_ptr=sp, sh_lid=sh_lid.array(), sh_w=sh_w.array(),
                  max_links=max(int(np.diff(sp).max()), 1) if len(sp) > 1 else 1, ch_identity=nch == 1)
