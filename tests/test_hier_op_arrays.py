"""`hier`'s array form (issue 29): `Hier.op_arrays` against the ops `build_rank` emits, op for
op, over small flat and tiered topologies, both swizzles, rails staged through gateways, chunks,
channels and sizes that do not divide the world; simulations through the arrays time exactly as
through built ops; the fold's symmetry check on the arrays says what the check on ops says;
the kinds the form does not cover say None."""

from __future__ import annotations

import itertools
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiercoll as hc
from hiercoll.planner.context import PlanContext
from hiercoll.schedule import Schedule
from hiercoll.schedule_arrays import native_op_arrays
from hiercoll.sim import simulate, symmetry
from hiercoll.topology import Topology
from tests.helpers import small_topology
from tests.test_hier_tiers import tiered
from tests.test_sim_compiled_build import (
    assert_identical,
    assert_same_arrays,
    built,
    check_written_in_blocks,
)

pytest.importorskip("numba")

KINDS = ("all_reduce", "reduce_scatter", "all_gather")
PARAMS: list[dict[str, int | bool]] = [
    {}, {"chunks": 3, "channels": 2}, {"node_swizzle": False}, {"rank_swizzle": False, "chunks": 2},
    {"node_swizzle": False, "rank_swizzle": False, "channels": 3}]


def plan(topo: Topology, kind: str, elems: int, params: dict[str, int | bool]) -> Schedule:
    """`elems` elements a rank's shard about (all_reduce: in all), so most sizes leave a remainder."""
    w = topo.world_size
    total = elems if kind == "all_reduce" else elems * w
    spec = hc.CollectiveSpec(kind=kind, world_size=w, dtype="bf16", nbytes=2 * total)
    return hc.plan(topo, spec, "hier", dict(params))


def check_ranks(sched: Schedule, ranks: list[int]) -> None:
    fast = native_op_arrays(sched, ranks)
    assert fast is not None
    assert_same_arrays(fast, built(sched, ranks))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("nodes,gpus", [(1, 1), (1, 5), (2, 1), (2, 8), (3, 3), (4, 2), (5, 4)])
def test_flat_topologies_every_param(kind: str, nodes: int, gpus: int) -> None:
    topo = small_topology(nodes, gpus)
    for params, elems in itertools.product(PARAMS, (1, 37, 1000)):
        sched = plan(topo, kind, elems, params)
        check_ranks(sched, list(range(topo.world_size)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("nodes,groups", [(4, [2]), (8, [2, 2]), (6, [3]), (12, [2, 6])])
def test_tiered_node_orders(kind: str, nodes: int, groups: list[int]) -> None:
    """Several scale-out levels: the swizzled node order walks mixed-radix digits."""
    topo = tiered(nodes, 2, groups)
    w = topo.world_size
    for params in PARAMS[:3]:
        sched = plan(topo, kind, 101, params)
        for ranks in (list(range(w)), [1, w - 1], [w // 2]):
            check_ranks(sched, ranks)


def test_presets_and_subsets() -> None:
    """The bench's fabric at a small size, and ranks asked in any subset."""
    for preset, nodes in (("h100-rail-3tier", 2), ("dgx-h100", 3), ("h200x4", 1), ("mi300x", 2)):
        topo = hc.load_topology(preset, nodes)
        w = topo.world_size
        sched = plan(topo, "all_reduce", 12345, {"chunks": 2})
        for ranks in (list(range(w)), [0, w - 1], [w // 2 + 1], list(range(3, w, 4))):
            check_ranks(sched, ranks)


def test_written_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large world is written a block of ranks at a time; the joined blocks are the whole."""
    topo = tiered(8, 2, [2, 2])
    sched = plan(topo, "all_reduce", 999, {"chunks": 2, "channels": 2})
    check_written_in_blocks(sched, "hiercoll.planner.hier.arrays.ARRAY_BLOCK_OPS",
                            list(range(16)), monkeypatch)
    staged = plan(small_topology(3, 4, nics=2), "all_gather", 50, {"chunks": 2})
    check_ranks(staged, list(range(12)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("nodes,gpus,nics,by_param", [(2, 4, 2, False), (3, 4, 1, False), (2, 8, 3, True),
                                                      (3, 3, 2, True), (4, 8, 5, True)])
def test_rails_staged_through_gateways(kind: str, nodes: int, gpus: int, nics: int, by_param: bool) -> None:
    """Fewer NICs than GPUs (the topology's, or the `nics` knob): a client rank stages its
    traffic through its gateway, with more ops than a gateway rank (ranks of unequal lengths)."""
    topo = small_topology(nodes, gpus) if by_param else small_topology(nodes, gpus, nics=nics)
    w = topo.world_size
    for params in PARAMS[:3]:
        sched = plan(topo, kind, 77, {**params, "nics": nics} if by_param else params)
        for ranks in (list(range(w)), [1, w - 1], list(range(1, w, 3))):
            check_ranks(sched, ranks)


def test_uncovered_plans_build_ops() -> None:
    """all_to_all and no ranks: no array form."""
    topo = small_topology(2, 2)
    spec = hc.CollectiveSpec(kind="all_to_all", world_size=4, dtype="bf16", nbytes=2 * 64)
    assert native_op_arrays(hc.plan(topo, spec, "hier", {}), [0]) is None
    assert native_op_arrays(plan(topo, "all_reduce", 64, {}), []) is None


@pytest.mark.parametrize("preset,nodes,kind,params", [
    ("dgx-h100", 2, "all_reduce", {}), ("h100-rail-3tier", 3, "all_reduce", {"chunks": 2, "channels": 2}),
    ("dgx-h100", 3, "reduce_scatter", {"node_swizzle": False}), ("h200x4", 1, "all_gather", {}),
    ("h200x4", 2, "all_reduce", {"nics": 2})])
def test_simulated_through_arrays_as_through_ops(preset: str, nodes: int, kind: str,
                                                 params: dict[str, int | bool]) -> None:
    """A compiled run that builds no Op at all gives the Python engine's result to the bit."""
    topo = hc.load_topology(preset, nodes)
    py = simulate(plan(topo, kind, (16 << 20) + 3, params), topo, mode="exact", engine="python")
    fresh = plan(topo, kind, (16 << 20) + 3, params)
    with mock.patch.object(PlanContext, "build", side_effect=AssertionError("built ops")):
        fast = simulate(fresh, topo, mode="exact", engine="compiled")
    assert_identical(py, fast)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 5), gpus=st.integers(1, 8), kind=st.sampled_from(KINDS),
       elems=st.integers(1, 5000), chunks=st.integers(1, 4), channels=st.integers(1, 3),
       node_swizzle=st.booleans(), rank_swizzle=st.booleans(), nics=st.integers(0, 8), data=st.data())
def test_random_plans(nodes: int, gpus: int, kind: str, elems: int, chunks: int, channels: int,
                      node_swizzle: bool, rank_swizzle: bool, nics: int, data: st.DataObject) -> None:
    topo = small_topology(nodes, gpus)
    w = topo.world_size
    params: dict[str, int | bool] = {"chunks": chunks, "channels": channels, "node_swizzle": node_swizzle,
                                     "rank_swizzle": rank_swizzle}
    if 0 < nics <= gpus:
        params["nics"] = nics
    sched = plan(topo, kind, elems, params)
    check_ranks(sched, sorted(data.draw(st.sets(st.integers(0, w - 1), min_size=1, max_size=w))))


@pytest.mark.parametrize("topo,kind,params,outcomes", [
    (small_topology(4, 2), "all_reduce", {}, {True, False}),
    (small_topology(3, 4), "all_gather", {"chunks": 2}, {True, False}),
    (small_topology(3, 2), "all_reduce", {"node_swizzle": False}, {False}),
    (tiered(8, 2, [2, 2]), "reduce_scatter", {}, {True, False})])
def test_the_fold_check_on_arrays_agrees_with_the_op_check(topo: Topology, kind: str,
                                                           params: dict[str, int | bool],
                                                           outcomes: set[bool]) -> None:
    """The fold's symmetry check now reads hier's arrays: it says what the check on built ops
    says, shift by shift, true and false alike."""
    from tests.test_sim_symmetry_arrays import _by_ops
    w = topo.world_size
    sched = plan(topo, kind, 4096 * w, params)
    seen = set()
    for r in range(0, w, 3):
        for by in (1, topo.gpus_per_node, 2 * topo.gpus_per_node, w // 2):
            fast = symmetry._shift_maps_arrays(sched, r, by)
            assert fast is not None and fast == _by_ops(sched, r, by), (r, by)
            seen.add(fast)
    assert seen == outcomes
