"""The node-aware fan-out order (builder.swizzled_peers): every step is a permutation, the
position formula matches the list, and the GPUs of a node start their inter-node sends on
different remote GPUs (the flat rank+1 order sent them all to the same one)."""

import itertools

import pytest

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec
from hiercoll.planner.builder import peer_position, swizzled_peers
from tests.helpers import small_topology

SHAPES = [(1, 1), (5, 1), (1, 3), (2, 2), (3, 4), (2, 8), (5, 3), (4, 2)]   # (nodes, gpus)


@pytest.mark.parametrize("nodes,gpus", SHAPES)
def test_each_step_is_a_permutation_and_positions_match(nodes, gpus):
    w = nodes * gpus
    for swizzle, with_self in itertools.product((True, False), (True, False)):
        orders = [swizzled_peers(r, w, swizzle, with_self, gpus=gpus) for r in range(w)]
        for r, order in enumerate(orders):
            assert sorted(order) == [p for p in range(w) if with_self or p != r]
            assert [peer_position(r, p, w, swizzle, with_self, gpus=gpus) for p in order] \
                == list(range(len(order)))
        if swizzle:
            for step in range(len(orders[0])):
                assert len({o[step] for o in orders}) == w, (swizzle, with_self, step)


def test_one_gpu_per_node_is_the_flat_rank_relative_order():
    assert swizzled_peers(2, 5, True, gpus=1) == [3, 4, 0, 1]
    assert swizzled_peers(2, 5, True, include_self=True) == [2, 3, 4, 0, 1]


@pytest.mark.parametrize("nodes,gpus", [(2, 8), (3, 4), (5, 3)])
def test_a_nodes_gpus_start_inter_node_on_different_remote_gpus(nodes, gpus):
    w = nodes * gpus
    for n in range(nodes):
        firsts = []
        for lr in range(gpus):
            r = n * gpus + lr
            firsts.append(next(p for p in swizzled_peers(r, w, True, gpus=gpus) if p // gpus != n))
        assert len(set(firsts)) == gpus
        # and, while there are enough remote nodes, on different remote nodes
        assert len({p // gpus for p in firsts}) == min(gpus, nodes - 1)


def test_direct_plans_use_the_node_aware_order():
    topo = small_topology(2, 4)
    spec = CollectiveSpec(kind="all_to_all", world_size=8, dtype="fp32", nbytes=8 * 8 * 4 * 16)
    sched = hc.plan(topo, spec, "direct")
    for r in range(8):
        dests = [op.dst.rank for op in sched.rank_ops(r)]
        assert dests == swizzled_peers(r, 8, True, include_self=True, gpus=4)
    assert hc.verify(sched, trials=1).ok
