"""Rows predicted by worker processes (calibrate --jobs): the same floats, in the same order, and
the same fit as one process."""

from __future__ import annotations

import json
from pathlib import Path

import hiercoll as hc
from hiercoll.calibration.fit import fit
from hiercoll.calibration.measurements import load_measurements
from hiercoll.calibration.parallel import MIN_ROWS_PER_JOB, RowPredictor, default_jobs
from hiercoll.calibration.predict import build_case, predict_us
from hiercoll.planner.library_model import library_model, sm_only

SIZES = [(8 << 10) << (2 * i) for i in range(8)]


def _cases(tmp_path: Path):  # type: ignore[no-untyped-def]
    """40 rows timed with known costs (launch 9 us), four plans and the library."""
    topo = hc.load_topology("h200x4", uncalibrated=True)
    truth = topo.model_copy(update={"costs": topo.costs.model_copy(update={"launch_us": 9.0})})
    rows = []
    for algo in ("ring", "direct", "two_shot", "rd", "nccl"):
        for n in SIZES:
            spec = hc.CollectiveSpec(kind="all_reduce", world_size=4, nbytes=n)
            if algo == "nccl":
                t = hc.simulate(library_model(truth, spec), truth, costs_from=sm_only(truth),
                                call_mode="graph").time_us
            else:
                t = hc.simulate(hc.plan(truth, spec, algo), truth, call_mode="graph").time_us
            rows.append({"collective": "all_reduce", "algorithm": algo, "world_size": 4,
                         "dtype": "bf16", "nbytes": n, "mode": "graph", "p50_us": t,
                         "params": {}, "topology": "h200x4"})
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"rows": rows}))
    return topo, [build_case(m, topo) for m in load_measurements([path])]


def test_workers_return_every_row_in_order(tmp_path: Path) -> None:
    topo, cases = _cases(tmp_path)
    costs = topo.model_copy(update={"costs": topo.costs.model_copy(update={"launch_us": 3.0})})
    serial = [predict_us(c, costs, topo) for c in cases]
    with RowPredictor(cases, topo, jobs=3) as predict:
        assert predict.jobs == min(3, len(cases) // MIN_ROWS_PER_JOB) > 1
        assert predict(costs) == serial
        assert predict(topo) == [predict_us(c, topo, topo) for c in cases]   # pool reused
    with RowPredictor(cases[:MIN_ROWS_PER_JOB], topo, jobs=8) as few:
        assert few.jobs == 1                    # too few rows to share: one process


def test_the_fit_is_the_same_for_any_number_of_jobs(tmp_path: Path) -> None:
    topo, cases = _cases(tmp_path)
    one = fit(cases, topo, only=["costs.launch_us"], jobs=1)
    two = fit(cases, topo, only=["costs.launch_us"], jobs=2)
    assert one.fitted == two.fitted and abs(one.fitted["costs.launch_us"] - 9.0) < 0.05
    assert [r.predicted_us for r in one.rows] == [r.predicted_us for r in two.rows]
    assert default_jobs() >= 1
