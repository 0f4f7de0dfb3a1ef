"""The log-depth families (rhd, rd, bruck): right results through the reference executor on
random non-zero inputs, a clean static check (races, deadlocks, rank-identical all-reduce) and
simulated times never below the lower bound, on random small topologies including
non-power-of-two world sizes; their step counts; the 128-GPU small all-reduce; auto-pick's
tie-break (pruning never changes the chosen plan)."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.planner import registry
from hiercoll.planner.bruck import Bruck, bruck_steps
from hiercoll.planner.fold import Fold
from hiercoll.planner.labels import BruckLabel, LogStepLabel
from hiercoll.planner.recursive_doubling import RECV as RD_RECV
from hiercoll.planner.search import autopick
from hiercoll.planner.search.autopick import SimCache, pick_one
from hiercoll.planner.search.candidates import Candidate
from hiercoll.sim import check, simulate
from tests.helpers import small_topology
from tests.test_planner_flat import make_spec

FAMILIES = [("rhd", Kind.REDUCE_SCATTER), ("rhd", Kind.ALL_GATHER), ("rhd", Kind.ALL_REDUCE),
            ("rd", Kind.ALL_REDUCE), ("bruck", Kind.ALL_TO_ALL)]


def _checked(topo, spec, algo, params, seed):
    s = hc.plan(topo, spec, algo, params)
    report = hc.verify(s, trials=2, seed=seed)
    assert report.ok, f"{algo} {params}: {report.mismatch}"
    static = check(s.expand(), topo)
    assert static.ok, static.problems[:3]
    if spec.kind == Kind.ALL_REDUCE and spec.world_size > 1:   # one rank: nothing to compare
        assert static.ranks_identical and report.ranks_identical
    res = simulate(s, topo)
    assert res.time_us >= res.lower_bound_us * (1 - 1e-9)
    return s


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 4), gpus=st.integers(1, 4), fabric=st.sampled_from(["nvswitch", "mesh", "pcie"]),
       family=st.sampled_from(FAMILIES), elems=st.integers(1, 97),
       dtype=st.sampled_from(["bf16", "fp32"]), op=st.sampled_from(["sum", "avg", "max", "min"]),
       chunks=st.integers(1, 3), channels=st.integers(1, 2), seed=st.integers(0, 10**6))
def test_random_topologies(nodes, gpus, fabric, family, elems, dtype, op, chunks, channels, seed):
    algo, kind = family
    topo = small_topology(nodes, gpus, kind=fabric)
    spec = make_spec(kind, topo.world_size, elems, dtype, seed, op)
    _checked(topo, spec, algo, {"chunks": chunks, "channels": channels}, seed)


@pytest.mark.parametrize("nodes,gpus", [(1, 3), (1, 5), (2, 3), (3, 4), (4, 2)])   # W = 3, 5, 6, 12, 8
@pytest.mark.parametrize("algo,kind", FAMILIES)
def test_non_power_of_two_world_sizes(nodes, gpus, algo, kind):
    topo = small_topology(nodes, gpus)
    spec = make_spec(kind, topo.world_size, 41, "fp32", nodes * 10 + gpus, "sum")
    s = _checked(topo, spec, algo, {"chunks": 2}, seed=gpus)
    fold = Fold(topo.world_size)
    steps = {lab.step for r in range(topo.world_size)
             for lab in s.source.ctx.label_map(r) if isinstance(lab, LogStepLabel | BruckLabel)}
    expect = bruck_steps(topo.world_size) if algo == "bruck" else fold.steps
    assert steps == set(range(expect))


@pytest.mark.parametrize("chunks", [2, 4, 16])
@pytest.mark.parametrize("kind", [Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_REDUCE])
def test_rank_relative_chunks(kind, chunks):
    """Even shards and a power-of-two chunk count: chunks are counted from the sender's
    position in each range (fewer, equal and more chunks than a range's segments), each one
    contiguous piece, every piece of every range moved once; and the plan is xor-symmetric."""
    from hiercoll.planner.halving_doubling import rank_relative, step_pieces
    topo = small_topology(2, 4)
    spec = make_spec(kind, 8, 8 * 6, "fp32", chunks, "sum")
    fold = Fold(8)
    assert rank_relative(spec, fold, chunks)
    for lo, hi in ((0, 8), (4, 8), (2, 4), (5, 6)):
        for sender in range(lo, hi):
            got = step_pieces(spec, fold, lo, hi, sender, chunks)
            assert sorted(c for c, _, _ in got) == list(range(chunks))
            a, n = fold.segment(spec, lo, hi)
            covered = sorted((off, cnt) for _, off, cnt in got)
            assert covered[0][0] == a and sum(cnt for _, cnt in covered) == n
            assert all(x[0] + x[1] == y[0] for x, y in zip(covered, covered[1:]))
        if hi - lo > 1:     # the order is the sender's (its position in the range), not absolute
            assert step_pieces(spec, fold, lo, hi, lo, chunks) != step_pieces(spec, fold, lo, hi, hi - 1, chunks)
    s = _checked(topo, spec, "rhd", {"chunks": chunks, "channels": 2}, seed=chunks)
    assert s.meta.symmetry_group == "xor" and s.meta.symmetry_period == 4


@pytest.mark.parametrize("world", [2, 4, 8, 16, 128])
def test_step_counts_are_log2_w(world):
    """rd: log2 W exchanges per rank; rhd all-reduce: log2 W halving + log2 W doubling steps;
    bruck: ceil(log2 W) steps; each step one peer."""
    assert Fold(world).steps == math.ceil(math.log2(world)) == bruck_steps(world)
    assert bruck_steps(world + 1) == math.ceil(math.log2(world + 1))
    topo = small_topology(max(world // 8, 1), min(world, 8))
    for algo, kind, phases in [("rd", Kind.ALL_REDUCE, {"rd"}), ("rhd", Kind.ALL_REDUCE, {"rs", "ag"})]:
        spec = make_spec(kind, world, 8 * world, "bf16", 1)
        s = hc.plan(topo, spec, algo)
        for r in (0, world - 1):
            labels = [lab for lab in s.source.ctx.label_map(r) if isinstance(lab, LogStepLabel)]
            assert len(labels) == len(phases) * Fold(world).steps
            peers = {op.dst.rank for op in s.rank_ops(r) if op.dst.rank != r}
            assert peers == {r ^ (1 << t) for t in range(Fold(world).steps)}


def test_recursive_doubling_partners_sum_in_the_same_order():
    """Both partners of a step put the lower virtual rank's operand first (the received vector
    first on the higher rank), so the two sides build one expression."""
    topo = small_topology(2, 4)
    spec = make_spec(Kind.ALL_REDUCE, 8, 64, "bf16", 3)
    s = hc.plan(topo, spec, "rd")
    for r in range(8):
        reduces = [op for op in s.rank_ops(r) if op.kind.value == "reduce"]
        assert len(reduces) == 3
        for t, op in enumerate(reduces):
            partner = r ^ (1 << t)
            assert (op.srcs[0].buffer == RD_RECV) == (partner < r), (r, t)


def test_bruck_moves_a_block_once_per_set_bit():
    w = 6
    topo = small_topology(2, 3)
    spec = make_spec(Kind.ALL_TO_ALL, w, 5 * w, "fp32", 2)
    s = hc.plan(topo, spec, "bruck")
    hops = sum(bin(i).count("1") for i in range(1, w))
    assert len(s.rank_ops(0)) == 1 + hops      # own block, then one copy per hop
    assert Bruck().symmetry_period(s.source.ctx) == 3


def test_4kib_all_reduce_on_128_gpus_is_log_depth(capsys):
    """dgx-h100 x16: rd and rhd take log2(128) = 7 exchange steps where every other family is
    O(W) or O(N+L) deep; the times are printed for the report, not asserted."""
    topo = hc.load_topology("dgx-h100", 16)
    spec = CollectiveSpec(kind="all_reduce", world_size=128, dtype="bf16", nbytes=4096)
    for algo in ("rd", "rhd"):
        s = hc.plan(topo, spec, algo)
        steps = {lab.step for lab in s.source.ctx.label_map(5) if isinstance(lab, LogStepLabel)}
        assert steps == set(range(7))
        res = simulate(s, topo)
        assert res.time_us >= res.lower_bound_us
        with capsys.disabled():
            print(f"\n4 KiB all-reduce, 128 GPUs, {algo}: {res.time_us:.1f} us simulated")


def test_auto_pick_takes_a_log_depth_family_for_a_small_all_reduce_on_128_gpus():
    topo = hc.load_topology("dgx-h100", 16)
    spec = CollectiveSpec(kind="all_reduce", world_size=128, dtype="bf16", nbytes=4096)
    row = pick_one(topo, spec, SimCache(None))
    assert row.algorithm in ("rd", "rhd")


# ---- auto-pick: ties -----------------------------------------------------------------------------
class _BruckTwin(Bruck):
    """The same plans under another name: its candidates tie bruck's exactly."""

    name = "bruck_twin"


def test_a_tie_is_broken_by_label_with_or_without_pruning(monkeypatch):
    """Two candidates with the same time and a bound as tight as it can be: the one evaluated
    first has the larger label. Pruning on `bound >= best` dropped the other and picked the
    first; the choice must be the full search's (the smaller label), plan and all."""
    monkeypatch.setitem(registry._REGISTRY, "bruck_twin", _BruckTwin())
    topo = small_topology(2, 2)
    spec = CollectiveSpec(kind="all_to_all", world_size=4, dtype="bf16", nbytes=4 * 2 * 64)
    params = {"chunks": 1, "channels": 1}
    first, second = Candidate("bruck_twin", params), Candidate("bruck", params)
    assert second.label() < first.label()
    monkeypatch.setattr(autopick, "candidates_and_oversized", lambda *a, **k: ([first, second], 0))
    exact = {}

    def tight(schedule, topology, rank=0):      # the simulated time itself: a valid bound
        key = schedule.meta.algorithm
        exact.setdefault(key, simulate(schedule, topology).time_us)
        return exact[key]

    monkeypatch.setattr(autopick, "rank_bound_us", tight)
    pruned = pick_one(topo, spec, SimCache(None))
    full = pick_one(topo, spec, SimCache(None), prune=False)
    assert exact["bruck"] == exact["bruck_twin"]
    assert (pruned.algorithm, pruned.params) == (full.algorithm, full.params) == ("bruck", params)


@pytest.mark.parametrize("nodes,gpus", [(2, 8), (3, 4), (1, 5)])
def test_op_estimate_covers_bruck(nodes, gpus):
    """The HIERCOLL_MAX_OPS guard estimates before building: bruck's popcount hops included."""
    topo = small_topology(nodes, gpus)
    spec = make_spec(Kind.ALL_TO_ALL, topo.world_size, 4 * topo.world_size, "bf16", 1)
    s = hc.plan(topo, spec, "bruck")
    algo = registry.get_algorithm("bruck")
    built = sum(len(s.rank_ops(r)) for r in range(topo.world_size))
    assert registry.estimate_ops(topo, spec, algo, algo.Params()) >= built


@pytest.mark.parametrize("world,chunks", [(2, 1), (5, 2), (12, 3), (16, 1)])
def test_bruck_label_formula_matches_the_built_lists(world, chunks):
    topo = small_topology(1, world)
    spec = make_spec(Kind.ALL_TO_ALL, world, 6 * world, "bf16", 1)
    s = hc.plan(topo, spec, "bruck", {"chunks": chunks})
    ctx = s.source.ctx
    for r in (0, world - 1):
        for label, index in ctx.label_map(r).items():
            assert Bruck().index_of(ctx, r, label) == index
