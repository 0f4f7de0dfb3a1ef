"""`hier`'s group_cast array form (issue 29): `group_arrays.group_cast_arrays` against the ops
`build_rank` emits, op for op, on random splits (zero-size splits, output splits re-cut, several
destination nodes per split) over flat and tiered topologies, both swizzles, rails staged
through gateways, chunks and channels; simulations through the arrays time exactly as through
built ops, and a Zipf-skewed MoE dispatch does too."""

from __future__ import annotations

import itertools
from unittest import mock

import numpy as np
import pytest

import hiercoll as hc
from hiercoll.planner.context import PlanContext
from hiercoll.schedule import Schedule
from hiercoll.schedule_arrays import native_op_arrays
from hiercoll.sim import simulate
from hiercoll.topology import Topology
from hiercoll.workloads import moe
from tests.helpers import random_group_cast, small_topology
from tests.test_hier_tiers import tiered
from tests.test_sim_compiled_build import assert_identical, assert_same_arrays, built

pytest.importorskip("numba")

PARAMS: list[dict[str, int | bool]] = [
    {}, {"chunks": 3, "channels": 2}, {"node_swizzle": False}, {"rank_swizzle": False, "chunks": 2},
    {"node_swizzle": False, "rank_swizzle": False, "channels": 3, "chunks": 4}]


def plan(topo: Topology, seed: int, params: dict[str, int | bool], max_size: int = 9) -> Schedule:
    w = topo.world_size
    spec = hc.CollectiveSpec(kind="group_cast", world_size=w, dtype="bf16",
                             splits=random_group_cast(w, seed, max_size))
    return hc.plan(topo, spec, "hier", dict(params))


def check_ranks(sched: Schedule) -> None:
    w = sched.world_size
    for ranks in (list(range(w)), [w - 1, 0], list(range(1, w, 3))):
        if ranks:
            fast = native_op_arrays(sched, ranks)
            assert fast is not None
            assert_same_arrays(fast, built(sched, ranks))


@pytest.mark.parametrize("nodes,gpus", [(1, 1), (1, 4), (2, 1), (3, 3), (4, 2)])
def test_flat_topologies_every_param(nodes: int, gpus: int) -> None:
    topo = small_topology(nodes, gpus)
    for params, seed in itertools.product(PARAMS, range(3)):
        check_ranks(plan(topo, 100 * nodes + 10 * gpus + seed, params))


@pytest.mark.parametrize("nodes,gpus,nics", [(2, 4, 2), (3, 4, 1), (4, 8, 3), (3, 3, 2)])
def test_rails_staged_through_gateways(nodes: int, gpus: int, nics: int) -> None:
    """Fewer NICs than GPUs: clients stage their remote splits through their gateway."""
    for topo, extra in ((small_topology(nodes, gpus, nics=nics), {}), (small_topology(nodes, gpus), {"nics": nics})):
        for params, seed in itertools.product(PARAMS[:3], range(2)):
            check_ranks(plan(topo, 7 * nodes + gpus + seed, {**params, **extra}))


@pytest.mark.parametrize("nodes,groups,nics", [(8, [2, 2], None), (12, [3, 2], 1), (6, [3], None)])
def test_tiered_node_orders(nodes: int, groups: list[int], nics: int | None) -> None:
    """Multi-level node orders (sends and the forwards' arrival order walk level digits)."""
    topo = tiered(nodes, 2, groups, nics=nics)
    for params, seed in itertools.product(PARAMS, range(2)):
        check_ranks(plan(topo, nodes + seed, params, max_size=5))


@pytest.mark.parametrize("preset,nodes,params", [
    ("dgx-h100", 2, {}), ("h100-rail-3tier", 3, {"chunks": 2, "channels": 2}),
    ("h200x4", 2, {"nics": 2, "rank_swizzle": False})])
def test_simulated_through_arrays_as_through_ops(preset: str, nodes: int, params: dict[str, int | bool]) -> None:
    """A compiled run that builds no Op gives the Python engine's result to the bit."""
    topo = hc.load_topology(preset, nodes)
    py = simulate(plan(topo, 5, params, max_size=4000), topo, mode="exact", engine="python")
    fresh = plan(topo, 5, params, max_size=4000)
    with mock.patch.object(PlanContext, "build", side_effect=AssertionError("built ops")):
        fast = simulate(fresh, topo, mode="exact", engine="compiled")
    assert_identical(py, fast)


def test_moe_dispatch_through_arrays_as_through_ops() -> None:
    """A Zipf-skewed MoE dispatch (splits per (node, local rank set), as `hiercoll workload
    moe` builds them): the arrays are the built ops, and time the same."""
    topo = hc.load_topology("h100-rail-3tier", 4)
    w = topo.world_size
    rng = np.random.default_rng(11)
    weights = 1.0 / np.arange(1, w + 1) ** 1.2
    router = [np.stack([rng.choice(w, 4, replace=False, p=weights / weights.sum()) for _ in range(24)])
              for _ in range(w)]
    spec = moe.spec_for(moe.layout(router, w, w, topo.gpus_per_node), 96, "bf16", "dispatch")
    sched = hc.plan(topo, spec, "hier", {})
    check_ranks(sched)
    by_ops = simulate(hc.plan(topo, spec, "hier", {}), topo, mode="exact", engine="python")
    assert_identical(by_ops, simulate(sched, topo, mode="exact", engine="compiled"))
