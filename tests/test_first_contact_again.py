"""Issue 30's first-contact findings that are fixed, each as a user meets it (the CLI in a
subprocess): one `error:` line and exit 2 for bad input, help text that says what a flag does."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import one_error_line, run_cli


def test_plan_without_a_size_is_refused_not_planned_empty(tmp_path: Path) -> None:
    line = one_error_line(run_cli("plan", "-t", "h200x4", "-c", "all_reduce", "-a", "ring",
                                  "-o", str(tmp_path / "p.json")))
    assert "--bytes" in line and "-b 64MiB" in line
    assert not (tmp_path / "p.json").exists()
    assert run_cli("plan", "-t", "h200x4", "-c", "all_reduce", "-b", "0", "-a", "ring", "-o",
                   str(tmp_path / "p.json")).returncode == 0      # asked for explicitly


@pytest.mark.parametrize("value", ["inf", "1e400", "-inf"])
def test_an_infinite_op_limit_is_one_line(tmp_path: Path, value: str) -> None:
    env = dict(os.environ, HIERCOLL_MAX_OPS=value)
    line = one_error_line(run_cli("plan", "-t", "h200x4", "-c", "all_reduce", "-b", "1MiB",
                                  "-a", "ring", "-o", str(tmp_path / "p.json"), env=env))
    assert "HIERCOLL_MAX_OPS" in line


def test_flag_help_names_no_default_and_sizes_read_as_sizes() -> None:
    run_help = run_cli("run", "--help").stdout
    no_fuse = run_help[run_help.index("--no-fuse  "):run_help.index("--launch-per-op  ")]
    assert "default: True" not in no_fuse
    verify_help = " ".join(run_cli("verify", "--help").stdout.split())
    assert "default 2GiB" in verify_help and "2147483648" not in verify_help


def _plan_file(tmp_path: Path) -> dict:
    path = tmp_path / "p.json"
    assert run_cli("plan", "-t", "h200x4", "-c", "all_reduce", "-b", "64KiB", "-a", "direct",
                   "--form", "expanded", "-o", str(path)).returncode == 0
    return json.loads(path.read_text())


@pytest.mark.parametrize("command", ["verify", "simulate"])
def test_a_negative_buffer_or_an_infinite_scale_is_one_line(tmp_path: Path, command: str) -> None:
    data = _plan_file(tmp_path)
    data["ranks"][1]["buffers"]["direct_recv"] = -5
    bad = tmp_path / "neg.json"
    bad.write_text(json.dumps(data))
    line = one_error_line(run_cli(command, str(bad)))
    assert "ranks.1.buffers.direct_recv" in line and "greater than or equal to 0" in line
    data = _plan_file(tmp_path)
    reduce = next(op for op in data["ranks"][0]["ops"] if op["kind"] == "reduce")
    reduce["scale"] = float("inf")
    bad.write_text(json.dumps(data))         # json writes Infinity, as a hand edit would
    line = one_error_line(run_cli(command, str(bad)))
    assert "scale" in line and "finite" in line


def test_compare_refuses_a_row_whose_topology_path_does_not_resolve_here(tmp_path: Path) -> None:
    """A bench row names its topology as the path it was given (relative to where bench ran).
    From another directory compare re-planned the 2-node hier row on one node and exited 0."""
    import subprocess
    import sys

    import hiercoll as hc
    from tests.helpers import ROOT
    name = "bench/gpu/topologies/h200-2node-x2.yaml"
    topo = hc.load_topology(str(ROOT / name))
    row = {"collective": "reduce_scatter", "algorithm": "hier", "backend": "cuda", "mode": "graph",
           "world_size": 4, "topology": name, "topology_fingerprint": topo.fingerprint(),
           "dtype": "bf16", "nbytes": 1 << 20, "p50_us": 20.0, "params": {"chunks": 1}}
    bench = tmp_path / "rows.json"
    bench.write_text(json.dumps({"rows": [row]}))
    proc = subprocess.run([sys.executable, "-m", "hiercoll", "compare", str(bench), "-t", "h200x4"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)
    line = one_error_line(proc)
    assert name in line and "does not load from here" in line


@pytest.mark.parametrize(("mask", "want"), [
    ([], "the file's list is empty"),
    ([{"q": [0, 2**62], "k": [0, 2**62], "type": "full"}], "use chunks of at least"),
])
def test_attention_masks_that_broke_it_are_one_line(tmp_path: Path, mask: list, want: str) -> None:
    """An empty mask file was max() of nothing; a range up to 2**62 a MemoryError."""
    path = tmp_path / "mask.json"
    path.write_text(json.dumps(mask))
    line = one_error_line(run_cli("workload", "attention", "--mask", str(path), "-t", "h200x4",
                                  "--chunk-size", "64"))
    assert want in line


@pytest.mark.parametrize(("field", "value"), [("nic_gbps", 5e-324), ("nic_gbps", 1e308),
                                              ("hbm_gbps", 1e-9)])
def test_extreme_topology_numbers_are_refused_not_simulated_forever(tmp_path: Path, field: str,
                                                                     value: float) -> None:
    """A node override of nic_gbps 5e-324 made autopick's event loop spin (a flow that never
    ends); numbers outside 1 MB/s .. 1 PB/s are refused by the topology model in one line."""
    doc = {"name": "t", "num_nodes": 2, "gpus_per_node": 2,
           "gpu": {"name": "T", "hbm_gbps": 3000.0, "num_sms": 100},
           "intra": {"kind": "nvswitch", "gbps": 300.0, "latency_us": 1.0},
           "inter": {"num_nics": 2, "nic_gbps": 50.0, "latency_us": 3.0},
           "node_overrides": [{"node": 1, field: value}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    line = one_error_line(run_cli("autopick", "-t", str(path), "-c", "all_reduce", "--sizes",
                                  "1MiB", "--no-cache"))
    assert f"node_overrides.0.{field}" in line


def test_every_option_of_every_command_says_what_it_does() -> None:
    """`bench --help` listed --collective, --nodes, --dtype, --reduce-op, --backend and --modes
    with no text (issue 30)."""
    import argparse

    from hiercoll.cli.main import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bare = [f"{name} {action.option_strings[0]}"
            for name, cmd in sub.choices.items() for action in cmd._actions
            if action.option_strings and not action.help and action.dest != "help"]
    assert bare == []


@pytest.mark.parametrize("algorithm", ["ring", "nccl"])
def test_run_prints_time_and_bandwidths_and_the_backend_that_ran(tmp_path: Path, algorithm: str) -> None:
    """`hiercoll run` printed no time, and a library plan run on gloo said `(nccl, eager)`."""
    import re

    from tests.test_exec_cli import _topo2, _torchrun
    topo = tmp_path / "t.json"
    topo.write_text(_topo2().model_dump_json())
    plan = tmp_path / "p.json"
    assert run_cli("plan", "-t", str(topo), "-c", "all_reduce", "-b", "64KiB", "-a", algorithm,
                   "-o", str(plan)).returncode == 0
    proc = _torchrun("run", str(plan), "--backend", "gloo", "--check", "--iters", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(gloo, eager)" in proc.stdout
    assert re.search(r"p50 [\d.]+ us per call, algbw [\d.]+ GB/s, busbw [\d.]+ GB/s", proc.stdout)


def test_the_readme_attention_line_runs_on_the_shipped_mask(tmp_path: Path) -> None:
    proc = run_cli("workload", "attention", "--mask", "examples/mask.yaml", "--chunk-size", "256",
                   "-t", "dgx-h100", "-n", "2", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "group_cast" in proc.stdout and (tmp_path / "out").is_dir()
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "--mask examples/mask.yaml --chunk-size 256 -t dgx-h100 -n 2" in readme


def test_a_misspelt_key_is_named_as_unknown_with_the_key_it_resembles(tmp_path: Path) -> None:
    """`nic_gbs` for `nic_gbps` was reported as 'inter.nic_gbps: required field is missing'."""
    doc = {"name": "t", "num_nodes": 2, "gpus_per_node": 2,
           "gpu": {"name": "T", "hbm_gbps": 3000.0, "num_sms": 100},
           "intra": {"kind": "nvswitch", "gbps": 300.0, "latency_us": 1.0},
           "inter": {"num_nics": 2, "nic_gbs": 50.0, "latency_us": 3.0}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    line = one_error_line(run_cli("topo", "show", str(path)))
    assert "inter.nic_gbs: unknown field; did you mean nic_gbps?" in line


def test_topo_detect_without_gpu_tools_says_so(tmp_path: Path) -> None:
    """It named recorded files (nvidia-smi-q.txt, ...) the user never made."""
    env = dict(os.environ, PATH=str(tmp_path))       # no nvidia-smi / rocm-smi on PATH
    import shutil
    import sys
    if shutil.which("nvidia-smi") or shutil.which("rocm-smi"):
        pytest.skip("this machine has GPU tools")
    import subprocess
    proc = subprocess.run([sys.executable, "-m", "hiercoll", "topo", "detect", "--no-nvml", "-n", "1",
                           "-o", str(tmp_path / "t.yaml")], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    line = one_error_line(proc)
    assert "no GPU found" in line and "nvidia-smi" in line and ".txt" not in line


def test_long_figure_titles_wrap_to_the_figure() -> None:
    """PNG titles were cut off at both edges: they now wrap to the figure's width."""
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hiercoll.files import fit_title
    fig = plt.figure(figsize=(6, 3))
    title = "MoE dispatch/combine, 4096 tokens/rank, top-8 of 256 experts, 32 ranks on dgx-h100 " * 2
    lines = fit_title(fig, title, 9).split("\n")
    assert len(lines) > 1 and all(len(line) <= 6 * 72 / (0.55 * 9) for line in lines)
    assert fit_title(fig, "short\nsecond", 9) == "short\nsecond"
    plt.close(fig)


def test_a_4096_gpu_recipe_on_the_ecmp_fabric_is_saved_at_once_with_an_estimated_count(
        tmp_path: Path) -> None:
    """It took 455 s, printing nothing, to count ops by building 2048 ranks."""
    import time
    t0 = time.monotonic()
    proc = run_cli("plan", "-t", "h100-rail-3tier", "-n", "512", "-c", "all_reduce", "-b", "1GiB",
                   "-a", "hier", "--form", "recipe", "-o", str(tmp_path / "r.json"), "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["num_ops_estimated"] and 1e7 < info["num_ops"] < 1e8
    assert time.monotonic() - t0 < 60


def _npy_claiming(shape: tuple[int, ...], path: Path) -> None:
    """A .npy whose header claims `shape` but holds almost no data (a fuzzed router file)."""
    import io

    import numpy as np
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<i8", "fortran_order": False, "shape": shape})
    path.write_bytes(buf.getvalue() + b"\0" * 64)


@pytest.mark.parametrize("shape", [(100000, 100000, 8), (4, 2, 2)])
def test_a_router_file_that_claims_a_huge_or_missing_shape_is_one_line(tmp_path: Path, shape: tuple) -> None:
    """A header claiming a huge shape allocated it (MemoryError / a machine out of memory)."""
    path = tmp_path / "router.npy"
    _npy_claiming(shape, path)
    line = one_error_line(run_cli("workload", "moe", "--router", str(path), "--tokens", "4",
                                  "--topk", "2", "--experts", "16", "-t", "h200x4"))
    assert str(path) in line


def test_compare_offers_no_group_collectives_for_logs() -> None:
    line = one_error_line(run_cli("compare", "examples/all_reduce_perf.2node.log", "-t", "dgx-h100",
                                  "-n", "2", "-c", "group_cast"))
    assert "invalid choice: 'group_cast'" in line


def test_a_simulator_deadlock_is_one_line_and_exit_1(tmp_path: Path, capsys, monkeypatch) -> None:
    """Extreme link speeds made the simulator report a deadlock as a VerificationError
    traceback; the CLI says it in one line (exit 1: the plan, not the input, is at fault)."""
    import hiercoll.sim as sim
    from hiercoll.cli.main import main
    from hiercoll.errors import VerificationError
    plan = tmp_path / "p.json"
    assert main(["plan", "-t", "h200x4", "-c", "all_reduce", "-b", "64KiB", "-a", "ring",
                 "-o", str(plan)]) == 0
    capsys.readouterr()

    def stuck(*args: object, **kwargs: object) -> None:
        raise VerificationError("deadlock: op 0.3 and 5 others never ran")
    monkeypatch.setattr(sim, "simulate", stuck)
    assert main(["simulate", str(plan)]) == 1
    err = capsys.readouterr().err
    assert err == "error: deadlock: op 0.3 and 5 others never ran\n"


def test_calibrate_and_compare_make_nccls_choice_by_one_rule() -> None:
    """calibrate fixed NCCL's ring/tree choice with uncalibrated costs before fitting, compare
    chose again with calibrated ones, so the two disagreed on the same file. Both now keep
    the candidates and take the faster under the costs they evaluate."""
    import hiercoll as hc
    from hiercoll.calibration.measurements import load_measurements
    from hiercoll.calibration.predict import build_case, predict_us
    base = hc.load_topology("dgx-h100", nodes=2, uncalibrated=True)
    rows = [m for m in load_measurements(["examples/all_reduce_perf.2node.log"])][:6]
    costs = base.costs.model_copy(update={"launch_us": 14.0, "nic_efficiency": 0.5})
    calibrated = base.model_copy(update={"costs": costs})
    for m in rows:
        fitted = build_case(m, base)               # what calibrate builds, before the fit
        compared = build_case(m, calibrated)       # what compare builds, after it
        assert {c.meta.algorithm for c in fitted.candidates} == {"ring", "tree"}
        assert predict_us(fitted, calibrated, base) == pytest.approx(
            predict_us(compared, calibrated, calibrated), rel=1e-9)


def test_autopick_piped_prints_a_line_per_size_on_stderr() -> None:
    """A piped autopick printed nothing for minutes; --json stays a single object."""
    proc = run_cli("autopick", "-t", "h200x4", "-c", "all_reduce", "--sizes", "64KiB:1MiB:4",
                   "--no-cache")
    assert proc.returncode == 0, proc.stderr
    steps = [ln for ln in proc.stderr.splitlines() if ln.startswith("auto-picking all_reduce")]
    assert [ln.rsplit(" ", 1)[1] for ln in steps] == ["1/3", "2/3", "3/3"]
    quiet = run_cli("autopick", "-t", "h200x4", "-c", "all_reduce", "--sizes", "64KiB:1MiB:4",
                    "--no-cache", "--json")
    assert quiet.returncode == 0 and "auto-picking" not in quiet.stderr
    json.loads(quiet.stdout)


def test_piped_tables_are_capped_in_width_and_wrap_their_cells() -> None:
    """Piped, a table could grow to 1000 columns; it now wraps cells at PIPED_TABLE_WIDTH (plain
    lines, paths included, are still never folded: test_piped_output_is_not_wrapped_at_80_columns)."""
    from hiercoll.cli.common import PIPED_TABLE_WIDTH
    proc = run_cli("algorithms")
    assert proc.returncode == 0, proc.stderr
    table_lines = [ln for ln in proc.stdout.splitlines() if ln[:1] in "┏┃┡│└"]
    assert table_lines and max(len(ln) for ln in table_lines) <= PIPED_TABLE_WIDTH


def test_a_router_expert_id_past_int64_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    path.write_text('{"topk_idx": [[[9223372036854775808, 1]], [[0, 1]], [[0, 1]], [[0, 1]]]}')
    line = one_error_line(run_cli("workload", "moe", "--router", str(path), "--tokens", "1",
                                  "--topk", "2", "--experts", "16", "-t", "h200x4"))
    assert "topk_idx[0]" in line and "9223372036854775808" in line


def test_piped_workloads_and_calibrate_say_how_far_they_are(tmp_path: Path) -> None:
    """autopick / calibrate / moe printed nothing when piped."""
    work = run_cli("workload", "llama3-cp", "--cu-seqlens", "0,3,9,12,16", "-t", "dgx-h100",
                   "-n", "2", "--row-bytes", "4KiB")
    assert work.returncode == 0, work.stderr
    assert "group_cast: plans simulated: 2/2" in work.stderr
    # the fit kept to five costs (a full fit of this log runs ~10 minutes on a 2-core machine):
    # enough steps for the progress lines
    fixed = ("costs.graph.call_us,costs.eager.issue_us,costs.eager.ce_issue_us,costs.sync_us,"
             "costs.ll_unpack_us,costs.ll_launch_us,costs.ce_launch_us,intra.latency_us,"
             "costs.pull_efficiency,"
             "costs.reduce_efficiency,costs.sm_op_gbps,costs.ce_op_gbps,costs.ce_concurrent_gbps")
    cal = run_cli("calibrate", "examples/all_reduce_perf.2node.log", "-t", "dgx-h100", "-n", "2",
                  "--fix", fixed, "-o", str(tmp_path / "cal.yaml"))
    assert cal.returncode == 0, cal.stderr
    assert "calibrate: 50 simulations" in cal.stderr


def test_bench_refuses_a_graph_of_no_calls() -> None:
    line = one_error_line(run_cli("bench", "-c", "all_reduce", "-t", "h200x4", "--sizes", "8KiB",
                                  "--graph-calls", "0"))
    assert "--graph-calls: 0" in line


def test_a_calibrated_copy_accepts_the_rows_its_base_was_measured_on(tmp_path: Path) -> None:
    """Rows name a topology file by a path that does not resolve here; `compare` against a
    calibrated copy of that file refused them (the copy's fingerprint differs from the rows');
    the calibration block keeps the base's fingerprint, so they are this machine's rows."""
    import hiercoll as hc
    from hiercoll.calibration.compat import check_rows
    from hiercoll.calibration.measurements import load_measurements
    from hiercoll.calibration.workflow import calibrate, load_rows, write_topology
    from tests.helpers import ROOT
    name = "bench/gpu/topologies/h200-2node-x2.yaml"
    base = hc.load_topology(str(ROOT / name))
    rows = [{"collective": "all_reduce", "algorithm": a, "backend": "cuda", "mode": "graph",
             "world_size": 4, "topology": "elsewhere/h200-2node-x2.yaml",
             "topology_fingerprint": base.fingerprint(), "dtype": "bf16", "nbytes": n,
             "p50_us": t, "params": {}}
            for a, n, t in (("ring", 1 << 20, 40.0), ("ring", 1 << 24, 160.0),
                            ("hier", 1 << 20, 45.0), ("hier", 1 << 24, 150.0))]
    bench = tmp_path / "rows.json"
    bench.write_text(json.dumps({"rows": rows}))
    fitted = calibrate(load_rows([bench], base), base, 0.0, [str(bench)]).topology
    assert fitted.calibration is not None and fitted.calibration.base_fingerprint == base.fingerprint()
    path = tmp_path / "calibrated.yaml"
    write_topology(fitted, path)
    again = hc.load_topology(str(path))
    assert again.fingerprint() != base.fingerprint()
    check_rows(load_measurements([bench]), again)          # accepted: no error
    other = base.model_copy(update={"name": "other"})
    other = hc.Topology.model_validate(other.model_dump() | {"costs": other.costs.model_dump()
                                                             | {"launch_us": 7.0}})
    with pytest.raises(hc.HiercollError, match="does not load from here"):
        check_rows(load_measurements([bench]), other)
