"""Every algorithm on random topologies: simulates, checks clean, never beats the lower bound,
and the symmetry shortcut agrees with the exact simulation."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiercoll as hc
from hiercoll.collectives import Kind
from hiercoll.planner import applicable
from hiercoll.sim import check, simulate
from tests.helpers import small_topology
from tests.test_planner_flat import make_spec


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 4), gpus=st.integers(1, 4), fabric=st.sampled_from(["nvswitch", "mesh", "pcie"]),
       kind=st.sampled_from(list(Kind)), elems=st.integers(0, 4096), chunks=st.integers(1, 3),
       seed=st.integers(0, 10**6), data=st.data())
def test_random_schedules_simulate_within_bounds(nodes, gpus, fabric, kind, elems, chunks, seed, data):
    topo = small_topology(nodes, gpus, kind=fabric)
    spec = make_spec(kind, topo.world_size, elems, "bf16", seed)
    algo = data.draw(st.sampled_from(applicable(topo, spec)))
    s = hc.plan(topo, spec, algo, {"chunks": chunks})
    res = simulate(s, topo)
    assert res.time_us >= res.lower_bound_us * (1 - 1e-9)
    if res.shortcut:
        assert simulate(s, topo, mode="exact").time_us == pytest.approx(res.time_us, rel=1e-9)
    if elems <= 256:
        report = check(s.expand())
        assert report.ok, report.problems
