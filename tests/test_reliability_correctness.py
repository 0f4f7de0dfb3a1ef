"""Nothing wrong accepted (issue 15, section 1): wrong scales, wrong transports, a recipe for
another topology or without a size, a library table of another machine, a missing tuning file."""

from __future__ import annotations

import dataclasses
import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

import hiercoll as hc
from hiercoll.errors import HiercollError
from hiercoll.plan_file import load_plan, plan_from_dict, plan_to_json, save_plan
from hiercoll.schedule import ExpandedOps, OpKind, Schedule
from hiercoll.sim import check
from hiercoll.sim.symbolic import exact_scale
from tests.helpers import one_error_line as _one_error_line
from tests.helpers import run_cli as _hc


def _topo16() -> hc.Topology:
    return hc.load_topology("dgx-h100", nodes=2)


def _plan(kind: str = "all_reduce", algo: str = "ring", op: str = "sum", elems: int = 16 * 64,
          **params: int) -> tuple[Schedule, hc.Topology]:
    topo = _topo16()
    spec = hc.CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="bf16",
                             nbytes=2 * elems, reduce_op=op)
    return hc.plan(topo, spec, algo, params).expand(), topo


def _map_ops(s: Schedule, fn) -> Schedule:
    """The schedule with every op replaced by fn(op) (see _edit in tests/test_sim_check.py)."""
    ops = [[fn(o) for o in s.rank_ops(r)] for r in range(s.world_size)]
    return Schedule(s.meta, ExpandedOps(tuple(map(tuple, ops)),
                                        tuple(s.buffers(r) for r in range(s.world_size))))


def _rescale(s: Schedule, factor: float | None = None, to: float | None = None) -> Schedule:
    def fix(o):
        if o.kind != OpKind.REDUCE:
            return o
        return dataclasses.replace(o, scale=to if to is not None else o.scale * factor)
    return _map_ops(s, fix)


# ---- 1. scale: symbolic weights, exact numeric pass -------------------------------------------
def test_exact_scale_reads_the_rational_a_float_stands_for():
    assert exact_scale(1.0) == 1 and exact_scale(1 / 3) == Fraction(1, 3)
    assert exact_scale(1 / 16) == Fraction(1, 16) and exact_scale(1 / 4096) == Fraction(1, 4096)
    assert exact_scale(1.02 / 16) == Fraction(51, 800)
    assert exact_scale(1 / 3 * (1 + 2**-40)) != Fraction(1, 3)


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("algo", ["ring", "hier", "two_shot"])
def test_wrong_scale_fails_both_checks(op, algo):
    """16-rank bf16 all-reduce, every reduce's scale x1.02: outputs ~2% off. The rounded bound
    (~6.6% of sum|x|) let it pass 20/20 seeds; the weights and the exact pass do not."""
    s, _ = _plan(algo=algo, op=op)
    assert check(s).ok and hc.verify(s, trials=3, seed=0).ok
    bad = _rescale(s, factor=1.02)
    report = check(bad)
    assert not report.ok
    assert any("postcondition" in p and "check the reduces' scale" in p for p in report.problems), \
        report.problems
    for seed in range(5):
        v = hc.verify(bad, trials=1, seed=seed)
        assert not v.ok, (seed, v)


def test_one_percent_off_in_one_reduce_is_caught():
    s, _ = _plan(algo="ring", op="avg")
    target = next(o for r in range(s.world_size) for o in s.rank_ops(r)
                  if o.kind == OpKind.REDUCE and o.scale != 1.0)
    bad = _map_ops(s, lambda o: dataclasses.replace(o, scale=o.scale * 1.01) if o is target else o)
    assert not check(bad).ok
    v = hc.verify(bad, trials=1, seed=3)
    assert not v.ok and v.mismatch is not None and v.mismatch.rank == target.dst.rank
    assert v.mismatch.exact, "the rounded pass's bound hides 1%; the exact pass must find it"


def test_avg_that_returns_the_sum_fails_the_symbolic_check():
    s, _ = _plan(algo="ring", op="avg")
    as_sum = _rescale(s, to=1.0)
    problems = check(as_sum).problems
    assert problems and "weigh 1 instead of 1/16" in problems[0], problems


def test_avg_plans_check_clean_with_exact_weights():
    for kind, algo in [("all_reduce", "hier"), ("all_reduce", "hier_2d"), ("reduce_scatter", "hier"),
                       ("reduce_scatter", "direct"), ("all_reduce", "two_shot"), ("reduce", "direct")]:
        s, _ = _plan(kind=kind, algo=algo, op="avg")
        report = check(s)
        assert report.ok, (kind, algo, report.problems)
        assert hc.verify(s, trials=2, seed=1).ok, (kind, algo)


def test_group_reduce_avg_weighs_each_source_by_its_split():
    topo = hc.load_topology("dgx-h100", nodes=1)
    w = topo.world_size
    ranks = [{"input": [{"size": 4, "peers": [(r + 1) % w]}],
              "output": [{"size": 4, "peers": [(r - 1) % w]}]} for r in range(w)]
    for r in (1, 2, 3):            # rank 0's second output split sums three sources
        ranks[r]["input"].append({"size": 3, "peers": [0]})
    ranks[0]["output"].append({"size": 3, "peers": [1, 2, 3]})
    splits = {"ranks": ranks}
    spec = hc.CollectiveSpec(kind="group_reduce", world_size=w, dtype="fp32", reduce_op="avg",
                             splits=splits)
    s = hc.plan(topo, spec, "direct", {}).expand()
    assert check(s).ok and hc.verify(s, trials=2, seed=0).ok
    bad = _rescale(s, factor=1.02)
    assert not check(bad).ok and not hc.verify(bad, trials=1, seed=0).ok


def test_verify_cli_without_reference_fails_an_avg_returning_the_sum(tmp_path):
    s, topo = _plan(algo="ring", op="avg")
    path = tmp_path / "as_sum.json"
    save_plan(path, _rescale(s, to=1.0), topo)
    proc = _hc("verify", str(path), "--max-memory", "0")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "reference executor SKIPPED" in proc.stderr and "instead of 1/16" in proc.stdout
    good = tmp_path / "good.json"
    save_plan(good, s, topo)
    assert _hc("verify", str(good), "--max-memory", "0").returncode == 3   # skipped is not a pass
    assert _hc("verify", str(good), "--max-memory", "0", "--allow-skip").returncode == 0


# ---- 2. transport comes from the topology -----------------------------------------------------
def _expanded_json(tmp_path: Path, nodes: int = 2) -> tuple[dict, Path]:
    topo = hc.load_topology("dgx-h100", nodes=nodes)
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=topo.world_size, dtype="bf16", nbytes=4096)
    s = hc.plan(topo, spec, "hier", {}).expand()
    return json.loads(plan_to_json(s, topo)), tmp_path / "plan.json"


def _first_op(data: dict, transport: str) -> tuple[int, int, dict]:
    return next((r, i, op) for r, rk in enumerate(data["ranks"]) for i, op in enumerate(rk["ops"])
                if op["transport"] == transport)


def test_intra_op_marked_inter_is_refused_naming_the_op(tmp_path):
    data, path = _expanded_json(tmp_path)
    r, i, op = _first_op(data, "intra")
    peer = next(s[0] for s in op["srcs"] if s[0] != op["dst"][0])
    op["transport"] = "inter"
    path.write_text(json.dumps(data))
    want = (f"op {r}.{i}: transport 'inter' but ranks {op['dst'][0]} and {peer} share a node in "
            "this topology; re-plan or fix the file")
    with pytest.raises(HiercollError, match=re.escape(want)):
        load_plan(path)
    line = _one_error_line(_hc("verify", str(path)))
    assert line.endswith(want), line


@pytest.mark.parametrize("stored,found,why", [("inter", "intra", "are on different nodes"),
                                              ("inter", "local", "are on different nodes"),
                                              ("intra", "inter", "share a node"),
                                              ("local", "inter", "all its regions are on rank"),
                                              ("intra", "local", "share a node")])
def test_every_wrong_tier_is_refused(tmp_path, stored, found, why):
    """`stored` is what the planner wrote (the topology's tier), `found` what the file says."""
    data, path = _expanded_json(tmp_path)
    *_, op = _first_op(data, stored)
    op["transport"] = found
    with pytest.raises(HiercollError, match=f"transport '{found}' but .*{why}"):
        plan_from_dict(data, "plan.json")


def test_planned_plans_load_with_their_transports(tmp_path):
    data, path = _expanded_json(tmp_path)
    path.write_text(json.dumps(data))
    assert load_plan(path).schedule.num_ops > 0


# ---- 3. recipes: fingerprint and size ---------------------------------------------------------
def _recipe(kind: str = "all_reduce", **spec_kw) -> dict:
    topo = hc.load_topology("dgx-h100", nodes=1)
    spec = hc.CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="bf16", **spec_kw)
    s = hc.plan(topo, spec, "direct", {})
    return json.loads(plan_to_json(s, topo, "recipe"))


def test_recipe_with_another_fingerprint_is_refused(tmp_path):
    data = _recipe(nbytes=4096)
    assert plan_from_dict(data, "r.json").schedule.spec.nbytes == 4096
    data["meta"]["topology_fingerprint"] = "0123456789abcdef"
    with pytest.raises(HiercollError, match="meta.topology_fingerprint '0123456789abcdef' does not "
                       "match the embedded topology"):
        plan_from_dict(data, "r.json")
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    assert "does not match the embedded topology" in _one_error_line(_hc("verify", str(path)))


def test_recipe_without_a_fingerprint_is_refused():
    data = _recipe(nbytes=4096)
    del data["meta"]["topology_fingerprint"]
    with pytest.raises(HiercollError, match="meta.topology_fingerprint: required field is missing"):
        plan_from_dict(data, "r.json")


def test_recipe_without_nbytes_is_refused(tmp_path):
    data = _recipe(nbytes=4096)
    del data["meta"]["spec"]["nbytes"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(HiercollError, match="meta.spec.nbytes: required field is missing"):
        load_plan(path)
    assert "meta.spec.nbytes" in _one_error_line(_hc("verify", str(path)))


def test_recipe_with_a_bad_spec_is_one_line(tmp_path):
    data = _recipe(nbytes=4096)
    data["meta"]["spec"]["dtype"] = "int3"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    assert "meta.spec: dtype" in _one_error_line(_hc("verify", str(path)))


def test_group_recipe_needs_no_nbytes():
    w = 8
    splits = {"ranks": [{"input": [{"size": 5, "peers": [(r + 1) % w]}],
                         "output": [{"size": 5, "peers": [(r - 1) % w]}]} for r in range(w)]}
    data = _recipe("group_cast", splits=splits)
    data["meta"]["spec"].pop("nbytes", None)
    plan = plan_from_dict(data, "r.json")
    assert plan.schedule.spec.total_bytes == 10


# ---- 4. a library table of another machine ----------------------------------------------------
SHIPPED_TABLE = str(Path(hc.__file__).parent / "data" / "nccl_h200x4.json")


def test_library_table_of_another_shape_is_refused():
    line = _one_error_line(_hc("autopick", "-t", "one-gpu-h200x4", "-c", "all_reduce", "--sizes", "4KiB",
                               "--no-cache", "--json", "--library-table", SHIPPED_TABLE))
    assert "--library-table" in line and "measured on h200x4" in line and "machine shape" in line


def test_library_table_of_another_topology_file_is_refused(tmp_path):
    table = json.loads(Path(SHIPPED_TABLE).read_text())
    table["shape_fingerprint"] = None
    table["topology_fingerprint"] = "0123456789abcdef"
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    line = _one_error_line(_hc("autopick", "-t", "h200x4", "-c", "all_reduce", "--sizes", "4KiB",
                               "--no-cache", "--library-table", str(path)))
    assert "topology fingerprint 0123456789abcdef" in line


def test_library_table_of_this_machine_is_used():
    proc = _hc("autopick", "-t", "h200x4", "-c", "all_reduce", "--sizes", "4KiB", "--no-cache",
               "--json", "--library-table", SHIPPED_TABLE)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["library_table"]["mode"] == "eager"


# ---- 5. --tuning must be a file ---------------------------------------------------------------
@pytest.mark.parametrize("what", ["missing", "directory"])
def test_plan_with_a_tuning_path_that_is_not_a_file(tmp_path, what):
    tuning = tmp_path / ("missing.json" if what == "missing" else "")
    line = _one_error_line(_hc("plan", "-t", "h200x4", "-c", "all_reduce", "-b", "1MiB", "-a", "auto",
                               "--tuning", str(tuning), "-o", str(tmp_path / "p.json")))
    assert f"--tuning {tuning}" in line
    assert ("no such file" if what == "missing" else "is a directory") in line
    assert not (tmp_path / "p.json").exists()
    topo = hc.load_topology("h200x4")
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=4, nbytes=1 << 20)
    with pytest.raises(HiercollError, match="--tuning"):
        hc.plan(topo, spec, "auto", tuning=str(tuning))
