"""Llama3-style context parallelism for varlen (packed) batches, and what its K/V exchange costs.

A packed batch of T tokens (documents cut by `cu_seqlens`, flash-attention's convention) is split
contiguously over W ranks: rank r holds tokens [r*T/W, (r+1)*T/W). Llama3's recipe all-gathers
K/V (one head group at a time, so the next group's gather overlaps this group's attention) and
runs varlen flash-attention on the local queries against the gathered keys; the backward
reduce-scatters dK/dV. Most of a packed batch's keys are needed by nobody else (documents are
short), so this module also builds the needed-only alternative — a group-cast of each rank's
K/V rows to exactly the ranks whose queries attend to them — and compares the two in the
simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from hiercoll.collectives import CollectiveSpec, DType, GroupSplits, Kind, RankSplits, Split
from hiercoll.errors import HiercollError
from hiercoll.planner import applicable, plan
from hiercoll.schedule import Schedule
from hiercoll.sim import simulate
from hiercoll.topology import Topology
from hiercoll.workloads.common import divide_evenly

Interval = tuple[int, int]   # [start, stop) in global token index


@dataclass(frozen=True, slots=True)
class Llama3Shard:
    """One rank's flash-attention varlen arguments against its gathered keys.

    `local_k_slice` = (start, stop): the global K/V rows the rank's queries need, gathered
    contiguously; `cu_seqlens_k` indexes into that gathered block (0 = row `start`). Causal pieces
    are bottom-right aligned (a document continued from an earlier rank has q_len < k_len)."""

    cu_seqlens_q: tuple[int, ...]
    cu_seqlens_k: tuple[int, ...]
    max_seqlen_q: int
    max_seqlen_k: int
    local_k_slice: tuple[int, int]


# ---- validation -------------------------------------------------------------------------------
def _check_cu_seqlens(cu_seqlens: Sequence[int]) -> tuple[int, ...]:
    cu = tuple(int(x) for x in cu_seqlens)
    if len(cu) < 2:
        raise HiercollError(f"cu_seqlens: {list(cu)} has fewer than 2 entries; give [0, end of doc 1, ...]")
    if cu[0] != 0:
        raise HiercollError(f"cu_seqlens: starts at {cu[0]}; cumulative offsets start at 0")
    for i, (a, b) in enumerate(pairwise(cu)):
        if b < a:
            raise HiercollError(f"cu_seqlens[{i + 1}]: {b} < {a}; offsets must be non-decreasing")
    return cu


def _check_world(total: int, world_size: int) -> int:
    """Tokens per rank; refuses a length the contiguous split cannot cut evenly."""
    if world_size < 1:
        raise HiercollError(f"world_size: {world_size}; give at least 1 rank")
    return divide_evenly(total, world_size, lambda pad: (
        f"cu_seqlens: {total} tokens do not split over {world_size} ranks; pad the "
        f"packed batch by {pad} tokens to {total + pad}"))


def _check_rank(rank: int, world_size: int) -> None:
    if not 0 <= rank < world_size:
        raise HiercollError(f"rank: {rank} is outside 0..{world_size - 1}")


# ---- per-rank view ----------------------------------------------------------------------------
def _documents(cu: tuple[int, ...]) -> list[Interval]:
    """Non-empty documents: an empty one holds no query and no key."""
    return [(a, b) for a, b in pairwise(cu) if b > a]


def _host(rank: int, per_rank: int) -> Interval:
    return rank * per_rank, (rank + 1) * per_rank


def _pieces(cu: tuple[int, ...], host: Interval, causal: bool) -> list[tuple[Interval, Interval]]:
    """(query piece, key range) per document the host range touches, in order. Causal keys end
    with the piece (bottom-right alignment); full attention takes the whole document."""
    lo, hi = host
    out = []
    for ds, de in _documents(cu):
        qs, qe = max(ds, lo), min(de, hi)
        if qs < qe:
            out.append(((qs, qe), (ds, qe if causal else de)))
    return out


def prepare(cu_seqlens: Sequence[int], rank: int, world_size: int, causal: bool) -> Llama3Shard:
    """Rank `rank`'s varlen arguments: its query pieces, and their key ranges inside the K/V rows
    it gathers. Consecutive pieces' key ranges are adjacent (they are consecutive documents), so
    both are cumulative offsets as flash_attn_varlen_func takes them."""
    cu = _check_cu_seqlens(cu_seqlens)
    per_rank = _check_world(cu[-1], world_size)
    _check_rank(rank, world_size)
    host = _host(rank, per_rank)
    pieces = _pieces(cu, host, causal)
    if not pieces:   # an empty batch: nothing to attend
        return Llama3Shard((0,), (0,), 0, 0, (host[0], host[0]))
    k_lo, k_hi = pieces[0][1][0], pieces[-1][1][1]
    cu_q, cu_k = [0], [0]
    for (qs, qe), (ks, ke) in pieces:
        assert ks - k_lo == cu_k[-1], "key ranges of consecutive pieces must be adjacent"
        cu_q.append(cu_q[-1] + qe - qs)
        cu_k.append(ke - k_lo)
    return Llama3Shard(cu_seqlens_q=tuple(cu_q), cu_seqlens_k=tuple(cu_k),
                       max_seqlen_q=max(qe - qs for (qs, qe), _ in pieces),
                       max_seqlen_k=max(ke - ks for _, (ks, ke) in pieces),
                       local_k_slice=(k_lo, k_hi))


# ---- llama3: all-gather forward, reduce-scatter backward --------------------------------------
def _head_groups(num_heads_k: int, heads_k_stride: int) -> int:
    if heads_k_stride < 1 or num_heads_k < 1 or num_heads_k % heads_k_stride:
        raise HiercollError(f"heads_k_stride: {heads_k_stride} does not divide num_heads_k {num_heads_k}; "
                            "pick a divisor of the number of KV heads")
    return num_heads_k // heads_k_stride


def _group_bytes(topology: Topology, total_tokens: int, row_elems: int, heads_k_stride: int,
                 dtype: str) -> int:
    """S of one head group's K+V: 2 x tokens x heads_k_stride x head_dim elements."""
    _check_world(total_tokens, topology.world_size)
    return 2 * total_tokens * heads_k_stride * row_elems * DType(dtype).itemsize


def all_gather_plans(topology: Topology, total_tokens: int, row_elems: int, heads_k_stride: int,
                     num_heads_k: int, dtype: str = "bf16", algorithm: str = "ring",
                     params: dict[str, Any] | None = None) -> list[Schedule]:
    """The forward K/V all-gathers, one per group of `heads_k_stride` KV heads (group g+1's gather
    overlaps group g's attention). `row_elems` is head_dim; a group's all-gather moves K and V of
    its heads for all tokens: S = 2 x total_tokens x heads_k_stride x head_dim elements, each
    rank contributing its T/W tokens' share."""
    groups = _head_groups(num_heads_k, heads_k_stride)
    nbytes = _group_bytes(topology, total_tokens, row_elems, heads_k_stride, dtype)
    spec = CollectiveSpec(kind=Kind.ALL_GATHER, world_size=topology.world_size, dtype=DType(dtype),
                          nbytes=nbytes)
    return [plan(topology, spec, algorithm, params) for _ in range(groups)]


def reduce_scatter_plan(topology: Topology, total_tokens: int, row_elems: int, heads_k_stride: int,
                        num_heads_k: int, dtype: str = "bf16", algorithm: str = "ring",
                        params: dict[str, Any] | None = None) -> list[Schedule]:
    """The backward dK/dV reduce-scatters, the transpose of `all_gather_plans`: one per head group
    (same S), summing every rank's partial dK/dV into the rank that hosts those tokens."""
    groups = _head_groups(num_heads_k, heads_k_stride)
    nbytes = _group_bytes(topology, total_tokens, row_elems, heads_k_stride, dtype)
    spec = CollectiveSpec(kind=Kind.REDUCE_SCATTER, world_size=topology.world_size, dtype=DType(dtype),
                          nbytes=nbytes)
    return [plan(topology, spec, algorithm, params) for _ in range(groups)]


# ---- needed-only: a group-cast of the rows each rank's queries attend to -----------------------
def _runs(host: Interval, needs: dict[int, list[Interval]]) -> list[tuple[Interval, list[int]]]:
    """Cut host rows into maximal runs with one destination set (ranks needing them)."""
    lo, hi = host
    cuts = {lo, hi} | {x for ivs in needs.values() for iv in ivs for x in iv if lo < x < hi}
    points = sorted(cuts)
    runs: list[tuple[Interval, list[int]]] = []
    for a, b in pairwise(points):
        dests = sorted(d for d, ivs in needs.items() if any(s <= a and b <= e for s, e in ivs))
        if runs and runs[-1][1] == dests:
            runs[-1] = ((runs[-1][0][0], b), dests)
        else:
            runs.append(((a, b), dests))
    return runs


def _sources(needed: list[Interval], per_rank: int) -> list[tuple[int, int]]:
    """(source rank, rows) per contiguous run of needed rows hosted by one rank, ascending."""
    out = []
    for a, b in needed:
        for src in range(a // per_rank, (b - 1) // per_rank + 1):
            s_lo, s_hi = _host(src, per_rank)
            out.append((src, min(b, s_hi) - max(a, s_lo)))
    return out


def needed_kv_group_cast(cu_seqlens: Sequence[int], world_size: int, row_elems: int,
                         causal: bool) -> GroupSplits:
    """Group-cast splits that send each rank's K/V rows only to the ranks whose queries need them.

    Input of rank s: its host rows in ascending order, every row once, one split per run of rows
    with the same destination set. Rows nobody else needs stay in the input as a split with
    `peers=[]`: collectives.py requires exactly one peer only of group_cast *output* splits, an
    input split with no destination is valid and sends nothing, and keeping it makes the input
    the rank's K/V tensor as is (no packing of the rows to send). Output of rank d: the remote
    rows of its local_k_slice in ascending order, one split per run from one source rank. Sizes
    are elements (rows x row_elems)."""
    cu = _check_cu_seqlens(cu_seqlens)
    per_rank = _check_world(cu[-1], world_size)
    if row_elems < 1:
        raise HiercollError(f"row_elems: {row_elems}; give the elements per token row (>= 1)")
    needs = {d: _needed_rows(cu, d, world_size, causal) for d in range(world_size)}
    ranks = []
    for r in range(world_size):
        others = {d: ivs for d, ivs in needs.items() if d != r}
        inputs = [Split(size=(b - a) * row_elems, peers=dests)
                  for (a, b), dests in _runs(_host(r, per_rank), others) if b > a]
        outputs = [Split(size=n * row_elems, peers=[src]) for src, n in _sources(needs[r], per_rank)]
        ranks.append(RankSplits(input=inputs, output=outputs))
    return GroupSplits(ranks=ranks)


def _needed_rows(cu: tuple[int, ...], rank: int, world_size: int, causal: bool) -> list[Interval]:
    """Rows of rank's local_k_slice it does not host: before it, and (full attention) after it."""
    per_rank = cu[-1] // world_size
    lo, hi = _host(rank, per_rank)
    ks, ke = prepare(cu, rank, world_size, causal).local_k_slice
    return [(a, b) for a, b in ((ks, lo), (hi, ke)) if b > a]


# ---- comparison -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CommRow:
    """One way to exchange one layer's K/V: bytes over each tier and simulated time."""

    method: str          # "all_gather" (llama3) or "group_cast" (needed-only)
    algorithm: str
    bytes_intra: float
    bytes_inter: float
    time_us: float

    @property
    def bytes_total(self) -> float:
        return self.bytes_intra + self.bytes_inter


def _row(method: str, algorithm: str, schedule: Schedule, topology: Topology) -> CommRow:
    res = simulate(schedule, topology)
    return CommRow(method, algorithm, res.bytes_intra, res.bytes_inter, res.time_us)


def compare(topology: Topology, cu_seqlens: Sequence[int], world_size: int, row_elems: int,
            causal: bool, dtype: str = "bf16",
            all_gather_algorithms: Sequence[str] = ("ring", "hier"),
            group_cast_algorithms: Sequence[str] = ("direct", "hier")) -> list[CommRow]:
    """One layer's K/V exchange, all-gather vs needed-only group-cast, each algorithm that applies.

    `row_elems` here is everything one token contributes to the exchange (K and V of all KV
    heads: 2 x num_heads_k x head_dim), so both methods move the same rows."""
    if world_size != topology.world_size:
        raise HiercollError(f"world_size: {world_size} but topology {topology.name} has "
                            f"{topology.world_size} ranks; pass the topology's world size")
    cu = _check_cu_seqlens(cu_seqlens)
    _check_world(cu[-1], world_size)
    dt = DType(dtype)
    gather = CollectiveSpec(kind=Kind.ALL_GATHER, world_size=world_size, dtype=dt,
                            nbytes=cu[-1] * row_elems * dt.itemsize)
    cast = CollectiveSpec(kind=Kind.GROUP_CAST, world_size=world_size, dtype=dt,
                          splits=needed_kv_group_cast(cu, world_size, row_elems, causal))
    rows = []
    for method, spec, algos in (("all_gather", gather, all_gather_algorithms),
                                ("group_cast", cast, group_cast_algorithms)):
        ok = applicable(topology, spec)
        rows += [_row(method, a, plan(topology, spec, a), topology) for a in algos if a in ok]
    return rows
