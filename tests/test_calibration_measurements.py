"""Measurements in: nccl-tests logs (hand-written in its format), hiercoll bench JSON (old rows
without the recipe keys, new rows with them) and the NCCL baseline, and their one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from hiercoll.calibration.measurements import Measurement, load_measurements
from hiercoll.calibration.nccl_tests import parse_nccl_tests
from hiercoll.collectives import DType, Kind, ReduceOp
from hiercoll.errors import HiercollError

DATA = Path(__file__).parent / "data"
LOGS = DATA / "nccl_tests"


def _one_line_error(paths: list[Path], match: str, **kw: object) -> str:
    with pytest.raises(HiercollError, match=match) as info:
        load_measurements(paths, **kw)  # type: ignore[arg-type]
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(paths[0]))
    return msg


# ---- nccl-tests logs ---------------------------------------------------------------------------
def test_all_reduce_rows_out_of_place_then_in_place() -> None:
    rows = load_measurements([LOGS / "all_reduce_perf.log"])
    assert len(rows) == 8
    assert [r.nbytes for r in rows] == [8192, 8192, 1048576, 1048576, 67108864, 67108864,
                                        1073741824, 1073741824]
    assert [r.in_place for r in rows] == [False, True] * 4
    assert [r.time_us for r in rows[:4]] == [20.05, 19.05, 26.99, 25.90]
    first = rows[0]
    assert first.tool == "nccl-tests" and first.algorithm == "nccl" and first.statistic == "mean"
    assert first.collective == Kind.ALL_REDUCE and first.dtype == DType.BF16
    assert first.reduce_op == ReduceOp.SUM and first.mode == "eager" and first.iters == 20
    assert (first.world_size, first.num_nodes, first.wrong) == (8, 1, 0)
    assert first.source == f"{LOGS / 'all_reduce_perf.log'}:16"
    assert rows[1].source == first.source      # both points of one line name that line


def test_two_nodes_sixteen_ranks_graph_all_gather_with_redop_none() -> None:
    rows = load_measurements([LOGS / "all_gather_perf.2node.log"])
    assert len(rows) == 6
    assert {(r.world_size, r.num_nodes, r.mode) for r in rows} == {(16, 2, "graph")}
    assert {r.collective for r in rows} == {Kind.ALL_GATHER} and rows[0].dtype == DType.FP32
    assert rows[0].reduce_op == ReduceOp.SUM and rows[0].iters == 50   # not warmup's 5
    assert (rows[4].nbytes, rows[4].time_us, rows[5].time_us) == (268435456, 6740.89, 6576.21)


def test_alltoall_out_of_place_only_and_na_wrong_column() -> None:
    rows = load_measurements([LOGS / "alltoall_perf.log"])
    assert [(r.nbytes, r.in_place, r.time_us, r.wrong) for r in rows] == [
        (8192, False, 25.08, 0), (4194304, False, 66.94, 0)]
    assert rows[0].collective == Kind.ALL_TO_ALL


def test_reduce_scatter_wrong_row_refused_unless_allowed_then_flagged() -> None:
    path = LOGS / "reduce_scatter_perf.wrong.log"
    msg = _one_line_error([path], r":17: 12 wrong elements \(in-place\)")
    assert "--allow-wrong" in msg
    rows = load_measurements([path], allow_wrong=True)
    assert [r.wrong for r in rows] == [0, 0, 0, 12]
    assert rows[3].in_place and rows[3].nbytes == 1048576 and rows[3].time_us == 29.0
    assert {r.collective for r in rows} == {Kind.REDUCE_SCATTER} and rows[0].dtype == DType.FP16


def test_broadcast_with_root_and_old_bus_ids() -> None:
    rows = load_measurements([LOGS / "broadcast_perf.log"])
    assert len(rows) == 4 and {r.collective for r in rows} == {Kind.BROADCAST}
    assert {(r.world_size, r.num_nodes, r.dtype, r.iters) for r in rows} == {
        (2, 1, DType.FP64, 100)}
    assert rows[3].time_us == 22.60


def test_concatenated_runs_each_take_their_own_header() -> None:
    rows = load_measurements([LOGS / "concatenated.log"], collective=Kind.ALL_REDUCE)
    assert [(r.mode, r.time_us) for r in rows] == [("eager", 20.0), ("eager", 19.0),
                                                  ("graph", 12.0), ("graph", 11.0)]
    assert [r.source.rsplit(":", 1)[1] for r in rows] == ["16", "16", "36", "36"]


def test_a_sweep_log_names_each_runs_binary_and_skips_noise() -> None:
    """Command lines and 'Collective test starting' name the binary per run; NCCL INFO lines
    inside the table, a size-0 row and mpirun --tag-output prefixes are stepped over."""
    rows = load_measurements([LOGS / "sweep.log"])
    assert [(r.collective, r.nbytes, r.in_place) for r in rows] == [
        (Kind.ALL_REDUCE, 4096, False), (Kind.ALL_REDUCE, 4096, True),
        (Kind.ALL_REDUCE, 2097152, False), (Kind.ALL_REDUCE, 2097152, True),
        (Kind.ALL_GATHER, 4096, False), (Kind.ALL_GATHER, 4096, True),
        (Kind.ALL_GATHER, 2097152, False), (Kind.ALL_GATHER, 2097152, True)]
    assert [r.mode for r in rows] == ["graph"] * 4 + ["eager"] * 4   # graph: 10 is graph
    assert {(r.world_size, r.num_nodes, r.dtype, r.iters) for r in rows} == {
        (4, 1, DType.FP16, 10)}
    assert rows[2].time_us == 28.61 and rows[7].time_us == 21.76


def test_a_concluded_line_names_the_run_before_not_the_next() -> None:
    lines = (LOGS / "sweep.log").read_text().splitlines()
    text = "\n".join(line for line in lines if "./build/all_gather_perf" not in line)
    with pytest.raises(HiercollError, match=r"^sweep.log:37: cannot tell which collective"):
        parse_nccl_tests(text, "sweep.log")


def test_the_collective_keyword_wins_over_nothing_and_the_file_name_over_the_log() -> None:
    text = (LOGS / "concatenated.log").read_text()
    rows = parse_nccl_tests(text, "runs/all_gather_perf.out")
    assert {r.collective for r in rows} == {Kind.ALL_GATHER}
    rows = parse_nccl_tests(text, "anything.log", collective=Kind.REDUCE_SCATTER)
    assert {r.collective for r in rows} == {Kind.REDUCE_SCATTER}


def test_a_log_that_does_not_tell_its_collective_asks_for_it() -> None:
    msg = _one_line_error([LOGS / "concatenated.log"], "cannot tell which collective")
    assert "--collective" in msg and "all_reduce_perf.log" in msg


def test_empty_log_unknown_type_and_missing_file_are_one_line_errors(tmp_path: Path) -> None:
    _one_line_error([LOGS / "empty_all_reduce_perf.log"], "empty file")
    msg = _one_line_error([LOGS / "int32_all_reduce_perf.log"], r":16: type 'int32'")
    assert "bfloat16" in msg
    _one_line_error([tmp_path / "missing_all_reduce_perf.log"], "cannot read")
    binary = tmp_path / "all_reduce_perf.log"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    _one_line_error([binary], "not a text file")


def test_logs_without_a_table_or_with_bad_rows(tmp_path: Path) -> None:
    no_table = tmp_path / "all_reduce_perf.log"
    no_table.write_text("# nThread 1 nGpus 1 ...\nsegmentation fault\n")
    _one_line_error([no_table], "no nccl-tests result table found .*#wrong' header")
    good = (LOGS / "all_reduce_perf.log").read_text().splitlines()
    for bad_line, match in [
            ("        8192          4096  bfloat16     sum      -1    0.00    0.41    0.71      0",
             r":16: time_us: Input should be greater than 0"),
            ("        8192          4096  bfloat16    prod      -1    20.0    0.41    0.71      0",
             r":16: reduction 'prod'"),
            ("        8192          4096  bfloat16     sum      -1    20.0    0.41    0.71    abc",
             r":16: #wrong 'abc'"),
            ("        8192          4096  bfloat16     sum      -1    20.0    0.41    0.71      0"
             "    19.0    0.43", r":16: the in-place columns are cut short")]:
        path = tmp_path / "all_reduce_perf.log"
        path.write_text("\n".join(good[:15] + [bad_line] + good[16:]) + "\n")
        _one_line_error([path], match)
    headless = tmp_path / "all_reduce_perf.log"
    headless.write_text("\n".join(good[12:17]) + "\n")
    _one_line_error([headless], r":4: no .#  Rank N")


# ---- hiercoll bench JSON -----------------------------------------------------------------------
def test_bench_json_old_rows_without_recipe_keys() -> None:
    rows = load_measurements([DATA / "bench_old.json"])
    assert [(r.algorithm, r.mode, r.nbytes, r.time_us) for r in rows] == [
        ("ring", "eager", 8192, 74.5), ("direct", "graph", 16777216, 141.9),
        ("nccl", "eager", 67108864, 383.5)]
    ring = rows[0]
    assert ring.tool == "hiercoll-bench" and ring.statistic == "p50" and ring.params == {}
    assert (ring.p90_us, ring.p99_us, ring.iters) == (80.25, 91.0, 200)
    assert ring.reduce_op == ReduceOp.SUM and not ring.one_gpu
    assert ring.topology_fingerprint is None and ring.num_nodes is None and ring.world_size == 4
    assert ring.source == f"{DATA / 'bench_old.json'}#0" and rows[2].source.endswith("#2")


def test_bench_json_new_rows_with_params_fingerprint_and_one_gpu() -> None:
    rows = load_measurements([DATA / "bench_new.json"])
    rs, hier, lib = rows
    assert rs.collective == Kind.REDUCE_SCATTER and rs.algorithm == "two_shot"
    assert rs.params == {"chunks": 2, "channels": 1} and rs.one_gpu and rs.mode == "graph"
    assert rs.topology_fingerprint == "0317a0c2240b71bb" and rs.reduce_op == ReduceOp.MAX
    assert rs.dtype == DType.FP16 and rs.time_us == 52.5 and rs.iters == 50
    assert hier.params == {"chunks": 4, "channels": 2, "pipeline": True, "inter": "ring"}
    assert hier.topology_fingerprint is None and not hier.one_gpu     # "" means not recorded
    assert lib.algorithm == "nccl" and lib.params == {} and lib.time_us == 86.5


def test_bench_row_errors_name_the_row_and_the_files_key(tmp_path: Path) -> None:
    good = json.loads((DATA / "bench_old.json").read_text())["rows"][0]
    path = tmp_path / "bench.json"
    for change, match in [({"p50_us": -3.0}, r"#0: p50_us: Input should be greater than 0"),
                          ({"p50_us": None}, r"#0: p50_us: "),
                          ({"collective": "all_scream"}, r"#0: unknown collective 'all_scream'"),
                          ({"params": [1, 2]}, r"#0: params: expected an object"),
                          ({"dtype": "int8"}, r"#0: dtype: ")]:
        path.write_text(json.dumps({"rows": [good | change]}))
        _one_line_error([path], match)
    path.write_text("{\"rows\": [")
    _one_line_error([path], "not valid JSON")
    path.write_text(json.dumps({"results": []}))
    _one_line_error([path], "JSON without 'rows'")


# ---- the NCCL baseline -------------------------------------------------------------------------
def test_baseline_nccl_part_only() -> None:
    rows = load_measurements([DATA / "baseline_small.json"])
    assert len(rows) == 8          # 4 collectives x 2 points; ce/symm are not read here
    assert [r.collective for r in rows[::2]] == [Kind.ALL_REDUCE, Kind.REDUCE_SCATTER,
                                                 Kind.ALL_GATHER, Kind.ALL_TO_ALL]
    assert {(r.tool, r.algorithm, r.dtype, r.statistic, r.mode, r.world_size, r.num_nodes)
            for r in rows} == {("baseline", "nccl", DType.BF16, "p50", "eager", 4, 1)}
    ar = rows[1]
    assert ar.nbytes == 1048576 and ar.time_us == pytest.approx(87.68, abs=0.01)
    assert ar.source == f"{DATA / 'baseline_small.json'}#nccl.all_reduce.1"


def test_bad_baseline_points_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    for nccl, match in [({"all_reduce": [[8192]]}, r"#nccl.all_reduce.0: expected \[bytes"),
                        ({"all_reduce": [[8192, 0.0]]}, r"#nccl.all_reduce.0: p50_us \(2nd"),
                        ({"all_reduce": 5}, r"#nccl.all_reduce: expected a list"),
                        ({"sendrecv": [[8192, 3.0]]}, r"#nccl.sendrecv.0: unknown collective")]:
        path.write_text(json.dumps({"world": 4, "nccl": nccl}))
        _one_line_error([path], match)


# ---- files together ----------------------------------------------------------------------------
def test_files_load_in_order_and_rows_are_frozen() -> None:
    rows = load_measurements([DATA / "baseline_small.json", str(LOGS / "alltoall_perf.log")])
    assert [r.tool for r in rows] == ["baseline"] * 8 + ["nccl-tests"] * 2
    with pytest.raises(ValidationError, match="frozen"):
        rows[0].time_us = 1.0
    with pytest.raises(ValidationError, match="colour"):
        Measurement.model_validate(rows[0].model_dump() | {"colour": "red"})


def test_bench_peer_rows_torchs_kernels_are_left_out_nccls_is_the_library(tmp_path: Path) -> None:
    """`hiercoll bench --peers` rows: torch's symmetric-memory kernels have no model to fit, so
    calibrate/compare skip them; NCCL's peer row is the library call."""
    base = {"collective": "all_reduce", "world_size": 4, "dtype": "bf16", "nbytes": 8192,
            "mode": "graph", "p50_us": 9.5, "backend": "peer", "peer": True, "graph_calls": 10}
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"rows": [base | {"algorithm": "torch-one-shot"},
                                         base | {"algorithm": "nccl", "p50_us": 12.5},
                                         base | {"algorithm": "ring", "peer": False,
                                                 "backend": "cuda", "p50_us": 20.0}]}))
    rows = load_measurements([path])
    assert [(r.algorithm, r.time_us) for r in rows] == [("nccl", 12.5), ("ring", 20.0)]
    from hiercoll.harness.results import row_label
    assert row_label(base | {"algorithm": "torch-one-shot"}) == "peer:torch-one-shot"


def test_a_bench_row_of_a_hier_plan_reads_back(tmp_path: Path) -> None:
    """hier's `nics` defaults to None; bench wrote `params.nics: null`, which calibrate and
    compare refused ("params.nics.int"). Rows leave unset parameters out, and reading drops them."""
    pytest.importorskip("torch")
    import hiercoll as hc
    from hiercoll.executor.interface import Mode
    from hiercoll.harness.bench import Timing, make_row
    topo = hc.load_topology("bench/gpu/topologies/h200-2node-x2.yaml")
    s = hc.plan(topo, hc.CollectiveSpec(kind="reduce_scatter", world_size=4, nbytes=1 << 20), "hier")
    assert s.meta.params.get("nics", 0) is None
    row = make_row(s, "cuda", Mode.GRAPH, "h200-2node-x2", Timing(20.0, 21.0, 22.0, 10, 10)).to_json()
    assert "nics" not in row["params"]
    old = dict(row, params=dict(s.meta.params))           # what earlier runs wrote
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"rows": [row, old]}))
    a, b = load_measurements([path])
    assert a.params == b.params == {k: v for k, v in s.meta.params.items() if v is not None}
