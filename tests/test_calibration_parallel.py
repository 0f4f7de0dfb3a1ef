"""Rows predicted by worker processes (calibrate --jobs): the same floats, in the same order, and
the same fit as one process."""

from __future__ import annotations

from pathlib import Path

from helpers import one_error_line, run_cli, truth_rows

from hiercoll.calibration.fit import fit
from hiercoll.calibration.parallel import MIN_ROWS_PER_JOB, RowPredictor, default_jobs
from hiercoll.calibration.predict import predict_us

SIZES = [(8 << 10) << (2 * i) for i in range(8)]


def _cases(tmp_path: Path):  # type: ignore[no-untyped-def]
    """40 rows timed with known costs (launch 9 us), four plans and the library."""
    return truth_rows(tmp_path, ("ring", "direct", "two_shot", "rd", "nccl"), SIZES)


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


def test_calibrate_refuses_no_workers_in_one_line() -> None:
    proc = run_cli("calibrate", "examples/all_reduce_perf.2node.log", "-t", "dgx-h100", "-n", "2",
                   "--jobs", "0")
    assert proc.returncode == 2 and "--jobs: 0" in one_error_line(proc)
