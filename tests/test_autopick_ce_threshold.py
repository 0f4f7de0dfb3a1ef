"""The auto-picker tunes the cuda backend's copy-engine threshold: the simulator's choice moves
with what each engine costs, the choice goes through tuning.json, and the cuda options take it."""

from __future__ import annotations

import random

import pytest
from helpers import ROOT

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.errors import HiercollError
from hiercoll.executor.cuda.lowering import COPY_ENGINE_OFF, CudaOptions
from hiercoll.executor.interface import BackendName
from hiercoll.harness.prepare import BackendChoice
from hiercoll.planner import plan
from hiercoll.planner.search.autopick import (
    CE_THRESHOLDS,
    SimCache,
    choose,
    pick_one,
    rows_to_table,
    tuned_executor,
    write_tuning,
)
from hiercoll.planner.search.library import shipped_table
from hiercoll.planner.search.select import plan_with
from hiercoll.sim import simulate
from hiercoll.topology import Topology, load_topology


def _topo(sm_gbps: float, ce_gbps: float) -> Topology:
    data = load_topology("h200x4", uncalibrated=True).model_dump()
    data["costs"].update(sm_op_gbps=sm_gbps, ce_op_gbps=ce_gbps, launch_us=2.0, ce_launch_us=4.0)
    return Topology.model_validate(data)


def _spec(nbytes: int) -> CollectiveSpec:
    return CollectiveSpec(kind=Kind.ALL_GATHER, world_size=4, dtype="bf16", nbytes=nbytes)


def test_the_threshold_follows_the_faster_engine():
    spec = _spec(random.choice([4, 8, 16]) << 20)          # peer copies of 1-4 MiB
    fast_ce = pick_one(_topo(40.0, 300.0), spec, SimCache(None), only=["direct"])
    assert fast_ce.executor["ce_threshold_bytes"] < spec.total_bytes // 4 <= 8 << 20
    slow_ce = pick_one(_topo(300.0, 40.0), spec, SimCache(None), only=["direct"])
    assert slow_ce.executor["ce_threshold_bytes"] > spec.total_bytes // 4
    # the row's time is the tuned one: faster than the plan at the default threshold
    topo = _topo(40.0, 300.0)
    at_default = simulate(plan(topo, spec, "direct"), topo).time_us
    assert fast_ce.time_us < at_default
    assert fast_ce.executor["ce_threshold_bytes"] in CE_THRESHOLDS


def test_uncapped_engines_keep_the_default_and_cost_no_simulation():
    topo = load_topology("h200x4", uncalibrated=True)
    row = pick_one(topo, _spec(16 << 20), SimCache(None), only=["direct", "ring"])
    assert row.executor == {"ce_threshold_bytes": 8 << 20}


def test_tuning_round_trip_into_cuda_options(tmp_path):
    topo = _topo(40.0, 300.0)
    template = _spec(8 << 20)
    sizes = [1 << 20, 8 << 20, 64 << 20]
    rows = [pick_one(topo, template.resized(n), SimCache(None), only=["direct"]) for n in sizes]
    path = tmp_path / "tuning.json"
    write_tuning(path, rows_to_table(topo, template, rows))
    for n, row in zip(sizes, rows, strict=True):
        spec = template.resized(n)
        assert choose(topo, spec, str(path)).executor == row.executor
        assert plan_with(topo, spec, "auto", tuning=str(path)).executor == row.executor
        knobs = tuned_executor(path, topo, spec)
        assert knobs == row.executor
        opts = CudaOptions(ctas=3).tuned(knobs)
        assert opts.ce_threshold_bytes == row.executor["ce_threshold_bytes"] and opts.ctas == 3
    other = load_topology("h200x4", uncalibrated=True)
    assert tuned_executor(path, other, template) == {}          # another topology: no entry


def test_backend_choice_takes_the_tuning_unless_a_flag_says_otherwise():
    knobs = {"ce_threshold_bytes": random.choice(CE_THRESHOLDS)}
    default = BackendChoice(BackendName.CUDA, {"ce_threshold_bytes": COPY_ENGINE_OFF, "ctas": None})
    assert default.with_tuning(knobs).cuda["ce_threshold_bytes"] == knobs["ce_threshold_bytes"]
    given = BackendChoice(BackendName.CUDA, {"ce_threshold_bytes": 12345})
    assert given.with_tuning(knobs).cuda["ce_threshold_bytes"] == 12345
    assert BackendChoice(BackendName.GLOO).with_tuning(knobs).cuda == {}
    with pytest.raises(HiercollError, match="ctas"):
        CudaOptions().tuned({"ctas": 4})
    with pytest.raises(HiercollError, match="integer"):
        CudaOptions().tuned({"ce_threshold_bytes": "8MiB"})


def test_a_measured_pick_runs_with_the_backends_own_knobs():
    """The measured tables' rows ran with the backend's defaults (no copy engine): a pick made
    from them carries no knob that would run it otherwise."""
    two = load_topology(str(ROOT / "bench/gpu/topologies/h200x2.yaml"), uncalibrated=True)
    row = pick_one(two, CollectiveSpec(kind=Kind.ALL_GATHER, world_size=2, dtype="bf16",
                                       nbytes=16 << 20), SimCache(None), library=shipped_table(two))
    assert row.measured and row.executor == {}
