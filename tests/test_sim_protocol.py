"""The simulator times a call by the protocol the cuda backend runs it with (ll_protocol):
simple calls pay their barriers, LL calls none but twice their bytes on the wire, and an LL call
whose receivers unpack pushes pays that pass. Calibration reads the protocol off a bench row's
lowering knobs with the backend's own rule."""

from __future__ import annotations

import pytest

import hiercoll as hc
from hiercoll.calibration.measurement import Measurement
from hiercoll.calibration.predict import build_case, protocol_of
from hiercoll.ll_protocol import SIMPLE, WIRE_FACTOR, CallProtocol, call_protocol
from tests.helpers import ROOT

TOPO = str(ROOT / "bench/gpu/topologies/h200x2.yaml")
KNOBS = {"protocol": "auto", "fuse": True, "launch_per_op": False, "forward": True,
         "ll_threshold_bytes": 262144, "ce_threshold_bytes": 1 << 40, "inter_transport": "peer"}


def _costed(**costs: float) -> hc.Topology:
    topo = hc.load_topology(TOPO)
    return hc.Topology.model_validate(topo.model_dump() | {"costs": topo.costs.model_dump() | costs})


def _plan(topo: hc.Topology, kind: str, nbytes: int, algorithm: str = "direct") -> hc.Schedule:
    return hc.plan(topo, hc.CollectiveSpec(kind=kind, world_size=2, dtype="bf16", nbytes=nbytes),
                   algorithm)


def test_a_simple_call_pays_its_barriers_and_an_ll_call_does_not() -> None:
    topo = _costed(sync_us=3.25, ll_unpack_us=0.0)
    s = _plan(topo, "reduce_scatter", 1 << 20)
    base = hc.simulate(s, topo, call_mode="graph").time_us
    assert hc.simulate(s, topo, call_mode="graph", protocol=SIMPLE).time_us == pytest.approx(base + 3.25)
    ll = hc.simulate(s, topo, call_mode="graph", protocol=CallProtocol(ll=True)).time_us
    assert ll > base            # twice the bytes on the wire, no barrier


def test_barrier_rows_of_their_own_cost_a_row_start_each_in_simple_calls_only() -> None:
    """A fused kernel whose first or last level splits the grid walks its start wait / end
    arrival as rows of their own (`row_merge.barrier_rows`): each costs `barrier_row_us` on top of
    the call's barriers; an LL call has no barriers to walk."""
    topo = _costed(sync_us=3.25, barrier_row_us=0.75)
    s = _plan(topo, "all_to_all", 1 << 20)
    simple = hc.simulate(s, topo, call_mode="graph", protocol=SIMPLE).time_us
    two = hc.simulate(s, topo, call_mode="graph",
                      protocol=SIMPLE.with_barrier_rows(2)).time_us
    assert two == pytest.approx(simple + 2 * 0.75)
    assert CallProtocol(ll=True).with_barrier_rows(2).barrier_rows == 0
    m = Measurement(source="x#0", tool="hiercoll-bench", collective="all_to_all",
                    nbytes=1 << 20, world_size=2, dtype="bf16", algorithm="direct",
                    params={"channels": 1, "chunks": 1}, time_us=11.0, mode="graph",
                    statistic="p50", lowering=dict(KNOBS, protocol="simple", single_stream=True,
                                                   split_channels=True, max_ctas=132))
    assert build_case(m, topo).protocol == SIMPLE.with_barrier_rows(2)
    unfused = Measurement(**(m.model_dump() | {"lowering": dict(m.lowering, fuse=False)}))
    assert build_case(unfused, topo).protocol == SIMPLE
    # the knob's default (off): the lowering still makes this all-SM plan one kernel
    default = Measurement(**(m.model_dump() | {"lowering": dict(m.lowering,
                                                                single_stream=False)}))
    assert build_case(default, topo).protocol == SIMPLE.with_barrier_rows(2)


def test_ll_puts_twice_the_bytes_on_the_wire_and_unpacking_costs_its_pass() -> None:
    topo = _costed(ll_unpack_us=1.5)
    s = _plan(topo, "all_gather", 1 << 16)
    plain = hc.simulate(s, topo, call_mode="graph")
    ll = hc.simulate(s, topo, call_mode="graph", protocol=CallProtocol(ll=True))
    unpack = hc.simulate(s, topo, call_mode="graph", protocol=CallProtocol(ll=True, unpacks=True))
    wire = {l.name: l.bytes for l in plain.links if l.tier == "intra" and l.bytes}
    assert wire
    for l in ll.links:
        if l.name in wire:
            assert l.bytes == pytest.approx(WIRE_FACTOR * wire[l.name])
    assert unpack.time_us == pytest.approx(ll.time_us + 1.5)


@pytest.mark.parametrize(("kind", "nbytes", "algorithm", "knobs", "want"), [
    ("all_gather", 8192, "direct", {}, CallProtocol(ll=True, unpacks=True)),
    ("reduce_scatter", 8192, "direct", {}, CallProtocol(ll=True, unpacks=False)),
    ("all_gather", 1 << 20, "direct", {}, SIMPLE),              # past the LL threshold
    ("all_gather", 8192, "direct", {"protocol": "simple"}, SIMPLE),
    ("all_gather", 8192, "direct", {"fuse": False}, SIMPLE),     # auto + no fuse: multi-launch
    ("all_gather", 8192, "direct", {"ll_threshold_bytes": 0}, SIMPLE),
    ("all_gather", 1 << 20, "direct", {"protocol": "ll"}, CallProtocol(ll=True, unpacks=True)),
])
def test_the_row_knobs_give_the_backends_protocol(kind: str, nbytes: int, algorithm: str,
                                                  knobs: dict, want: CallProtocol) -> None:
    topo = hc.load_topology(TOPO)
    s = _plan(topo, kind, nbytes, algorithm)
    assert protocol_of(s, topo, KNOBS | knobs) == want


def test_a_row_without_a_protocol_knob_is_timed_without_one_and_an_ll_row_as_planned() -> None:
    topo = hc.load_topology(TOPO)
    s = _plan(topo, "all_gather", 8192)
    assert protocol_of(s, topo, {}) is None
    row = dict(source="x#0", tool="hiercoll-bench", collective="all_gather", algorithm="direct",
               world_size=2, dtype="bf16", nbytes=8192, mode="graph", time_us=6.0, statistic="p50")
    assert build_case(Measurement(**row), topo).protocol is None
    case = build_case(Measurement(**row, lowering=KNOBS), topo)
    assert case.protocol == CallProtocol(ll=True, unpacks=True)
    # LL runs the plan as written (pushes), not the forwarded one the simple lowering runs
    assert case.planned is not None and call_protocol(case.planned, 1 << 20).ll


def test_costs_fitted_without_protocol_terms_time_rows_as_before() -> None:
    """The protocol terms apply only with costs fitted with them: h200x4's shipped costs (fitted
    on NCCL) priced an LL row's doubled wire bytes against no barrier cost, and the regret of
    its picks on the committed 4-GPU runs went from 1.005 to 1.588."""
    from hiercoll.calibration.predict import predict_us
    topo = hc.load_topology(TOPO)
    row = dict(source="x#0", tool="hiercoll-bench", collective="all_gather", algorithm="direct",
               world_size=2, dtype="bf16", nbytes=65536, mode="graph", time_us=6.0,
               statistic="p50", lowering=KNOBS)
    case = build_case(Measurement(**row), topo)
    assert case.protocol == CallProtocol(ll=True, unpacks=True) and not topo.costs.prices_protocols()
    plain = hc.simulate(case.schedule, topo, call_mode="graph").time_us
    assert predict_us(case, topo, topo) == pytest.approx(plain)
    priced = _costed(sync_us=2.0, ll_unpack_us=1.5)
    assert priced.costs.prices_protocols()
    want = hc.simulate(case.planned, topo, costs_from=priced, call_mode="graph",
                       protocol=case.protocol).time_us
    assert predict_us(case, priced, topo) == pytest.approx(want)
    assert abs(want - plain) > 0.1


def test_the_new_cost_terms_leave_fingerprints_alone() -> None:
    """Rows carry their topology's fingerprint: terms added at their defaults must hash as
    before, or every committed bench row would stop matching its topology."""
    topo = hc.load_topology(TOPO)
    moved = _costed(sync_us=0.0, ll_unpack_us=0.0)
    assert moved.fingerprint() == topo.fingerprint()
    assert _costed(sync_us=1.0).fingerprint() != topo.fingerprint()


def test_the_auto_picker_times_plans_by_the_protocol_where_the_topology_prices_it() -> None:
    """h200x2 ships costs fitted on our executor (sync_us, ll_unpack_us): the auto-picker times
    a candidate as the cuda backend runs it at its default knobs. Topologies without those
    terms are timed as before (no protocol, no walk over a large plan's ops)."""
    from hiercoll.planner.search.autopick import (
        SimCache,
        backend_protocol,
        backend_schedule,
        simulate_candidate,
    )
    from hiercoll.planner.search.candidates import Candidate
    topo = hc.load_topology("h200x2")
    assert topo.costs.sync_us > 0
    for nbytes, want_ll in ((8192, True), (64 << 20, False)):
        spec = hc.CollectiveSpec(kind="all_reduce", world_size=2, dtype="bf16", nbytes=nbytes)
        s = hc.plan(topo, spec, "direct")
        proto = backend_protocol(topo, s)
        assert proto is not None and proto.ll == want_ll
        got = simulate_candidate(topo, spec, Candidate("direct", {}), SimCache(None), s,
                                 call_mode="graph")
        ran = s if proto.ll else backend_schedule(topo, s, proto).schedule   # simple: as timed
        assert got.time_us == pytest.approx(
            hc.simulate(ran, topo, call_mode="graph", protocol=proto).time_us)
    # a simple-protocol call is timed with its copies forwarded, as the lowering runs it (and as
    # `autopick --validate` prices bench rows): two_shot's pushes into scratch become pulls
    from hiercoll.sim.forwarding import as_lowered
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=2, dtype="bf16", nbytes=64 << 20)
    s = hc.plan(topo, spec, "two_shot")
    proto = backend_protocol(topo, s)
    fwd = as_lowered(s, topo.costs.ce_threshold_bytes, inter_peer=True)
    assert proto is not None and not proto.ll and fwd is not s
    want = hc.simulate(fwd, topo, call_mode="graph", protocol=proto).time_us
    assert want != pytest.approx(hc.simulate(s, topo, call_mode="graph", protocol=proto).time_us)
    got = simulate_candidate(topo, spec, Candidate("two_shot", {}), SimCache(None), s,
                             call_mode="graph")
    assert got.time_us == pytest.approx(want)
    ag = hc.plan(topo, hc.CollectiveSpec(kind="all_gather", world_size=2, dtype="bf16",
                                         nbytes=8192), "direct")
    assert backend_protocol(topo, ag).ll          # each rank unpacks from its one peer: LL
    plain = hc.load_topology("dgx-h100", 1)
    spec = hc.CollectiveSpec(kind="all_gather", world_size=8, dtype="bf16", nbytes=8192)
    assert backend_protocol(plain, hc.plan(plain, spec, "direct")) is None


def test_nccls_model_takes_the_faster_of_its_protocols_once_fitted_with_them() -> None:
    """costs.library.sync_us set: NCCL's model times its ring as Simple (that cost on top) and
    as LL (twice the bytes on the wire) and takes the faster, as NCCL's tuner picks a protocol
    by size; unset, one protocol as before (h200x4's shipped costs)."""
    from hiercoll.calibration.predict import predict_us
    from hiercoll.planner.library_model import library_protocols, sm_only
    topo = hc.load_topology(TOPO)
    assert library_protocols(topo) == (None,)
    lib = hc.Topology.model_validate(topo.model_dump() | {"costs": topo.costs.model_dump() | {
        "library": topo.costs.library.model_dump() | {"sync_us": 10.0}}})
    assert library_protocols(lib) == (SIMPLE, CallProtocol(ll=True))
    for nbytes, want_ll in ((8192, True), (256 << 20, False)):
        row = dict(source="x#0", tool="hiercoll-bench", collective="all_gather", algorithm="nccl",
                   world_size=2, dtype="bf16", nbytes=nbytes, mode="graph", time_us=6.0,
                   statistic="p50")
        case = build_case(Measurement(**row), topo)
        timed = sm_only(lib)
        simple, ll = (hc.simulate(case.schedule, topo, costs_from=timed, call_mode="graph",
                                  protocol=p).time_us for p in (SIMPLE, CallProtocol(ll=True)))
        assert (ll < simple) == want_ll
        assert predict_us(case, lib, topo) == pytest.approx(min(simple, ll))
    assert lib.fingerprint() != topo.fingerprint()


def test_a_row_with_a_protocol_the_backend_does_not_run_is_refused_in_one_line() -> None:
    """An unknown protocol used to be timed as LL (anything but auto and simple was)."""
    from hiercoll.errors import HiercollError
    from hiercoll.executor.cuda.lowering import Protocol
    from hiercoll.ll_protocol import PROTOCOLS
    assert PROTOCOLS == tuple(p.value for p in Protocol)
    topo = hc.load_topology(TOPO)
    s = _plan(topo, "all_gather", 8192)
    with pytest.raises(HiercollError, match=r"lowering.protocol: 'fast' is not one"):
        protocol_of(s, topo, KNOBS | {"protocol": "fast"})


def test_an_ll_calls_ops_start_after_their_own_cost_and_its_pushes_go_side_by_side() -> None:
    """LL rows wait for no reply and no barrier: their per-op cost is `ll_launch_us` where
    fitted (simple calls keep `launch_us`), and the pushes a plan orders on one channel
    (`direct`'s swizzle) leave together (`as_timed_ll`): 4 x H200, direct all_reduce 8 KiB,
    timed one after another 22.6 us against 6.7 measured."""
    from hiercoll.sim.forwarding import as_timed_ll
    ll = CallProtocol(ll=True)
    base = _costed(sync_us=1.0, ll_unpack_us=0.5)
    s = _plan(base, "all_reduce", 8192)
    t = hc.simulate(s, base, call_mode="graph", protocol=ll).time_us
    same = _costed(sync_us=1.0, ll_unpack_us=0.5, ll_launch_us=base.costs.launch_us)
    assert hc.simulate(s, base, costs_from=same, call_mode="graph",
                       protocol=ll).time_us == pytest.approx(t)
    cheap = _costed(sync_us=1.0, ll_unpack_us=0.5, ll_launch_us=0.1)
    assert cheap.costs.prices_protocols()
    assert hc.simulate(s, base, costs_from=cheap, call_mode="graph",
                       protocol=ll).time_us < t - 1.0
    assert hc.simulate(s, base, costs_from=cheap, call_mode="graph",
                       protocol=SIMPLE).time_us == pytest.approx(
        hc.simulate(s, base, call_mode="graph", protocol=SIMPLE).time_us)
    four = hc.load_topology("h200x4")
    s4 = hc.plan(four, hc.CollectiveSpec(kind="all_reduce", world_size=4, dtype="bf16",
                                         nbytes=8192), "direct")
    split = as_timed_ll(s4)
    assert len({op.channel for op in split.rank_ops(0)}) > len({op.channel for op in s4.rank_ops(0)})
    assert (hc.simulate(split, four, call_mode="graph", protocol=ll).time_us
            < hc.simulate(s4, four, call_mode="graph", protocol=ll).time_us)
