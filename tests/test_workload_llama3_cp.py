"""Llama3-style context parallelism on a packed batch: per-rank varlen arguments, the needed-only
K/V group-cast, and the all-gather plans, checked against examples worked by hand.

The worked example: cu_seqlens [0, 3, 9, 12, 16], W = 4, T = 16, 4 tokens per rank.
Documents A = [0, 3), B = [3, 9), C = [9, 12), D = [12, 16); ranks hold
r0 = [0, 4), r1 = [4, 8), r2 = [8, 12), r3 = [12, 16).

Causal (keys of a piece end with the piece, start at its document's start):
  r0: pieces A[0,3) B[3,4)   keys A[0,3) B[3,4)        slice (0, 4)   cu_q [0,3,4] cu_k [0,3,4]
  r1: piece  B[4,8)          keys B[3,8)               slice (3, 8)   cu_q [0,4]   cu_k [0,5]
  r2: pieces B[8,9) C[9,12)  keys B[3,9) C[9,12)       slice (3, 12)  cu_q [0,1,4] cu_k [0,6,9]
  r3: piece  D[12,16)        keys D[12,16)             slice (12, 16) cu_q [0,4]   cu_k [0,4]
  max_q/max_k: r0 3/3, r1 4/5 (q_len 4 < k_len 5: bottom-right), r2 3/6, r3 4/4.
Full (keys are the whole document):
  r0: keys A[0,3) B[3,9) slice (0, 9), cu_k [0,3,9], max_k 6; r1: keys B[3,9) slice (3, 9),
  cu_k [0,6], max_k 6; r2 and r3 as causal (their last document ends on the rank).

Needed remote rows (local_k_slice minus the rank's own rows):
  causal: r0 none; r1 [3,4) from r0; r2 [3,4) from r0, [4,8) from r1; r3 none.
  full:   r0 [4,8) from r1, [8,9) from r2; r1 [3,4) from r0, [8,9) from r2;
          r2 [3,4) from r0, [4,8) from r1; r3 none.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from helpers import small_topology
from hypothesis import given, settings
from hypothesis import strategies as st

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec, GroupSplits, Kind
from hiercoll.errors import HiercollError
from hiercoll.executor import execute
from hiercoll.planner import plan
from hiercoll.workloads.llama3_cp import (
    Llama3Shard,
    all_gather_plans,
    compare,
    needed_kv_group_cast,
    prepare,
    reduce_scatter_plan,
)

CU = [0, 3, 9, 12, 16]
W = 4

CAUSAL = [
    Llama3Shard((0, 3, 4), (0, 3, 4), 3, 3, (0, 4)),
    Llama3Shard((0, 4), (0, 5), 4, 5, (3, 8)),
    Llama3Shard((0, 1, 4), (0, 6, 9), 3, 6, (3, 12)),
    Llama3Shard((0, 4), (0, 4), 4, 4, (12, 16)),
]
FULL = [
    Llama3Shard((0, 3, 4), (0, 3, 9), 3, 6, (0, 9)),
    Llama3Shard((0, 4), (0, 6), 4, 6, (3, 9)),
    Llama3Shard((0, 1, 4), (0, 6, 9), 3, 6, (3, 12)),
    Llama3Shard((0, 4), (0, 4), 4, 4, (12, 16)),
]


@pytest.mark.parametrize("rank", range(W))
def test_prepare_causal_worked_example(rank: int) -> None:
    assert prepare(CU, rank, W, causal=True) == CAUSAL[rank]


@pytest.mark.parametrize("rank", range(W))
def test_prepare_full_worked_example(rank: int) -> None:
    assert prepare(CU, rank, W, causal=False) == FULL[rank]


def test_empty_documents_hold_nothing() -> None:
    # an empty document between A and B changes nothing
    assert prepare([0, 3, 3, 9, 12, 16], 2, W, causal=True) == CAUSAL[2]


def _one_line_error(call: Callable[..., object], *args: object) -> str:
    with pytest.raises(HiercollError) as info:
        call(*args)
    msg = str(info.value)
    assert msg and "\n" not in msg
    return msg


def test_uneven_total_is_refused_in_one_line() -> None:
    msg = _one_line_error(prepare, [0, 5, 17], 0, 4, True)
    assert "17" in msg and "pad" in msg and "20" in msg
    assert "pad" in _one_line_error(needed_kv_group_cast, [0, 5, 17], 4, 8, True)


@pytest.mark.parametrize(("cu", "word"), [
    ([], "2 entries"), ([0], "2 entries"), ([1, 5], "start at 0"), ([0, 6, 4, 8], "non-decreasing"),
])
def test_bad_cu_seqlens_are_refused_in_one_line(cu: list[int], word: str) -> None:
    assert word in _one_line_error(prepare, cu, 0, 2, True)


def test_bad_rank_is_refused() -> None:
    assert "rank" in _one_line_error(prepare, CU, 4, W, True)


# ---- needed-only group-cast -------------------------------------------------------------------
def _layout(splits: GroupSplits, rank: int, side: str) -> list[tuple[int, list[int]]]:
    return [(sp.size, sp.peers) for sp in getattr(splits.ranks[rank], side)]


def test_needed_kv_splits_worked_example_causal() -> None:
    g = needed_kv_group_cast(CU, W, row_elems=2, causal=True)
    # r0: tokens 0-2 nobody's (peers []), token 3 to r1 and r2; r1 all to r2; r2, r3 nobody's
    assert [_layout(g, r, "input") for r in range(W)] == [
        [(6, []), (2, [1, 2])], [(8, [2])], [(8, [])], [(8, [])]]
    assert [_layout(g, r, "output") for r in range(W)] == [
        [], [(2, [0])], [(2, [0]), (8, [1])], []]


def test_needed_kv_splits_worked_example_full() -> None:
    g = needed_kv_group_cast(CU, W, row_elems=1, causal=False)
    assert [_layout(g, r, "input") for r in range(W)] == [
        [(3, []), (1, [1, 2])], [(4, [0, 2])], [(1, [0, 1]), (3, [])], [(4, [])]]
    assert [_layout(g, r, "output") for r in range(W)] == [
        [(4, [1]), (1, [2])], [(1, [0]), (1, [2])], [(1, [0]), (4, [1])], []]


def _spec(cu: list[int], world: int, row_elems: int, causal: bool) -> CollectiveSpec:
    return CollectiveSpec(kind="group_cast", world_size=world, dtype="fp32", nbytes=0,
                          splits=needed_kv_group_cast(cu, world, row_elems, causal))


def _check_delivery(schedule: hc.Schedule, cu: list[int], world: int, row_elems: int,
                    causal: bool) -> None:
    """Inputs are token ids (each row = its id, row_elems times): every rank must receive the ids
    of its local_k_slice that it does not host, ascending."""
    per = cu[-1] // world
    inputs = [np.repeat(np.arange(r * per, (r + 1) * per, dtype=np.float32), row_elems)
              for r in range(world)]
    outs = execute(schedule, inputs, seed=1)
    for r in range(world):
        ks, ke = prepare(cu, r, world, causal).local_k_slice
        want = [t for t in range(ks, ke) if not r * per <= t < (r + 1) * per]
        np.testing.assert_array_equal(outs[r], np.repeat(np.array(want, dtype=np.float32), row_elems))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cu", [CU, [0, 16], [0, 4, 8, 12, 16], [0, 1, 2, 15, 16], [0, 0, 7, 16]])
def test_needed_kv_direct_delivers_the_needed_rows(cu: list[int], causal: bool) -> None:
    topo = small_topology(1, W)
    sched = plan(topo, _spec(cu, W, 3, causal), "direct")
    _check_delivery(sched, cu, W, 3, causal)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cu", [CU, [0, 16], [0, 5, 6, 16]])
def test_needed_kv_hier_on_two_nodes_verifies(cu: list[int], causal: bool) -> None:
    topo = small_topology(2, 2)
    for algo in ("direct", "hier"):
        sched = plan(topo, _spec(cu, W, 2, causal), algo)
        assert hc.verify(sched, trials=2, seed=0).ok
        _check_delivery(sched, cu, W, 2, causal)


# ---- llama3 all-gather / reduce-scatter plans ---------------------------------------------------
def test_all_gather_plans_one_per_head_group() -> None:
    topo = small_topology(2, 2)
    plans = all_gather_plans(topo, total_tokens=16, row_elems=8, heads_k_stride=2, num_heads_k=8)
    assert len(plans) == 4
    for s in plans:   # K and V of 2 heads x 16 tokens x head_dim 8, bf16
        assert s.spec.kind == Kind.ALL_GATHER and s.spec.nbytes == 2 * 16 * 2 * 8 * 2
        assert s.spec.input_count(0) == 2 * 4 * 2 * 8   # each rank's 4 tokens
    assert hc.verify(plans[0], trials=1, seed=0).ok


def test_reduce_scatter_plan_is_the_transposed_gather() -> None:
    topo = small_topology(2, 2)
    ag = all_gather_plans(topo, 16, 8, 4, 8, algorithm="hier")
    rs = reduce_scatter_plan(topo, 16, 8, 4, 8, algorithm="hier")
    assert len(rs) == len(ag) == 2
    for g, r in zip(ag, rs, strict=True):
        assert r.spec.kind == Kind.REDUCE_SCATTER
        assert [r.spec.input_count(x) for x in range(W)] == [g.spec.output_count(x) for x in range(W)]
        assert [r.spec.output_count(x) for x in range(W)] == [g.spec.input_count(x) for x in range(W)]
    assert hc.verify(rs[0], trials=1, seed=0).ok


def test_head_stride_must_divide_heads() -> None:
    assert "heads_k_stride" in _one_line_error(all_gather_plans, small_topology(1, 4), 16, 8, 3, 8)
    assert "pad" in _one_line_error(reduce_scatter_plan, small_topology(1, 4), 17, 8, 1, 8)


# ---- comparison -------------------------------------------------------------------------------
def test_compare_worked_example_bytes() -> None:
    """row_elems 256 bf16 = 512 B a token. Causal needs: token 3 (r0) -> r1 (same node) and r2
    (other node); tokens 4-7 (r1) -> r2 (other node). Direct: 512 B intra, 5 x 512 B inter.
    hier: token 3 crosses to r2 (gateway local rank 0) once; r1's rows cross to r3 (its same-rank
    gateway) and r3 forwards them to r2 over NVLink: 512 + 2048 intra, 2560 inter. Ring
    all-gather: each rank receives 12 of 16 tokens, half the ring hops cross nodes."""
    rows = {(r.method, r.algorithm): r for r in compare(small_topology(2, 2), CU, W, 256, True)}
    assert set(rows) == {("all_gather", "ring"), ("all_gather", "hier"),
                         ("group_cast", "direct"), ("group_cast", "hier")}
    assert (rows["group_cast", "direct"].bytes_intra, rows["group_cast", "direct"].bytes_inter) == (512, 2560)
    assert (rows["group_cast", "hier"].bytes_intra, rows["group_cast", "hier"].bytes_inter) == (2560, 2560)
    assert (rows["all_gather", "ring"].bytes_intra, rows["all_gather", "ring"].bytes_inter) == (12288, 12288)
    assert all(r.time_us > 0 for r in rows.values())


def test_compare_refuses_a_world_size_other_than_the_topology() -> None:
    assert "world_size" in _one_line_error(compare, small_topology(1, 4), CU, 2, 8, True)


@st.composite
def _packed(draw: st.DrawFn) -> list[int]:
    """Random documents (some empty), the last padded so that T is a positive multiple of W."""
    docs = draw(st.lists(st.integers(0, 12), min_size=1, max_size=6))
    pad = -sum(docs) % W
    docs[-1] += pad if sum(docs) + pad else W
    cu = [0]
    for d in docs:
        cu.append(cu[-1] + d)
    return cu


@settings(max_examples=40, deadline=None)
@given(cu=_packed(), two_nodes=st.booleans())
def test_needed_only_never_moves_more_than_all_gather_causal(cu: list[int], two_nodes: bool) -> None:
    """A row is needed by at most W-1 other ranks, which is what the all-gather sends it to; the
    hier cast crosses RDMA at most once per remote node, as the hier all-gather does."""
    topo = small_topology(2, 2) if two_nodes else small_topology(1, W)
    rows = {(r.method, r.algorithm): r for r in compare(topo, cu, W, 8, causal=True)}
    gathers = [r for (m, _), r in rows.items() if m == "all_gather"]
    casts = [r for (m, _), r in rows.items() if m == "group_cast"]
    assert gathers and len(casts) == 2
    for c in casts:
        assert all(c.bytes_total <= g.bytes_total for g in gathers)
    assert rows["group_cast", "hier"].bytes_inter <= rows["all_gather", "hier"].bytes_inter
    needed = sum(sp.size for rs in needed_kv_group_cast(cu, W, 8, True).ranks for sp in rs.output)
    assert rows["group_cast", "direct"].bytes_total == needed * 2   # bf16
