"""`hier_tiers`: hier's reduce-scatter / all-gather / all-reduce over every scale-out tier.

Right results through the reference executor on random data (every reduce op, chunks, channels)
on small tiered topologies, a clean static check (races, deadlocks, rank-identical all-reduce),
simulated times never below the bound; the level arithmetic; one level = `hier`'s very ops and
time; partial groups refused in one line (and skipped by auto-pick); and, by hand, the bytes that
cross each tier: (groups - 1) x S per tier, against hier's (nodes - nodes per group) x S.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.errors import HiercollError
from hiercoll.plan_file import plan_from_dict, plan_to_json
from hiercoll.planner.hier.levels import Levels, levels_of
from hiercoll.planner.labels import FinalReduceLabel, ScatterLabel, TierGatherLabel, TierSendLabel
from hiercoll.planner.registry import algorithms, applicable
from hiercoll.planner.search.candidates import candidates
from hiercoll.schedule import Schedule
from hiercoll.sim import check, simulate
from hiercoll.sim.symmetry import find_symmetry
from hiercoll.topology import Topology, preset
from hiercoll.topology.load import topology_from_dict
from tests.helpers import small_topology
from tests.test_planner_flat import make_spec

SHARDED = [Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_REDUCE]


def tiered(nodes: int, gpus: int, groups: list[int], rails: bool = False, nics: int | None = None) -> Topology:
    """`nodes` x `gpus` under len(groups) + 1 tiers: tier i joins groups[i] groups of the tier
    below (the leaf: nodes), the outermost joins everything (a schema-2 file)."""
    tiers: list[dict[str, Any]] = [{"name": f"t{i}", "group_size": size, "uplinks": 2, "latency_us": 0.5}
                                   for i, size in enumerate(groups)]
    tiers.append({"name": "top", "latency_us": 0.5})
    if rails:
        tiers[0]["rails"] = True
    return topology_from_dict({
        "schema_version": 2, "name": f"tiered{nodes}x{gpus}", "num_nodes": nodes, "gpus_per_node": gpus,
        "gpu": {"name": "T", "hbm_gbps": 3000.0, "num_sms": 100},
        "intra": {"kind": "nvswitch", "gbps": 300.0, "latency_us": 1.0},
        "inter": {"num_nics": nics or gpus, "nic_gbps": 40.0, "latency_us": 3.0, "tiers": tiers}},
        "test.yaml")


def checked(topo: Topology, spec: CollectiveSpec, params: dict[str, Any], seed: int) -> Schedule:
    s = hc.plan(topo, spec, "hier_tiers", params)
    report = hc.verify(s, trials=2, seed=seed)
    assert report.ok, f"{params}: {report.mismatch}"
    static = check(s.expand(), topo)
    assert static.ok, static.problems[:3]
    if spec.kind == Kind.ALL_REDUCE:
        assert static.ranks_identical and report.ranks_identical
    res = simulate(s, topo)
    assert res.time_us >= res.lower_bound_us * (1 - 1e-9)
    return s


# ---- levels --------------------------------------------------------------------------------------
def test_levels_of_presets_and_toys() -> None:
    assert levels_of(preset("h100-rail-3tier", 64)).radices == (32, 2)     # spine joins all 64
    assert levels_of(preset("h100-rail-3tier", 512)).radices == (32, 8, 2)
    assert levels_of(preset("dgx-b200", 64)).radices == (32, 2)
    assert levels_of(preset("gb200-nvl72", 8)).radices == (8,)             # one leaf group: hier
    assert levels_of(preset("dgx-h100", 4)).radices == (4,)                # no tiers
    assert levels_of(tiered(8, 1, [2, 1, 2])).radices == (2, 2, 2)        # a group of 1 adds nothing
    assert levels_of(tiered(8, 1, [2, 4])).radices == (2, 4)               # spine spans all 8


def test_digits_by_hand() -> None:
    lv = Levels((2, 3, 2))          # 12 nodes: leaf pairs, spine groups of 3 pairs, 2 of those
    assert lv.strides == (1, 2, 6) and lv.num_nodes == 12
    assert [lv.digit(7, j) for j in range(3)] == [1, 0, 1]                # 7 = 1 + 0*2 + 1*6
    assert lv.with_digit(7, 1, 2) == 11 and lv.with_digit(7, 0, 0) == 6
    assert lv.first_difference(7, 6) == 0 and lv.first_difference(7, 9) == 1
    assert lv.first_difference(7, 1) == 2 and lv.first_difference(7, 7) == 3
    assert [lv.kept(j) for j in range(3)] == [6, 2, 1]


# ---- correctness ---------------------------------------------------------------------------------
CASES = [(4, 2, [2], False), (8, 1, [2, 2], False), (6, 3, [3], True), (8, 2, [2, 2], True),
         (4, 4, [2], False), (8, 1, [4], False), (12, 1, [2, 3], False), (6, 2, [2], False)]


@pytest.mark.parametrize("nodes,gpus,groups,rails", CASES)
@pytest.mark.parametrize("kind", SHARDED)
def test_verifies_on_tiered_topologies(nodes: int, gpus: int, groups: list[int], rails: bool,
                                       kind: Kind) -> None:
    topo = tiered(nodes, gpus, groups, rails)
    assert levels_of(topo).count >= 2
    for i, op in enumerate(["sum", "avg", "max", "min"]):
        for inner in ("direct", "ring"):
            spec = make_spec(kind, topo.world_size, 37 + 13 * i, "fp32", nodes * 10 + i, op)
            checked(topo, spec, {"chunks": 1 + i % 3, "channels": 1 + i % 2, "inner": inner}, seed=i)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpus=st.integers(1, 4), leaf=st.integers(2, 4), spine=st.integers(1, 3), top=st.integers(1, 2),
       rails=st.booleans(), kind=st.sampled_from(SHARDED), elems=st.integers(0, 97),
       dtype=st.sampled_from(["bf16", "fp32"]), op=st.sampled_from(["sum", "avg", "max", "min"]),
       chunks=st.integers(1, 3), channels=st.integers(1, 2), swizzle=st.booleans(),
       inner=st.sampled_from(["direct", "ring"]), seed=st.integers(0, 10**6))
def test_random_tiered_topologies(gpus: int, leaf: int, spine: int, top: int, rails: bool, kind: Kind,
                                  elems: int, dtype: str, op: str, chunks: int, channels: int,
                                  swizzle: bool, inner: str, seed: int) -> None:
    nodes = leaf * spine * top
    if nodes * gpus > 32 or nodes == leaf:
        nodes = leaf * 2
    topo = tiered(nodes, gpus, [leaf, spine], rails)
    spec = make_spec(kind, topo.world_size, elems, dtype, seed, op)
    checked(topo, spec, {"chunks": chunks, "channels": channels, "node_swizzle": swizzle,
                         "rank_swizzle": swizzle, "inner": inner}, seed)


@pytest.mark.parametrize("inner", ["direct", "ring"])
def test_symmetry_is_claimed_by_the_top_group_and_folds_exactly(inner: str) -> None:
    """hier_tiers declares whole top groups (a translation: what ECMP's hash survives); it also
    maps onto itself under every level shift, so on a sprayed fabric one node's ranks are
    simulated, exactly."""
    ecmp = tiered(12, 2, [3, 2])                      # levels (3, 2, 2): top groups of 6 nodes
    spec = make_spec(Kind.ALL_REDUCE, 24, 24 * 64, "bf16")
    s = hc.plan(ecmp, spec, "hier_tiers", {"inner": inner})
    assert s.meta.symmetry_period == 12               # 6 nodes x 2 GPUs
    folded = simulate(s, ecmp)
    assert folded.shortcut is not None and "period 12" in folded.shortcut
    assert simulate(s, ecmp, mode="exact").time_us == pytest.approx(folded.time_us, rel=1e-9)
    data = ecmp.model_dump(mode="json")
    data["inter"]["routing"] = "spray"
    topo = Topology.model_validate(data)
    s = hc.plan(topo, spec, "hier_tiers", {"inner": inner})
    assert find_symmetry(s, topo) is not None
    folded = simulate(s, topo)
    assert folded.shortcut is not None and "level-shift symmetry, 2 of 24 ranks" in folded.shortcut
    exact = simulate(s, topo, mode="exact")
    assert exact.time_us == pytest.approx(folded.time_us, rel=1e-9)
    # a folded port's bytes are one real port's, and copies x bytes is every port's in all
    for kind in ("t0_up", "t1_down"):
        f = [l for l in folded.links if l.name.startswith(kind)]
        e = [l for l in exact.links if l.name.startswith(kind)]
        assert sum(l.bytes * l.copies for l in f) == pytest.approx(sum(l.bytes for l in e), rel=1e-9)


@pytest.mark.parametrize("params", [{}, {"inner": "ring", "chunks": 2},
                                    {"chunks": 3, "node_swizzle": False, "rank_swizzle": False},
                                    {"inner": "ring", "node_swizzle": False},
                                    {"inner_levels": ["ring", "direct", "ring"]}])
@pytest.mark.parametrize("nodes,gpus,groups", [(8, 2, [2, 2]), (12, 1, [2, 3]), (12, 3, [2, 3])])
@pytest.mark.parametrize("kind", SHARDED)
def test_label_formulas_match_the_labels_built(nodes: int, gpus: int, groups: list[int], kind: Kind,
                                               params: dict[str, Any]) -> None:
    """index_of (used at scale: it never builds the peer) agrees with every label peers depend
    on, as the recipe emits it."""
    topo = tiered(nodes, gpus, groups)
    if "inner_levels" in params and levels_of(topo).count != 3:
        params = {"inner_levels": ["ring"] * levels_of(topo).count}
    s = hc.plan(topo, make_spec(kind, topo.world_size, 77, "fp32", 1), "hier_tiers", params)
    ctx = s.source.ctx
    deps = (ScatterLabel, TierSendLabel, TierGatherLabel, FinalReduceLabel)
    checked_labels = 0
    for r in range(topo.world_size):
        for label, index in ctx.label_map(r).items():
            if isinstance(label, deps):
                assert ctx.algorithm.index_of(ctx, r, label) == index, (r, label)
                checked_labels += 1
    assert checked_labels > topo.world_size


# ---- one level: hier -----------------------------------------------------------------------------
@pytest.mark.parametrize("topo", [small_topology(4, 2), small_topology(3, 4, nics=2),
                                  tiered(4, 2, [4]), small_topology(1, 4)],
                         ids=["4x2", "3x4-2nics", "4x2-one-leaf", "1x4"])
@pytest.mark.parametrize("kind", SHARDED)
def test_one_level_is_hier(topo: Topology, kind: Kind) -> None:
    spec = make_spec(kind, topo.world_size, 101, "fp32", 1, "avg")
    params = {"chunks": 2, "channels": 2}
    ours, theirs = hc.plan(topo, spec, "hier_tiers", params), hc.plan(topo, spec, "hier", params)
    for r in range(topo.world_size):
        assert list(ours.rank_ops(r)) == list(theirs.rank_ops(r))
        assert ours.buffers(r) == theirs.buffers(r)
    assert simulate(ours, topo).time_us == simulate(theirs, topo).time_us
    assert algorithms()["hier_tiers"].duplicate_of(topo) == "hier"
    names = {c.algorithm for c in candidates(topo, spec)}
    assert "hier" in names and "hier_tiers" not in names      # auto-pick does not simulate it twice


@pytest.mark.parametrize("kind", SHARDED)
def test_ring_on_one_level_plans_and_verifies(kind: Kind) -> None:
    """inner=ring is not hier's plan: one level of N nodes run as a ring along the rail."""
    topo = small_topology(4, 2)
    spec = make_spec(kind, 8, 61, "fp32", 5, "avg")
    s = checked(topo, spec, {"inner": "ring", "chunks": 2}, seed=5)
    sends = [op for op in s.rank_ops(0) if op.transport.value == "inter"]
    assert {op.dst.rank for op in sends} == {2}       # node 1, local rank 0: the next on the ring


@pytest.mark.parametrize("inner_levels", [["direct", "ring", "direct"], ["ring", "direct", "ring"]])
@pytest.mark.parametrize("kind", SHARDED)
def test_an_exchange_per_level(inner_levels: list[str], kind: Kind) -> None:
    topo = tiered(12, 2, [2, 3])                       # levels (2, 3, 2)
    spec = make_spec(kind, 24, 24 * 5 + 3, "fp32", 9, "sum")
    checked(topo, spec, {"inner_levels": inner_levels, "chunks": 2}, seed=9)


def test_inner_levels_must_name_every_level() -> None:
    topo = tiered(12, 2, [2, 3])
    with pytest.raises(HiercollError, match=r"^--algorithm hier_tiers: inner_levels: 2 values for the "
                       r"3 scale-out levels of this topology \(2 x 3 x 2 nodes\); give one per "
                       r"level, leaf first$"):
        hc.plan(topo, make_spec(Kind.ALL_REDUCE, 24, 240), "hier_tiers", {"inner_levels": ["ring", "ring"]})


@pytest.mark.parametrize("form", ["recipe", "expanded"])
def test_plan_file_round_trip(form: str) -> None:
    """The recipe (algorithm, params with inner=ring, a schema-2 topology) re-plans the same ops."""
    topo = tiered(8, 2, [2, 2], rails=True)
    s = hc.plan(topo, make_spec(Kind.ALL_REDUCE, 16, 333, "bf16", 2), "hier_tiers",
                {"inner": "ring", "chunks": 2})
    back = plan_from_dict(json.loads(plan_to_json(s, topo, form)))
    assert back.schedule.meta.params["inner"] == "ring"
    assert all(list(back.schedule.rank_ops(r)) == list(s.rank_ops(r)) for r in range(16))


def test_auto_pick_searches_it_on_tiered_topologies() -> None:
    topo = tiered(8, 2, [2, 2])
    spec = make_spec(Kind.ALL_REDUCE, 16, 4096, "bf16")
    assert algorithms()["hier_tiers"].duplicate_of(topo) is None
    inners = {c.params["inner"] for c in candidates(topo, spec) if c.algorithm == "hier_tiers"}
    assert inners == {"direct", "ring"}


def test_partial_groups_are_refused_in_one_line() -> None:
    topo = tiered(6, 2, [4])
    spec = make_spec(Kind.ALL_REDUCE, 12, 96, "bf16")
    with pytest.raises(HiercollError, match=r"^--algorithm hier_tiers: 6 nodes do not fill the t0 "
                       r"tier's groups of 4 nodes \(the last holds 2\); use a multiple of 4 nodes, "
                       r"or -a hier$"):
        hc.plan(topo, spec, "hier_tiers")
    assert "hier_tiers" not in applicable(topo, spec) and "hier" in applicable(topo, spec)
    assert "hier_tiers" not in {c.algorithm for c in candidates(topo, spec)}
    with pytest.raises(HiercollError, match="hier_tiers does not implement all_to_all"):
        hc.plan(topo, make_spec(Kind.ALL_TO_ALL, 12, 96), "hier_tiers")


# ---- bytes per tier, by hand ---------------------------------------------------------------------
def crossing_elements(s: Schedule, topo: Topology, span: int) -> int:
    """Elements moved by ops whose source and destination lie in different groups of `span`
    nodes (the transfers that leave a group through its tier's uplinks)."""
    g, total = topo.gpus_per_node, 0
    for r in range(topo.world_size):
        for op in s.rank_ops(r):
            if any(src.rank // g // span != op.dst.rank // g // span for src in op.srcs):
                total += op.dst.count
    return total


@pytest.mark.parametrize("nodes,gpus,groups", [(8, 2, [2, 2]), (12, 1, [2, 3]), (8, 4, [4]),
                                               (16, 2, [4, 2])])
@pytest.mark.parametrize("kind", SHARDED)
@pytest.mark.parametrize("inner", ["direct", "ring"])
def test_each_byte_crosses_each_tier_once(nodes: int, gpus: int, groups: list[int], kind: Kind,
                                          inner: str) -> None:
    """A group of `span` nodes is one of G = N / span. Reduce-scatter: each shard needs one
    partial from every other group, so (G - 1) x S elements leave groups, where hier sends one
    per other node: (N - span) x S, `span` times as much. All-gather mirrors it, all-reduce is
    both (x 2). Checked for every tier below the outermost, with uneven shards and chunks; a
    ring inside a level moves as much as direct sends (m - 1 steps of 1/m each)."""
    topo = tiered(nodes, gpus, groups)
    spec = make_spec(kind, topo.world_size, 40 * topo.world_size + 7, "bf16", 3)
    per_call = 2 if kind == Kind.ALL_REDUCE else 1
    ours = hc.plan(topo, spec, "hier_tiers", {"chunks": 2, "inner": inner})
    theirs = hc.plan(topo, spec, "hier", {"chunks": 2})
    span = 1
    for size in groups:
        span *= size
        if span >= nodes:
            break
        assert crossing_elements(ours, topo, span) == per_call * (nodes // span - 1) * spec.count
        assert crossing_elements(theirs, topo, span) == per_call * (nodes - span) * spec.count
    # and between nodes at all (span 1): both send every shard once per other node's partial
    assert crossing_elements(ours, topo, 1) == crossing_elements(theirs, topo, 1)


def test_spine_bytes_on_h100_rail_3tier() -> None:
    """64 nodes (two leaf groups of 32, levels (32, 2)), 256 MiB bf16 all-reduce: hier sends
    32 x S across the spine, hier_tiers 1 x S. Counted from the plan; nothing simulated."""
    topo = preset("h100-rail-3tier", 64)
    spec = CollectiveSpec(kind="all_reduce", world_size=512, dtype="bf16", nbytes=256 << 20)
    g = topo.gpus_per_node
    for algo, expect in [("hier_tiers", 1), ("hier", 32)]:
        s = hc.plan(topo, spec, algo)
        rank0 = sum(op.dst.count for op in s.rank_ops(0)
                    if any(src.rank // g // 32 != op.dst.rank // g // 32 for src in op.srcs))
        # rank 0 sends its share: 2 (RS + AG) x expect x S / W elements
        assert rank0 == 2 * expect * spec.count // 512
