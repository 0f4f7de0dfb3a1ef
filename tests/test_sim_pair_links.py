"""`copy_links_batch` (sim/pair_links.py) against `copy_links` pair by pair: the same links,
weights, latencies, and the network's links made in the same order (so link ids agree), on
one-switch fabrics with and without oversubscription, folded, under LL's wire factor, with
self-copies and repeated pairs; and on tiered fabrics (ECMP and spray, rail-optimised leaves,
folded, a slow node, a degraded port), where a simulation with the batch is the one without it to
the bit. None where not covered (no NVSwitch, spray over a degraded port)."""

from __future__ import annotations

import numpy as np
import pytest

import hiercoll as hc
from hiercoll.sim.engine import copy_links
from hiercoll.sim.links import Network
from hiercoll.sim.pair_links import copy_links_batch
from hiercoll.topology import Topology, load_topology
from hiercoll.topology.model import DegradedLink, NodeOverride


def _oversubscribed(nodes: int):  # type: ignore[no-untyped-def]
    t = load_topology("dgx-h100", nodes)
    assert t.inter is not None
    return t.model_copy(update={"inter": t.inter.model_copy(update={"oversubscription": 3.0})})


@pytest.mark.parametrize("make", [lambda: load_topology("dgx-h100", 3), lambda: _oversubscribed(4),
                                  lambda: load_topology("h200x4", None)])
@pytest.mark.parametrize("fold", [None, 8])
@pytest.mark.parametrize("wire", [1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_batch_equals_copy_links_pair_by_pair(make, fold, wire, seed):
    topo = make()
    w = topo.world_size
    rng = np.random.default_rng(seed)
    k = 3 * w
    a = rng.integers(0, w, k).astype(np.int64)
    b = rng.integers(0, w, k).astype(np.int64)
    a[:3], b[:3] = [0, 1, 1], [0, 1, 1]          # self copies, and a pair asked twice
    assert_batch_is_pair_by_pair(topo, a, b, fold=fold, wire=wire)


def assert_batch_is_pair_by_pair(topo: Topology, a: np.ndarray, b: np.ndarray, **net: object) -> None:
    """The batch of pairs (a[i], b[i]) on a fresh network is `copy_links` asked pair by pair on
    another: rows, latencies, and the links each network made, in order."""
    one, many = (Network(topo, itemsize=2, wire_factor=net.get("wire", 1.0),  # type: ignore[arg-type]
                         fold=net.get("fold"), levels=net.get("levels", False)) for _ in range(2))  # type: ignore[arg-type]
    want = [copy_links(one, int(x), int(y)) for x, y in zip(a, b)]
    got = copy_links_batch(many, a, b)
    assert got is not None
    ptr, lid, wt, lat = got
    assert len(ptr) == len(a) + 1
    for i, (links, latency) in enumerate(want):
        row = tuple(zip(lid[ptr[i]:ptr[i + 1]].tolist(), wt[ptr[i]:ptr[i + 1]].tolist()))
        assert row == links and lat[i] == latency, (i, int(a[i]), int(b[i]))
    assert [x.name for x in many.links] == [x.name for x in one.links]
    assert many.links == one.links


def _with(topo: Topology, **update: object) -> Topology:
    """`topo` with top-level fields (node_overrides, degraded_links) or inter's (routing,
    ecmp_seed) replaced, validated again."""
    data = topo.model_dump(mode="json")
    for name, value in update.items():
        if name in ("routing", "ecmp_seed"):
            data["inter"][name] = value
        else:
            data[name] = [v.model_dump(mode="json") for v in value]  # type: ignore[attr-defined]
    return Topology.model_validate(data)


def _slow(topo: Topology) -> Topology:
    assert topo.inter is not None
    return _with(topo, node_overrides=[NodeOverride(node=1, nic_gbps=topo.inter.nic_gbps / 2)])


def _four_tiers(nodes: int, routing: str = "ecmp") -> Topology:
    """A small 4-tier Clos (rail leaves of 4 nodes, 2 of them a spine group, 2 of those an
    aggregation group, a core above), so a pair's path turns at any of four tiers."""
    data = load_topology("h100-rail-3tier", nodes).model_dump(mode="json")
    data["inter"]["routing"] = routing
    data["inter"]["tiers"] = [
        {"name": "leaf", "group_size": 4, "rails": True, "uplinks": 4, "latency_us": 0.5},
        {"name": "spine", "group_size": 2, "uplinks": 3, "oversubscription": 2.0, "latency_us": 0.25},
        {"name": "agg", "group_size": 2, "uplinks": 2, "latency_us": 0.75},
        {"name": "core", "latency_us": 1.0}]
    return Topology.model_validate(data)


TIERED = {
    "3tier-2": lambda: load_topology("h100-rail-3tier", 2),
    "3tier-37": lambda: load_topology("h100-rail-3tier", 37),          # a partial leaf group
    "3tier-300": lambda: load_topology("h100-rail-3tier", 300),        # two pods, one partial
    "3tier-64-seed": lambda: _with(load_topology("h100-rail-3tier", 64), ecmp_seed=7),
    "3tier-64-slow": lambda: _slow(load_topology("h100-rail-3tier", 64)),
    "3tier-64-degraded": lambda: _with(load_topology("h100-rail-3tier", 64), degraded_links=[
        DegradedLink(link="leaf_up[0,3,5]", factor=0.5), DegradedLink(link="nic_tx[2,1]", factor=0.5)]),
    "3tier-300-spray": lambda: _with(load_topology("h100-rail-3tier", 300), routing="spray"),
    "b200-40": lambda: load_topology("dgx-b200", 40),
    "b200-40-spray": lambda: _with(load_topology("dgx-b200", 40), routing="spray"),
    "nvl72-9": lambda: load_topology("gb200-nvl72", 9),
    "4tier-37": lambda: _four_tiers(37),
    "4tier-37-spray": lambda: _four_tiers(37, "spray"),
}


def _pairs(w: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """k random pairs of w GPUs, the first few self copies and one pair asked twice; half of
    the rest on one rail (what hierarchical plans send across nodes)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, w, k).astype(np.int64)
    b = rng.integers(0, w, k).astype(np.int64)
    rail = rng.random(k) < 0.5
    b[rail] = b[rail] - b[rail] % 8 + a[rail] % 8
    b %= w
    a[:4], b[:4] = [0, 1, 1, 9], [0, 1, 1, 1]
    return a, b


@pytest.mark.parametrize("name", list(TIERED))
@pytest.mark.parametrize("seed", [0, 1])
def test_the_batch_equals_copy_links_pair_by_pair_on_tiered_fabrics(name, seed):
    topo = TIERED[name]()
    w = topo.world_size
    a, b = _pairs(w, min(3 * w, 2000), seed)
    assert_batch_is_pair_by_pair(topo, a, b, wire=2.0 if seed else 1.0)


@pytest.mark.parametrize("nodes,fold,levels,routing", [
    (64, 256, False, "ecmp"), (300, 8, True, "spray"), (64, 8, True, "ecmp"), (512, 2048, False, "ecmp")])
def test_the_batch_on_a_folded_tiered_fabric(nodes, fold, levels, routing):
    """Folded: ports keyed by the representative's nodes, weighted by the shifts sharing them."""
    topo = _with(load_topology("h100-rail-3tier", nodes), routing=routing)
    a, b = _pairs(topo.world_size, 1500, nodes)
    a %= fold                         # the representatives send
    assert_batch_is_pair_by_pair(topo, a, b, fold=fold, levels=levels)


def test_every_pair_of_a_two_pod_fabric_in_a_random_order():
    """Each pair of 64 GPUs spread over both pods of a 3-tier fabric (every turn tier), shuffled."""
    topo = load_topology("h100-rail-3tier", 264)
    gpus = np.array([0, 3, 8, 11, 250, 257, 263, 264, 511, 1000, 2047, 2048, 2055, 2100, 2111] +
                    list(range(1500, 1549)), np.int64)
    a, b = (x.ravel() for x in np.meshgrid(gpus, gpus))
    order = np.random.default_rng(3).permutation(len(a))
    assert_batch_is_pair_by_pair(topo, a[order], b[order])


def test_what_the_batch_does_not_cover():
    sprayed = _with(load_topology("h100-rail-3tier", 64), routing="spray",
                    degraded_links=[DegradedLink(link="leaf_up[0,3,5]", factor=0.5)])
    for topo in (sprayed, load_topology("pcie-8gpu", 2)):
        assert copy_links_batch(Network(topo), np.array([0, 1]), np.array([9, 2])) is None


def _schedule(topo: Topology, kind: str, algo: str) -> hc.Schedule:
    """A dense all-to-all-v (`a2av`: a group_cast, 1-99 elements a pair), else `kind` of 4 MiB."""
    from hiercoll.collectives import GroupSplits
    w = topo.world_size
    if kind == "a2av":
        m = np.random.default_rng(w).integers(1, 100, (w, w)).tolist()
        spec = hc.CollectiveSpec(kind="group_cast", world_size=w, dtype="bf16", splits=GroupSplits.from_counts(m))
    else:
        spec = hc.CollectiveSpec(kind=kind, world_size=w, dtype="bf16", nbytes=1 << 22)
    return hc.plan(topo, spec, algo, {})


# a tree all-reduce and a direct reduce: a reduce is the first to use some links, between copies
CASES = [("h100-rail-3tier", 5, False, "a2av", "direct"), ("h100-rail-3tier", 5, True, "a2av", "direct"),
         ("dgx-b200", 3, False, "a2av", "direct"), ("h100-rail-3tier", 6, False, "a2av", "hier"),
         ("h100-rail-3tier", 6, True, "all_reduce", "hier"), ("dgx-h100", 3, False, "all_reduce", "hier"),
         ("h100-rail-3tier", 4, False, "all_reduce", "tree"), ("dgx-h100", 2, False, "reduce", "direct")]


def _counting(tb, calls: list[int]):  # type: ignore[no-untyped-def]
    """`copy_links_batch` that records how many pairs each batch it answered held."""
    real = tb.copy_links_batch

    def counted(net, a, b, ask=None):  # type: ignore[no-untyped-def]
        got = real(net, a, b, ask)
        calls.append(len(a) if got is not None else 0)
        return got
    return counted


@pytest.mark.parametrize("preset,nodes,slow,kind,algo", CASES)
@pytest.mark.parametrize("chunk", [None, 700])
def test_tables_are_the_same_with_and_without_the_batch(monkeypatch, preset, nodes, slow, kind, algo, chunk):
    """The tables (keys, shapes, link lists) and the network's links, array for array, whether
    pair copies are keyed at once or one by one; with reduces among the copies (hierarchical
    plans: their links made in row order between the copies'), and across table chunks."""
    from hiercoll.schedule_arrays import native_op_arrays, op_arrays_from_ops
    from hiercoll.sim.compiled import tables as tb
    topo = load_topology(preset, nodes)
    topo = _slow(topo) if slow else topo
    sched = _schedule(topo, kind, algo)
    ranks = list(range(topo.world_size))
    arrays = native_op_arrays(sched, ranks) or op_arrays_from_ops([sched.rank_ops(r) for r in ranks], ranks)
    assert arrays is not None
    if chunk is not None:
        monkeypatch.setattr(tb, "CHUNK_OPS", chunk)
    calls: list[int] = []
    monkeypatch.setattr(tb, "copy_links_batch", _counting(tb, calls))
    net_fast = Network(topo, itemsize=2)
    fast = tb.tables_from_arrays(arrays, net_fast, 2)
    assert calls and max(calls) > 1
    monkeypatch.setattr(tb, "copy_links_batch", lambda net, a, b, ask=None: None)
    net_slow = Network(topo, itemsize=2)
    slow_t = tb.tables_from_arrays(arrays, net_slow, 2)
    for name in fast.__dataclass_fields__:
        x, y = getattr(fast, name), getattr(slow_t, name)
        assert np.array_equal(np.asarray(x), np.asarray(y)), name
    assert net_fast.links == net_slow.links


@pytest.mark.parametrize("preset,nodes,slow,kind,algo", CASES)
def test_a_simulation_is_the_same_with_and_without_the_batch(monkeypatch, preset, nodes, slow, kind, algo):
    """A dense all-to-all-v or a hierarchical plan on a tiered fabric (the tables batch their
    copies): the same time, link loads and op times to the bit as with every pair routed one
    by one."""
    pytest.importorskip("numba")
    from hiercoll.sim import simulate
    from hiercoll.sim.compiled import tables as tb
    topo = load_topology(preset, nodes)
    topo = _slow(topo) if slow else topo
    sched = _schedule(topo, kind, algo)
    calls: list[int] = []
    monkeypatch.setattr(tb, "copy_links_batch", _counting(tb, calls))
    fast = simulate(sched, topo, mode="exact", engine="compiled")
    assert calls and max(calls) > 1
    monkeypatch.setattr(tb, "copy_links_batch", lambda net, a, b, ask=None: None)
    slow_res = simulate(sched, topo, mode="exact", engine="compiled")
    assert fast.time_us == slow_res.time_us
    assert [(x.name, x.bytes, x.busy_us) for x in fast.links] == [(x.name, x.bytes, x.busy_us) for x in slow_res.links]
    assert list(fast.op_end.items()) == list(slow_res.op_end.items())
    assert (fast.bytes_intra, fast.bytes_inter) == (slow_res.bytes_intra, slow_res.bytes_inter)


@pytest.mark.parametrize("make", [lambda: load_topology("h100-rail-3tier", 300), lambda: load_topology("dgx-h100", 4)])
def test_batches_after_batches_on_one_network(make):
    """Later batches ask only pairs that bring links no earlier batch made: three batches on one
    network are still `copy_links` pair by pair, links in the same order."""
    topo = make()
    a, b = _pairs(topo.world_size, 3000, 5)
    one, many = Network(topo), Network(topo)
    want = [copy_links(one, int(x), int(y)) for x, y in zip(a, b)]
    got = []
    for lo, hi in ((0, 1000), (1000, 1001), (1001, 3000)):
        out = copy_links_batch(many, a[lo:hi], b[lo:hi])
        assert out is not None
        ptr, lid, wt, lat = out
        got += [(tuple(zip(lid[ptr[i]:ptr[i + 1]].tolist(), wt[ptr[i]:ptr[i + 1]].tolist())), lat[i])
                for i in range(hi - lo)]
    assert got == want
    assert many.links == one.links
