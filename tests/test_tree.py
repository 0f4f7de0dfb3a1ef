"""NCCL's double binary tree all-reduce (`-a tree`, planner/tree.py): correct through the
reference executor and the static check on one and several nodes, shaped like NCCL's tree
(two trees over the nodes, heads on two rails), and the library model's choice on several
nodes: the tree for small all-reduces, the ring for large ones."""

from __future__ import annotations

import random

import pytest

from hiercoll.collectives import CollectiveSpec, Kind, ReduceOp
from hiercoll.executor.reference import verify
from hiercoll.planner import plan
from hiercoll.planner.library_model import library_model
from hiercoll.planner.search.autopick import SimCache, pick_one
from hiercoll.schedule import Transport
from hiercoll.sim import check
from tests.helpers import small_topology


@pytest.mark.parametrize("nodes,gpus", [(1, 4), (2, 2), (3, 2), (4, 4), (5, 1)])
def test_tree_all_reduce_is_correct(nodes, gpus):
    topo = small_topology(nodes, gpus)
    op = random.choice(list(ReduceOp))
    count = random.randint(1, 3000)
    spec = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=nodes * gpus, dtype="fp32",
                          nbytes=4 * count, reduce_op=op)
    sched = plan(topo, spec, "tree", {"chunks": random.choice([1, 2, 3])})
    assert check(sched).ok, check(sched)
    report = verify(sched, trials=2, seed=random.randint(0, 10**6))
    assert report.ok, report


def test_tree_shape_two_trees_on_two_rails():
    topo = small_topology(4, 4)
    spec = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=16, dtype="bf16", nbytes=1 << 20)
    sched = plan(topo, spec, "tree")
    inter = [op for op in sched.ops() if op.transport == Transport.INTER]
    rails = {r % 4 for op in inter
             for r in (op.rank, *(s.rank for s in op.srcs if s.rank // 4 != op.rank // 4))}
    assert rails == {0, 3}                      # tree 0 on local rank 0, tree 1 on local rank 3
    # each node is an inner node (more than one child) in at most one of the two trees
    for node in range(4):
        heads = [node * 4, node * 4 + 3]
        inner = [h for h in heads if sum(1 for op in inter if op.rank == h and op.kind.value
                                         == "reduce" and len(op.srcs) > 2) > 0]
        assert len(inner) <= 1
    # a rank touches the network only as a head: 2 (tree) x 2 (up and down) ops at most
    per_rank = {}
    for op in inter:
        per_rank[op.rank] = per_rank.get(op.rank, 0) + 1
    assert max(per_rank.values()) <= 4


def test_the_library_model_runs_nccls_tree_for_small_all_reduces_across_nodes():
    topo = small_topology(8, 4)
    small = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=32, dtype="bf16", nbytes=64 << 10)
    large = small.resized(512 << 20)
    assert library_model(topo, small).meta.algorithm == "tree"
    assert library_model(topo, large).meta.algorithm == "ring"
    one_node = small_topology(1, 8)
    assert library_model(one_node, small.model_copy(update={"world_size": 8})).meta.algorithm \
        == "ring"


def test_tree_is_not_an_auto_pick_candidate():
    topo = small_topology(2, 2)
    spec = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=4, dtype="bf16", nbytes=64 << 10)
    row = pick_one(topo, spec, SimCache(None))
    assert not any(label.startswith("tree") for label in row.all_times)
