"""k-fold cross-validation of the calibration (issue 28): every row held out exactly once,
figures per size band and for hiercoll's plans and NCCL's library model apart."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import truth_rows

from hiercoll.calibration.crossval import BANDS, cross_validate, fold_of
from hiercoll.errors import HiercollError


def _cases(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Rows made by simulating with known costs (the truth), ring and the library, 6 sizes."""
    return truth_rows(tmp_path, ("ring", "nccl"),
                      (16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20))


def test_every_row_is_held_out_once_and_each_fold_spans_the_sizes(tmp_path: Path) -> None:
    _, cases = _cases(tmp_path)
    folds = fold_of(cases, 3)
    assert sorted(set(folds)) == [0, 1, 2]
    for f in range(3):
        sizes = sorted(c.measurement.nbytes for c, g in zip(cases, folds) if g == f)
        assert sizes[-1] >= 16 * sizes[0]              # small and large sizes in every fold


def test_cross_validation_recovers_the_truth_and_reports_each_group(tmp_path: Path) -> None:
    topo, cases = _cases(tmp_path)
    figures = cross_validate(cases, topo, 3, only=["costs.launch_us"])
    by = {f.label: f for f in figures}
    assert by["all rows"].rows == len(cases) and by["all rows"].mean < 0.02
    assert {f"NCCL library model, {name}" for name, _, _ in BANDS} <= set(by)
    assert any(label.startswith("hiercoll plans") for label in by)
    assert all(f.low <= f.mean <= f.high for f in figures)
    with pytest.raises(HiercollError, match="--folds"):
        cross_validate(cases, topo, 1)
