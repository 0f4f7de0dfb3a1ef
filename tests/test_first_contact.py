"""First contact without surprises (issue 17 s3/s4): one test per item, named after it. Each
fails without its fix: the README's Python runs as written, verify says what it ran, bad input
is one `error:` line, the CLI describes itself, files and plots say what they hold."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import hiercoll as hc
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
