"""Tiered scale-out fabrics (inter.tiers), heterogeneous nodes (node_overrides) and the schema
version 2 converter: old files unchanged, hand-worked spine contention, ECMP determinism,
oversubscription, degraded nodes, bounds and folding on random tiered topologies, presets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.errors import HiercollError
from hiercoll.planner import applicable
from hiercoll.schedule import ExpandedOps, Op, OpKind, Region, Schedule, ScheduleMeta, Transport
from hiercoll.sim import simulate
from hiercoll.sim.bounds import contention_free_us
from hiercoll.sim.links import Network
from hiercoll.sim.symmetry import find_level_symmetry
from hiercoll.topology import Topology, load_topology, preset
from hiercoll.topology.fabric import ecmp_choice, layout, level_radices, level_shifts_keep_paths, translation_span
from hiercoll.topology.load import topology_from_dict
from hiercoll.topology.versions import upgrade
from tests.test_planner_flat import make_spec

V1_FILE: dict[str, Any] = {
    "name": "v1", "num_nodes": 4, "gpus_per_node": 2, "schema_version": 1,
    "gpu": {"name": "T", "hbm_gbps": 3000.0, "num_sms": 100},
    "intra": {"kind": "nvswitch", "gbps": 300.0, "latency_us": 1.0},
    "inter": {"num_nics": 2, "nic_gbps": 40.0, "latency_us": 3.0, "oversubscription": 2.0}}


def toy(tiers: list[dict[str, Any]], nodes: int = 4, gpus: int = 1, nics: int = 1,
        **extra: Any) -> Topology:
    """`nodes` x `gpus` with one 10 GB/s NIC per GPU rail, 2 us between nodes, 1 us launches,
    HBM and PCIe fast enough never to matter: only NICs and fabric ports limit a flow."""
    inter = {"num_nics": nics, "nic_gbps": 10.0, "latency_us": 2.0, "gpu_nic_gbps": 1000.0,
             "tiers": tiers} | extra.pop("inter", {})
    data = {"name": "toy", "num_nodes": nodes, "gpus_per_node": gpus,
            "gpu": {"name": "T", "hbm_gbps": 1e6, "num_sms": 100},
            "intra": {"kind": "nvswitch", "gbps": 1000.0, "latency_us": 1.0},
            "inter": inter, "costs": {"launch_us": 1.0, "reduce_efficiency": 1.0}} | extra
    return Topology.model_validate(data)


def copies(topo: Topology, flows: list[tuple[int, int]], count: int) -> Schedule:
    """One copy per (src, dst), issued by src, each on its own channel, all at t=0."""
    w = topo.world_size
    ops: list[list[Op]] = [[] for _ in range(w)]
    bufs = [{"input": count, "output": count, "scratch": count * w} for _ in range(w)]
    for ch, (src, dst) in enumerate(flows):
        ops[src].append(Op(src, len(ops[src]), ch, OpKind.COPY,
                           Region(dst, "scratch", src * count, count),
                           (Region(src, "input", 0, count),), (), Transport.INTER))
    spec = CollectiveSpec(kind="all_reduce", world_size=w, dtype="fp32", nbytes=count * 4)
    meta = ScheduleMeta("handmade", {}, spec, topo.fingerprint())
    return Schedule(meta, ExpandedOps(tuple(map(tuple, ops)), tuple(bufs)))


def end_times(topo: Topology, flows: list[tuple[int, int]], count: int) -> list[float]:
    res = simulate(copies(topo, flows, count), topo)
    return [res.op_end[ref] for ref in sorted(res.op_end, key=lambda r: (r[0], r[1]))]


# ---- old files ---------------------------------------------------------------------------------
def test_old_files_load_unchanged_and_time_identically() -> None:
    """Fingerprints and times from before the bump (computed with c e b 8 f 5 6, the last commit
    without tiers): a schema-1 file with a per-node oversubscribed uplink, and a preset."""
    t = Topology.model_validate(V1_FILE)
    assert t.schema_version == 2 and t.inter is not None and t.inter.tiers is None
    assert t.fingerprint() == "f68073161450a232"
    want = {("ring", "all_gather"): 60.046826666666675, ("hier", "all_reduce"): 85.01461333333334,
            ("direct", "all_to_all"): 72.75850666666668}   # 74.87 before direct's self copy
    #                                                  got a channel of its own (stop 35)
    for (algo, kind), time_us in want.items():
        spec = CollectiveSpec(kind=kind, world_size=t.world_size, dtype="bf16", nbytes=1 << 20)
        res = simulate(hc.plan(t, spec, algo), t)
        assert res.time_us == time_us and res.notes == []
        assert res.lower_bound_us == (22.6608 if kind == "all_gather" else 42.3216)
    d = load_topology("dgx-h100", nodes=2)
    assert d.fingerprint() == "c25e9aee9dd329a3"
    assert {n: load_topology(n, nodes=4).fingerprint() for n in ("dgx-h100", "mi300x", "pcie-8gpu")} == {
        "dgx-h100": "551f91bb9261c493", "mi300x": "ee0877714b2230af", "pcie-8gpu": "74192501d2fd611a"}
    spec = CollectiveSpec(kind="all_reduce", world_size=d.world_size, dtype="bf16", nbytes=16 << 20)
    assert simulate(hc.plan(d, spec, "hier"), d).time_us == 172.86394054814338


def test_converter() -> None:
    """A version-1 mapping becomes version 2 unchanged otherwise; version-1 files cannot use
    version-2 fields; a file without a version is read as whichever its fields say."""
    up = upgrade(V1_FILE)
    assert isinstance(up, dict) and up["schema_version"] == 2
    assert {k: v for k, v in up.items() if k != "schema_version"} == {
        k: v for k, v in V1_FILE.items() if k != "schema_version"}
    no_version = {k: v for k, v in V1_FILE.items() if k != "schema_version"}
    assert Topology.model_validate(no_version).fingerprint() == Topology.model_validate(V1_FILE).fingerprint()
    bad = json.loads(json.dumps(V1_FILE))
    bad["inter"]["oversubscription"] = 1.0
    bad["inter"]["tiers"] = [{"name": "leaf"}]
    with pytest.raises(HiercollError, match=r"schema_version: 1 has no inter.tiers; set schema_version: 2"):
        topology_from_dict(bad, "f.yaml")
    bad.pop("schema_version")          # no version + a version-2 field: version 2
    assert topology_from_dict(bad, "f.yaml").inter.tiers is not None   # type: ignore[union-attr]
    # what `topo show --json` prints loads back as the same topology
    t = toy([{"name": "leaf", "group_size": 2, "uplinks": 2}, {"name": "spine"}])
    dumped = t.model_dump(mode="json") | {"fingerprint": "x", "world_size": t.world_size}
    again = topology_from_dict(dumped, "show.json")
    assert again == t and again.fingerprint() == t.fingerprint() != toy([{"name": "leaf"}]).fingerprint()


@pytest.mark.parametrize("tiers,inter,match", [
    ([], {}, "tiers: an empty list"),
    ([{"name": "leaf"}, {"name": "spine"}], {}, r"tiers\[0\] \(leaf\): group_size is required"),
    ([{"name": "leaf", "group_size": 2}, {"name": "spine", "uplinks": 2}], {}, "outermost tier has no uplinks"),
    ([{"name": "leaf", "group_size": 2, "uplink_gbps": 5, "oversubscription": 2}, {"name": "s"}], {},
     "uplink_gbps or oversubscription, not both"),
    ([{"name": "leaf", "rails": True}], {}, "rail-optimised leaf needs a tier above"),
    ([{"name": "leaf", "group_size": 2}, {"name": "leaf"}], {}, "names .* repeat"),
    ([{"name": "leaf", "group_size": 1}, {"name": "spine", "group_size": 2}], {}, "must join every node"),
    ([{"name": "leaf", "group_size": 4, "uplinks": 2, "radix": 5}, {"name": "s"}], {},
     r"radix: a switch needs 4 down \+ 2 up = 6 ports"),
    ([{"name": "leaf"}], {"oversubscription": 2.0}, "give each tier's oversubscription"),
    ([{"name": "Leaf"}], {}, "tiers.0.name"),
])
def test_bad_tiers_are_one_line_errors(tiers: list[dict[str, Any]], inter: dict[str, Any], match: str) -> None:
    data = toy([{"name": "leaf"}]).model_dump(mode="json")
    data["inter"] |= {"tiers": tiers} | inter
    with pytest.raises(HiercollError, match=match) as err:
        topology_from_dict(data, "t.yaml")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("overrides,match", [
    ([{"node": 4, "nic_gbps": 1.0}], r"node_overrides\[0\].node: 4 is not a node"),
    ([{"node": 1}], "give at least one of"),
    ([{"node": 1, "nic_gbps": 1.0}, {"node": 1, "hbm_gbps": 9.0}], "overridden twice"),
    ([{"node": 1, "nic": 3, "nic_gbps": 1.0}], r"nic: 3 is not a NIC"),
    ([{"node": 1, "nic": 0, "hbm_gbps": 1.0}], "give nic_gbps alone"),
])
def test_bad_overrides_are_one_line_errors(overrides: list[dict[str, Any]], match: str) -> None:
    data = toy([{"name": "leaf"}]).model_dump(mode="json") | {"node_overrides": overrides}
    with pytest.raises(HiercollError, match=match):
        topology_from_dict(data, "t.yaml")


def test_cli_bad_tier_file_is_one_line(tmp_path: Path) -> None:
    data = toy([{"name": "leaf"}]).model_dump(mode="json")
    data["inter"]["tiers"] = [{"name": "leaf", "group_size": 1}, {"name": "spine", "group_size": 2}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, "-m", "hiercoll", "topo", "show", str(path)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert out.stderr.startswith("error: ") and "tiers[1] (spine).group_size" in out.stderr


# ---- hand-worked -------------------------------------------------------------------------------
def test_two_leaf_one_spine_spine_contention_by_hand() -> None:
    """Nodes 0,1 under leaf 0, nodes 2,3 under leaf 1, one spine; NICs 10 GB/s; each leaf has
    one 10 GB/s uplink (2:1). A (0->2) and B (1->3) both go leaf 0 up -> spine -> leaf 1 down:
    they share that uplink and the spine's port into leaf 1, 5 GB/s each, though their NICs
    could do 10. D (2->0) goes the other way (full duplex: leaf 1 up, leaf 0 down) alone: 10.
    S (0->1) stays under leaf 0 (10 GB/s, no spine latency), sharing nothing with A but node
    0's NIC tx: A takes 5 of its 10, S the other 5.

    Times: launch 1 us + latency (2 us, plus 0.5 us for the second leaf and 0.25 us for the
    spine when crossing it) + bytes / rate. N = 4 MiB: A = B = 1 + 2.75 + N/5000 us,
    D = 1 + 2.75 + N/10000. S starts 0.75 us before A (no spine hops) and moves 0.75 x 10000
    B alone at 10 GB/s, then the rest at 5: S = 3.75 + (N - 7500)/5000 = 2.25 + N/5000."""
    t = toy([{"name": "leaf", "group_size": 2, "uplink_gbps": 10.0, "latency_us": 0.5},
             {"name": "spine", "latency_us": 0.25}])
    count = 1 << 20
    n = count * 4
    a, s, b, d = end_times(t, [(0, 2), (0, 1), (1, 3), (2, 0)], count)
    assert a == pytest.approx(1 + 2.75 + n / 5000, rel=1e-12)
    assert b == pytest.approx(a, rel=1e-12)
    assert d == pytest.approx(1 + 2.75 + n / 10000, rel=1e-12)
    assert s == pytest.approx(2.25 + n / 5000, rel=1e-12)
    # the same with the uplink given as oversubscription (2 nodes x 10 GB/s down / 2 = 10 up)
    t2 = toy([{"name": "leaf", "group_size": 2, "oversubscription": 2.0, "latency_us": 0.5},
              {"name": "spine", "latency_us": 0.25}])
    assert end_times(t2, [(0, 2), (0, 1), (1, 3), (2, 0)], count) == [a, s, b, d]


def test_oversubscription_halves_cross_leaf_bandwidth() -> None:
    """Both nodes of leaf 0 send to leaf 1 at once: non-blocking, each at its NIC's 10 GB/s;
    2:1 oversubscribed, the leaf's 10 GB/s of uplink is shared: each at 5, twice as long."""
    count = 1 << 20
    fixed = 1 + 2
    times = {}
    for over in (1.0, 2.0):
        t = toy([{"name": "leaf", "group_size": 2, "oversubscription": over}, {"name": "spine"}])
        times[over] = [e - fixed for e in end_times(t, [(0, 2), (1, 3)], count)]
    assert times[1.0][0] == pytest.approx(count * 4 / 10000, rel=1e-12)
    assert times[2.0] == pytest.approx([2 * x for x in times[1.0]], rel=1e-12)


def test_rails_cross_rail_traffic_goes_up() -> None:
    """A rail-optimised leaf joins NIC i of every node: 0->3 (rail 0 -> rail 1) crosses the
    spine even between nodes of one leaf group; 0->2 (rail 0 -> rail 0) stays on leaf 0."""
    t = toy([{"name": "leaf", "group_size": 2, "rails": True}, {"name": "spine"}], nodes=2, gpus=2, nics=2)
    net = Network(t)
    names = lambda a, b: {net.links[lid].name for lid, _ in net.net_path(a, b)}  # noqa: E731
    assert not any(n.startswith("leaf_") for n in names(0, 2))
    assert {"leaf_up[0,0,0]", "leaf_down[0,1,0]"} <= names(0, 3)
    assert net.latency_us(0, 3) == net.latency_us(0, 2) == 2.0       # tier latencies 0 here


def test_ecmp_is_deterministic_per_seed_and_spray_splits_evenly() -> None:
    tiers = [{"name": "leaf", "group_size": 2, "uplinks": 4}, {"name": "spine"}]
    pairs = [(a, b) for a in range(4) for b in range(4, 8)]

    def uplinks(seed: int) -> list[str]:
        t = toy(tiers, nodes=4, gpus=2, nics=2, inter={"ecmp_seed": seed})
        net = Network(t)
        return [next(net.links[lid].name for lid, _ in net.net_path(a, b)
                     if net.links[lid].name.startswith("leaf_up")) for a, b in pairs]
    assert uplinks(7) == uplinks(7)
    assert uplinks(7) != uplinks(8)
    t = toy(tiers, nodes=4, gpus=2, nics=2, inter={"ecmp_seed": 7})
    lay = layout(t)
    span = translation_span(t)
    assert span == 2
    # the path of 0 -> 4 is the hash of its endpoints (relative to the 2-node groups)
    k = ecmp_choice(7, 0, (0 % 2, 0, (2 - 0) % 4, 0), lay[0].uplinks)
    assert f"leaf_up[0,0,{k}]" in uplinks(7)[0:1]
    spray = toy(tiers, nodes=4, gpus=2, nics=2, inter={"routing": "spray"})
    net = Network(spray)
    ups = {net.links[lid].name: (w, net.links[lid].bytes_per_us) for lid, w in net.net_path(0, 4)
           if net.links[lid].name.startswith("leaf_")}
    # spray: every flow through a leaf's 4 uplinks splits evenly over them, so one bundle of 4x
    # a port's capacity, weight 1, stands for them (identical max-min constraints)
    assert ups == {"leaf_up[0,0,*]": (1.0, 4 * lay[0].port_gbps * 1e3),
                   "leaf_down[1,0,*]": (1.0, 4 * lay[0].port_gbps * 1e3)}
    res = [simulate(copies(t, [(0, 4), (1, 5), (2, 6)], 1 << 16), t).time_us for _ in range(2)]
    assert res[0] == res[1]


def test_degraded_node_slows_exactly_the_flows_through_it() -> None:
    """Node 2's NIC at 2.5 GB/s instead of 10: the flow into it takes 4x as long; the others
    (not through node 2) keep their times to the bit. A ring over it is not folded (note)."""
    tiers = [{"name": "leaf", "group_size": 2}, {"name": "spine"}]
    flows = [(0, 2), (1, 3), (3, 1)]
    count = 1 << 20
    fixed = 1 + 2
    base = end_times(toy(tiers), flows, count)
    slow_topo = toy(tiers, node_overrides=[{"node": 2, "nic_gbps": 2.5}])
    slow = end_times(slow_topo, flows, count)
    assert slow[0] - fixed == pytest.approx(4 * (base[0] - fixed), rel=1e-12)
    assert slow[1:] == base[1:]
    spec = CollectiveSpec(kind="all_gather", world_size=4, dtype="bf16", nbytes=1 << 20)
    res = simulate(hc.plan(slow_topo, spec, "ring"), slow_topo)
    assert res.shortcut is None and any("node_overrides" in n for n in res.notes)
    assert res.time_us > simulate(hc.plan(toy(tiers), spec, "ring"), toy(tiers)).time_us
    one_nic = toy(tiers, nodes=4, gpus=2, nics=2, node_overrides=[{"node": 2, "nic": 1, "nic_gbps": 2.5}])
    net = Network(one_nic)
    caps = {net.links[lid].name: net.links[lid].bytes_per_us for lid, _ in net.net_path(0, 4)}
    caps |= {net.links[lid].name: net.links[lid].bytes_per_us for lid, _ in net.net_path(1, 5)}
    assert caps["nic_rx[2,0]"] == 10000.0 and caps["nic_rx[2,1]"] == 2500.0


def test_tiered_folding_grows_the_period_and_matches_exact() -> None:
    """8 nodes x 2 GPUs, leaves of 2 nodes, spines of 2 leaves, an aggregation layer: the fabric
    repeats every 4 nodes, so a schedule of period 2 is folded by 8 ranks, not 2."""
    t = toy([{"name": "leaf", "group_size": 2, "uplinks": 2},
             {"name": "spine", "group_size": 2, "uplinks": 2, "oversubscription": 2.0},
             {"name": "aggregation"}], nodes=8, gpus=2, nics=2)
    spec = CollectiveSpec(kind="all_gather", world_size=16, dtype="bf16", nbytes=1 << 20)
    sched = hc.plan(t, spec, "ring")
    res = simulate(sched, t)
    assert res.shortcut is not None and "period 8" in res.shortcut
    assert any("folded by 8 ranks" in n for n in res.notes)
    assert simulate(sched, t, mode="exact").time_us == pytest.approx(res.time_us, rel=1e-9)
    partial = toy([{"name": "leaf", "group_size": 3}, {"name": "spine"}], nodes=4)
    spec4 = CollectiveSpec(kind="all_gather", world_size=4, dtype="bf16", nbytes=1 << 16)
    res4 = simulate(hc.plan(partial, spec4, "ring"), partial)
    assert res4.shortcut is None and any("not all full" in n for n in res4.notes)


def test_one_rail_leaf_group_for_the_whole_cluster_folds_with_its_shared_uplink() -> None:
    """Found by the hypothesis test below: 2 nodes x 2 GPUs under one group of rail leaves with
    an uplink each. Cross-rail flows of both nodes climb the same rail-leaf uplink, a link every
    node shift keeps in place: folded by one node, that uplink must count both nodes' copies of
    a flow (weight 2), or folding halves their contention (direct reduce-scatter, 4 bf16
    elements: folded 9.000402 us, exact 9.000502, before ports counted their copies)."""
    t = toy([{"name": "t0", "group_size": 2, "uplinks": 1, "oversubscription": 1.5, "rails": True},
             {"name": "t1", "group_size": 1, "uplinks": 1}, {"name": "top"}], nodes=2, gpus=2, nics=2)
    spec = CollectiveSpec(kind="reduce_scatter", world_size=4, dtype="bf16", nbytes=8)
    sched = hc.plan(t, spec, "direct")
    res = simulate(sched, t)
    assert res.shortcut is not None and "2 of 4 ranks" in res.shortcut
    exact = simulate(sched, t, mode="exact")
    assert res.time_us == pytest.approx(exact.time_us, rel=1e-12)
    up = next(l for l in res.links if l.name.startswith("t0_up"))
    assert up.copies == 1            # one such uplink per rail, which both nodes share
    assert up.bytes == pytest.approx(sum(l.bytes for l in exact.links if l.name == up.name), rel=1e-12)
    # two uplinks: ECMP hashes the node itself there (nothing smaller to be relative to), so no
    # shift maps paths onto paths; spray has no hash and folds, its shared uplinks counted
    for routing, folds in (("ecmp", False), ("spray", True)):
        t2 = toy([{"name": "t0", "group_size": 2, "uplinks": 2, "oversubscription": 1.5, "rails": True},
                  {"name": "t1", "group_size": 1, "uplinks": 1}, {"name": "top"}], nodes=2, gpus=2, nics=2,
                 inter={"routing": routing})
        res = simulate(hc.plan(t2, spec, "direct"), t2)
        assert (res.shortcut is not None) == folds, routing
        assert res.time_us == pytest.approx(simulate(hc.plan(t2, spec, "direct"), t2, mode="exact").time_us,
                                            rel=1e-12)


def test_tier_cut_binds_the_bound() -> None:
    """All-gather on 4 nodes x 1 GPU, leaves of 2 at 4:1: each leaf group must take in half of
    S over one 5 GB/s uplink, slower than any node's 10 GB/s NIC taking 3/4 of S."""
    t = toy([{"name": "leaf", "group_size": 2, "oversubscription": 4.0}, {"name": "spine"}])
    spec = CollectiveSpec(kind="all_gather", world_size=4, dtype="bf16", nbytes=1 << 20)
    bound = hc.sim.bounds.lower_bound(spec, t)
    assert bound.cut == "leaf"
    assert bound.time_us == pytest.approx((1 << 20) / 2 / 5000 + 2 + 1, rel=1e-12)   # + hop + launch
    assert simulate(hc.plan(t, spec, "ring"), t).time_us >= bound.time_us


@st.composite
def tiered_topologies(draw: st.DrawFn) -> Topology:
    nodes, gpus = draw(st.integers(2, 6)), draw(st.integers(1, 3))
    nics = draw(st.integers(1, gpus))
    rails = draw(st.booleans())
    levels = draw(st.integers(1 if not rails else 2, 3))
    tiers: list[dict[str, Any]] = []
    for i in range(levels - 1):
        tier: dict[str, Any] = {"name": f"t{i}", "group_size": draw(st.integers(1, 3)),
                                "uplinks": draw(st.integers(1, 3)),
                                "oversubscription": draw(st.sampled_from([1.0, 1.5, 2.0, 4.0])),
                                "latency_us": draw(st.sampled_from([0.0, 0.5]))}
        tiers.append(tier)
    tiers.append({"name": "top"})
    if rails:
        tiers[0]["rails"] = True
    overrides = []
    if draw(st.booleans()):
        overrides = [{"node": draw(st.integers(0, nodes - 1)),
                      "nic_gbps": draw(st.sampled_from([2.0, 20.0])),
                      "intra_gbps": draw(st.sampled_from([100.0, 2000.0]))}]
    inter = {"routing": draw(st.sampled_from(["ecmp", "spray"])), "ecmp_seed": draw(st.integers(0, 3))}
    return toy(tiers, nodes=nodes, gpus=gpus, nics=nics, inter=inter, node_overrides=overrides)


@st.composite
def foldable_topologies(draw: st.DrawFn) -> Topology:
    """Three tiers whose groups are all full: the fabric repeats every leaf x spine nodes."""
    g0, g1, m = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(2, 3))
    gpus = draw(st.integers(1, 3))
    tiers = [{"name": "leaf", "group_size": g0, "uplinks": draw(st.integers(1, 3)),
              "rails": draw(st.booleans()), "oversubscription": draw(st.sampled_from([1.0, 2.0]))},
             {"name": "spine", "group_size": g1, "uplinks": draw(st.integers(1, 3)),
              "oversubscription": draw(st.sampled_from([1.0, 3.0]))}, {"name": "agg"}]
    inter = {"routing": draw(st.sampled_from(["ecmp", "spray"])), "ecmp_seed": draw(st.integers(0, 5))}
    return toy(tiers, nodes=g0 * g1 * m, gpus=gpus, nics=draw(st.integers(1, gpus)), inter=inter)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=st.one_of(tiered_topologies(), foldable_topologies()), kind=st.sampled_from(list(Kind)),
       elems=st.integers(1, 4096), even=st.booleans(), seed=st.integers(0, 10**6), data=st.data())
def test_bounds_never_exceed_simulated_time_on_tiered_fabrics(topo: Topology, kind: Kind, elems: int,
                                                            even: bool, seed: int,
                                                            data: st.DataObject) -> None:
    """Every algorithm never beats the bound; where folded (even shards keep the planners'
    symmetry), the folded time is the exact one."""
    if even:
        elems = topo.world_size * 64 * (1 + elems % 4)
    spec = make_spec(kind, topo.world_size, elems, "bf16", seed)
    algo = data.draw(st.sampled_from(applicable(topo, spec)))
    sched = hc.plan(topo, spec, algo, {})
    res = simulate(sched, topo)
    assert res.time_us >= res.lower_bound_us * (1 - 1e-9)
    assert res.time_us >= contention_free_us(sched, topo) * (1 - 1e-9)
    if res.shortcut:
        assert simulate(sched, topo, mode="exact").time_us == pytest.approx(res.time_us, rel=1e-9)


# ---- presets -----------------------------------------------------------------------------------
def test_tiered_presets_load() -> None:
    b200 = preset("dgx-b200", 64)
    assert (b200.gpus_per_node, b200.gpu.name, b200.inter.num_nics) == (8, "B200", 8)  # type: ignore[union-attr]
    assert [tl.name for tl in layout(b200)] == ["leaf", "spine"] and layout(b200)[0].switches == 8
    nvl = preset("gb200-nvl72", 4)
    assert nvl.gpus_per_node == 72 and nvl.inter.num_nics == 72 and nvl.world_size == 288  # type: ignore[union-attr]
    big = preset("h100-rail-3tier")
    assert big.world_size == 4096 and [tl.name for tl in layout(big)] == ["leaf", "spine", "aggregation"]
    spine = layout(big)[1]
    assert spine.down_ports * layout(big)[0].port_gbps / (spine.uplinks * spine.port_gbps) == pytest.approx(7.0)
    assert preset("h100-rail-3tier", 3072).world_size == 24576
    assert translation_span(big) == 256
    wide = b200.model_dump(mode="json")
    wide["inter"]["tiers"][0]["group_size"] = 40           # 40 down + 32 up on a 64-port leaf
    with pytest.raises(HiercollError, match=r"tiers\[0\] \(leaf\).radix: a switch needs 40 down"):
        topology_from_dict(wide, "b200.yaml")
    # a small one simulates, bounded
    small = preset("h100-rail-3tier", 32)
    spec = CollectiveSpec(kind="all_reduce", world_size=small.world_size, dtype="bf16", nbytes=1 << 20)
    res = simulate(hc.plan(small, spec, "hier"), small)
    assert res.time_us >= res.lower_bound_us


def test_topo_upgrade_writes_version_2_with_the_same_fingerprint(tmp_path: Path) -> None:
    src, dst = tmp_path / "old.json", tmp_path / "new.yaml"
    src.write_text(json.dumps(V1_FILE))
    out = subprocess.run([sys.executable, "-m", "hiercoll", "topo", "upgrade", str(src), "-o", str(dst),
                          "--json"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["schema_version"] == 2 and report["fingerprint"] == "f68073161450a232"
    assert "schema_version: 2" in dst.read_text() and "tiers" not in dst.read_text()
    assert load_topology(str(dst)).fingerprint() == "f68073161450a232"


def test_docs_tier_example_loads() -> None:
    """The YAML block of docs/simulator.md's tiers section is a valid inter + node_overrides."""
    import yaml
    text = (Path(__file__).parent.parent / "docs" / "simulator.md").read_text()
    block = text.split("## Scale-out fabrics", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    doc = yaml.safe_load(block)
    base = preset("h100-rail-3tier").model_dump(mode="json")
    t = topology_from_dict(base | {"inter": doc["inter"], "node_overrides": doc["node_overrides"]}, "doc")
    assert [tl.name for tl in layout(t)] == ["leaf", "spine", "aggregation"]
    t = topology_from_dict(base | {k: doc[k] for k in ("inter", "node_overrides", "degraded_links")}, "doc")
    assert t.nic_gbps_of(9, 3) == 12.5 and t.nic_gbps_of(9, 2) == 46.0 and t.hbm_gbps_of(2) == 2800.0
    assert not t.symmetric_nodes and t.degraded_links[0].link == "leaf_up[3,2,17]"


def test_degraded_link_slows_exactly_the_flows_on_it() -> None:
    """leaf 0's uplink at half speed: A (0->2) and B (1->3) share 5 GB/s instead of 10 (their
    transfers take twice as long); D (2->0) comes down the other direction, untouched."""
    tiers = [{"name": "leaf", "group_size": 2, "uplink_gbps": 10.0}, {"name": "spine"}]
    flows, count, fixed = [(0, 2), (1, 3), (2, 0)], 1 << 20, 1 + 2
    base = end_times(toy(tiers), flows, count)
    slow = end_times(toy(tiers, degraded_links=[{"link": "leaf_up[0,0,0]", "factor": 0.5}]), flows, count)
    assert slow[0] - fixed == pytest.approx(2 * (base[0] - fixed), rel=1e-12)
    assert slow[1] == slow[0] and slow[2] == base[2]
    data = toy(tiers).model_dump(mode="json")
    for bad, match in (([{"link": "spine_up[0,0,0]", "factor": 0.5}], "'spine_up' is no link kind"),
                       ([{"link": "leaf_up[0]", "factor": 0.0}], "factor"),
                       ([{"link": "leaf_up", "factor": 0.5}], "link"),
                       ([{"link": "nic_tx[1,0]", "factor": 0.5}] * 2, "appears twice")):
        with pytest.raises(HiercollError, match=match):
            topology_from_dict(data | {"degraded_links": bad}, "t.yaml")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=foldable_topologies(), kind=st.sampled_from([Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_GATHER]),
       inner=st.sampled_from(["direct", "ring"]), seed=st.integers(0, 10**6))
def test_level_shift_fold_is_exact(topo: Topology, kind: Kind, inner: str, seed: int) -> None:
    """hier_tiers on full tier groups: one node's ranks simulated (level shifts, where routing
    sprays or has no choice), to the exact time of every rank, and its ports' bytes x copies are
    every port's bytes."""
    spec = make_spec(kind, topo.world_size, topo.world_size * 64, "bf16", seed)
    sched = hc.plan(topo, spec, "hier_tiers", {"inner": inner})
    res = simulate(sched, topo)
    radices = level_radices(topo)
    assert radices is not None
    if len([m for m in radices if m > 1]) >= 2 and level_shifts_keep_paths(topo):
        assert res.shortcut is not None and res.shortcut.startswith("level-shift symmetry")
        assert len(res.ranks_simulated) == topo.gpus_per_node
    exact = simulate(sched, topo, mode="exact")
    assert exact.time_us == pytest.approx(res.time_us, rel=1e-9)
    ports = ("leaf_", "spine_")
    assert sum(l.bytes * l.copies for l in res.links if l.name.startswith(ports)) == pytest.approx(
        sum(l.bytes for l in exact.links if l.name.startswith(ports)), rel=1e-9, abs=1e-6)


def test_a_ring_is_not_level_symmetric_and_keeps_the_translation_fold() -> None:
    """A flat ring's flow from a leaf group's last node to the next group's first climbs to the
    spine; its neighbours' do not: no level shift maps it onto itself (whole groups still do)."""
    t = toy([{"name": "leaf", "group_size": 2, "uplinks": 2}, {"name": "spine", "group_size": 2, "uplinks": 2},
             {"name": "agg"}], nodes=8, gpus=2, nics=2)
    spec = CollectiveSpec(kind="all_reduce", world_size=16, dtype="bf16", nbytes=16 * 256)
    sched = hc.plan(t, spec, "ring", {"channels": 1})
    assert find_level_symmetry(sched, t) is None
    res = simulate(sched, t)
    assert res.shortcut is not None and "period 8" in res.shortcut
    assert res.time_us == pytest.approx(simulate(sched, t, mode="exact").time_us, rel=1e-9)


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_gather", "all_reduce", "all_to_all"])
def test_every_declared_symmetry_holds_on_a_tiered_fabric(kind: str) -> None:
    """On 3 levels (2 x 2 x 2 nodes, sprayed) every algorithm's declared period holds on every
    rank of its expanded schedule; hier and hier_tiers (level-relative node orders) also map
    onto themselves under every level shift, and the trusted fold times what exact does."""
    from hiercoll.planner import applicable
    from hiercoll.sim.symmetry import find_symmetry
    t = toy([{"name": "leaf", "group_size": 2, "uplinks": 2}, {"name": "spine", "group_size": 2, "uplinks": 2,
              "oversubscription": 2.0}, {"name": "agg"}], nodes=8, gpus=2, nics=2, inter={"routing": "spray"})
    spec = CollectiveSpec(kind=kind, world_size=16, dtype="bf16", nbytes=16 * 2 * 24)
    for algo in applicable(t, spec):
        for params in ({}, {"chunks": 2, "channels": 2}):
            s = hc.plan(t, spec, algo, params)
            if s.meta.symmetry_period:
                assert find_symmetry(s.expand(), t) is not None, (algo, params)
            if algo in ("hier", "hier_tiers"):
                assert find_level_symmetry(s.expand(), t) is not None, (algo, params)
            if s.meta.symmetry_period or algo == "hier":
                assert simulate(s, t, mode="trusted").time_us == pytest.approx(
                    simulate(s, t, mode="exact").time_us, rel=1e-9), (algo, params)


@pytest.mark.parametrize("algo", ["hier", "ring", "hier_tiers"])
def test_sprayed_bundles_time_what_every_port_on_its_own_does(algo: str) -> None:
    """A degraded link (here at full speed) makes spray list every uplink on its own, in equal
    shares; the bundles of the plain fabric must give the very same times."""
    tiers = [{"name": "leaf", "group_size": 2, "uplinks": 3, "rails": True, "oversubscription": 2.0},
             {"name": "spine", "group_size": 2, "uplinks": 2, "oversubscription": 1.5}, {"name": "agg"}]
    bundled = toy(tiers, nodes=8, gpus=2, nics=2, inter={"routing": "spray"})
    ports = toy(tiers, nodes=8, gpus=2, nics=2, inter={"routing": "spray"},
                degraded_links=[{"link": "nic_tx[7,1]", "factor": 1.0}])
    spec = CollectiveSpec(kind="all_reduce", world_size=16, dtype="bf16", nbytes=16 * 2 * 1000)
    a = simulate(hc.plan(bundled, spec, algo), bundled, mode="exact")
    b = simulate(hc.plan(ports, spec, algo), ports, mode="exact")
    assert a.time_us == pytest.approx(b.time_us, rel=1e-12)
    assert any(l.name.endswith(",*]") for l in a.links) and not any(l.name.endswith(",*]") for l in b.links)
