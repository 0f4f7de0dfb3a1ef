"""The rows' own spread: where one program was measured twice at a point, how far apart, and the
floor no model can beat on average (half the mean log gap)."""

from __future__ import annotations

import json
import math

import pytest

from hiercoll.calibration.measurements import bench_measurement
from hiercoll.calibration.predict import build_case
from hiercoll.calibration.regret import measured_points, regret_run
from hiercoll.calibration.spread import Sample, spreads, spreads_of
from hiercoll.cli.main import main
from hiercoll.topology import load_topology

KNOBS = {"forward": True, "fuse": True, "single_stream": True, "split_channels": True,
         "protocol": "simple", "max_ctas": 132, "ce_threshold_bytes": 1 << 40}


def _row(algorithm: str, t: float, mode: str = "graph", nbytes: int = 1 << 20) -> dict:
    """4 x H200 all_to_all: `direct` and `hier` lower to one program on one node, `bruck`
    (relays through a third GPU) to another."""
    return {"algorithm": algorithm, "backend": "cuda", "peer": False, "mode": mode,
            "collective": "all_to_all", "dtype": "bf16", "nbytes": nbytes, "world_size": 4,
            "p50_us": t, "params": {"channels": 1, "chunks": 1}, "options": KNOBS}


def test_one_program_measured_twice_gives_its_gap_and_half_of_it_as_the_floor():
    topo = load_topology("h200x4")
    rows = [_row("direct", 10.0), _row("hier", 20.0), _row("bruck", 100.0),     # bruck: alone
            _row("direct", 30.0, mode="eager"), _row("hier", 30.0, mode="eager"),
            _row("direct", 50.0, nbytes=1 << 27), _row("bruck", 55.0, nbytes=1 << 27)]
    cases = [build_case(bench_measurement(r, f"rows[{i}]"), topo) for i, r in enumerate(rows)]
    got = {s.label: s for s in spreads(cases)}
    assert set(got) == {"graph, 1-64 MiB", "eager, 1-64 MiB"}    # 128 MiB: two programs
    g = got["graph, 1-64 MiB"]
    assert g.pairs == 1 and g.spread == pytest.approx(1.0) and g.worst == pytest.approx(1.0)
    assert g.floor == pytest.approx(math.sqrt(2) - 1)
    e = got["eager, 1-64 MiB"]
    assert e.spread == 0.0 and e.floor == 0.0


def test_no_model_beats_the_floor_on_the_rows_it_is_drawn_from():
    """Whatever one time p a model gives a program, its mean |log error| over that program's
    rows is at least the floor (the triangle inequality the docstring rests on)."""
    times = [10.0, 13.0, 31.0, 12.0]
    (s,) = spreads_of(Sample("graph", 1 << 20, ("p",), t) for t in times)
    for p in [x / 10 for x in range(80, 400)]:
        err = math.exp(sum(abs(math.log(p / t)) for t in times) / len(times)) - 1
        assert err >= s.floor - 1e-12


def test_regret_and_calibrate_report_the_spread(tmp_path, capsys):
    topo = load_topology("h200x4")
    rows = [_row("direct", 10.0), _row("hier", 12.0), _row("bruck", 11.0)]
    points, spread = regret_run(topo, measured_points(rows, "graph"), "graph")
    assert len(points) == 1 and points[0].candidates == 3
    (s,) = spread
    assert s.pairs == 1 and s.spread == pytest.approx(0.2)
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"rows": rows}))
    assert main(["autopick", "-t", "h200x4", "--validate", str(f), "--no-cache",
                 "--out", str(tmp_path / "r")]) == 0
    assert "20.0 % apart" in (tmp_path / "r" / "regret.md").read_text()
    capsys.readouterr()
    assert main(["calibrate", str(f), "-t", "h200x4", "--holdout", "0", "--jobs", "1",
                 "--json", "--fix", ",".join(_all_but("costs.launch_us"))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spread"][0]["pairs"] == 1 and out["spread"][0]["spread"] == pytest.approx(0.2)


def _all_but(keep: str) -> list[str]:
    from hiercoll.calibration.params import BY_PATH
    return [p for p in BY_PATH if p != keep]


def test_nccl_measured_twice_is_its_own_spread():
    """A bench times NCCL twice per point (the library fallback's row and the `nccl` peer's): their
    gap is NCCL's own spread, reported apart from hiercoll's plans."""
    topo = load_topology("h200x4")
    lib = dict(_row("nccl", 10.0), backend="nccl", params={}, options={})
    peer = dict(_row("nccl", 12.0), backend="peer", peer=True, params={}, options={})
    rows = [lib, peer, _row("direct", 10.0), _row("hier", 10.5)]
    cases = [build_case(bench_measurement(r, f"rows[{i}]"), topo) for i, r in enumerate(rows)]
    got = {s.label: s for s in spreads(cases)}
    assert set(got) == {"graph, 1-64 MiB", "NCCL, graph, 1-64 MiB"}
    assert got["NCCL, graph, 1-64 MiB"].spread == pytest.approx(0.2)
    assert got["graph, 1-64 MiB"].spread == pytest.approx(0.05)
