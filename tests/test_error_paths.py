"""User-facing error paths that had no test: each gives one line naming the problem."""

import json

import pytest

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec
from hiercoll.errors import HiercollError
from hiercoll.executor.reference import verify
from hiercoll.plan_file import plan_from_dict, plan_to_json
from hiercoll.planner.search.autopick import SimCache, pick_one, read_tuning
from tests.helpers import small_topology


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_reference_executor_refuses_plans_that_do_not_fit():
    topo = small_topology(1, 2)
    s = hc.plan(topo, CollectiveSpec(kind="all_reduce", world_size=2, nbytes=1 << 20), "ring")
    with pytest.raises(HiercollError, match="reference executor would need") as exc:
        verify(s, max_memory=0)     # not even its size-reduced copy fits
    assert "smaller" in _one_line(exc)


def test_recipe_without_algorithm_names_the_field():
    topo = small_topology(1, 2)
    s = hc.plan(topo, CollectiveSpec(kind="all_gather", world_size=2, nbytes=64), "ring")
    data = json.loads(plan_to_json(s, topo, "recipe"))
    del data["meta"]["algorithm"]
    with pytest.raises(HiercollError, match="meta.algorithm: required field is missing"):
        plan_from_dict(data)


def test_simulating_on_another_topology_is_refused():
    a, b = small_topology(1, 2), small_topology(1, 2, kind="mesh")
    s = hc.plan(a, CollectiveSpec(kind="all_gather", world_size=2, nbytes=64), "ring")
    with pytest.raises(HiercollError, match="planned for another topology"):
        hc.simulate(s, b)


def test_world_size_mismatch_is_refused():
    with pytest.raises(HiercollError, match="the spec has 3 ranks"):
        hc.plan(small_topology(1, 2), CollectiveSpec(kind="all_reduce", world_size=3, nbytes=64), "ring")


def test_bad_tuning_file_names_the_field(tmp_path):
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"schema_version": 1, "tables": [{"topology": "x"}]}))
    with pytest.raises(HiercollError, match=r"tables\.0\.topology_fingerprint: required field is missing"):
        read_tuning(path)


def test_no_candidate_is_one_line():
    topo = small_topology(1, 2)
    spec = CollectiveSpec(kind="all_to_all", world_size=2, nbytes=64)
    with pytest.raises(HiercollError, match="no algorithm can plan all_to_all") as exc:
        pick_one(topo, spec, SimCache(None), only=["ring"])
    _one_line(exc)


def test_cuda_only_flags_are_one_line_on_other_backends(tmp_path):
    """--profile / --one-gpu need the cuda backend; bench --one-gpu times whole calls."""
    import subprocess
    import sys
    plan = tmp_path / "p.json"
    assert subprocess.run([sys.executable, "-m", "hiercoll", "plan", "-t", "h200x4", "-c",
                           "all_reduce", "-b", "4KiB", "-a", "ring", "-o", str(plan)],
                          capture_output=True, check=False).returncode == 0
    cases = [(["run", str(plan), "--backend", "gloo", "--profile", str(tmp_path / "t.json")],
              "need --backend cuda"),
             (["run", str(plan), "--backend", "gloo", "--one-gpu"], "need --backend cuda"),
             (["bench", str(plan), "--backend", "gloo", "--one-gpu"], "needs --backend cuda"),
             (["bench", str(plan), "--one-gpu", "--zero-copy"], "drop --zero-copy")]
    for argv, want in cases:
        proc = subprocess.run([sys.executable, "-m", "hiercoll", *argv], capture_output=True,
                              text=True, check=False, timeout=120)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert want in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
