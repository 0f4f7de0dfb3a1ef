"""`verify` exits 0 only on what it checked: a race check that did not run is not a pass.

The plan of issue 24: a ring all-reduce with channels=16 chunks=4 on dgx-h100 x 4 (129,024 ops,
512 streams) with one write-after-read dependency removed. Its postcondition and random op orders
still come out right, so only the race check can see that a legal order overwrites a buffer a
peer has not read yet."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

import hiercoll as hc
from hiercoll.cli.main import main
from hiercoll.plan_file import save_plan

check_mod = importlib.import_module("hiercoll.sim.check")


def _drop_one_war_dependency(path: Path) -> str:
    """Remove, from the first reduce past index 200 on rank 1 that writes another rank's receive
    buffer, its dependency on that rank (the op that frees the slot): the id of the edited op."""
    data = json.loads(path.read_text())
    for op in data["ranks"][1]["ops"][200:]:
        owner = op["dst"][0]
        freeing = [d for d in op["deps"] if d[0] == owner != 1]
        if op["kind"] == "reduce" and freeing:
            op["deps"] = [d for d in op["deps"] if d not in freeing]
            path.write_text(json.dumps(data))
            return str(op["id"])
    raise AssertionError("no reduce into a peer's buffer found")


@pytest.mark.slow
def test_verify_catches_the_removed_dependency_in_the_129k_op_ring(tmp_path, capsys):
    topo = hc.load_topology("dgx-h100", nodes=4)
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=32, nbytes=1 << 30)
    path = tmp_path / "ring.json"
    save_plan(path, hc.plan(topo, spec, "ring", {"channels": 16, "chunks": 4}).expand(), topo)
    edited = _drop_one_war_dependency(path)
    code = main(["verify", str(path), "--trials", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["ok"] is False, out
    assert out["check"]["unchecked"] == []
    races = [p for p in out["check"]["problems"] if p.startswith("race")]
    assert races and f"op {edited} " in races[0] + " ", races


def test_a_skipped_race_check_exits_3_unless_allowed(tmp_path, capsys, monkeypatch):
    topo = hc.load_topology("h200x4")
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=4, nbytes=64 << 10)
    path = tmp_path / "p.json"
    save_plan(path, hc.plan(topo, spec, "ring", {}).expand(), topo)
    monkeypatch.setattr(check_mod, "MAX_CLOCK_CELLS", 10)
    assert main(["verify", str(path)]) == 3
    out = capsys.readouterr()
    assert "race check not run" in out.out and "race check SKIPPED" in out.err, out
    assert "--allow-skip" in out.err
    assert main(["verify", str(path), "--allow-skip", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["check"]["unchecked"] and report["exit"] == 0


def test_race_clocks_are_dropped_once_every_successor_has_read_them():
    """Memory is the walk's frontier, not ops x streams: after the walk no clock is kept but
    those of ops nobody waits on (the last of each stream)."""
    topo = hc.load_topology("h200x4")
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=4, nbytes=1 << 20)
    s = hc.plan(topo, spec, "ring", {"channels": 2, "chunks": 2}).expand()
    order = hc.schedule.topological_order(s)
    clocks = check_mod.Clocks(s)
    for op in order:
        clocks.advance(op)
    sinks = {op.ref for op in order if op.ref not in clocks.waiting}     # nobody waits on them
    assert set(clocks.clock) == sinks and len(sinks) < len(order) // 4
