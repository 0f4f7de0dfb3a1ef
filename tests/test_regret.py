"""autopick --validate: the simulator's pick among a bench run's measured candidates, priced by
the run (regret = measured(pick) / measured(best)); peers and other modes are not candidates."""

from __future__ import annotations

import json

import pytest

from hiercoll.calibration.regret import measured_points, regret_points, summary
from hiercoll.cli.main import main
from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.planner.search.autopick import SimCache, simulate_candidate
from hiercoll.planner.search.candidates import Candidate
from hiercoll.topology import load_topology

PARAMS = {"channels": 1, "chunks": 1}


def _row(algorithm: str, t: float, nbytes: int = 1 << 24, mode: str = "graph",
         backend: str = "cuda", peer: bool = False, world: int = 4) -> dict:
    return {"algorithm": algorithm, "backend": backend, "peer": peer, "mode": mode,
            "collective": "all_reduce", "dtype": "bf16", "nbytes": nbytes, "world_size": world,
            "p50_us": t, "params": {} if backend != "cuda" else dict(PARAMS, nics=None)}


def _sim(topo, algorithm: str, nbytes: int = 1 << 24) -> float:
    spec = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=4, dtype="bf16", nbytes=nbytes)
    return simulate_candidate(topo, spec, Candidate(algorithm, dict(PARAMS)), SimCache(None)).time_us


def test_regret_prices_the_simulated_pick_with_the_measured_times():
    topo = load_topology("h200x4")
    fast, slow = sorted(("ring", "direct"), key=lambda a: _sim(topo, a))   # by the simulator
    rows = [_row(fast, 300.0), _row(slow, 200.0),             # the run disagrees with it
            _row("nccl", 150.0, backend="peer", peer=True),   # a peer: not a candidate
            _row(fast, 1.0, mode="eager")]                    # another mode
    points = measured_points(rows, "graph")
    assert [len(v) for v in points.values()] == [2]
    (p,) = regret_points(topo, points, "graph")
    assert p.pick.startswith(fast) and p.best.startswith(slow) and "nics" not in p.pick
    assert p.regret == pytest.approx(300.0 / 200.0) and p.candidates == 2
    s = summary([p])
    assert s["worst"] == pytest.approx(1.5) and s["above_1_05"] == 1
    # the run agrees with the simulator: no regret
    (q,) = regret_points(topo, measured_points([_row(fast, 100.0), _row(slow, 200.0)], "graph"),
                         "graph")
    assert q.regret == 1.0


def test_a_bench_of_another_world_size_is_one_line(tmp_path, capsys):
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"rows": [_row("ring", 1.0, world=8), _row("direct", 2.0, world=8)]}))
    assert main(["autopick", "-t", "h200x4", "--validate", str(f), "--no-cache"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "8 ranks" in err[0] and "-t" in err[0]


def test_validate_writes_the_table_json_and_plot(tmp_path):
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"rows": [_row("ring", 300.0), _row("direct", 200.0),
                                      _row("ring", 40.0, nbytes=1 << 20),
                                      _row("direct", 30.0, nbytes=1 << 20)]}))
    out = tmp_path / "out"
    assert main(["autopick", "-t", "h200x4", "--validate", str(f), "--no-cache",
                 "--out", str(out)]) == 0
    got = json.loads((out / "regret.json").read_text())
    assert got["summary"]["points"] == 2 and len(got["points"]) == 2
    assert "| all_reduce | 1048576 |" in (out / "regret.md").read_text()
    assert (out / "regret.png").stat().st_size > 0


def test_without_validate_the_collective_is_still_required(capsys):
    assert main(["autopick", "-t", "h200x4", "--sizes", "1MiB"]) == 2
    assert "--collective" in capsys.readouterr().err


def test_a_cuda_bench_row_is_predicted_as_its_lowering_ran(tmp_path):
    """The row's options are the model's input: with forwarding on, the direct all-reduce is the
    one-step pull the kernels run (4 reduces), not the plan's push + reduce (16 ops); off, or a
    gloo row, the plan as written."""
    from hiercoll.calibration.measurements import load_measurements
    from hiercoll.calibration.predict import build_case, predict_us
    topo = load_topology("h200x4")
    on = dict(_row("direct", 9.2, nbytes=8192), options={"forward": True, "fuse": True})
    off = dict(on, options={"forward": False, "fuse": True}, nbytes=16384)
    gloo = dict(on, backend="gloo", nbytes=32768)
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"rows": [on, off, gloo]}))
    by_size = {m.nbytes: m for m in load_measurements([str(f)])}
    assert by_size[8192].lowering == {"forward": True, "fuse": True} and by_size[32768].lowering == {}
    ops = {n: len(list(build_case(m, topo).schedule.ops())) for n, m in by_size.items()}
    assert ops == {8192: 4, 16384: 16, 32768: 16}
    fwd, planned = build_case(by_size[8192], topo), build_case(by_size[16384], topo)
    assert predict_us(fwd, topo, topo) < predict_us(planned, topo, topo)


def test_autopick_in_graph_mode_times_candidates_as_graph_replays():
    """`autopick --mode graph`: every candidate timed as a replayed call (the graph per-call cost,
    no host launch), cached apart from the eager times of the same candidates."""
    from hiercoll.planner.search.autopick import pick_one
    from hiercoll.planner.search.candidates import candidates_and_oversized
    topo = load_topology("h200x4")
    spec = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=4, dtype="bf16", nbytes=65536)
    cache = SimCache(None)
    eager = pick_one(topo, spec, cache, ["ring", "direct"], prune=False)
    graph = pick_one(topo, spec, cache, ["ring", "direct"], prune=False, call_mode="graph")
    assert eager.all_times != graph.all_times             # not the eager entries reused
    cands, _ = candidates_and_oversized(topo, spec, ["ring", "direct"])
    # each candidate untuned, as the auto-picker times it (h200x4's costs price protocols: the
    # schedule the cuda backend runs, by the protocol it runs)
    alone = {c.label(): simulate_candidate(topo, spec, c, SimCache(None), call_mode="graph").time_us
             for c in cands}
    assert set(graph.all_times) == set(alone)
    # the copy-engine threshold is tuned on the fastest few: never slower than untuned
    assert all(graph.all_times[k] <= alone[k] * (1 + 1e-9) for k in alone)
    assert sum(graph.all_times[k] == pytest.approx(alone[k]) for k in alone) >= len(alone) - 3


def test_the_autopick_cli_takes_the_graph_mode(capsys):
    assert main(["autopick", "-t", "h200x4", "-c", "all_reduce", "--sizes", "64KiB",
                 "--algorithms", "ring,direct", "--mode", "graph", "--no-cache", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["rows"][0]["algorithm"] in ("ring", "direct")


@pytest.mark.parametrize(("content", "says"), [
    (None, "cannot read"),
    ("{\"nccl\": {}}", "is not a `hiercoll bench --out` JSON"),
    (json.dumps({"rows": [_row("ring", 1.0, mode="eager")]}), "no graph-mode rows"),
    (json.dumps({"rows": [_row("ring", -1.0)]}), "rows[0]"),
])
def test_validate_refuses_bad_files_in_one_line(tmp_path, capsys, content, says):
    f = tmp_path / "b.json"
    if content is not None:
        f.write_text(content)
    assert main(["autopick", "-t", "h200x4", "--validate", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_a_pick_that_lowered_to_the_best_s_own_ops_is_marked_as_the_same_program():
    """4 x H200 all_to_all: `direct` and `hier` lower to the same rows on one node (only their
    channel numbers differ), so a regret between them is the spread of one program run twice;
    `bruck` relays through a third GPU and is another program."""
    topo = load_topology("h200x4")
    knobs = {"forward": True, "fuse": True, "single_stream": True, "split_channels": True,
             "protocol": "simple", "max_ctas": 132, "ce_threshold_bytes": 1 << 40}

    def row(algorithm: str, t: float) -> dict:
        return dict(_row(algorithm, t, nbytes=1 << 20), collective="all_to_all", options=knobs)

    pair = regret_points(topo, measured_points([row("direct", 12.0), row("hier", 10.0)], "graph"),
                         "graph")
    assert len(pair) == 1 and pair[0].same_program and pair[0].regret > 1.05
    assert summary(pair)["above_1_05_same_program"] == 1
    assert summary(pair)["worst_other_program"] == 1.0      # the only miss is one program's spread
    other = regret_points(topo, measured_points([row("direct", 12.0), row("bruck", 10.0)], "graph"),
                          "graph")
    assert len(other) == 1 and other[0].pick.startswith("direct") and not other[0].same_program
    assert summary(other)["worst_other_program"] == pytest.approx(1.2)


def test_reduces_that_differ_only_in_their_sources_order_are_one_program():
    """2 x H200 reduce_scatter: `direct` and `hier` differ only in the order rank 1 lists its
    two sources (the kernel loads them together and adds them in registers), so a regret between
    them is marked as one program's spread. A 2-GPU `direct` all_to_all (its copy and push side
    by side, the start wait and end arrival as rows of their own) and `bruck` (one after the
    other) are two programs; with a cost on those barrier rows the simulator ranks bruck first,
    as three runs measured (11.0-11.2 against 9.8-10.2 us)."""
    topo = load_topology("h200x2")
    knobs = {"forward": True, "fuse": True, "single_stream": True, "split_channels": True,
             "protocol": "simple", "max_ctas": 132, "ce_threshold_bytes": 1 << 40}

    def row(kind: str, algorithm: str, t: float) -> dict:
        return dict(_row(algorithm, t, nbytes=1 << 20, world=2), collective=kind, options=knobs)

    (rs,) = regret_points(topo, measured_points([row("reduce_scatter", "direct", 10.5),
                                                 row("reduce_scatter", "hier", 9.4)], "graph"),
                          "graph")
    assert rs.same_program
    a2a = measured_points([row("all_to_all", "direct", 11.2), row("all_to_all", "bruck", 9.9)],
                          "graph")
    (free,) = regret_points(topo.with_costs(barrier_row_us=0.0), a2a, "graph")
    assert free.pick.startswith("direct") and not free.same_program
    (priced,) = regret_points(topo.with_costs(barrier_row_us=0.75), a2a, "graph")
    assert priced.pick.startswith("bruck") and priced.regret == 1.0


def test_plans_that_differ_only_in_their_scratch_buffers_names_are_one_program():
    """2 x H200 reduce_scatter at 2 MiB: `direct` receives into `direct_recv`, `hier_2d` into
    `hier_scatter`; forwarded, neither buffer is touched and both run the same pull-reduce rows
    (measured 12.2 / 11.0 us in one run: one program's spread, not a model miss)."""
    topo = load_topology("h200x2")
    knobs = {"forward": True, "fuse": True, "single_stream": True, "split_channels": True,
             "protocol": "simple", "max_ctas": 132, "ce_threshold_bytes": 1 << 40}
    rows = [dict(_row(a, t, nbytes=2 << 20, world=2), collective="reduce_scatter", options=knobs)
            for a, t in (("direct", 12.2), ("hier_2d", 11.0))]
    (point,) = regret_points(topo, measured_points(rows, "graph"), "graph")
    assert point.same_program
    forwarded_off = [dict(r, options=dict(knobs, forward=False)) for r in rows]
    (kept,) = regret_points(topo, measured_points(forwarded_off, "graph"), "graph")
    assert kept.same_program       # unforwarded, both copy into their scratch at the same place
