"""Auto-pick's cache makes a warm rerun free: pruned candidates' bounds and the tuned copy-engine
thresholds are cached with the simulated times, so a rerun builds no plan, computes no bound and
simulates nothing, and picks exactly what the cold run picked. Candidates the planner would refuse
as too large (HIERCOLL_MAX_OPS: flat direct on 4096 GPUs) are left out instead of failing the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import hiercoll.sim
from hiercoll.collectives import CollectiveSpec
from hiercoll.planner.registry import estimate_ops, get_algorithm, parse_params
from hiercoll.planner.search import autopick
from hiercoll.planner.search.autopick import BOUNDS_SUFFIX, CE_SUFFIX, SimCache, pick_one, sweep
from hiercoll.planner.search.candidates import candidates
from hiercoll.topology import Topology, load_topology
from tests.helpers import small_topology

SIZES = [4 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20]


def _ce_topology() -> Topology:
    data = load_topology("h200x4", uncalibrated=True).model_dump()
    data["costs"].update(sm_op_gbps=150.0, ce_op_gbps=300.0, launch_us=2.0, ce_launch_us=4.0)
    return Topology.model_validate(data)


def _rows(topo: Topology, kind: str, cache_path: Path | None) -> list[dict[str, Any]]:
    template = CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="bf16", nbytes=0)
    return [r.to_json() for r in sweep(topo, template, SIZES, progress=False,
                                       cache_path=cache_path, jobs=1)]


def _forbid(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> None:
    def counted(name: str, real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return real(*args, **kwargs)
        return wrapper
    monkeypatch.setattr(hiercoll.sim, "simulate", counted("simulate", hiercoll.sim.simulate))
    monkeypatch.setattr(autopick, "plan", counted("plan", autopick.plan))
    monkeypatch.setattr(autopick, "rank_bound_us", counted("rank_bound", autopick.rank_bound_us))
    monkeypatch.setattr(autopick, "_critical_path_bound",
                        counted("critical_path", autopick._critical_path_bound))


@pytest.mark.parametrize("case", ["2x4 all_reduce", "2x4 reduce_scatter", "ce all_gather"])
def test_warm_rerun_picks_the_same_and_computes_nothing(case: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    topo = _ce_topology() if case.startswith("ce") else small_topology(2, 4)
    kind = case.split()[1]
    uncached = _rows(topo, kind, None)          # no cache at all: the reference
    path = tmp_path / "sim-cache.json"
    cold = _rows(topo, kind, path)
    assert cold == uncached
    assert sum(r["pruned"] for r in cold) > 0      # the bounds cache has something to do
    data = SimCache(path).data
    assert any(k.endswith(BOUNDS_SUFFIX) for k in data)
    if case.startswith("ce"):
        assert any(k.endswith(CE_SUFFIX) for k in data)
        assert any(r["executor"] for r in cold)
    calls: list[str] = []
    _forbid(monkeypatch, calls)
    warm = _rows(topo, kind, path)
    assert warm == cold                          # every field: pick, times, counts, runner-up
    assert calls == []                           # nothing built, bounded or simulated


def test_cached_bounds_prune_exactly_as_computed_ones(tmp_path: Path) -> None:
    """A cache holding times for some candidates and bounds for others (a run at other sizes or
    with other candidates wrote it) still gives the uncached pick."""
    topo = small_topology(2, 4)
    for nbytes in (64 << 10, 8 << 20):
        spec = CollectiveSpec(kind="all_reduce", world_size=8, dtype="bf16", nbytes=nbytes)
        ref = pick_one(topo, spec, SimCache(None))
        cache = SimCache(None)
        pick_one(topo, spec, cache, only=["ring", "hier"])      # partial: a different best
        again = pick_one(topo, spec, cache)
        assert (again.algorithm, again.params, again.time_us) == (ref.algorithm, ref.params,
                                                                 ref.time_us)
        full = pick_one(topo, spec, SimCache(None), prune=False)
        assert (full.algorithm, full.params) == (ref.algorithm, ref.params)


def test_candidates_over_the_op_limit_are_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    topo = small_topology(2, 4)
    spec = CollectiveSpec(kind="all_reduce", world_size=8, dtype="bf16", nbytes=8 << 20)
    everything = candidates(topo, spec)
    limit = 140
    monkeypatch.setenv("HIERCOLL_MAX_OPS", str(limit))   # flat 8-rank plans ~128 ops, hier ~160
    kept = candidates(topo, spec)
    assert 0 < len(kept) < len(everything)
    for c in kept:
        algo = get_algorithm(c.algorithm)
        assert estimate_ops(topo, spec, algo, parse_params(algo, c.params)) <= limit
    # no "size: ..." error from plan(), nor from the library model's refused ring (a column only)
    row = pick_one(topo, spec, SimCache(None), library_model=True)
    assert row.algorithm in {c.algorithm for c in kept}
    assert row.library_model_us is None


@pytest.mark.parametrize("nodes,gpus", [(4, 8), (16, 2), (3, 4), (32, 2)])
def test_op_estimate_is_never_below_the_ops_built(nodes: int, gpus: int) -> None:
    """HIERCOLL_MAX_OPS bounds what is built by the estimate, so it must not undercount, for
    every parameter set the auto-picker tries: hier's per-node NVLink scatters once made it ~L x
    too low (W = 512: 72704 estimated, 556032 built), hier_2d's one-shot ~N / L x (W = 4096:
    9216 a rank estimated, 269824 built)."""
    from hiercoll.planner import applicable, plan
    topo = small_topology(nodes, gpus)
    w = topo.world_size
    for kind in ("reduce_scatter", "all_gather", "all_reduce", "all_to_all"):
        spec = CollectiveSpec(kind=kind, world_size=w, dtype="bf16", nbytes=w * 64)
        tried = [(name, {}) for name in applicable(topo, spec)]
        tried += [(c.algorithm, c.params) for c in candidates(topo, spec)]
        for name, params in tried:
            algo = get_algorithm(name)
            built = sum(len(plan(topo, spec, name, params).rank_ops(r)) for r in range(w))
            assert estimate_ops(topo, spec, algo, parse_params(algo, params)) >= built, (kind, name, params)
