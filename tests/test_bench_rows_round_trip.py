"""Every bench file hiercoll writes reads back into calibrate, compare and autopick --validate:
one row per family applicable to each collective (on one node and on the 2 x 2 mapping, so the
hierarchical families and their parameters are there), written as `hiercoll bench` writes them
(graph mode, the cuda lowering's options), re-planned from the row and predicted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hiercoll.calibration.measurements import load_measurements
from hiercoll.calibration.predict import build_case, predict_us
from hiercoll.calibration.regret import measured_points, regret_points
from hiercoll.cli.main import main
from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.planner.registry import applicable, plan
from hiercoll.topology import load_topology

KINDS = (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_TO_ALL)
TOPOLOGIES = {"h200x4": "h200x4", "h200-2node-x2": "bench/gpu/topologies/h200-2node-x2.yaml"}
OPTIONS = {"ce_threshold_bytes": 8 << 20, "ctas": None, "debug_timeout_ms": 0.0, "forward": True,
           "fuse": True, "inter_transport": "peer", "launch_per_op": False, "single_stream": True}


def _rows(name: str) -> list[dict]:
    pytest.importorskip("torch")
    from hiercoll.executor.interface import Mode
    from hiercoll.harness.bench import Timing, make_row
    topo = load_topology(TOPOLOGIES[name])
    rows = []
    for kind in KINDS:
        spec = CollectiveSpec(kind=kind, world_size=4, dtype="bf16", nbytes=1 << 20)
        for algorithm in applicable(topo, spec):
            if algorithm == "nccl":
                continue
            s = plan(topo, spec, algorithm)
            rows.append(make_row(s, "cuda", Mode.GRAPH, name, Timing(30.0, 31.0, 32.0, 10, 10),
                                 zero_copy=True, options=OPTIONS).to_json())
    return rows


@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_every_family_s_row_reads_back_and_is_predicted(tmp_path: Path, name: str) -> None:
    rows = _rows(name)
    families = {(r["collective"], r["algorithm"]) for r in rows}
    assert {a for _, a in families} >= {"ring", "direct"}
    if name != "h200x4":
        assert {a for _, a in families} >= {"hier", "hier_2d"}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"rows": rows}))
    base = load_topology(TOPOLOGIES[name])
    measured = load_measurements([path])
    assert len(measured) == len(rows)
    for m in measured:
        assert m.lowering == OPTIONS and m.mode == "graph"
        t = predict_us(build_case(m, base), base, base)
        assert t > 0, m.source
    points = measured_points(rows, "graph")
    assert sum(len(v) for v in points.values()) == len(rows)
    assert {p.collective for p in regret_points(base, points, "graph")} == {k.value for k in KINDS}


def test_compare_reads_a_bench_file_of_every_family(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"rows": _rows("h200x4")}))
    assert main(["compare", "-t", "h200x4", str(path), "--json"]) == 0
