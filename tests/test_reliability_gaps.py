"""Issue 15, gaps the long fuzz run found: a plan file whose fields hold the wrong type (a list
where the algorithm's name belongs) is one line, not a TypeError from the planner's registry;
sizes that cannot fit are refused when the topology is made, whatever the algorithm (the library
call included, which has no ops for HIERCOLL_MAX_OPS to count)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import hiercoll as hc
from hiercoll.cli.main import main
from hiercoll.collectives import GroupSplits
from hiercoll.errors import HiercollError
from hiercoll.plan_file import load_plan, plan_from_dict, plan_to_json
from hiercoll.topology.model import MAX_WORLD_SIZE
from tests.helpers import small_topology

JUNK: list[Any] = [None, -1, 0, 2, 1e300, "x", "", [], {}, [1, 2], {"a": 1}, True, 10**30,
                   "nccl", "ring"]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


def _one_line(code: int, err: str, *needles: str) -> str:
    assert code == 2, (code, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _plan_doc(form: str, kind: str = "all_reduce", algo: str = "ring") -> dict[str, Any]:
    topo = small_topology(1, 2)
    spec = hc.CollectiveSpec(kind=kind, world_size=2, dtype="fp32", nbytes=64)
    return json.loads(plan_to_json(hc.plan(topo, spec, algo), topo, form))


# ---- plan files: wrong types are one line -------------------------------------------------------
@pytest.mark.parametrize("field,value", [
    ("algorithm", []), ("algorithm", {"a": 1}), ("algorithm", 3), ("algorithm", None),
    ("params", []), ("params", "chunks=2"), ("spec", "all_reduce"), ("spec", []),
    ("topology_fingerprint", 7), ("topology_fingerprint", []), ("schema_version", 2),
    ("symmetry_period", "x"), ("bogus", 1)])
def test_recipe_meta_of_the_wrong_type_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   field: str, value: Any) -> None:
    data = _plan_doc("recipe")
    data["meta"][field] = value
    with pytest.raises(HiercollError, match=f"r.json: meta.{field}: "):
        plan_from_dict(data, "r.json")
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    for cmd in (["verify", "--trials", "1"], ["simulate"]):
        _one_line(*_cli(capsys, *cmd, str(path)), str(path), f"meta.{field}")


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:2]):
            out += _paths(v, (*prefix, i))
    return out


@pytest.mark.parametrize("form", ["recipe", "expanded"])
def test_any_field_of_a_plan_file_replaced_by_junk_loads_or_is_a_user_error(form: str) -> None:
    """Every field (the first two entries of each list) set to every junk value: the plan
    loads, verifies and simulates, or the loader says why (HiercollError); nothing else."""
    doc = _plan_doc(form)
    loaded = 0
    for path in _paths(doc):
        if path[0] == "topology" and len(path) > 2:
            continue     # topology files have their own tests; their first level is kept
        for value in JUNK:
            data = copy.deepcopy(doc)
            parent = data
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = value
            try:
                plan = plan_from_dict(data, "p.json")
            except HiercollError:
                continue
            loaded += 1
            if plan.schedule.is_library_call:      # "nccl" for "ring": nothing to verify
                continue
            try:       # a wrong plan is a failed report; one too large is one line
                hc.verify(plan.schedule, trials=1)
                hc.simulate(plan.schedule, plan.topology)
            except HiercollError:
                pass
    assert loaded > 0      # junk that changes nothing (e.g. 2 for 2) still loads


# ---- sizes: refused when the topology is made ----------------------------------------------------
@pytest.mark.parametrize("algo", ["nccl", "ring", "direct", "two_shot", "hier", "hier_2d", "auto"])
def test_a_million_nodes_is_refused_in_one_line_for_every_algorithm(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], algo: str) -> None:
    out = tmp_path / "p.json"
    line = _one_line(*_cli(capsys, "plan", "-t", "pcie-8gpu", "-n", "1000000", "-c", "all_reduce",
                           "-b", "64MiB", "-a", algo, "-o", str(out)),
                     "--nodes", "8000000 ranks", str(MAX_WORLD_SIZE), "use fewer nodes")
    assert line.startswith("error: --nodes: num_nodes x gpus_per_node: 1000000 x 8")
    assert not out.exists()


def test_too_many_gpus_per_node_in_a_topology_file_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = small_topology(1, 2).model_dump(mode="json") | {"gpus_per_node": MAX_WORLD_SIZE + 1}
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(data))
    _one_line(*_cli(capsys, "topo", "show", str(path)), str(path), f"{MAX_WORLD_SIZE + 1} ranks")
    for cmd in (["plan", "-t", str(path), "-c", "all_reduce", "-b", "1MiB", "-a", "nccl",
                 "-o", str(tmp_path / "p.json")],
                ["autopick", "-t", str(path), "-c", "all_reduce", "--sizes", "64KiB:1MiB"]):
        _one_line(*_cli(capsys, *cmd), f"{MAX_WORLD_SIZE + 1} ranks")


def test_the_largest_topology_allowed_loads() -> None:
    topo = hc.load_topology("dgx-h100", nodes=MAX_WORLD_SIZE // 8)
    assert topo.world_size == MAX_WORLD_SIZE
    with pytest.raises(HiercollError, match="--nodes: num_nodes x gpus_per_node"):
        hc.load_topology("dgx-h100", nodes=MAX_WORLD_SIZE // 8 + 1)


def test_a_hundred_thousand_gpus_per_node_is_refused_by_the_op_bound_except_the_library(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = small_topology(1, 2).model_dump(mode="json") | {"gpus_per_node": 100_000}
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(data))
    for algo in ("ring", "direct", "hier", "auto"):
        _one_line(*_cli(capsys, "plan", "-t", str(path), "-c", "all_reduce", "-b", "64MiB", "-a", algo,
                        "-o", str(tmp_path / "p.json")), "HIERCOLL_MAX_OPS")
    code, err = _cli(capsys, "plan", "-t", str(path), "-c", "all_reduce", "-b", "64MiB", "-a", "nccl",
                     "-o", str(tmp_path / "lib.json"))
    assert code == 0, err                 # one library call: 100,000 ranks' buffers, no ops
    assert load_plan(tmp_path / "lib.json").schedule.world_size == 100_000


BILLION_LAUGHS = """\
a: &a [x, x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
"""


@pytest.mark.parametrize(("text", "what"), [(BILLION_LAUGHS, "billion laughs"),
                                            ("a: &a [1, *a]\n", "cycle")])
def test_yaml_aliases_that_expand_without_bound_are_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, what: str) -> None:
    """10^7 values from 7 lines (or a list containing itself): refused before pydantic walks it."""
    path = tmp_path / "topo.yaml"
    path.write_text(text)
    with pytest.raises(HiercollError, match=what):
        hc.load_topology(str(path))
    assert main(["topo", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and what in err


def test_yaml_aliases_within_bounds_still_load(tmp_path: Path) -> None:
    """A topology naming one value twice through an alias (what aliases are for) still loads."""
    path = tmp_path / "topo.yaml"
    path.write_text("name: t\nnum_nodes: 2\ngpus_per_node: 2\n"
                    "gpu: {name: T, hbm_gbps: 1000, num_sms: 100}\n"
                    "intra: {kind: nvswitch, gbps: 100, latency_us: &lat 1.5}\n"
                    "inter: {num_nics: 1, nic_gbps: 40, latency_us: *lat}\n")
    topo = hc.load_topology(str(path))
    assert topo.intra.latency_us == topo.inter.latency_us == 1.5


def test_more_nics_than_gpus_per_node_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The long fuzz run's one hang: num_nics 10^12 on 4 GPUs built a 10^12-entry NIC list."""
    path = tmp_path / "topo.yaml"
    path.write_text("name: t\nnum_nodes: 2\ngpus_per_node: 4\n"
                    "gpu: {name: T, hbm_gbps: 3000, num_sms: 100}\n"
                    "intra: {kind: nvswitch, gbps: 300, latency_us: 1}\n"
                    "inter: {num_nics: 1000000000000, nic_gbps: 40, latency_us: 3}\n")
    assert main(["autopick", "-t", str(path), "-c", "all_gather", "--sizes", "4KiB:1MiB:2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "inter.num_nics" in err and "at most gpus_per_node" in err
    path.write_text(path.read_text().replace("1000000000000", "4"))
    assert hc.load_topology(str(path)).inter.num_nics == 4


def test_an_all_to_all_v_counts_file_plans_and_a_bad_one_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "a2av.json", tmp_path / "bad.json"
    good.write_text(json.dumps({"counts": [[0, 3, 1, 2], [1, 0, 4, 0], [2, 2, 0, 1], [5, 0, 1, 1]]}))
    bad.write_text(json.dumps({"counts": [[0, 3], [-1, 0]]}))
    out = tmp_path / "p.json"
    code, err = _cli(capsys, "plan", "-t", "dgx-h100", "-n", "2", "-c", "group_cast", "--splits", str(good),
                     "-a", "direct", "-o", str(out))
    assert code == 2 and "world size" in err       # 4 ranks' counts on a 16-GPU cluster
    small = tmp_path / "topo.json"
    small.write_text(json.dumps(small_topology(2, 2).model_dump(mode="json")))
    code, err = _cli(capsys, "plan", "-t", str(small), "-c", "group_cast", "--splits", str(good),
                     "-a", "direct", "-o", str(out))
    assert code == 0, err
    plan = load_plan(out)
    assert plan.schedule.spec.splits == GroupSplits.from_counts(json.loads(good.read_text())["counts"])
    _one_line(*_cli(capsys, "plan", "-t", str(small), "-c", "group_cast", "--splits", str(bad),
                    "-a", "direct", "-o", str(out)), "counts[1][0] = -1")


def test_a_recipe_over_the_op_limit_is_saved_uncounted_and_its_expansion_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A recipe file holds no ops, so it is written whatever its size; counting its ops would
    walk every rank, so its count is the estimate from sizes. The expanded form is refused
    before any file."""
    monkeypatch.setenv("HIERCOLL_MAX_OPS", "2000")
    recipe, expanded = tmp_path / "r.json", tmp_path / "e.json"
    args = ("plan", "-t", "dgx-h100", "-n", "8", "-c", "all_reduce", "-b", "1000002", "-a", "rhd")
    code = main([*args, "--form", "recipe", "-o", str(recipe)])
    out = capsys.readouterr().out
    assert code == 0 and recipe.exists() and "ops, estimated" in out, out
    _one_line(*_cli(capsys, *args, "-o", str(expanded)), "HIERCOLL_MAX_OPS")
    assert not expanded.exists()
