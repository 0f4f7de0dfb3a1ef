"""The calibrate and compare workflows behind the CLI: measurements in, a fit or a report out.

    rows = load_rows(paths, topology)            # parsed, checked against the topology's shape
    result = calibrate(rows, topology, holdout)  # least squares, held-out rows, provenance
    write_topology(result.topology, "calibrated.yaml")
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from hiercoll.calibration.compat import check_rows
from hiercoll.calibration.fit import FitResult, RowError, fit, geomean_error, worst_error
from hiercoll.calibration.measurements import load_measurements, merge_repeats
from hiercoll.calibration.predict import Case, build_case, predict_us
from hiercoll.calibration.report import summary
from hiercoll.collectives import Kind
from hiercoll.topology import Topology
from hiercoll.topology.model import Calibration


def load_rows(paths: Sequence[str | Path], topology: Topology, *,
              collective: Kind | None = None, allow_wrong: bool = False) -> list[Case]:
    """Every point of every file (repeats merged to their median), each with the schedule that
    reproduces it on `topology`."""
    rows = merge_repeats(load_measurements(paths, allow_wrong=allow_wrong, collective=collective))
    check_rows(rows, topology)
    return [build_case(m, topology) for m in rows]


def calibrate(cases: Sequence[Case], base: Topology, holdout: float,
              sources: Sequence[str], progress: Callable[[int], None] | None = None,
              fixed: Sequence[str] = (), jobs: int = 1) -> FitResult:
    """Fit, then stamp the fitted topology with its provenance (sources, date, values, errors)."""
    result = fit(cases, base, holdout, progress=progress, fixed=fixed, jobs=jobs)
    held = result.ratios(held_out=True)
    cal = Calibration(
        date_utc=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        sources=[str(s) for s in sources], fitted=result.fitted,
        unconstrained=sorted(result.unconstrained), rows=len(cases),
        fit_geomean_error=geomean_error(result.ratios(held_out=False)),
        holdout_geomean_error=geomean_error(held) if held else None,
        worst_error=worst_error(result.ratios()),
        base_fingerprint=base.base_fingerprint())
    topo = result.topology.model_copy(update={"calibration": cal,
                                              "name": f"{base.name}-calibrated"})
    return dataclasses.replace(result, topology=topo)


def compare(cases: Sequence[Case], topology: Topology) -> list[RowError]:
    """Each row's prediction on `topology` as it is (no fitting: nothing is held out)."""
    return [RowError(c, predict_us(c, topology, topology), False) for c in cases]


def result_json(result: FitResult) -> dict[str, Any]:
    """What `calibrate --json` prints: the issue's keys first, then the detail."""
    s = summary(result.rows)
    return {"params": result.fitted, "fit_geomean_error": s["fit"]["geomean_error"],
            "holdout_geomean_error": s["held_out"]["geomean_error"],
            "worst_error": s["all"]["worst_error"], "rows": len(result.rows),
            "not_constrained": sorted(result.unconstrained), "summary": s,
            "evaluations": result.evaluations}


def write_topology(topology: Topology, path: str | Path) -> None:
    """The calibrated topology as YAML (same schema as any topology file), atomically."""
    from hiercoll.files import write_atomic
    data = topology.model_dump(mode="json", exclude_none=True)
    header = ("# Calibrated by `hiercoll calibrate`: the 'calibration' block says from what.\n"
              "# Load it like any topology: hiercoll autopick -t THIS_FILE ...\n")
    write_atomic(Path(path), header + yaml.safe_dump(data, sort_keys=False))
