"""The auto-picker: pruning is exact, bounds hold, tuning files drive `plan --algorithm auto`."""

import json

import pytest

import hiercoll as hc
from hiercoll.cli.main import main
from hiercoll.collectives import CollectiveSpec
from hiercoll.planner.search.autopick import (
    SimCache,
    _bound,
    choose,
    pick_one,
    rows_to_table,
    sweep,
    write_tuning,
)
from hiercoll.planner.search.candidates import candidates
from tests.helpers import small_topology


@pytest.mark.parametrize("kind,nbytes", [("all_reduce", 64 << 10), ("all_reduce", 8 << 20),
                                         ("reduce_scatter", 4 << 20), ("all_to_all", 1 << 20)])
def test_pruning_never_changes_the_choice(kind, nbytes):
    topo = small_topology(2, 4)
    spec = CollectiveSpec(kind=kind, world_size=8, dtype="bf16", nbytes=nbytes)
    pruned = pick_one(topo, spec, SimCache(None))
    full = pick_one(topo, spec, SimCache(None), prune=False)
    assert pruned.time_us == pytest.approx(full.time_us, rel=1e-12)
    assert (pruned.algorithm, pruned.params) == (full.algorithm, full.params)   # the plan, not a tie
    assert pruned.simulated + pruned.pruned == full.simulated


def test_candidate_bounds_never_exceed_simulated_time():
    topo = small_topology(2, 4)
    for kind, nbytes in [("all_reduce", 1 << 20), ("all_gather", 16 << 20)]:
        spec = CollectiveSpec(kind=kind, world_size=8, dtype="bf16", nbytes=nbytes)
        for cand in candidates(topo, spec):
            sched = hc.plan(topo, spec, cand.algorithm, cand.params)
            assert _bound(topo, sched) <= hc.simulate(sched, topo).time_us * (1 + 1e-9), cand


def test_rows_report_choice_runner_up_and_ring():
    topo = hc.load_topology("dgx-h100", 2)
    template = CollectiveSpec(kind="all_reduce", world_size=16, dtype="bf16", nbytes=0)
    rows = sweep(topo, template, [64 << 10, 64 << 20], progress=False)
    for row in rows:
        assert row.time_us <= row.flat_ring_time_us
        assert row.runner_up is not None and row.runner_up["algorithm"] != row.algorithm
        assert 0 < row.pct_of_bound <= 100
    assert rows[0].bytes == 64 << 10 and rows[1].bytes == 64 << 20


def test_tuning_file_drives_auto(tmp_path):
    topo = small_topology(2, 2)
    template = CollectiveSpec(kind="reduce_scatter", world_size=4, dtype="bf16", nbytes=0)
    rows = sweep(topo, template, [4096, 16 << 20], progress=False)
    path = tmp_path / "tuning.json"
    write_tuning(path, rows_to_table(topo, template, rows))
    small = template.model_copy(update={"nbytes": 8192})
    pick = choose(topo, small, str(path))
    assert pick.source.startswith("tuning file") and pick.algorithm == rows[0].algorithm
    big = template.model_copy(update={"nbytes": 1 << 30})
    assert choose(topo, big, str(path)).algorithm == rows[1].algorithm


def test_autopick_cli_json_and_plan_auto(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HIERCOLL_CACHE_DIR", str(tmp_path / "cache"))
    tuning = tmp_path / "tuning.json"
    assert main(["autopick", "-t", "h200x4", "-n", "2", "-c", "all_gather", "--sizes", "64KiB:1MiB:4",
                 "--json", "-o", str(tuning)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == 3
    for row in out["rows"]:
        for key in ("bytes", "algorithm", "params", "time_us", "busbw_gbps", "runner_up", "flat_ring_time_us"):
            assert key in row
    assert (tmp_path / "cache" / "sim-cache.json").exists()
    plan = tmp_path / "p.json"
    assert main(["plan", "-t", "h200x4", "-n", "2", "-c", "all_gather", "-b", "256KiB", "-a", "auto",
                 "--tuning", str(tuning), "-o", str(plan), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["how"].startswith("tuning file") and info["algorithm"] == out["rows"][1]["algorithm"]


def test_plan_auto_without_tuning_searches(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HIERCOLL_NO_CACHE", "1")
    topo = small_topology(1, 4)
    spec = CollectiveSpec(kind="all_reduce", world_size=4, dtype="bf16", nbytes=1 << 20)
    pick = choose(topo, spec)
    assert pick.source == "searched (simulated)"
    assert hc.verify(hc.plan(topo, spec, pick.algorithm, pick.params), trials=1).ok
