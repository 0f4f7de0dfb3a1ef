"""The timing model against hand-worked answers: closed forms, contention, max-min fairness."""

import pytest

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec
from hiercoll.schedule import ExpandedOps, Op, OpKind, Region, Schedule, ScheduleMeta, Transport
from hiercoll.sim import simulate
from hiercoll.sim.fluid import Flow, max_min_rates
from tests.helpers import small_topology


def test_ring_reduce_scatter_matches_alpha_beta():
    topo = small_topology(1, 4)                       # one flow per port at every step
    w, s = 4, 64 << 20
    spec = CollectiveSpec(kind="reduce_scatter", world_size=w, dtype="fp32", nbytes=s)
    res = simulate(hc.plan(topo, spec, "ring"), topo)
    bw = topo.intra.gbps * 1e3                        # bytes per us
    alpha = topo.costs.launch_us + topo.intra.latency_us
    hbm = topo.gpu.hbm_gbps * topo.costs.reduce_efficiency * 1e3
    final_reduce = topo.costs.launch_us + 3 * (s / w) / hbm   # local: read 2 pieces, write 1
    expected = (w - 1) * (alpha + s / (w * bw)) + final_reduce
    assert res.time_us == pytest.approx(expected, rel=0.005)


def _handmade(topo, flows: list[tuple[int, int, int]], count: int) -> Schedule:
    """One copy per (issuer, src, dst), each on its own channel, all at t=0."""
    w = topo.world_size
    ops = [[] for _ in range(w)]
    bufs = [{"input": count, "output": count, "scratch": count * w} for _ in range(w)]
    for ch, (issuer, src, dst) in enumerate(flows):
        ops[issuer].append(Op(issuer, len(ops[issuer]), ch, OpKind.COPY,
                              Region(dst, "scratch", src * count, count), (Region(src, "input", 0, count),),
                              (), Transport.INTRA))
    spec = CollectiveSpec(kind="all_reduce", world_size=w, dtype="fp32", nbytes=count * 4)
    meta = ScheduleMeta("handmade", {}, spec, topo.fingerprint())
    return Schedule(meta, ExpandedOps(tuple(map(tuple, ops)), tuple(bufs)))


def _transfer_times(topo, flows, count):
    res = simulate(_handmade(topo, flows, count), topo)
    fixed = topo.costs.launch_us + topo.intra.latency_us
    return [res.op_end[ref] - fixed for ref in sorted(res.op_end)], res


def test_n_minus_one_flows_out_of_one_port_take_n_minus_one_times_longer():
    topo = small_topology(1, 5)
    count = 1 << 22
    one, _ = _transfer_times(topo, [(0, 0, 1)], count)
    many, _ = _transfer_times(topo, [(0, 0, p) for p in range(1, 5)], count)
    assert all(t == pytest.approx(4 * one[0], rel=1e-6) for t in many)


def test_max_min_fair_share():
    """A: 0->1, B: 0->2, C: 3->2, D: 4->2. Port in[2] is shared three ways, so B, C, D get a
    third; A shares out[0] only with B and takes the rest: two thirds (not a half)."""
    topo = small_topology(1, 5)
    count = 1 << 22
    nbytes = count * 4
    bw = topo.intra.gbps * 1e3
    times, _ = _transfer_times(topo, [(0, 0, 1), (0, 0, 2), (3, 3, 2), (4, 4, 2)], count)
    a, b, c, d = times
    assert a == pytest.approx(nbytes / (bw * 2 / 3), rel=1e-6)
    assert b == c == pytest.approx(nbytes / (bw / 3), rel=1e-6)
    assert d == pytest.approx(b, rel=1e-9)


def test_weighted_progressive_filling():
    """A reduce reading two local sources uses HBM with weight 3 (2 reads + 1 write)."""
    f1 = Flow(((0, 3.0),), 1.0)
    f2 = Flow(((0, 1.0), (1, 1.0)), 1.0)
    rates = max_min_rates({f1, f2}, {0, 1}, [100.0, 10.0])
    assert rates[f2] == pytest.approx(10.0)             # bottlenecked on link 1
    assert rates[f1] == pytest.approx((100.0 - 10.0) / 3)


def test_inter_node_traffic_is_counted_once_per_transfer():
    topo = small_topology(2, 2)
    spec = CollectiveSpec(kind="all_gather", world_size=4, dtype="bf16", nbytes=4 * 2 * 1024)
    res = simulate(hc.plan(topo, spec, "direct"), topo)
    # every rank sends its 1024-element shard to the 2 ranks of the other node
    assert res.bytes_inter == 4 * 2 * 1024 * 2
    assert res.bytes_intra == 4 * 1 * 1024 * 2


def test_folded_simulation_equals_exact():
    topo = hc.load_topology("dgx-h100", 3)
    spec = CollectiveSpec(kind="all_reduce", world_size=24, dtype="bf16", nbytes=24 << 20)
    for algo in ("ring", "hier", "two_shot"):
        s = hc.plan(topo, spec, algo, {"chunks": 2})
        folded, exact = simulate(s, topo), simulate(s, topo, mode="exact")
        assert folded.shortcut and "period 8" in folded.shortcut and exact.shortcut is None
        assert folded.time_us == pytest.approx(exact.time_us, rel=1e-9)
        assert folded.bytes_inter == pytest.approx(exact.bytes_inter, rel=1e-9)


def test_uneven_shards_break_symmetry_and_fall_back_to_exact():
    topo = hc.load_topology("dgx-h100", 2)
    spec = CollectiveSpec(kind="reduce_scatter", world_size=16, dtype="bf16", nbytes=2 * 1001)
    res = simulate(hc.plan(topo, spec, "ring"), topo)
    assert res.shortcut is None and len(res.ranks_simulated) == 16


def test_lower_bound_reported_and_respected():
    topo = hc.load_topology("dgx-h100", 2)
    spec = CollectiveSpec(kind="reduce_scatter", world_size=16, dtype="bf16", nbytes=64 << 20)
    res = simulate(hc.plan(topo, spec, "hier"), topo)
    assert 0 < res.lower_bound_us <= res.time_us and 0 < res.bound_ratio <= 1
    assert res.critical_path and res.critical_path[-1].count(".") == 1


def test_flows_sharing_only_an_idle_link_keep_their_rates():
    """A: 0->1 alone on its ports; B1, B2: 2->0 share out[2] and in[0]. A and the Bs meet only on
    HBM of GPU 0, far from full, so A ending must not change the Bs (they keep their wake-up):
    A takes T, the Bs 2T."""
    topo = small_topology(1, 3)
    count = 1 << 22
    t_one = count * 4 / (topo.intra.gbps * 1e3)
    (a, b1, b2), _ = _transfer_times(topo, [(0, 0, 1), (2, 2, 0), (2, 2, 0)], count)
    assert a == pytest.approx(t_one, rel=1e-9)
    assert b1 == b2 == pytest.approx(2 * t_one, rel=1e-9)


def test_contention_free_bound_never_exceeds_the_simulation():
    """The auto-picker prunes with this bound, so it must stay below the simulated time, folded
    or not (an op alone sees real links: a folded HBM link's weight 2 must not halve its rate)."""
    from hiercoll.sim.bounds import contention_free_us
    topo = hc.load_topology("dgx-h100", 2)
    spec = CollectiveSpec(kind="all_reduce", world_size=16, dtype="bf16", nbytes=16 << 20)
    for algo in ("ring", "direct", "hier", "two_shot"):
        s = hc.plan(topo, spec, algo)
        assert contention_free_us(s, topo) <= simulate(s, topo).time_us * (1 + 1e-9), algo


@pytest.mark.parametrize("nodes,gpus", [(3, 4), (4, 2), (2, 4)])
def test_every_declared_symmetry_holds_on_every_rank(nodes, gpus):
    """The auto-picker trusts declarations (mode="trusted"); here each algorithm's claim is
    checked exhaustively on expanded schedules (power-of-two worlds: rd / rhd's xor claim)."""
    from hiercoll.planner import applicable
    from hiercoll.sim.symmetry import find_symmetry
    topo = small_topology(nodes, gpus)
    w = topo.world_size
    for kind in ("reduce_scatter", "all_gather", "all_reduce", "all_to_all"):
        spec = CollectiveSpec(kind=kind, world_size=w, dtype="bf16", nbytes=w * 2 * 24)
        for algo in applicable(topo, spec):
            for params in ({}, {"chunks": 2, "channels": 2}):
                s = hc.plan(topo, spec, algo, params)
                if s.meta.symmetry_period:
                    assert find_symmetry(s.expand(), topo) is not None, (kind, algo, params)
                    assert simulate(s, topo, mode="trusted").time_us == pytest.approx(
                        simulate(s, topo, mode="exact").time_us, rel=1e-9)


def test_recursive_halving_doubling_folds_by_xor_exactly():
    """rhd / rd pair rank r with r xor 2^t: xor by a multiple of a node maps the schedule and a
    one-switch fabric onto themselves, so one node's ranks are simulated, with the exact time;
    uneven shards and tiered fabrics are not folded (and the note says why)."""
    from hiercoll.sim.symmetry import find_symmetry
    topo = hc.load_topology("dgx-h100", 8)
    for algo, params in (("rhd", {}), ("rd", {}), ("rd", {"chunks": 2, "channels": 2}),
                         ("rhd", {"chunks": 4, "channels": 2}), ("rhd", {"chunks": 32, "channels": 4})):
        spec = CollectiveSpec(kind="all_reduce", world_size=64, dtype="bf16", nbytes=64 << 16)
        s = hc.plan(topo, spec, algo, params)
        assert s.meta.symmetry_group == "xor" and find_symmetry(s, topo) is not None
        folded, exact = simulate(s, topo), simulate(s, topo, mode="exact")
        assert len(folded.ranks_simulated) == 8 and folded.shortcut
        assert folded.time_us == pytest.approx(exact.time_us, rel=1e-9), (algo, params)
    uneven = CollectiveSpec(kind="all_reduce", world_size=64, dtype="bf16", nbytes=(64 * 1000 + 2) * 2)
    assert hc.plan(topo, uneven, "rhd").meta.symmetry_period is None
    # a chunk count that is not a power of two splits ranges in balanced pieces: not xor-symmetric
    spec = CollectiveSpec(kind="all_reduce", world_size=64, dtype="bf16", nbytes=64 << 16)
    assert hc.plan(topo, spec, "rhd", {"chunks": 3}).meta.symmetry_period is None
    tiered = hc.load_topology("h100-rail-3tier", 64)
    spec = CollectiveSpec(kind="all_reduce", world_size=512, dtype="bf16", nbytes=512 << 10)
    res = simulate(hc.plan(tiered, spec, "rhd"), tiered)
    assert not res.shortcut and len(res.ranks_simulated) == 512


def test_a_wrong_xor_claim_is_caught():
    """The check is not vacuous: a ring declared xor-symmetric is refused on every rank."""
    import dataclasses

    from hiercoll.sim.symmetry import find_symmetry
    topo = small_topology(4, 2)
    spec = CollectiveSpec(kind="all_reduce", world_size=8, dtype="bf16", nbytes=8 * 2 * 24)
    ring = hc.plan(topo, spec, "ring").expand()
    assert find_symmetry(ring, topo) is not None
    claimed = dataclasses.replace(ring, meta=dataclasses.replace(ring.meta, symmetry_group="xor"))
    assert find_symmetry(claimed, topo) is None
