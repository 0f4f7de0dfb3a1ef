"""A GPU's copy engines shared by concurrent copies (`costs.ce_concurrent_gbps`, issue 16 §2):
on 4x H200, one copy-engine put to one peer moved 380 GB/s, puts to three peers at once 199 GB/s
in all per GPU (shared/measurements/h200x4-baseline.json, `ce`); port limits alone predicted 379.
The simulator gives each GPU a copy-engine link that is unlimited for one copy and
`ce_concurrent_gbps` in all while two or more of its copies run."""

from __future__ import annotations

import pytest

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec
from hiercoll.sim import simulate
from hiercoll.topology import Topology
from tests.helpers import small_topology


def _with_costs(topo: Topology, **costs: object) -> Topology:
    return topo.model_copy(update={"costs": topo.costs.model_copy(update=costs)})


def _a2a_gbps_per_gpu(topo: Topology, copies_at_once: int, nbytes: int = 96 << 20) -> float:
    """Per-GPU rate of a direct all-to-all whose every peer transfer is split over
    `copies_at_once` channels (that many copy-engine copies of a GPU in flight together)."""
    spec = CollectiveSpec(kind="all_to_all", world_size=topo.world_size, dtype="bf16", nbytes=nbytes)
    plan = hc.plan(topo, spec, "direct", {"channels": copies_at_once, "chunks": copies_at_once})
    sent = nbytes * (topo.world_size - 1) / topo.world_size     # each GPU's bytes to its peers
    return sent / simulate(plan, topo).time_us / 1e3


def test_one_copy_at_a_time_is_not_limited_and_three_at_once_share_the_engines() -> None:
    base = _with_costs(small_topology(1, 4), launch_us=0.0, ce_threshold_bytes=1, ce_op_gbps=380.0)
    shared = _with_costs(base, ce_concurrent_gbps=100.0)
    # one copy at a time: the same time with or without the shared limit
    assert simulate(hc.plan(shared, CollectiveSpec(kind="all_to_all", world_size=4, dtype="bf16",
                                                   nbytes=96 << 20), "direct"), shared).time_us == \
        pytest.approx(simulate(hc.plan(base, CollectiveSpec(kind="all_to_all", world_size=4,
                                                            dtype="bf16", nbytes=96 << 20), "direct"),
                               base).time_us, rel=1e-12)
    assert _a2a_gbps_per_gpu(base, 3) > 150                      # ports and per-copy caps only
    assert _a2a_gbps_per_gpu(shared, 3) == pytest.approx(100.0, rel=0.05)   # the engines' total


def test_copies_below_the_threshold_run_on_sms_and_never_share_the_engines() -> None:
    base = _with_costs(small_topology(1, 4), launch_us=0.0, ce_threshold_bytes=1 << 40)
    assert _a2a_gbps_per_gpu(_with_costs(base, ce_concurrent_gbps=1.0), 3) == \
        pytest.approx(_a2a_gbps_per_gpu(base, 3), rel=1e-12)


@pytest.mark.parametrize("nodes", [1, 2])
def test_folded_equals_exact_with_shared_copy_engines(nodes: int) -> None:
    topo = _with_costs(small_topology(nodes, 4), ce_threshold_bytes=1, ce_concurrent_gbps=60.0,
                       ce_op_gbps=90.0)
    spec = CollectiveSpec(kind="all_gather", world_size=topo.world_size, dtype="bf16", nbytes=24 << 20)
    for algo, params in (("direct", {"channels": 3, "chunks": 3}), ("ring", {"channels": 2})):
        plan = hc.plan(topo, spec, algo, params)
        folded, exact = simulate(plan, topo, "auto"), simulate(plan, topo, "exact")
        assert folded.time_us == pytest.approx(exact.time_us, rel=1e-9), (algo, folded.notes)
        assert folded.time_us >= folded.lower_bound_us * (1 - 1e-9)


def test_h200x4_preset_predicts_the_measured_three_peer_puts() -> None:
    """The calibrated h200x4 preset with the measured value: three copy-engine copies at once
    per GPU move about 199 GB/s in all, where port limits alone gave 379."""
    topo = hc.load_topology("h200x4")
    assert topo.costs.ce_concurrent_gbps == pytest.approx(199.0)
    topo = _with_costs(topo, ce_threshold_bytes=1, launch_us=0.0, ce_launch_us=0.0)
    assert _a2a_gbps_per_gpu(topo, 3, nbytes=4 * (64 << 20)) == pytest.approx(199.0, rel=0.1)


def test_the_nccl_model_is_timed_without_copy_engines() -> None:
    """NCCL's kernels never use a copy engine: its model's time does not move with the copy
    engines' caps (calibration and auto-pick time it with sm_only)."""
    from hiercoll.calibration.measurements import Measurement
    from hiercoll.calibration.predict import build_case, predict_us
    from hiercoll.planner.library_model import library_model, sm_only
    base = _with_costs(small_topology(1, 4), ce_threshold_bytes=1)
    slow_ce = _with_costs(base, ce_op_gbps=1.0, ce_concurrent_gbps=1.0)
    spec = CollectiveSpec(kind="all_to_all", world_size=4, dtype="bf16", nbytes=64 << 20)
    sched = library_model(base, spec)
    sm = simulate(sched, base, costs_from=sm_only(base)).time_us
    assert simulate(sched, base, costs_from=sm_only(slow_ce)).time_us == pytest.approx(sm, rel=1e-12)
    assert simulate(sched, base, costs_from=slow_ce).time_us > 10 * sm      # on the engines: slow
    row = Measurement(source="x", tool="baseline", collective="all_to_all", algorithm="nccl",
                      world_size=4, dtype="bf16", nbytes=64 << 20, time_us=1.0, statistic="p50")
    assert predict_us(build_case(row, base), slow_ce, base) == pytest.approx(sm, rel=1e-12)


def test_shared_copy_engines_alone_make_the_threshold_worth_tuning() -> None:
    """ce_concurrent_gbps is the only engine difference: the tuner must still see one."""
    base = small_topology(1, 4)
    assert not base.costs.engines_differ()
    assert _with_costs(base, ce_concurrent_gbps=100.0).costs.engines_differ()
