"""Calibration: measurements in (nccl-tests logs, bench JSON), a fit that recovers known costs,
reports, the calibrated file, and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import hiercoll as hc
from hiercoll.calibration.fit import fit, geomean_error, split_holdout
from hiercoll.calibration.measurements import Measurement, load_measurements
from hiercoll.calibration.nccl_tests import parse_nccl_tests
from hiercoll.calibration.params import with_values
from hiercoll.calibration.predict import build_case, predict_us
from hiercoll.collectives import Kind
from hiercoll.errors import HiercollError
from hiercoll.planner import plan
from tests.helpers import run_cli as _hc

DATA = Path(__file__).parent / "data" / "nccl_tests"


# ---- nccl-tests logs ------------------------------------------------------------------------
def test_all_reduce_log_gives_out_of_place_and_in_place_rows() -> None:
    rows = load_measurements([DATA / "all_reduce_perf.log"])
    assert len(rows) == 8                        # 4 sizes x (out-of-place, in-place)
    assert {r.collective for r in rows} == {Kind.ALL_REDUCE}
    assert {r.world_size for r in rows} == {8} and {r.num_nodes for r in rows} == {1}
    first = [r for r in rows if r.nbytes == 8192]
    assert [r.in_place for r in first] == [False, True]
    assert first[0].time_us == pytest.approx(20 + 8192 / 150e3, abs=0.01)
    assert all(r.dtype.value == "bf16" and r.algorithm == "nccl" and r.statistic == "mean"
               for r in rows)
    assert rows[0].source.endswith("all_reduce_perf.log:16") and rows[0].iters == 20


def test_two_node_graph_all_gather_log() -> None:
    rows = load_measurements([DATA / "all_gather_perf.2node.log"])
    assert {r.world_size for r in rows} == {16} and {r.num_nodes for r in rows} == {2}
    assert {r.mode for r in rows} == {"graph"} and {r.collective for r in rows} == {Kind.ALL_GATHER}
    assert {r.dtype.value for r in rows} == {"fp32"} and rows[0].iters == 50


def test_alltoall_with_only_out_of_place_columns_and_no_validation() -> None:
    rows = load_measurements([DATA / "alltoall_perf.log"])
    assert len(rows) == 2 and not any(r.in_place for r in rows)
    assert {r.wrong for r in rows} == {0}


def test_a_point_measured_several_times_is_one_row_at_its_median() -> None:
    """Three runs of one log (times x1, x1.1, x3): one row per point, at the middle run's time,
    in the first run's order; in-place and out-of-place stay apart."""
    from hiercoll.calibration.measurements import merge_repeats
    once = load_measurements([DATA / "all_reduce_perf.log"])
    runs = [r.model_copy(update={"time_us": r.time_us * f, "source": f"run{k}"})
            for k, f in enumerate((1.0, 3.0, 1.1)) for r in once]
    merged = merge_repeats(runs)
    assert len(merged) == len(once) == 8
    for m, o in zip(merged, once, strict=True):
        assert (m.nbytes, m.in_place) == (o.nbytes, o.in_place)
        assert m.time_us == pytest.approx(o.time_us * 1.1)
        assert m.source == "run0 (median of 3 repeats)" and m.iters == 3 * o.iters
    assert merge_repeats(once) == once                # nothing repeated: unchanged


def test_a_wrong_row_is_refused_unless_allowed_and_then_flagged() -> None:
    with pytest.raises(HiercollError, match=r"reduce_scatter_perf.wrong.log:\d+: 12 wrong"):
        load_measurements([DATA / "reduce_scatter_perf.wrong.log"])
    rows = load_measurements([DATA / "reduce_scatter_perf.wrong.log"], allow_wrong=True)
    assert [r.wrong for r in rows] == [0, 0, 0, 12]


def test_concatenated_runs_take_their_own_headers_and_need_a_collective() -> None:
    with pytest.raises(HiercollError, match="cannot tell which collective"):
        load_measurements([DATA / "concatenated.log"])
    rows = load_measurements([DATA / "concatenated.log"], collective=Kind.ALL_REDUCE)
    assert [r.mode for r in rows] == ["eager", "eager", "graph", "graph"]
    assert [r.world_size for r in rows] == [8] * 4


def test_bad_logs_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(HiercollError, match="type 'int32'"):
        load_measurements([DATA / "int32_all_reduce_perf.log"])
    empty = tmp_path / "all_reduce_perf.log"
    empty.write_text("")
    with pytest.raises(HiercollError, match="empty file"):
        load_measurements([empty])
    junk = tmp_path / "all_reduce_perf.txt"
    junk.write_text("hello\nworld\n")
    with pytest.raises(HiercollError, match="no nccl-tests result table"):
        load_measurements([junk])
    with pytest.raises(HiercollError, match="lost its header"):
        parse_nccl_tests("#  size  count  type  redop  root  time  algbw  busbw #wrong\n"
                         " 8 2 float sum -1 1.0 0 0 0\n", "all_reduce_perf.log")


def test_bench_json_rows_old_and_new(tmp_path: Path) -> None:
    topo = hc.load_topology("h200x4")
    new = {"collective": "all_reduce", "algorithm": "ring", "backend": "cuda", "mode": "graph",
           "world_size": 4, "topology": "h200x4", "dtype": "bf16", "nbytes": 1 << 20,
           "p50_us": 50.0, "p90_us": 55.0, "p99_us": 60.0, "iters": 100,
           "params": {"chunks": 2, "channels": 1}, "topology_fingerprint": topo.fingerprint(),
           "one_gpu": False}
    old = {k: v for k, v in new.items() if k not in ("params", "topology_fingerprint", "one_gpu")}
    lib = new | {"algorithm": "nccl", "backend": "nccl", "params": {}}
    path = tmp_path / "all_reduce-w4.json"
    path.write_text(json.dumps({"rows": [new, old, lib]}))
    rows = load_measurements([path])
    assert rows[0].params == {"chunks": 2, "channels": 1} and rows[1].params == {}
    assert rows[2].algorithm == "nccl" and rows[0].statistic == "p50"
    assert rows[0].time_us == 50.0 and rows[0].p99_us == 60.0 and rows[0].mode == "graph"


# ---- the model -----------------------------------------------------------------------------
def test_default_costs_leave_fingerprints_and_times_as_they_were() -> None:
    topo = hc.load_topology("dgx-h100", 2)
    assert topo.fingerprint() == "c25e9aee9dd329a3"      # what f34ae23 (before the cost terms) gave
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=16, dtype="bf16", nbytes=1 << 20)
    s = plan(topo, spec, "ring")
    assert hc.simulate(s, topo, call_mode="eager").time_us == hc.simulate(
        s, topo, call_mode="graph").time_us


def test_eager_calls_take_the_longer_of_host_and_device_and_graph_calls_add() -> None:
    base = hc.load_topology("h200x4", uncalibrated=True)
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=4, dtype="bf16", nbytes=8192)
    s = plan(base, spec, "ring")
    device = hc.simulate(s, base).time_us
    slow_host = with_values(base, {"costs.eager.call_us": 10 * device,
                                   "costs.graph.call_us": 7.0})
    assert hc.simulate(s, base, costs_from=slow_host).time_us == pytest.approx(10 * device)
    assert hc.simulate(s, base, costs_from=slow_host, call_mode="graph").time_us == \
        pytest.approx(device + 7.0)
    big = plan(base, hc.CollectiveSpec(kind="all_reduce", world_size=4, dtype="bf16",
                                       nbytes=256 << 20), "ring")
    assert hc.simulate(big, base, costs_from=slow_host).time_us == \
        pytest.approx(hc.simulate(big, base).time_us)         # device-bound: the host hides


def test_shared_gpu_topology_shares_one_hbm_and_never_folds() -> None:
    topo = hc.load_topology("one-gpu-h200x4", uncalibrated=True)
    topo = with_values(topo, {"costs.reduce_efficiency": 0.05})     # make HBM the bottleneck
    spec = hc.CollectiveSpec(kind="all_gather", world_size=4, dtype="bf16", nbytes=64 << 20)
    shared = hc.simulate(plan(topo, spec, "direct"), topo)
    apart = topo.model_copy(update={"shared_gpu": False})
    alone = hc.simulate(plan(apart, spec, "direct"), apart)
    assert shared.shortcut is None
    assert shared.time_us > 3 * alone.time_us      # four ranks' traffic through one HBM


def test_costs_from_refuses_another_shape() -> None:
    a, b = hc.load_topology("h200x4"), hc.load_topology("dgx-h100", 1)
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=4, dtype="bf16", nbytes=8192)
    with pytest.raises(HiercollError, match="another shape"):
        hc.simulate(plan(a, spec, "ring"), a, costs_from=b)


def _synthetic(base: hc.Topology, truth: dict[str, float], seed: int = 7) -> list:
    """Rows timed by the simulator itself with known costs, with 1% multiplicative noise."""
    true_topo = with_values(base, truth)
    rng = np.random.default_rng(seed)
    plans = {"all_reduce": [("ring", {}), ("ring", {"chunks": 4, "channels": 2}), ("direct", {}),
                            ("two_shot", {})],
             "reduce_scatter": [("ring", {}), ("direct", {})],
             "all_gather": [("ring", {}), ("ring", {"chunks": 4})]}
    cases = []
    for kind, algos in plans.items():
        for algo, params in algos:
            for n in (8 << 10, 64 << 10, 512 << 10, 4 << 20, 32 << 20, 256 << 20):
                m = Measurement(source=f"synthetic#{len(cases)}", tool="hiercoll-bench",
                                collective=kind, algorithm=algo, params=params, world_size=4,
                                dtype="bf16", nbytes=n, time_us=1.0, statistic="p50",
                                mode="graph")
                t = predict_us(build_case(m, base), true_topo, base)
                m = m.model_copy(update={"time_us": t * float(np.exp(rng.normal(0, 0.01)))})
                cases.append(build_case(m, base))
    return cases


def test_calibrate_recovers_known_costs_and_names_what_it_cannot_see() -> None:
    base = with_values(hc.load_topology("h200x4"), {"costs.ce_threshold_bytes": 1 << 40})
    truth = {"costs.graph.call_us": 15.0, "costs.launch_us": 3.0, "costs.intra_efficiency": 0.7}
    cases = _synthetic(base, truth)
    # no copy reaches the copy-engine threshold: the CE cap is invisible; eager rows: none
    result = fit(cases, base, holdout=0.0,
                 only=[*truth, "costs.ce_op_gbps", "costs.eager.call_us"])
    for path, value in truth.items():
        assert result.fitted[path] == pytest.approx(value, rel=0.02), path
    assert "costs.ce_op_gbps" in result.unconstrained
    assert "costs.eager.call_us" in result.unconstrained
    assert geomean_error(result.ratios()) < 0.02


def test_holdout_keeps_each_plans_smallest_size_in_the_fit() -> None:
    base = hc.load_topology("h200x4")
    cases = _synthetic(base, {"costs.graph.call_us": 10.0})
    held = split_holdout(cases, 0.3)
    assert 0.25 < sum(held) / len(held) < 0.4
    smallest = [i for i, c in enumerate(cases) if c.measurement.nbytes == 8 << 10]
    assert not any(held[i] for i in smallest)


# ---- the CLI -------------------------------------------------------------------------------
def _bench_file(path: Path, cases: list) -> Path:
    rows = [{"collective": c.measurement.collective.value, "algorithm": c.measurement.algorithm,
             "backend": "cuda", "mode": c.measurement.mode, "world_size": 4,
             "topology": "h200x4", "dtype": "bf16", "nbytes": c.measurement.nbytes,
             "p50_us": c.measurement.time_us, "p90_us": c.measurement.time_us,
             "p99_us": c.measurement.time_us, "iters": 20, "params": c.measurement.params,
             "topology_fingerprint": c.schedule.meta.topology_fingerprint}
            for c in cases]
    path.write_text(json.dumps({"rows": rows}))
    return path


def test_calibrate_cli_writes_a_topology_that_loads_and_compare_reads_it(tmp_path: Path) -> None:
    base = hc.load_topology("h200x4")
    cases = [c for c in _synthetic(base, {"costs.graph.call_us": 20.0, "costs.launch_us": 4.0})
             if c.measurement.algorithm != "ring" or not c.measurement.params]
    meas = _bench_file(tmp_path / "all_reduce-w4.json", cases)
    out = tmp_path / "cal.yaml"
    proc = _hc("calibrate", str(meas), "-t", "h200x4", "-o", str(out), "--json",
               "--md", str(tmp_path / "r.md"), "--png", str(tmp_path / "r.png"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert {"params", "fit_geomean_error", "holdout_geomean_error", "worst_error",
            "rows"} <= set(report)
    assert report["rows"] == len(cases) and report["holdout_geomean_error"] < 0.05
    topo = hc.load_topology(str(out))
    assert topo.calibration is not None and topo.calibration.rows == len(cases)
    assert topo.shape_fingerprint() == base.shape_fingerprint()
    # 10 %: the copy-engine ops' own start (costs.ce_launch_us) trades with the per-call cost
    # where every large row has the same copy-engine ops on its critical path
    assert topo.costs.graph.call_us == pytest.approx(20.0, rel=0.1)
    assert (tmp_path / "r.png").stat().st_size > 1000 and "held out" in (tmp_path / "r.md").read_text()
    cmp = _hc("compare", str(meas), "-t", str(out), "--json")
    assert cmp.returncode == 0, cmp.stderr
    body = json.loads(cmp.stdout)
    assert body["calibration"].startswith("calibrated") and len(body["rows"]) == len(cases)
    assert body["summary"]["all"]["geomean_error"] < 0.05
    defaults = tmp_path / "defaults.json"
    defaults.write_text(hc.load_topology("h200x4", uncalibrated=True).model_dump_json())
    plain = _hc("compare", str(meas), "-t", str(defaults))
    assert plain.returncode == 0 and "defaults, uncalibrated" in plain.stdout


def test_the_h200x4_preset_ships_calibrated_with_its_provenance() -> None:
    cal, raw = hc.load_topology("h200x4"), hc.load_topology("h200x4", uncalibrated=True)
    assert cal.calibration is not None and raw.calibration is None
    assert cal.calibration.sources and cal.calibration.holdout_geomean_error < 0.10
    assert cal.costs.eager.call_us > 10 and raw.costs.eager.call_us == 0.0
    assert cal.shape_fingerprint() == raw.shape_fingerprint() != cal.fingerprint()
    assert cal.calibration_label().startswith("calibrated 2026")


def test_fixed_parameters_keep_their_values_and_the_rest_still_fit() -> None:
    """--fix: a parameter the rows would bend to stand in for another stays where it is."""
    base = with_values(hc.load_topology("h200x4"), {"costs.ce_threshold_bytes": 1 << 40,
                                                    "costs.graph.call_us": 5.0})
    truth = {"costs.graph.call_us": 15.0, "costs.launch_us": base.costs.launch_us}
    cases = _synthetic(base, truth)
    result = fit(cases, base, holdout=0.0, only=[*truth], fixed=["costs.launch_us"])
    assert "costs.launch_us" not in result.fitted and "costs.launch_us" not in result.unconstrained
    assert result.topology.costs.launch_us == base.costs.launch_us
    assert result.fitted["costs.graph.call_us"] == pytest.approx(15.0, rel=0.02)


@pytest.mark.parametrize("case", ["empty", "unknown_collective", "world", "shape", "wrong",
                                  "one_gpu", "holdout", "fix"])
def test_bad_calibration_input_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    good = {"collective": "all_reduce", "algorithm": "ring", "backend": "cuda", "mode": "eager",
            "world_size": 4, "topology": "h200x4", "dtype": "bf16", "nbytes": 8192,
            "p50_us": 50.0, "p90_us": 55.0, "p99_us": 60.0, "iters": 10,
            "topology_fingerprint": hc.load_topology("h200x4").fingerprint()}
    path, topo, extra = tmp_path / "m.json", "h200x4", []
    if case == "empty":
        path.write_text("")
    elif case == "unknown_collective":
        path.write_text(json.dumps({"rows": [good | {"collective": "all_scream"}]}))
    elif case == "world":
        path.write_text(json.dumps({"rows": [good]}))
        topo = "dgx-h100"
    elif case == "shape":
        two_nodes = Path(__file__).parents[1] / "bench/gpu/topologies/h200-2node-x2.yaml"
        other = hc.load_topology(str(two_nodes))       # 2 nodes x 2 GPUs: also 4 ranks
        path.write_text(json.dumps({"rows": [good | {"topology": str(two_nodes),
                                                      "topology_fingerprint": other.fingerprint()}]}))
    elif case == "wrong":
        path = DATA / "reduce_scatter_perf.wrong.log"
        topo = "dgx-h100"
        extra = ["--nodes", "1"]
    elif case == "one_gpu":
        path.write_text(json.dumps({"rows": [good | {"one_gpu": True}]}))
    elif case == "fix":
        path.write_text(json.dumps({"rows": [good]}))
        extra = ["--fix", "costs.launch_us,costs.nope"]
    else:
        path.write_text(json.dumps({"rows": [good]}))
        extra = ["--holdout", "1.5"]
    proc = _hc("calibrate", str(path), "-t", topo, *extra)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "Traceback" not in proc.stderr


# ---- timeline overlay ----------------------------------------------------------------------
def _fake_timeline(path: Path, slow_op: str) -> tuple[Path, hc.Topology]:
    """A `run --profile` document whose launches are the simulated ops themselves (one op per
    launch), with one op made 3x slower: the overlay must name it first."""
    topo = hc.load_topology("h200x4")
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=4, dtype="bf16", nbytes=1 << 20)
    s = plan(topo, spec, "ring")
    res = hc.simulate(s, topo, mode="exact")
    launches = []
    for r in range(4):
        for op in s.rank_ops(r):
            t0, t1 = res.op_start[op.ref], res.op_end[op.ref]
            if op.id == slow_op:
                t1 = t0 + 3 * (t1 - t0)
            launches.append({"rank": r, "channel": op.channel, "launch": op.id, "ops": [op.id],
                             "start_us": t0, "end_us": t1})
    launches.append({"rank": 0, "channel": -1, "launch": "barrier:start", "ops": [],
                     "start_us": 0.0, "end_us": 1.0})
    doc = {"kind": "hiercoll-timeline", "plan": s.meta.to_json(), "topology": "h200x4",
           "setting": "test", "device": "none", "mode": "eager", "launches": launches}
    path.write_text(json.dumps(doc))
    return path, topo


def test_timeline_overlay_matches_ops_by_id_and_names_the_worst(tmp_path: Path) -> None:
    from hiercoll.calibration.timeline import load_timeline, overlay
    path, topo = _fake_timeline(tmp_path / "t.json", "2.1")
    trace, pairs, measured, simulated = overlay(load_timeline(path), topo)
    assert pairs[0].op == "2.1" and pairs[0].ratio == pytest.approx(1 / 3, rel=1e-6)
    assert all(p.ratio == pytest.approx(1.0) for p in pairs[1:])
    events = json.loads(trace)["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert any(n.startswith("measured") for n in names) and any(n.startswith("simulated") for n in names)
    measured_ops = {e["name"] for e in events if e.get("pid") == 1 and e["ph"] == "X"}
    simulated_ops = {e["name"] for e in events if e.get("pid") == 2 and e["ph"] == "X"}
    assert simulated_ops <= measured_ops and "barrier:start" in measured_ops
    proc = _hc("compare", "--timeline", str(path), "-t", "h200x4", "--trace",
               str(tmp_path / "overlay.json"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ops"][0]["op"] == "2.1"
    assert (tmp_path / "overlay.json").stat().st_size > 1000


def test_a_bad_timeline_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"kind": "something-else"}))
    proc = _hc("compare", "--timeline", str(bad), "-t", "h200x4")
    assert proc.returncode == 2 and proc.stderr.startswith("error:")
    assert len(proc.stderr.strip().splitlines()) == 1
    none = _hc("compare", "-t", "h200x4")
    assert none.returncode == 2 and "MEAS" in none.stderr


def test_resized_spec_does_not_carry_the_old_layout() -> None:
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=4, dtype="bf16", nbytes=8192)
    assert spec.count == 4096                       # cached now
    assert spec.resized(1 << 20).count == 1 << 19   # model_copy(update=) would say 4096


def test_autopick_reports_the_nccl_model_where_nothing_was_measured() -> None:
    from hiercoll.planner.library_model import library_model
    from hiercoll.planner.search.autopick import SimCache, pick_one
    topo = hc.load_topology("dgx-h100", 2)
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=16, dtype="bf16", nbytes=4 << 20)
    assert pick_one(topo, spec, SimCache(None)).library_model_us is None   # plan -a auto's path
    row = pick_one(topo, spec, SimCache(None), library_model=True)
    want = hc.simulate(library_model(topo, spec), topo, mode="trusted").time_us
    assert row.library_time_us is None and row.library_model_us == pytest.approx(want)
    assert row.algorithm != "nccl"                  # a comparison, not a candidate


def test_rows_measured_before_a_preset_was_calibrated_still_get_the_shape_check(tmp_path: Path) -> None:
    """Bench rows carry the fingerprint of the topology they ran with; for h200x4 that was the
    default-cost one. They must still be refused on a machine of another shape."""
    raw = hc.load_topology("h200x4", uncalibrated=True)
    row = {"collective": "all_reduce", "algorithm": "ring", "backend": "cuda", "mode": "eager",
           "world_size": 4, "topology": "h200x4", "dtype": "bf16", "nbytes": 8192,
           "p50_us": 50.0, "p90_us": 55.0, "p99_us": 60.0, "iters": 10,
           "topology_fingerprint": raw.fingerprint()}
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"rows": [row]}))
    two_nodes = str(Path(__file__).parents[1] / "bench/gpu/topologies/h200-2node-x2.yaml")
    proc = _hc("calibrate", str(path), "-t", two_nodes)
    assert proc.returncode == 2 and "shape differs" in proc.stderr


def test_a_cap_raised_past_binding_keeps_its_fitted_value() -> None:
    """The rows were timed with no per-op cap; the base caps SM ops at 50 GB/s. The fit raises
    the cap until it stops binding, where its gradient is nil: going back to the prior would
    bind again, so the fitted value stays (and the rows fit)."""
    base = with_values(hc.load_topology("h200x4"), {"costs.ce_threshold_bytes": 1 << 40,
                                                   "costs.sm_op_gbps": 50.0})
    cases = _synthetic(base, {"costs.sm_op_gbps": 20000.0})
    result = fit(cases, base, holdout=0.0, only=["costs.sm_op_gbps"])
    assert result.fitted["costs.sm_op_gbps"] > 300.0
    assert geomean_error(result.ratios()) < 0.02
