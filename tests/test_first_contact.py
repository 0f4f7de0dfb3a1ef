"""First contact without surprises (issue 17 s3/s4): one test per item, named after it. Each
fails without its fix: the README's Python runs as written, verify says what it ran, bad input
is one `error:` line, the CLI describes itself, files and plots say what they hold."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import hiercoll as hc
from hiercoll.cli.main import main
from hiercoll.plan_file import save_plan
from hiercoll.schedule import ExpandedOps, OpKind, Schedule
from tests.helpers import ROOT
from tests.helpers import one_error_line as _one_error_line
from tests.helpers import run_cli as _hc


def _readme_python() -> str:
    """The first python block of the README's "## Python API" section."""
    text = (ROOT / "README.md").read_text()
    assert "## Python API" in text, "README.md lost its '## Python API' section"
    blocks = re.findall(r"```python\n(.*?)```", text.split("## Python API", 1)[1], re.S)
    assert blocks, "README.md's Python API section has no ```python block"
    return blocks[0]


# ---- README snippet ---------------------------------------------------------------------------
def test_readme_python_snippet_runs_as_written():
    """The block is taken from README.md itself, so the README cannot drift from the API."""
    code = _readme_python()
    assert "inputs =" in code.split("hc.execute")[0], "the snippet must define `inputs` before use"
    names: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), names)   # noqa: S102 - the README is ours
    assert names["report"].ok and names["report"].reduced_by > 1   # 64 MiB x 16: reduced copy
    outs, inputs = names["outs"], names["inputs"]
    assert np.allclose(outs[3], np.sum(inputs, axis=0), rtol=0.02)


# ---- verify: a size-reduced copy, or a loud skip ------------------------------------------------
def _avg_as_sum(s: Schedule) -> Schedule:
    ops = [[dataclasses.replace(o, scale=1.0) if o.kind == OpKind.REDUCE else o
            for o in s.rank_ops(r)] for r in range(s.world_size)]
    return Schedule(s.meta, ExpandedOps(tuple(tuple(o) for o in ops),
                                        tuple(dict(s.buffers(r)) for r in range(s.world_size))))


def test_verify_large_plan_runs_size_reduced_copy_and_still_catches_errors():
    topo = hc.load_topology("dgx-h100", nodes=2)
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=16, nbytes=64 << 20, reduce_op="avg")
    good = hc.plan(topo, spec, "hier", {"chunks": 4}).expand()
    seed = int(np.random.default_rng().integers(1 << 30))
    report = hc.verify(good, trials=2, seed=seed, max_memory=64 << 20)
    assert report.ok and report.reduced_by > 1 and "size-reduced" in report.how
    bad = hc.verify(_avg_as_sum(good), trials=1, seed=seed, max_memory=64 << 20)
    assert not bad.ok and bad.reduced_by > 1      # summing instead of averaging: seen on the copy


def test_verify_cli_says_reduced_copy_and_exits_3_when_skipped(tmp_path):
    topo = hc.load_topology("h200x4")
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=4, nbytes=16 << 20)
    path = tmp_path / "p.json"
    save_plan(path, hc.plan(topo, spec, "ring", {}).expand(), topo)
    reduced = _hc("verify", str(path), "--max-memory", "1MiB")
    assert reduced.returncode == 0 and "size-reduced copy" in reduced.stdout, reduced
    skipped = _hc("verify", str(path), "--max-memory", "0")
    assert skipped.returncode == 3 and "SKIPPED" in skipped.stderr, skipped
    assert _hc("verify", str(path), "--max-memory", "0", "--allow-skip").returncode == 0


# ---- bad input: one line ------------------------------------------------------------------------
@pytest.mark.parametrize("factor", ["foo", "1.5", "-2", "1"])
def test_sizes_with_bad_factor_is_one_error_line(factor):
    line = _one_error_line(_hc("autopick", "-t", "h200x4", "-c", "all_reduce",
                               "--sizes", f"4KiB:1MiB:{factor}", "--no-cache"))
    assert "--sizes" in line and "FACTOR" in line


def test_unknown_param_lists_the_algorithms_parameters_with_defaults(tmp_path):
    line = _one_error_line(_hc("plan", "-t", "dgx-h100", "-c", "all_reduce", "-b", "1MiB", "-a",
                               "hier", "-p", "chunk=4", "-o", str(tmp_path / "p.json")))
    assert "chunk: unknown field" in line and "topo schema" not in line
    assert "chunks=1" in line and "channels=1" in line and "node_swizzle=True" in line


# ---- make demo ----------------------------------------------------------------------------------
def test_make_demo_compares_hier_with_the_8_channel_ring():
    demo = (ROOT / "Makefile").read_text().split("\ndemo:")[1].split("\n\n")[0]
    plans = [ln for ln in demo.splitlines() if " plan " in ln]
    assert any("-a hier" in ln for ln in plans)
    ring = [ln for ln in plans if "-a ring" in ln]
    assert ring and all("channels=8" in ln for ln in ring), ring


# ---- the CLI describes itself -------------------------------------------------------------------
def test_algorithms_command_lists_algorithms_collectives_and_parameters(capsys):
    assert main(["algorithms", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["algorithms"]}
    assert {"ring", "direct", "two_shot", "hier", "hier_2d", "nccl"} <= set(rows)
    assert rows["two_shot"]["collectives"] == ["all_reduce"]
    assert rows["hier"]["params"]["chunks"]["default"] == 1
    assert rows["hier_2d"]["params"]["inter"]["default"] == "ring"
    assert main(["algorithms"]) == 0
    out = capsys.readouterr().out
    assert "hier_2d" in out and "node_swizzle=True" in out


def test_version_flag():
    proc = _hc("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"hiercoll {hc.__version__}"


def test_help_shows_defaults_and_collective_choices():
    out = _hc("plan", "--help").stdout
    flat = " ".join(out.split())
    assert "(default: bf16)" in flat and "(default: auto)" in flat and "(default: expanded)" in flat
    assert "all_reduce, all_to_all, broadcast" in flat     # --collective lists its choices
    assert "(default: None)" not in flat and "(default: False)" not in flat


def _leaf_commands(parser, path=()):
    import argparse
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaf_commands(sub, (*path, name))


def test_every_reporting_command_takes_json(capsys):
    from hiercoll.cli.main import build_parser
    missing = [" ".join(path) for path, p in _leaf_commands(build_parser())
               if not any("--json" in a.option_strings for a in p._actions)]
    assert missing == []
    assert main(["topo", "schema", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "properties" in json.loads(out)


def test_piped_output_is_not_wrapped_at_80_columns(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    out = deep / "plan.json"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = _hc("plan", "-t", "h200x4", "-c", "all_reduce", "-b", "1MiB", "-a", "ring",
               "-o", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and str(out) in lines[0], lines
    table = _hc("simulate", str(out), env=env).stdout      # one row per field, none folded
    assert sum("of bound" in ln and "cut" in ln for ln in table.splitlines()) == 1, table


def test_plan_message_prints_no_python_reprs(tmp_path):
    proc = _hc("plan", "-t", "dgx-h100", "-c", "all_reduce", "-b", "64MiB", "-a", "hier",
               "-o", str(tmp_path / "p.json"))
    assert proc.returncode == 0, proc.stderr
    for repr_bit in ("{'", "True", "None", "<Kind", "Kind."):
        assert repr_bit not in proc.stdout, proc.stdout
    assert "node_swizzle=true" in proc.stdout and "64MiB" in proc.stdout


# ---- core install without extras ----------------------------------------------------------------
_WITHOUT = ("import sys\nfor m in {mods!r}: sys.modules[m] = None\n"
            "from hiercoll.cli.main import main\nsys.exit(main(sys.argv[1:]))")


@pytest.mark.parametrize("command,missing,extra", [
    (["simulate", "{plan}", "--png", "{tmp}/t.png"], ("matplotlib",), "plot"),
    (["run", "{plan}", "--backend", "gloo"], ("torch", "triton"), "torch"),
    (["bench", "-t", "h200x4", "-c", "all_reduce", "--sizes", "1MiB", "--backend", "gloo"],
     ("torch", "triton"), "torch"),
])
def test_core_install_without_extras_names_the_extra_to_install(tmp_path, command, missing, extra):
    plan = tmp_path / "p.json"
    assert main(["plan", "-t", "h200x4", "-c", "all_reduce", "-b", "1MiB", "-a", "ring",
                 "-o", str(plan)]) == 0
    argv = [a.format(plan=plan, tmp=tmp_path) for a in command]
    proc = subprocess.run([sys.executable, "-c", _WITHOUT.format(mods=missing), *argv],
                          capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)
    line = _one_error_line(proc)
    assert f"pip install 'hiercoll[{extra}]'" in line and "ModuleNotFound" not in line
    assert not (tmp_path / "t.png").exists()


def test_pyproject_declares_triton_in_cuda_extra_drops_unused_and_uses_spdx_license():
    import tomllib
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project, extras = meta["project"], meta["project"]["optional-dependencies"]
    assert any(d.startswith("triton") for d in extras["cuda"])
    assert any(d.startswith("torch") for d in extras["cuda"])
    # a CUDA build of torch pins its own triton (torch 2.13.0: 3.7.1): an extra that pins another
    # makes `pip install torch -e .[dev]` unresolvable anywhere but a machine with a CPU build
    pins = [d for ds in extras.values() for d in ds if d.replace(" ", "").startswith("triton==")]
    assert pins == [], pins
    assert project["license"] == "Apache-2.0"                 # PEP 639 string, not {text=...}
    assert not any("pytest-timeout" in d for d in extras["dev"])   # nothing uses it
    assert project["requires-python"] == ">=3.11"             # datetime.UTC, StrEnum, tomllib
    from hiercoll.cli.common import EXTRAS
    assert set(EXTRAS.values()) <= set(extras)                # every extra a message names exists


# ---- tuning files and the simulation cache ----------------------------------------------------
def test_tuning_file_schema_version_is_checked(tmp_path):
    tuning = tmp_path / "tuning.json"
    tuning.write_text(json.dumps({"schema_version": 2, "tables": []}))
    line = _one_error_line(_hc("plan", "-t", "h200x4", "-c", "all_reduce", "-b", "1MiB",
                               "--tuning", str(tuning), "-o", str(tmp_path / "p.json")))
    assert "schema_version" in line and "2" in line and "autopick" in line


def test_sim_cache_is_keyed_on_versions_and_safe_with_two_writers(tmp_path, monkeypatch):
    from hiercoll.planner.search.autopick import SimCache
    from hiercoll.planner.search.candidates import Candidate
    topo = hc.load_topology("h200x4")
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=4, nbytes=1 << 20)
    cand = Candidate("ring", {"chunks": 1, "channels": 1})
    key = SimCache.key(topo, spec, cand)
    monkeypatch.setattr(hc, "__version__", hc.__version__ + ".post1")
    assert SimCache.key(topo, spec, cand) != key
    monkeypatch.undo()
    monkeypatch.setattr(SimCache, "MODEL_VERSION", SimCache.MODEL_VERSION + 1)
    assert SimCache.key(topo, spec, cand) != key
    monkeypatch.undo()
    path = tmp_path / "cache.json"
    writer = ("import sys\nfrom pathlib import Path\nfrom hiercoll.planner.search.autopick import SimCache\n"
              "for i in range(60):\n    c = SimCache(Path(sys.argv[1]))\n"
              "    c.put(f'{sys.argv[2]}{i}', [1.0, 2.0, 3.0])\n    c.save()\n")
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(path), tag]) for tag in "ab"]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    data = json.loads(path.read_text())                       # never a torn or mixed file
    assert data and all(v == [1.0, 2.0, 3.0] for v in data.values())
    assert any(k.startswith("a") for k in data) and any(k.startswith("b") for k in data)


# ---- bench files --------------------------------------------------------------------------------
def test_bench_rows_keep_full_precision_and_round_only_when_printed():
    from hiercoll.executor.interface import Mode
    from hiercoll.harness.bench import Timing, make_row
    from hiercoll.harness.results import markdown
    topo = hc.load_topology("h200x4")
    s = hc.plan(topo, hc.CollectiveSpec(kind="all_reduce", world_size=4, nbytes=1 << 20), "ring", {})
    p50 = float(np.random.default_rng().uniform(10, 20)) + 1e-7      # digits past the 2nd decimal
    row = make_row(s, "gloo", Mode.EAGER, "h200x4", Timing(p50, p50 * 1.1, p50 * 1.2, 7)).to_json()
    assert row["p50_us"] == p50 and row["busbw_gbps"] == s.spec.bandwidths_gbps(p50)[1]
    table = markdown({"provenance": {"command": "hiercoll bench", "date_utc": "x", "torch": "t"},
                      "rows": [row]})
    assert f"| {p50:.2f} |" in table and str(p50) not in table


def test_bench_git_sha_is_hiercolls_own_checkout(tmp_path, monkeypatch):
    from hiercoll.harness.results import git_sha
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    other = tmp_path / "elsewhere"
    other.mkdir()
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    monkeypatch.chdir(other)            # a bench run from another repository
    monkeypatch.delenv("HIERCOLL_GIT_SHA", raising=False)
    assert (git_sha() or "").split("-")[0] == head
    # a copy whose .git is stale (the lent GPU machines) is named by its caller
    monkeypatch.setenv("HIERCOLL_GIT_SHA", "3ac7be3")
    assert git_sha() == "3ac7be3"


def test_bench_library_row_is_labelled_by_the_backend_that_ran_it(tmp_path):
    dist = pytest.importorskip("torch.distributed")

    from hiercoll.executor.library import LibraryBackend
    from hiercoll.harness.results import row_label
    from hiercoll.planner.search.library import load_library_table
    from tests.helpers import small_topology
    topo = small_topology(1, 1)
    s = hc.plan(topo, hc.CollectiveSpec(kind="all_reduce", world_size=1, nbytes=4096), "nccl")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        prepared = LibraryBackend().prepare(s)
    finally:
        dist.destroy_process_group()
    assert prepared.ran_on == "gloo"
    row = {"algorithm": "nccl", "backend": prepared.ran_on, "collective": "all_reduce",
           "mode": "eager", "world_size": 1, "topology": "t", "nbytes": 4096, "p50_us": 9.0}
    assert row_label(row) == "gloo (library call)"
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"provenance": {}, "rows": [row]}))
    with pytest.raises(hc.HiercollError, match="through gloo"):
        load_library_table(bench)          # gloo's times never stand in for NCCL's


# ---- plots and traces ---------------------------------------------------------------------------
def test_planner_sweep_plot_labels_the_bound_a_busbw_ceiling_on_a_log_size_axis(tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import planner_sweep
    figs = []
    monkeypatch.setattr("hiercoll.files.save_figure", lambda fig, path, dpi=None: figs.append(fig))
    sizes = [64 << 10 << (2 * i) for i in range(8)]
    rows = [{"nodes": 2, "collective": k.value, "bytes": b, "autopick": "ring",
             "lower_bound_busbw_gbps": 300.0, "algorithms": {"ring": {"busbw_gbps": 100.0}}}
            for k in planner_sweep.KINDS for b in sizes]
    planner_sweep.plot({"rows": rows, "preset": "dgx-h100"}, str(tmp_path / "sweep"))
    (fig,) = figs
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("ceiling" in t for t in labels) and "lower bound" not in labels
    ax = fig.axes[2]                                          # bottom row: the labelled axis
    assert ax.get_xscale() == "log" and len(ax.get_xticks()) == 8
    assert [t.get_text() for t in ax.get_xticklabels()][:2] == ["64KiB", "256KiB"]
    with pytest.raises(SystemExit, match="at least"):            # 4 points: too few to read
        planner_sweep.plot({"rows": [r for r in rows if r["bytes"] in sizes[::2]],
                            "preset": "dgx-h100"}, str(tmp_path / "few"))


def test_trace_names_channels_draws_cross_rank_flows_notes_representatives_and_uses_us():
    from hiercoll.sim.trace import chrome_trace
    topo = hc.load_topology("dgx-h100", nodes=2)
    s = hc.plan(topo, hc.CollectiveSpec(kind="reduce_scatter", world_size=16, nbytes=16 << 20),
                "hier", {"channels": 2, "chunks": 2})
    res = hc.simulate(s, topo, record=True)
    trace = chrome_trace(s, res)
    ev = trace["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert threads[(res.ranks_simulated[0], 1)] == "channel 1"
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = [e for e in ev if e["ph"] == "f"]
    assert ends and all(starts[e["id"]]["pid"] != e["pid"] for e in ends)   # across ranks only
    assert all(starts[e["id"]]["ts"] <= e["ts"] for e in ends)
    assert len(res.ranks_simulated) < 16 and trace["otherData"]["note"]
    assert any(e["ph"] == "i" and "representative ranks only" in e["name"] for e in ev)
    assert trace["displayTimeUnit"] == "ms" and trace["otherData"]["timestamps"] == "us"
    exact = chrome_trace(s, hc.simulate(s, topo, mode="exact"))
    assert exact["otherData"]["note"] is None


# ---- recipes are cheap to write -----------------------------------------------------------------
def test_plan_recipe_on_128_ranks_builds_one_node_of_ranks_not_all_twice(tmp_path, monkeypatch):
    from hiercoll.planner.context import PlanContext
    built: list[int] = []
    real = PlanContext.build
    monkeypatch.setattr(PlanContext, "build", lambda self, rank: built.append(rank) or real(self, rank))
    out = tmp_path / "r.json"
    assert main(["plan", "-t", "dgx-h100", "-n", "16", "-c", "all_reduce", "-b", "64MiB", "-a",
                 "hier", "-p", "chunks=4", "--form", "recipe", "-o", str(out), "--json"]) == 0
    assert len(built) <= 8, len(built)
    small = hc.plan(hc.load_topology("dgx-h100", nodes=2),
                    hc.CollectiveSpec(kind="all_reduce", world_size=16, nbytes=1 << 20), "hier", {})
    from hiercoll.cli.plan_cmd import op_count
    assert op_count(small) == small.expand().num_ops        # the symmetric count is the count


def test_bench_refuses_an_unknown_peer_in_one_line():
    line = _one_error_line(_hc("bench", "-c", "all_reduce", "-t", "h200x4", "--sizes", "8KiB",
                               "--peers", "nccl,mpi"))
    assert "--peers" in line and "'mpi'" in line and "torch-one-shot" in line


def test_the_makefile_pins_one_torch_release_and_prefers_its_cpu_build():
    """A clean machine must not pull GBs of CUDA wheels for a CPU test run: torch is pinned,
    the CPU build is tried first (disk, then PyTorch's CPU index), PyPI's build last."""
    text = (ROOT / "Makefile").read_text()
    pins = dict(re.findall(r"^(TORCH_\w+) \?= (\S+)$", text, re.M))
    assert pins["TORCH_CPU"] == "torch==2.13.0+cpu" and pins["TORCH_PYPI"] == "torch==2.13.0"
    recipe = text[text.index("$(VENV)/.installed:"):text.index("install: $(VENV)/.installed")]
    assert recipe.index('"$(TORCH_CPU)"') < recipe.index("TORCH_CPU_INDEX") < recipe.index('"$(TORCH_PYPI)"')
