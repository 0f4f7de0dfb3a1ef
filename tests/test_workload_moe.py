"""MoE dispatch/combine as group_cast/group_reduce (hiercoll/workloads/moe.py).

Worked example (derived by hand): 2 nodes x 2 GPUs (W=4), E=8 experts, k=2, so rank r hosts
experts 2r and 2r+1; node 0 = ranks 0,1, node 1 = ranks 2,3.

    src  token  topk_idx   expert ranks   destination ranks   destination nodes
    0    0      [0, 5]     0, 2           {0, 2}               {0, 1}
    0    1      [6, 7]     3, 3           {3}  (twice: once)   {1}
    0    2      [-1,-1]    -              {}   (dropped)       {}
    1    0      [2, -1]    1              {1}  (itself)        {0}
    1    1      [4, 7]     2, 3           {2, 3}               {1}   (one RDMA crossing)
    2    0      [1, 3]     0, 1           {0, 1}               {0}   (one RDMA crossing)
    2    1      [0, 2]     0, 1           {0, 1}               {0}   (same set: merged run)
    2    2      [5, 4]     2, 2           {2}  (itself, twice) {1}
    2    3      [-1, 6]    3              {3}                  {1}
    3    -      (no tokens: shape (0, 2))

tokens_per_rank[src] (rows) x dst (cols):  [1,0,1,1] [0,1,1,1] [2,2,1,1] [0,0,0,0]
tokens_per_node[src] x node:               [1,2] [1,1] [2,2] [0,0]
tokens_per_expert (over all sources): e0: 0.0, 2.1 -> 2; e1: 2.0 -> 1; e2: 1.0, 2.1 -> 2;
    e3: 2.0 -> 1; e4: 1.1, 2.2 -> 2; e5: 0.0, 2.2 -> 2; e6: 0.1, 2.3 -> 2; e7: 0.1, 1.1 -> 2
Received, by (source, index): rank 0: 0.0 2.0 2.1; rank 1: 1.0 2.0 2.1; rank 2: 0.0 1.1 2.2;
    rank 3: 0.1 1.1 2.3
Combine of ones: per token, the number of destination ranks: rank 0 [2,1,0], rank 1 [1,2],
    rank 2 [2,2,1,1], rank 3 [].
Inter-node (token, remote node) pairs: 0.0->n1, 0.1->n1, 1.1->n1, 2.0->n0, 2.1->n0 = 5; with
    row_elems=4 fp32 (16 B a row): 80 B, what `hier` moves. `direct` sends per remote rank:
    0.0->2, 0.1->3, 1.1->2,3, 2.0->0,1, 2.1->0,1 = 8 rows = 128 B.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import small_topology
from hypothesis import given, settings
from hypothesis import strategies as st

import hiercoll as hc
from hiercoll.collectives import RankSplits, Split, transpose
from hiercoll.planner import plan
from hiercoll.workloads import moe

E, W, G, ROW = 8, 4, 2, 4

ROUTER = [np.array([[0, 5], [6, 7], [-1, -1]]),
          np.array([[2, -1], [4, 7]]),
          np.array([[1, 3], [0, 2], [5, 4], [-1, 6]]),
          np.zeros((0, 2), dtype=np.int64)]

# what each rank receives, (source, index), in output order
RECEIVED = [[(0, 0), (2, 0), (2, 1)], [(1, 0), (2, 0), (2, 1)],
            [(0, 0), (1, 1), (2, 2)], [(0, 1), (1, 1), (2, 3)]]


@pytest.fixture
def lay() -> moe.MoeLayout:
    return moe.layout(ROUTER, E, W, G)


def test_worked_layout_counts(lay: moe.MoeLayout) -> None:
    assert lay.tokens_per_rank.tolist() == [[1, 0, 1, 1], [0, 1, 1, 1], [2, 2, 1, 1], [0, 0, 0, 0]]
    assert lay.tokens_per_node.tolist() == [[1, 2], [1, 1], [2, 2], [0, 0]]
    assert lay.tokens_per_expert.tolist() == [2, 1, 2, 1, 2, 2, 2, 2]
    assert [m.astype(int).tolist() for m in lay.is_token_in_rank] == [
        [[1, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]],
        [[0, 1, 0, 0], [0, 0, 1, 1]],
        [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
        []]
    assert lay.is_token_in_rank[3].shape == (0, 4)
    assert not lay.tokens_per_rank.flags.writeable


def test_worked_splits(lay: moe.MoeLayout) -> None:
    g = moe.dispatch_splits(lay, ROW, "token")
    assert g.ranks[0] == RankSplits(input=[Split(size=4, peers=[0, 2]), Split(size=4, peers=[3]),
                                           Split(size=4, peers=[])],   # dropped: rows kept
                                    output=[Split(size=4, peers=[0]), Split(size=8, peers=[2])])
    assert g.ranks[2].input[0] == Split(size=8, peers=[0, 1])           # tokens 0 and 1 merged
    assert g.ranks[3] == RankSplits(input=[], output=[Split(size=4, peers=[p]) for p in range(3)])
    assert moe.combine_splits(lay, ROW, "token") == transpose(g)
    assert [moe.recv_tokens(lay, d, "token").tolist() for d in range(W)] == \
        [[list(p) for p in r] for r in RECEIVED]


# node packing of the worked example, by hand: each source's tokens per destination node, ordered
# by their set of that node's ranks (local bit j = rank n*G + j; key ascending), then by index
#   src 0: node 0 [t0 ->{0}]; node 1 [t0 ->{2} (key 1), t1 ->{3} (key 2)]; t2 goes nowhere: absent
#   src 1: node 0 [t0 ->{1}]; node 1 [t1 ->{2,3}]
#   src 2: node 0 [t0, t1 ->{0,1}: one run]; node 1 [t2 ->{2}, t3 ->{3}]
SEND_ORDER = [[(0, 0), (1, 0), (1, 1)], [(0, 0), (1, 1)], [(0, 0), (0, 1), (1, 2), (1, 3)], []]


def test_worked_node_packing(lay: moe.MoeLayout) -> None:
    g = moe.dispatch_splits(lay, ROW)                      # "node" is the default
    assert [[(sp.size, sp.peers) for sp in r.input] for r in g.ranks] == [
        [(4, [0]), (4, [2]), (4, [3])], [(4, [1]), (4, [2, 3])], [(8, [0, 1]), (4, [2]), (4, [3])], []]
    assert [r.output for r in g.ranks] == [r.output for r in moe.dispatch_splits(lay, ROW, "token").ranks]
    assert [moe.send_order(lay, r).tolist() for r in range(W)] == [[list(p) for p in r] for r in SEND_ORDER]
    # every destination receives the same (source, token) rows as with token packing
    assert [moe.recv_tokens(lay, d).tolist() for d in range(W)] == [[list(p) for p in r] for r in RECEIVED]
    assert moe.combine_splits(lay, ROW) == transpose(g)


@pytest.mark.parametrize("algo", ["direct", "hier"])
def test_node_packed_dispatch_and_combine_on_the_reference_executor(lay: moe.MoeLayout, algo: str) -> None:
    """The sender gathers its tokens by `send_order`; combine's per-node partial rows add up to
    one row per token (`combine_rows`) exactly as with token packing."""
    topo = small_topology(2, 2)
    ids = [np.repeat(s * 1000.0 + moe.send_order(lay, s)[:, 1], ROW).astype(np.float32) for s in range(W)]
    outs = hc.execute(plan(topo, moe.spec_for(lay, ROW, "fp32"), algo), ids, seed=1)
    for d in range(W):
        assert outs[d].tolist() == np.repeat([s * 1000.0 + t for s, t in RECEIVED[d]], ROW).tolist()
    spec = moe.spec_for(lay, ROW, "fp32", phase="combine")
    ones = [np.ones(spec.input_count(r), dtype=np.float32) for r in range(W)]
    packed = hc.execute(plan(topo, spec, algo), ones, seed=2)
    got = [moe.combine_rows(lay, r, packed[r], ROW)[:, 0].tolist() for r in range(W)]
    assert got == [[2, 1, 0], [1, 2], [2, 2, 1, 1], []]


def test_node_packing_bounds_the_splits_whatever_the_token_count() -> None:
    """At most nodes x (2**G - 1) input splits a rank: what keeps the README's MoE line small."""
    w, g, e = 8, 2, 32
    lay = moe.layout(moe.random_router(3000, 6, e, w, seed=3), e, w, g)
    node = moe.dispatch_splits(lay, 2)
    token = moe.dispatch_splits(lay, 2, "token")
    assert all(len(r.input) <= (w // g) * (2**g - 1) for r in node.ranks)
    assert all(len(r.input) > 1000 for r in token.ranks)
    for s in range(w):    # the packed input holds each token once per node it visits
        assert len(moe.send_order(lay, s)) == int(lay.tokens_per_node[s].sum())


def _token_ids(lay: moe.MoeLayout) -> list[np.ndarray]:
    return [np.repeat(s * 1000.0 + np.arange(lay.num_tokens(s)), ROW).astype(np.float32)
            for s in range(W)]


@pytest.mark.parametrize("algo", ["direct", "hier"])
def test_dispatch_delivers_tokens_in_source_index_order(lay: moe.MoeLayout, algo: str) -> None:
    topo = small_topology(2, 2)
    sched = plan(topo, moe.spec_for(lay, ROW, "fp32", packing="token"), algo)
    outs = hc.execute(sched, _token_ids(lay), seed=1)
    for d in range(W):
        want = np.repeat([s * 1000.0 + t for s, t in RECEIVED[d]], ROW)
        assert outs[d].tolist() == want.tolist(), d


# direct used to emit a reduce with no sources for a dropped token's combine split (a raw numpy
# error in verify/execute); planner/group.py now emits no op for a split nobody sends to
COMBINE_ALGOS = ["hier", "direct"]


@pytest.mark.parametrize("algo", COMBINE_ALGOS)
def test_combine_of_ones_counts_destination_ranks(lay: moe.MoeLayout, algo: str) -> None:
    spec = moe.spec_for(lay, ROW, "fp32", phase="combine", packing="token")
    sched = plan(small_topology(2, 2), spec, algo)
    ones = [np.ones(spec.input_count(r), dtype=np.float32) for r in range(W)]
    outs = hc.execute(sched, ones, seed=2)    # outputs before: zeros
    want = [[2, 1, 0], [1, 2], [2, 2, 1, 1], []]
    assert [o.reshape(-1, ROW)[:, 0].tolist() for o in outs] == want
    assert all((o.reshape(-1, ROW) == o.reshape(-1, ROW)[:, :1]).all() for o in outs)


def test_combine_with_no_dropped_token_runs_on_direct() -> None:
    """direct's group_reduce, every token with a destination (and, above, with dropped ones)."""
    router = [a.copy() for a in ROUTER]
    router[0][2] = [1, -1]                    # token 0.2 now goes to rank 0 itself
    lay = moe.layout(router, E, W, G)
    sched = plan(small_topology(2, 2), moe.spec_for(lay, ROW, "fp32", "combine"), "direct")
    assert hc.verify(sched, trials=2, seed=4).ok


def test_worked_rdma_bytes(lay: moe.MoeLayout) -> None:
    assert moe.min_inter_bytes(lay, ROW, "fp32") == 5 * ROW * 4 == 80
    for packing in moe.PACKINGS:     # the same bytes cross RDMA however the input is packed
        rows = moe.rdma_bytes_report(lay, small_topology(2, 2), ROW, "fp32",
                                     phases=("dispatch", "combine"), packing=packing)
        got = {(r.phase, r.algorithm): (r.inter_bytes, r.min_inter_bytes) for r in rows}
        assert got == {("dispatch", "direct"): (128, 80), ("dispatch", "hier"): (80, 80),
                       ("combine", "direct"): (128, 80), ("combine", "hier"): (80, 80)}
        assert all(r.time_us > 0 for r in rows)
        assert [r.excess_bytes for r in rows] == [48, 0, 48, 0]


@pytest.mark.parametrize("algo", ["direct", "hier"])
def test_dispatch_verifies(lay: moe.MoeLayout, algo: str) -> None:
    sched = plan(small_topology(2, 2), moe.spec_for(lay, ROW, "bf16"), algo)
    assert hc.verify(sched, trials=2, seed=0).ok


def test_hier_combine_verifies(lay: moe.MoeLayout) -> None:
    sched = plan(small_topology(2, 2), moe.spec_for(lay, ROW, "bf16", "combine"), "hier")
    assert hc.verify(sched, trials=2, seed=0).ok


# ---- routers --------------------------------------------------------------------------------------
def test_random_router_distinct_and_drops() -> None:
    r = moe.random_router([5, 0, 7], topk=3, num_experts=6, world_size=3, seed=1)
    assert [a.shape for a in r] == [(5, 3), (0, 3), (7, 3)]
    assert all(len(set(row)) == 3 for a in r for row in a.tolist())
    assert moe.random_router(5, 2, 4, 2, seed=3)[1].tolist() == moe.random_router(5, 2, 4, 2, seed=3)[1].tolist()
    dropped = moe.random_router(4, 2, 4, 2, seed=0, drop_prob=1.0)
    assert all((a == -1).all() for a in dropped)
    moe.layout(dropped, 4, 2, 1)                      # all dropped is a valid layout


def test_router_round_trip(tmp_path: Path) -> None:
    same_t = moe.random_router(6, 2, 8, 4, seed=5, drop_prob=0.2)
    moe.save_router(same_t, tmp_path / "r.npy")
    assert [a.tolist() for a in moe.load_router(tmp_path / "r.npy")] == [a.tolist() for a in same_t]
    moe.save_router(ROUTER, tmp_path / "r.json")     # ragged token counts: JSON only
    back = moe.load_router(tmp_path / "r.json")
    assert [a.tolist() for a in back] == [a.tolist() for a in ROUTER]
    assert back[3].shape == (0, 2)
    lay = moe.layout(back, E, W, G)
    assert lay.tokens_per_rank.tolist() == moe.layout(ROUTER, E, W, G).tokens_per_rank.tolist()


def _one_line_error(fn, *args, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(hc.HiercollError, match=match) as err:
        fn(*args)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("router, args, match", [
    (ROUTER, (6, 4, 2), r"num_experts: 6 experts do not split evenly over 4 ranks"),
    (ROUTER, (8, 4, 3), r"gpus_per_node: world_size 4 is not a multiple"),
    (ROUTER[:3], (8, 4, 2), r"topk_idx: 3 arrays for world size 4"),
    ([*ROUTER[:3], np.zeros(2, dtype=np.int64)], (8, 4, 2), r"topk_idx\[3\]: shape \(2,\)"),
    ([*ROUTER[:3], np.zeros((1, 2))], (8, 4, 2), r"topk_idx\[3\]: dtype float64"),
    ([*ROUTER[:3], [[0, 1]]], (8, 4, 2), r"topk_idx\[3\]: a list"),
    ([*ROUTER[:3], np.array([[0, 8]])], (8, 4, 2), r"topk_idx\[3\]\[0, 1\]: expert 8 outside 0..7"),
    ([*ROUTER[:3], np.array([[-2, 1]])], (8, 4, 2), r"topk_idx\[3\]\[0, 0\]: expert -2"),
    ([*ROUTER[:3], np.array([[0, 1], [3, 3]])], (8, 4, 2), r"topk_idx\[3\]\[1\]: lists expert 3 twice"),
])
def test_layout_bad_inputs(router, args, match) -> None:  # type: ignore[no-untyped-def]
    _one_line_error(moe.layout, router, *args, match=match)


def test_other_bad_inputs(tmp_path: Path, lay: moe.MoeLayout) -> None:
    _one_line_error(moe.dispatch_splits, lay, 0, match="row_elems: 0")
    _one_line_error(moe.dispatch_splits, lay, 4, "rank", match="packing: 'rank'; choose one of node, token")
    _one_line_error(moe.spec_for, lay, ROW, "int8", match="dtype: 'int8'; choose one of bf16")
    _one_line_error(moe.spec_for, lay, ROW, "bf16", "forward", match="phase: 'forward'")
    _one_line_error(moe.random_router, 4, 9, 8, 4, 0, match=r"topk: 9 must be in 0..num_experts")
    _one_line_error(moe.random_router, [1, 2], 2, 8, 4, 0, match="tokens_per_rank")
    _one_line_error(moe.random_router, 4, 2, 8, 4, 0, 1.5, match="drop_prob")
    _one_line_error(moe.rdma_bytes_report, lay, small_topology(1, 4), ROW, "fp32", match="topology")
    _one_line_error(moe.load_router, tmp_path / "none.npy", match="no such router file")
    bad = {"r.txt": "x", "a.json": "{", "b.json": '{"idx": []}', "c.json": '{"topk_idx": [[[1, 2], [3]]]}',
           "d.json": '{"topk_idx": [[[1.5, 2]]]}', "e.json": '{"topk_idx": [[[true, 2]]]}',
           "f.json": '{"topk_idx": [5]}'}
    match = {"r.txt": "unknown router format '.txt'", "a.json": "cannot read JSON",
             "b.json": "expected", "c.json": r"topk_idx\[0\]: tokens have different top-k lengths",
             "d.json": r"topk_idx\[0\]: every token must be a list of integer",
             "e.json": "integer expert ids", "f.json": r"topk_idx\[0\]: int, expected a list"}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        _one_line_error(moe.load_router, tmp_path / name, match=match[name])
    np.save(tmp_path / "g.npy", np.zeros((2, 3)))
    _one_line_error(moe.load_router, tmp_path / "g.npy", match=r"expected an integer array \[world, tokens, topk\]")
    (tmp_path / "h.npy").write_text("not numpy")
    _one_line_error(moe.load_router, tmp_path / "h.npy", match="cannot read .npy")
    _one_line_error(moe.save_router, ROUTER, tmp_path / "r.npy", match="different shapes")


# ---- property: hier reaches the de-duplicated minimum -----------------------------------------------
@settings(max_examples=100, deadline=None)
@given(nodes=st.integers(1, 3), gpus=st.integers(1, 3), experts_per_rank=st.integers(1, 3),
       tokens=st.lists(st.integers(0, 5), min_size=9, max_size=9), topk=st.integers(1, 4),
       drop=st.sampled_from([0.0, 0.3, 1.0]), one_nic=st.booleans(), seed=st.integers(0, 2**16))
def test_hier_inter_bytes_is_the_minimum(nodes: int, gpus: int, experts_per_rank: int,
                                         tokens: list[int], topk: int, drop: float,
                                         one_nic: bool, seed: int) -> None:
    w, e = nodes * gpus, nodes * gpus * experts_per_rank
    router = moe.random_router(tokens[:w], min(topk, e), e, w, seed, drop)
    lay = moe.layout(router, e, w, gpus)
    topo = small_topology(nodes, gpus, nics=1 if one_nic else None)
    floor = moe.min_inter_bytes(lay, 3, "bf16")
    for packing in moe.PACKINGS:
        rows = {r.algorithm: r for r in moe.rdma_bytes_report(lay, topo, 3, "bf16", packing=packing)}
        assert rows["hier"].inter_bytes == floor <= rows["direct"].inter_bytes
    total = sum(len(a) for a in router)
    assert int(lay.tokens_per_node.sum()) <= int(lay.tokens_per_rank.sum()) <= total * w


def test_dispatch_splits_equal_the_validated_splits():
    """The splits are built from checked values without pydantic's validation (hundreds of
    thousands at 1024 ranks): they equal the same splits validated, dump for dump."""
    from hiercoll.collectives import GroupSplits
    from hiercoll.workloads import moe
    router = moe.random_router(16, 2, 8, 4, seed=3)
    lay = moe.layout(router, 8, 4, 2)
    for packing in ("node", "token"):
        made = moe.dispatch_splits(lay, np.int64(12), packing)
        checked = GroupSplits.model_validate(made.model_dump())
        assert made == checked and made.model_dump_json() == checked.model_dump_json()
        assert all(type(sp.size) is int and all(type(p) is int for p in sp.peers)
                   for rs in made.ranks for sp in (*rs.input, *rs.output))


@pytest.mark.parametrize("seed,drop", [(0, 0.0), (1, 0.3), (2, 0.9)])
def test_node_packing_at_once_equals_node_by_node(monkeypatch: pytest.MonkeyPatch, seed: int,
                                                  drop: float) -> None:
    """A rank's node blocks and splits from one sort over every node (keys as local-rank bits)
    equal the per-node loop's, array for array and split for split, dropped tokens and empty
    ranks included."""
    router = moe.random_router([24, 0, 7, 31, 1, 16, 9, 12], 3, 16, 8, seed=seed, drop_prob=drop)
    fast = moe.layout(router, 16, 8, 2)
    slow = moe.layout(router, 16, 8, 2)
    got = {r: moe._node_blocks(fast, r) for r in range(8)}
    made = moe.dispatch_splits(fast, 5)
    monkeypatch.setattr(moe, "_keys_pack", lambda layout, rank: False)
    for r in range(8):
        want = moe._node_blocks(slow, r)
        assert [n for n, _, _ in got[r]] == [n for n, _, _ in want]
        for (_, tok, key), (_, tok2, key2) in zip(got[r], want, strict=True):
            assert tok.dtype == tok2.dtype and key.dtype == key2.dtype
            assert np.array_equal(tok, tok2) and np.array_equal(key, key2)
    assert made == moe.dispatch_splits(slow, 5)
