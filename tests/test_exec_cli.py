"""`hiercoll run/stress/bench` from the command line: argument errors (one line, exit 2) in
process, and real torchrun launches of the gloo backend on 2 CPU processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hiercoll.cli.main import main
from hiercoll.collectives import CollectiveSpec
from hiercoll.errors import HiercollError
from hiercoll.plan_file import save_plan
from hiercoll.planner import plan
from hiercoll.topology import Topology, preset


def _topo2() -> Topology:
    data = preset("h200x4").model_dump(mode="json")
    data.update(name="cpu2", num_nodes=1, gpus_per_node=2)
    data["inter"] = dict(data["inter"], num_nics=2, nic_affinity=[0, 1])
    return Topology.model_validate(data)


@pytest.fixture()
def plan_file(tmp_path: Path) -> Path:
    topo = _topo2()
    s = plan(topo, CollectiveSpec(kind="all_reduce", world_size=2, nbytes=2 * 1001), "ring")
    path = tmp_path / "plan.json"
    save_plan(path, s, topo)
    return path


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _torchrun(*args: str, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={nproc}", "-m", "hiercoll", *args],
                          capture_output=True, text=True, env=env, timeout=120, check=False)


HAS_CUDA = _has_cuda()


def test_import_needs_no_torch():
    code = ("import sys, hiercoll, hiercoll.executor, hiercoll.executor.cuda.lowering, "
            "hiercoll.executor.cuda.emulate, hiercoll.executor.backends, hiercoll.cli.main;"
            "hiercoll.cli.main.build_parser(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("argv", "match"), [
    (["run", "{plan}", "--iters", "0"], "--iters: 0 must be >= 1"),
    (["stress", "{plan}", "--sizes", "1KiB", "--shapes", "4"], "give one of them"),
    (["stress", "--collective", "all_reduce"], "give a plan file, or --collective and --topology"),
    (["stress", "{plan}", "--modes", "fast"], "--modes: 'fast' should be eager or graph"),
    (["stress", "{plan}", "--one-gpu"], "--one-gpu: needs --backend cuda"),
    (["stress", "{plan}", "--one-gpu", "--backend", "cuda", "--reference", "library"],
     "--reference library: the library needs one process per GPU"),
    pytest.param(["stress", "{plan}", "--one-gpu", "--backend", "cuda"], "--one-gpu: needs a CUDA",
                 marks=pytest.mark.skipif(HAS_CUDA, reason="a GPU is visible")),
    (["bench", "--collective", "all_reduce", "-t", "h200x4", "--modes", "slow"], "--modes"),
    (["run", "{plan}", "--backend", "cuda", "--ce-threshold", "lots"], "--ce-threshold"),
    (["run", "missing.json"], "missing.json: cannot read"),
])
def test_argument_errors_are_one_line_and_exit_2(argv, match, plan_file, capsys):
    rc = main([a.replace("{plan}", str(plan_file)) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2 and match in err and err.count("\n") == 1


def test_run_checks_every_call_against_numpy_under_torchrun(plan_file):
    proc = _torchrun("run", str(plan_file), "--backend", "gloo", "--check", "--iters", "3",
                     "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["iterations"] == 3 and report["algorithm"] == "ring"
    assert 0 < report["max_abs_error"] <= report["bound"]


def test_a_comma_list_of_collectives_sweeps_each_in_turn():
    """`-c all_reduce,all_gather`: one process runs a whole comparison (one start-up), each
    collective's cases in the order given, and a plan file still names its own."""
    from hiercoll.harness.sweep import SweepRequest, cases_for
    req = SweepRequest(collective="all_reduce,all_gather", topology="h200x4",
                       algorithms="ring,direct", sizes=[1 << 20, 1 << 24])
    cases = cases_for(req)
    got = [(c.schedule.spec.kind.value, c.algorithm, c.schedule.spec.total_bytes) for c in cases]
    assert got == [(k, a, n) for k in ("all_reduce", "all_gather") for n in (1 << 20, 1 << 24)
                   for a in ("ring", "direct")]
    # an algorithm runs where it applies: hier_2d has no all-to-all
    mixed = cases_for(SweepRequest(collective="all_to_all,reduce_scatter", topology="h200x4",
                                   algorithms="hier_2d,hier", sizes=[1 << 20]))
    assert [(c.schedule.spec.kind.value, c.algorithm) for c in mixed] == [
        ("all_to_all", "hier"), ("reduce_scatter", "hier_2d"), ("reduce_scatter", "hier")]
    with pytest.raises(HiercollError, match="applies to none of"):
        cases_for(SweepRequest(collective="all_to_all,broadcast", topology="h200x4",
                               algorithms="hier_2d", sizes=[1 << 20]))


def test_a_misspelt_collective_in_the_list_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "-c", "all_reduce,allgather", "-t", "h200x4"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "allgather: choose from" in err and err.count("\n") == 1


def test_bench_writes_rows_table_and_plot(tmp_path):
    topo_file = tmp_path / "t.json"
    topo_file.write_text(_topo2().model_dump_json())
    proc = _torchrun("bench", "--backend", "gloo", "-c", "all_gather", "-t", str(topo_file),
                     "--sizes", "4KiB,64KiB", "--algorithms", "direct,nccl", "--iters", "3",
                     "--out", str(tmp_path / "res"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = json.loads((tmp_path / "res" / "all_gather-w2.json").read_text())
    rows = body["rows"]
    assert {(r["algorithm"], r["nbytes"]) for r in rows} == {
        (a, n) for a in ("direct", "nccl") for n in (4096, 65536)}
    for r in rows:   # CPU times are long: bandwidths may round to 0.0, so check the formula
        assert r["mode"] == "eager" and r["p50_us"] > 0
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] / 2, abs=0.011)
    assert body["provenance"]["command"].startswith("hiercoll bench")
    assert (tmp_path / "res" / "all_gather-w2.md").read_text().count("| direct |") == 2
    assert (tmp_path / "res" / "all_gather-w2.png").stat().st_size > 1000


def test_the_auto_reference_of_a_group_collective_is_numpy_at_any_size():
    """The device reference covers the four flat collectives: a large group-cast keeps numpy."""
    from types import SimpleNamespace

    from hiercoll.cli.stress_cmd import AUTO_NUMPY_LIMIT, _auto_reference
    from hiercoll.collectives import Kind
    from hiercoll.harness.inputs import RefKind

    def spec(kind: Kind, nbytes: int):  # type: ignore[no-untyped-def]
        return SimpleNamespace(kind=kind, total_bytes=nbytes)
    big = 4 * AUTO_NUMPY_LIMIT
    assert _auto_reference(spec(Kind.ALL_REDUCE, big), "cuda") == RefKind.DEVICE
    assert _auto_reference(spec(Kind.ALL_REDUCE, big), "cpu") == RefKind.NUMPY
    assert _auto_reference(spec(Kind.ALL_REDUCE, 8192), "cuda") == RefKind.NUMPY
    for kind in (Kind.GROUP_CAST, Kind.GROUP_REDUCE):
        assert _auto_reference(spec(kind, big), "cuda") == RefKind.NUMPY


def test_compare_says_a_size_band_without_rows_has_none(capsys):
    """A bench of sizes >= 1 MiB only: the small band has no rows, said so (not "nan%")."""
    root = Path(__file__).resolve().parents[1]
    bench = root / "bench/results/gpu/nvshmem/w4-2x2-graph/bench-nvshmem/all_gather-all_reduce-all_to_all-w4.json"
    topo = root / "bench/gpu/topologies/h200-2node-x2.yaml"
    assert main(["compare", "-t", str(topo), str(bench)]) == 0
    out = capsys.readouterr().out
    assert "smaller no rows" in out and "nan" not in out
