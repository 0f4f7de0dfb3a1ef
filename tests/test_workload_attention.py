"""MagiAttention-style mask -> dispatch -> zero-redundancy group-cast, on examples worked by hand,
against a dense boolean mask, and through the planner and the reference executor.

Example A: varlen causal, cu_seqlens [0, 6, 8], T = 8, chunk 2, cp 2 (4 chunks, 2 per rank).
  Docs A = [0, 6), B = [6, 8); row i of a causal doc attends to i + 1 keys.
  Areas: c0 [0,2) = 1+2 = 3, c1 [2,4) = 3+4 = 7, c2 [4,6) = 5+6 = 11, c3 [6,8) = B's 1+2 = 3
  (total 24 = 21 + 3).
  Greedy, largest first to the least-loaded rank with room (ties: lower chunk, lower rank):
  c2 -> r0 (11), c1 -> r1 (7), c0 -> r1 (10, now full), c3 -> r0 (14).
  r0 {2, 3} = 14, r1 {0, 1} = 10, mean 12: imbalance 14/12.
  Host r0 [4,8), r1 [0,4). r0's queries need A[0,6) (rows 4, 5 see all of A up to themselves)
  and B[6,8): [0,8), so it fetches [0,4) from r1; r1 needs [0,4), all hosted.

Example B: varlen causal, cu_seqlens [0, 3, 9, 12, 16], T = 16, chunk 2, cp 4 (8 chunks, 2 per rank).
  Docs A [0,3), B [3,9), C [9,12), D [12,16).
  Areas: c0 = A 1+2 = 3; c1 = A 3 + B 1 = 4; c2 = B 2+3 = 5; c3 = B 4+5 = 9; c4 = B 6 + C 1 = 7;
  c5 = C 2+3 = 5; c6 = D 1+2 = 3; c7 = D 3+4 = 7 (total 43 = 6 + 21 + 6 + 10).
  Greedy order c3 9, c4 7, c7 7, c2 5, c5 5, c1 4, c0 3, c6 3:
  c3 -> r0 (9), c4 -> r1 (7), c7 -> r2 (7), c2 -> r3 (5), c5 -> r3 (10, full),
  c1 -> r1 (tie 7/7 with r2, lower rank; 11, full), c0 -> r2 (10, full), c6 -> r0 (12).
  Loads r0 {3,6} 12, r1 {1,4} 11, r2 {0,7} 10, r3 {2,5} 10; mean 10.75: imbalance 12/10.75.
  Keys per chunk: c0 [0,2), c1 A[0,3)+B[3,4) = [0,4), c2 [3,6), c3 [3,8), c4 B[3,9)+C[9,10) = [3,10),
  c5 [9,12), c6 [12,14), c7 [12,16).
  Host / needed / remote:
    r0 [6,8) [12,14)  needs [3,8) [12,14)  fetches [3,6): [3,4) from r1 (c1), [4,6) from r3 (c2)
    r1 [2,4) [8,10)   needs [0,10)         fetches [0,2) from r2, [4,6) from r3, [6,8) from r0
    r2 [0,2) [14,16)  needs [0,2) [12,16)  fetches [12,14) from r0
    r3 [4,6) [10,12)  needs [3,6) [9,12)   fetches [3,4) and [9,10) from r1
  Fetchers per token (what a group-reduce of ones counts): 3 -> r0, r3; 4, 5 -> r0, r1;
  0, 1, 6, 7 -> r1; 9 -> r3; 12, 13 -> r2; every other token 0.

Example C: full mask ([0,8), [0,8)), T = 8, chunk 2, cp 4: every chunk has area 2 x 8 = 16, greedy
  deals c0..c3 to r0..r3 (all ties), imbalance 1. Every rank needs all 8 tokens and fetches the
  6 it does not host: each token goes to 3 ranks.

Example D: block_causal_mask(12, block=4, global_block=4), chunk 2, cp 2.
  Triples: global ([0,4), [0,12), full); ([4,8), [0,4), full), ([4,8), [4,8), causal);
  ([8,12), [0,8), full), ([8,12), [8,12), causal). Dense: 4 x 12 + (16 + 10) + (32 + 10) = 116.
  Areas: c0 = c1 = 2 x 12 = 24; c2 = 2x4 + 1+2 = 11; c3 = 8 + 3+4 = 15; c4 = 2x8 + 3 = 19;
  c5 = 16 + 7 = 23. Greedy order c0 24, c1 24, c5 23, c4 19, c3 15, c2 11:
  c0 -> r0, c1 -> r1, c5 -> r0 (47), c4 -> r1 (43), c3 -> r1 (58, full), c2 -> r0 (58): imbalance 1.
  Host r0 [0,2) [4,6) [10,12), r1 [2,4) [6,10); the global chunks need every key, so each rank
  fetches everything the other hosts: r0 [2,4) [6,10) from r1, r1 [0,2) [4,6) [10,12) from r0.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import small_topology
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec, GroupSplits
from hiercoll.errors import HiercollError
from hiercoll.executor import execute
from hiercoll.planner import plan
from hiercoll.workloads.attention import (
    MASK_TYPES,
    SOLVERS,
    AttentionPlan,
    KVCast,
    MaskSlice,
    MaskType,
    block_causal_mask,
    check_mask,
    chunk_areas,
    dispatch,
    group_splits_to_magi,
    load_magi_splits,
    load_mask,
    magi_to_group_splits,
    mask_from_cu_seqlens,
    merge,
    slice_area,
    slice_keys,
    solve,
    subtract,
    tokens,
)

EX_A = dict(mask=mask_from_cu_seqlens([0, 6, 8], causal=True), total_seqlen=8, chunk_size=2, cp_size=2)
EX_B = dict(mask=mask_from_cu_seqlens([0, 3, 9, 12, 16], causal=True), total_seqlen=16, chunk_size=2,
            cp_size=4)
EX_C = dict(mask=[((0, 8), (0, 8), "full")], total_seqlen=8, chunk_size=2, cp_size=4)
EX_D = dict(mask=block_causal_mask(12, 4, global_block=4), total_seqlen=12, chunk_size=2, cp_size=2)


def _solve(ex: dict, **kw: object) -> AttentionPlan:
    return solve(ex["mask"], ex["total_seqlen"], ex["chunk_size"], ex["cp_size"], **kw)


def _one_line_error(call: Callable[..., object], *args: object, **kw: object) -> str:
    with pytest.raises(HiercollError) as info:
        call(*args, **kw)
    msg = str(info.value)
    assert msg and "\n" not in msg
    return msg


# ---- dense brute force: straight from the definition ------------------------------------------
def _dense_slice(s: MaskSlice, total: int) -> np.ndarray:
    """Query qs+i attends to key ks+j: full always; causal j <= i + (Lk - Lq); inv_causal j >= i;
    bi_causal both."""
    m = np.zeros((total, total), dtype=bool)
    (qs, qe), (ks, ke) = s.q, s.k
    i = np.arange(qe - qs)[:, None]
    j = np.arange(ke - ks)[None, :]
    d = (ke - ks) - (qe - qs)
    allow = {MaskType.FULL: np.ones((qe - qs, ke - ks), dtype=bool), MaskType.CAUSAL: j <= i + d,
             MaskType.INV_CAUSAL: j >= i, MaskType.BI_CAUSAL: (j >= i) & (j <= i + d)}[MaskType(s.type)]
    m[qs:qe, ks:ke] = allow
    return m


def _dense(mask: Sequence[MaskSlice], total: int) -> np.ndarray:
    out = np.zeros((total, total), dtype=bool)
    for s in mask:
        out |= _dense_slice(s, total)
    return out


def _ranges_of(flags: np.ndarray) -> tuple[tuple[int, int], ...]:
    return merge((int(t), int(t) + 1) for t in np.flatnonzero(flags))


def _token_set(ranges: Sequence[tuple[int, int]]) -> set[int]:
    return {t for s, e in ranges for t in range(s, e)}


def _check_against_dense(p: AttentionPlan) -> None:
    """Areas per chunk and type, and each rank's needed keys, equal the dense mask's."""
    cs, total = p.chunk_size, p.total_seqlen
    for t in MASK_TYPES:
        dense = _dense([s for s in p.mask if s.type == t], total)
        want = tuple(int(dense[c * cs:(c + 1) * cs].sum()) for c in range(total // cs))
        assert p.areas.of_type(t) == want, t
    dense = _dense(p.mask, total)
    for r, chunks in enumerate(p.dispatch.rank_chunks):
        rows = np.zeros(total, dtype=bool)
        for c in chunks:
            rows[c * cs:(c + 1) * cs] = True
        assert p.needed_ranges[r] == _ranges_of(dense[rows].any(axis=0)), r


# ---- worked examples --------------------------------------------------------------------------
def test_example_a_two_ranks_varlen_causal() -> None:
    p = _solve(EX_A)
    assert p.areas.totals == (3, 7, 11, 3)
    assert p.dispatch.rank_chunks == ((2, 3), (0, 1))
    assert p.dispatch.loads == (14, 10)
    assert p.imbalance == pytest.approx(14 / 12)
    assert p.host_ranges == (((4, 8),), ((0, 4),))
    assert p.needed_ranges == (((0, 8),), ((0, 4),))
    assert p.remote_ranges == (((0, 4),), ())
    assert [(t.src, t.dst, t.ranges) for t in p.transfers] == [(1, 0, ((0, 4),))]
    _check_against_dense(p)


def test_example_b_four_ranks_varlen_causal() -> None:
    p = _solve(EX_B)
    assert p.areas.totals == (3, 4, 5, 9, 7, 5, 3, 7)
    assert p.areas.of_type("causal") == p.areas.totals and set(p.areas.of_type("full")) == {0}
    assert p.dispatch.rank_chunks == ((3, 6), (1, 4), (0, 7), (2, 5))
    assert p.dispatch.loads == (12, 11, 10, 10)
    assert p.imbalance == pytest.approx(12 / 10.75)
    assert p.host_ranges == (((6, 8), (12, 14)), ((2, 4), (8, 10)), ((0, 2), (14, 16)), ((4, 6), (10, 12)))
    assert p.needed_ranges == (((3, 8), (12, 14)), ((0, 10),), ((0, 2), (12, 16)), ((3, 6), (9, 12)))
    assert p.remote_ranges == (((3, 6),), ((0, 2), (4, 8)), ((12, 14),), ((3, 4), (9, 10)))
    assert [(t.src, t.dst, t.ranges) for t in p.transfers] == [
        (0, 1, ((6, 8),)), (0, 2, ((12, 14),)), (1, 0, ((3, 4),)), (1, 3, ((3, 4), (9, 10))),
        (2, 1, ((0, 2),)), (3, 0, ((4, 6),)), (3, 1, ((4, 6),))]
    _check_against_dense(p)


def test_example_b_splits_by_hand() -> None:
    g = _solve(EX_B).group_cast_splits(row_elems=3)
    lay = [([(s.size // 3, s.peers) for s in r.input], [(s.size // 3, s.peers) for s in r.output])
           for r in g.ranks]
    # r1 hosts tokens 2, 3, 8, 9: 2 nobody's, 3 to r0 and r3, 8 nobody's, 9 to r3 (peers [] stays
    # in the input so the input is the host K/V as is); r1 receives [0,2) r2, [4,6) r3, [6,8) r0
    assert lay == [
        ([(2, [1]), (2, [2])], [(1, [1]), (2, [3])]),
        ([(1, []), (1, [0, 3]), (1, []), (1, [3])], [(2, [2]), (2, [3]), (2, [0])]),
        ([(2, [1]), (2, [])], [(2, [0])]),
        ([(2, [0, 1]), (2, [])], [(2, [1])]),
    ]


def test_example_c_full_mask() -> None:
    p = _solve(EX_C)
    assert p.areas.totals == (16, 16, 16, 16)
    assert p.dispatch.rank_chunks == ((0,), (1,), (2,), (3,))
    assert p.imbalance == 1.0
    assert p.remote_ranges == (((2, 8),), ((0, 2), (4, 8)), ((0, 4), (6, 8)), ((0, 6),))
    assert len(p.transfers) == 12 and all(t.tokens == 2 for t in p.transfers)
    _check_against_dense(p)


def test_example_d_block_causal_with_global_block() -> None:
    assert EX_D["mask"] == (
        MaskSlice((0, 4), (0, 12), MaskType.FULL),
        MaskSlice((4, 8), (0, 4), MaskType.FULL), MaskSlice((4, 8), (4, 8), MaskType.CAUSAL),
        MaskSlice((8, 12), (0, 8), MaskType.FULL), MaskSlice((8, 12), (8, 12), MaskType.CAUSAL))
    assert int(_dense(EX_D["mask"], 12).sum()) == 116
    p = _solve(EX_D)
    assert p.areas.totals == (24, 24, 11, 15, 19, 23)
    assert p.dispatch.rank_chunks == ((0, 2, 5), (1, 3, 4))
    assert p.dispatch.loads == (58, 58) and p.imbalance == 1.0
    assert p.host_ranges == (((0, 2), (4, 6), (10, 12)), ((2, 4), (6, 10)))
    assert p.remote_ranges == (((2, 4), (6, 10)), ((0, 2), (4, 6), (10, 12)))
    _check_against_dense(p)


def test_block_causal_without_global_block_and_ragged_last_block() -> None:
    # blocks [0,4) [4,8) [8,10): the first attends causally to itself only
    assert block_causal_mask(10, 4) == (
        MaskSlice((0, 4), (0, 4), MaskType.CAUSAL),
        MaskSlice((4, 8), (0, 4), MaskType.FULL), MaskSlice((4, 8), (4, 8), MaskType.CAUSAL),
        MaskSlice((8, 10), (0, 8), MaskType.FULL), MaskSlice((8, 10), (8, 10), MaskType.CAUSAL))


def test_cu_seqlens_mask_skips_empty_documents() -> None:
    assert mask_from_cu_seqlens([0, 3, 3, 5], causal=False) == (
        MaskSlice((0, 3), (0, 3), MaskType.FULL), MaskSlice((3, 5), (3, 5), MaskType.FULL))


# ---- area and key formulas by brute force, every type and shape -------------------------------
@pytest.mark.parametrize("kind", MASK_TYPES)
@pytest.mark.parametrize(("q", "k"), [((2, 7), (1, 9)), ((0, 8), (3, 6)), ((4, 9), (4, 9)), ((1, 3), (0, 10))])
def test_slice_area_and_keys_match_dense(kind: MaskType, q: tuple[int, int], k: tuple[int, int]) -> None:
    s = MaskSlice(q, k, kind)
    dense = _dense_slice(s, 12)
    for a in range(12):
        for b in range(a + 1, 13):
            assert slice_area(s, (a, b)) == int(dense[a:b].sum()), (a, b)
            keys = _ranges_of(dense[a:b].any(axis=0))
            got = slice_keys(s, (a, b))
            assert (got,) == keys if got else keys == (), (a, b)


# ---- dispatch ---------------------------------------------------------------------------------
def test_dispatch_balances_equal_chunks_with_every_solver() -> None:
    areas = chunk_areas([((0, 16), (0, 16), "full")], 16, 2)        # 8 chunks of area 32
    for solver in SOLVERS:
        d = dispatch(areas, 4, solver)
        assert [len(cs) for cs in d.rank_chunks] == [2, 2, 2, 2]
        assert d.loads == (64, 64, 64, 64) and d.imbalance == 1.0


def test_greedy_beats_contiguous_on_one_causal_sequence() -> None:
    areas = chunk_areas([((0, 16), (0, 16), "causal")], 16, 2)      # 3, 7, 11, .., 31
    assert areas.totals == (3, 7, 11, 15, 19, 23, 27, 31)
    contiguous = dispatch(areas, 4, "contiguous")
    assert contiguous.loads == (10, 26, 42, 58) and contiguous.imbalance == pytest.approx(58 / 34)
    assert dispatch(areas, 4, "zigzag").rank_chunks == ((0, 7), (1, 6), (2, 5), (3, 4))
    greedy = dispatch(areas, 4, "greedy")
    assert greedy.loads == (34, 34, 34, 34) and greedy.imbalance == 1.0


def test_a_plugged_solver_is_used_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    areas = chunk_areas(EX_B["mask"], 16, 2)
    monkeypatch.setitem(SOLVERS, "reverse", lambda a, w: [[7 - 2 * r, 6 - 2 * r] for r in range(w)])
    assert dispatch(areas, 4, "reverse").rank_chunks == ((6, 7), (4, 5), (2, 3), (0, 1))
    monkeypatch.setitem(SOLVERS, "broken", lambda a, w: [[0, 0]] + [[2 * r, 2 * r + 1] for r in range(1, w)])
    assert "chunks [1]" in _one_line_error(dispatch, areas, 4, "broken")
    monkeypatch.setitem(SOLVERS, "lopsided", lambda a, w: [list(range(8))] + [[]] * (w - 1))
    assert "rank 0 got 8 chunks" in _one_line_error(dispatch, areas, 4, "lopsided")
    assert "greedy" in _one_line_error(dispatch, areas, 4, "nope")


# ---- through the planner and the reference executor -------------------------------------------
def _ids(ranges: Sequence[tuple[int, int]], row_elems: int) -> np.ndarray:
    return np.repeat(np.array(sorted(_token_set(ranges)), dtype=np.float32), row_elems)


def _cast_and_check(cast: KVCast, topo: hc.Topology, algorithm: str, row_elems: int) -> None:
    """Inputs are host token ids (each repeated row_elems times): every rank must receive exactly
    the ids of its remote tokens, ascending. Then the transposed group-reduce of ones counts, on
    each host row, the ranks that fetched that token."""
    w = cast.world_size
    spec = CollectiveSpec(kind="group_cast", world_size=w, dtype="fp32", nbytes=0,
                          splits=cast.group_cast_splits(row_elems))
    outs = execute(plan(topo, spec, algorithm), [_ids(h, row_elems) for h in cast.host_ranges], seed=3)
    for r in range(w):
        np.testing.assert_array_equal(outs[r], _ids(cast.remote_ranges[r], row_elems))
    red = CollectiveSpec(kind="group_reduce", world_size=w, dtype="fp32", nbytes=0,
                         splits=cast.group_reduce_splits(row_elems))
    ones = [np.ones(tokens(rr) * row_elems, dtype=np.float32) for rr in cast.remote_ranges]
    counts = execute(plan(topo, red, algorithm), ones, seed=4)
    for r in range(w):
        host = sorted(_token_set(cast.host_ranges[r]))
        want = [sum(t in _token_set(rr) for rr in cast.remote_ranges) for t in host]
        np.testing.assert_array_equal(counts[r], np.repeat(np.array(want, dtype=np.float32), row_elems))


@pytest.mark.parametrize("ex", [EX_A, EX_B, EX_C, EX_D], ids=["A", "B", "C", "D"])
def test_every_rank_receives_exactly_what_its_queries_need(ex: dict) -> None:
    p = _solve(ex)
    _cast_and_check(p.cast, small_topology(1, p.cp_size), "direct", row_elems=3)


def test_example_b_fetcher_counts_by_hand() -> None:
    p = _solve(EX_B)
    red = CollectiveSpec(kind="group_reduce", world_size=4, dtype="fp32", nbytes=0,
                         splits=p.group_reduce_splits(1))
    ones = [np.ones(tokens(rr), dtype=np.float32) for rr in p.remote_ranges]
    counts = execute(plan(small_topology(1, 4), red, "direct"), ones)
    # host tokens r0 [6,7,12,13], r1 [2,3,8,9], r2 [0,1,14,15], r3 [4,5,10,11]
    assert [c.tolist() for c in counts] == [[1, 1, 1, 1], [0, 2, 0, 1], [1, 1, 0, 0], [2, 2, 0, 0]]


@pytest.mark.parametrize("ex", [EX_B, dict(EX_D, chunk_size=1, cp_size=4)], ids=["B", "D-4ranks"])
def test_hier_on_two_nodes_verifies_and_delivers(ex: dict) -> None:
    p = _solve(ex)
    topo = small_topology(2, 2)
    for kind, splits in (("group_cast", p.group_cast_splits(2)), ("group_reduce", p.group_reduce_splits(2))):
        spec = CollectiveSpec(kind=kind, world_size=4, dtype="fp32", nbytes=0, splits=splits)
        report = hc.verify(plan(topo, spec, "hier"), trials=2)
        assert report.ok, report.to_json()
    _cast_and_check(p.cast, topo, "hier", row_elems=2)


def test_stages_split_the_remote_tokens_and_each_delivers() -> None:
    p = _solve(EX_B, degree=2)
    stages = p.stages()
    # remote tokens r0 [3,4,5] -> [3,4] | [5]; r1 [0,1,4,5,6,7] -> [0,1,4] | [5,6,7];
    # r2 [12,13] -> [12] | [13]; r3 [3,9] -> [3] | [9]
    assert [s.remote_ranges for s in stages] == [
        (((3, 5),), ((0, 2), (4, 5)), ((12, 13),), ((3, 4),)),
        (((5, 6),), ((5, 8),), ((13, 14),), ((9, 10),))]
    for s in stages:
        assert s.host_ranges == p.host_ranges
        _cast_and_check(s, small_topology(1, 4), "direct", row_elems=1)
    for degree in (1, 3, 7):
        parts = p.stages(degree)
        assert len(parts) == degree
        for r in range(4):
            assert merge(iv for s in parts for iv in s.remote_ranges[r]) == p.remote_ranges[r]
            assert sum(tokens(s.remote_ranges[r]) for s in parts) == tokens(p.remote_ranges[r])
    assert "degree" in _one_line_error(p.stages, 0)


# ---- MagiAttention's argument form ------------------------------------------------------------
def test_magi_form_round_trip(tmp_path: Path) -> None:
    p = _solve(EX_B)
    args = p.magi_args(row_elems=4)
    # r1: host tokens 2, 3, 8, 9 (see test_example_b_splits_by_hand), receives 2 from r2, r3, r0
    r1 = args.ranks[1]
    assert (r1.input_split_sizes, r1.dst_indices) == ([1, 1, 1, 1], [[], [0, 3], [], [3]])
    assert (r1.output_split_sizes, r1.src_index, r1.input_tokens) == ([2, 2, 2], [2, 3, 0], 4)
    assert magi_to_group_splits(args) == p.group_cast_splits(4)
    assert magi_to_group_splits(args.model_dump()) == p.group_cast_splits(4)
    assert group_splits_to_magi(p.group_cast_splits(4), 4, [4] * 4) == args
    base = tmp_path
    (base / "m.json").write_text(json.dumps(args.model_dump()))
    (base / "m.yaml").write_text(yaml.safe_dump(args.model_dump()))
    for name in ("m.json", "m.yaml"):
        g = load_magi_splits(base / name)
        assert isinstance(g, GroupSplits) and g == p.group_cast_splits(4)


def _magi(**rank1: object) -> dict:
    """Two ranks: r0 sends its 3 tokens' first 2 to r1; r1 (2 tokens) sends nothing."""
    r0 = {"input_split_sizes": [2, 1], "dst_indices": [[1], []], "output_split_sizes": [], "src_index": [],
          "input_tokens": 3}
    r1 = {"input_split_sizes": [2], "dst_indices": [[]], "output_split_sizes": [2], "src_index": [0],
          "input_tokens": 2} | rank1
    return {"row_elems": 2, "ranks": [r0, r1]}


@pytest.mark.parametrize(("rank1", "words"), [
    ({"input_split_sizes": [1]}, ["ranks[1].input_split_sizes", "sum to 1", "2 tokens"]),
    ({"dst_indices": [[2]]}, ["ranks[1].dst_indices[0]", "[2] outside 0..1"]),
    ({"dst_indices": [[0, 0]]}, ["ranks[1].dst_indices[0]", "twice"]),
    ({"dst_indices": []}, ["ranks[1].dst_indices", "0 lists for 1 input splits"]),
    ({"src_index": [5]}, ["ranks[1].src_index[0]", "rank 5 outside"]),
    ({"src_index": [0, 0]}, ["ranks[1].src_index", "2 sources for 1 output splits"]),
    ({"output_split_sizes": [3]}, ["ranks[1].src_index[0]", "expects 3 tokens from rank 0", "send it 2"]),
    ({"output_split_sizes": [], "src_index": []}, ["ranks[0].dst_indices[0]", "sends 2 tokens to rank 1"]),
    ({"src_index": [1]}, ["ranks[1].src_index[0]", "expects 2 tokens from rank 1"]),
    ({"output_split_sizes": [-1]}, ["ranks[1].output_split_sizes[0]", "greater than or equal to 0"]),
    ({"colour": 1}, ["ranks[1].colour", "unknown field"]),
])
def test_magi_form_errors_name_rank_and_field(rank1: dict, words: list[str]) -> None:
    msg = _one_line_error(magi_to_group_splits, _magi(**rank1))
    for w in words:
        assert w in msg, msg


def test_magi_form_good_and_file_errors(tmp_path: Path) -> None:
    g = magi_to_group_splits(_magi())
    assert [(s.size, s.peers) for s in g.ranks[0].input] == [(4, [1]), (2, [])]
    base = tmp_path
    (base / "bad.yaml").write_text(yaml.safe_dump(_magi(src_index=[7])))
    msg = _one_line_error(load_magi_splits, base / "bad.yaml")
    assert msg.startswith(f"{base / 'bad.yaml'}: ranks[1].src_index[0]")
    (base / "list.yaml").write_text("- 1\n")
    assert "mapping" in _one_line_error(load_magi_splits, base / "list.yaml")


# ---- bad input: one line naming the field and the fix -----------------------------------------
@pytest.mark.parametrize(("args", "words"), [
    (([((0, 4), (0, 20), "full")], 16, 2, 2), ["mask[0].k", "past total_seqlen 16", "[0, 16)"]),
    (([((-1, 4), (0, 4), "full")], 16, 2, 2), ["mask[0].q", "before 0"]),
    (([((4, 4), (0, 4), "full")], 16, 2, 2), ["mask[0].q", "empty"]),
    (([((0, 4), (0, 4), "sliding")], 16, 2, 2), ["mask[0].type", "'sliding'", "full, causal, inv_causal, bi_causal"]),
    (([((0, 4), (0, 4))], 16, 2, 2), ["mask[0]", "triple"]),
    (([((0, 4), (0, 4), "full")], 18, 4, 2), ["total_seqlen", "multiple of chunk_size 4", "pad", "20"]),
    (([((0, 4), (0, 4), "full")], 12, 2, 4), ["cp_size", "6 chunks", "4 ranks"]),
    (([((0, 4), (0, 4), "full")], 16, 0, 2), ["chunk_size"]),
    (([((0, 8), (0, 8), "causal"), ((4, 6), (2, 3), "full")], 16, 2, 2),
     ["mask[1]", "overlaps mask[0]", "(q=4, k=2)"]),
])
def test_bad_input_is_one_line(args: tuple, words: list[str]) -> None:
    msg = _one_line_error(solve, *args)
    for w in words:
        assert w in msg, msg


def test_more_bad_input_is_one_line() -> None:
    assert "solver" in _one_line_error(solve, EX_A["mask"], 8, 2, 2, solver="magic")
    assert "degree" in _one_line_error(solve, EX_A["mask"], 8, 2, 2, degree=0)
    assert "row_elems" in _one_line_error(_solve(EX_A).group_cast_splits, 0)
    assert "non-decreasing" in _one_line_error(mask_from_cu_seqlens, [0, 5, 3], True)
    assert "cu_seqlens" in _one_line_error(mask_from_cu_seqlens, [1, 5], True)
    assert "global_block" in _one_line_error(block_causal_mask, 8, 2, global_block=9)
    # causal and inv_causal of one square share its diagonal; bi_causal next to full does not overlap
    assert "overlaps" in _one_line_error(check_mask, [((0, 4), (0, 4), "causal"), ((0, 4), (0, 4), "inv_causal")], 4)
    check_mask([((0, 4), (0, 2), "full"), ((0, 4), (2, 6), "bi_causal")], 8)


def test_mask_file(tmp_path: Path) -> None:
    base = tmp_path
    entries = [{"q": [0, 6], "k": [0, 6], "type": "causal"}, {"q": [6, 8], "k": [6, 8], "type": "causal"}]
    (base / "mask.yaml").write_text(yaml.safe_dump(entries))
    (base / "mask.json").write_text(json.dumps(entries))
    for name in ("mask.yaml", "mask.json"):
        assert load_mask(base / name) == EX_A["mask"]
    (base / "bad.yaml").write_text(yaml.safe_dump([entries[0], {"q": [0, 2], "k": [0, 2], "type": "diag"}]))
    msg = _one_line_error(load_mask, base / "bad.yaml")
    assert msg.startswith(f"{base / 'bad.yaml'}: mask[1].type: unknown mask type 'diag'"), msg
    (base / "extra.json").write_text(json.dumps([entries[0] | {"weight": 2}]))
    assert "mask[0].weight: unknown field" in _one_line_error(load_mask, base / "extra.json")
    (base / "map.yaml").write_text("q: [0, 1]\n")
    assert "list" in _one_line_error(load_mask, base / "map.yaml")


# ---- properties over random masks -------------------------------------------------------------
@st.composite
def masks(draw: st.DrawFn) -> tuple[list[MaskSlice], int, int, int]:
    """A random mask with no overlapping triples: the queries are cut into segments, each segment
    gets 0-2 triples over disjoint key ranges of random types."""
    cp = draw(st.sampled_from([1, 2, 4]))
    chunk = draw(st.integers(1, 3))
    total = chunk * cp * draw(st.integers(1, 3))
    cuts = sorted(set(draw(st.lists(st.integers(1, total - 1), max_size=4)))) if total > 1 else []
    mask = []
    for qs, qe in zip([0, *cuts], [*cuts, total]):
        kc = sorted(set(draw(st.lists(st.integers(0, total), min_size=2, max_size=5))))
        for ks, ke in list(zip(kc, kc[1:]))[::2][:2]:
            if draw(st.booleans()) or not mask:
                mask.append(MaskSlice((qs, qe), (ks, ke), draw(st.sampled_from(MASK_TYPES))))
    return mask, total, chunk, cp


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(masks(), st.sampled_from(sorted(SOLVERS)))
def test_remote_never_overlaps_host_and_covers_every_need(case: tuple, solver: str) -> None:
    mask, total, chunk, cp = case
    p = solve(mask, total, chunk, cp, solver=solver)
    _check_against_dense(p)
    assert sum(p.areas.totals) == int(_dense(mask, total).sum())
    hosted = [_token_set(h) for h in p.host_ranges]
    assert sorted(t for h in hosted for t in h) == list(range(total))      # every token hosted once
    for r in range(cp):
        remote, needed = _token_set(p.remote_ranges[r]), _token_set(p.needed_ranges[r])
        assert not remote & hosted[r]
        assert needed <= hosted[r] | remote and remote <= needed
        assert subtract(p.remote_ranges[r], p.host_ranges[r]) == p.remote_ranges[r]
    fetched = sorted((t.dst, x) for t in p.transfers for x in _token_set(t.ranges))
    assert fetched == sorted((r, x) for r in range(cp) for x in _token_set(p.remote_ranges[r]))
    assert all(x in hosted[t.src] for t in p.transfers for x in _token_set(t.ranges))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(masks(), st.integers(1, 3))
def test_random_masks_deliver_through_the_executor(case: tuple, degree: int) -> None:
    mask, total, chunk, cp = case
    p = solve(mask, total, chunk, cp, degree=degree)
    topo = small_topology(1, cp)
    _cast_and_check(p.cast, topo, "direct", row_elems=2)
    for s in p.stages():
        _cast_and_check(s, topo, "direct", row_elems=1)
    assert magi_to_group_splits(p.magi_args(2)) == p.group_cast_splits(2)


_triple = st.builds(lambda q, k, t: MaskSlice(tuple(sorted(q)), tuple(sorted(k)), t),
                    st.lists(st.integers(0, 10), min_size=2, max_size=2, unique=True),
                    st.lists(st.integers(0, 10), min_size=2, max_size=2, unique=True),
                    st.sampled_from(MASK_TYPES))


@settings(max_examples=300, deadline=None)
@given(_triple, _triple)
def test_overlap_check_is_exact(s: MaskSlice, t: MaskSlice) -> None:
    shared = _dense_slice(s, 10) & _dense_slice(t, 10)
    if shared.any():
        msg = _one_line_error(check_mask, [s, t], 10)
        q, k = (int(x) for x in msg.split("(q=")[1].split(")")[0].replace("k=", "").split(", "))
        assert shared[q, k], msg
    else:
        check_mask([s, t], 10)
