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
from pathlib import Path

import numpy as np
import pytest

import hiercoll as hc
from hiercoll.cli.main import main
from hiercoll.plan_file import save_plan
from hiercoll.schedule import ExpandedOps, OpKind, Schedule

ROOT = Path(__file__).resolve().parents[1]


def _hc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hiercoll", *args], capture_output=True,
                          text=True, timeout=600, check=False, cwd=ROOT, env=env)


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def _readme_python() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README.md has no ```python block"
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
