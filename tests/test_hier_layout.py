"""How the hierarchical schedules are laid out: a hand-checkable 2 x 2 reduce-scatter, visiting
orders, gateways with fewer NICs, and the label formulas that keep 1000s of ranks cheap."""

from __future__ import annotations

import itertools

import pytest
from helpers import small_topology

from hiercoll.collectives import CollectiveSpec
from hiercoll.planner import plan
from hiercoll.planner.context import PlanContext
from hiercoll.planner.hier.common import Place, rails
from hiercoll.schedule import Transport
from hiercoll.topology import preset


def test_two_by_two_reduce_scatter_by_hand() -> None:
    """Rank 0 = (node 0, local 0), one element per shard. Target node 1 first: scatter shard
    (1,1)=input[3] to local peer 1, reduce shard (1,0)=input[2] with what peer 1 scattered,
    send it over RDMA to rank 2 (same local rank on node 1); then own node: scatter input[1],
    and the final reduce of input[0], peer 1's piece and node 1's partial."""
    topo = small_topology(2, 2)
    spec = CollectiveSpec(kind="reduce_scatter", world_size=4, dtype="fp32", nbytes=16)
    ops = plan(topo, spec, "hier").rank_ops(0)
    assert [op.describe() for op in ops] == [
        "op 0.0 [copy, ch0, intra] r0.input[3:4] -> r1.hier_scatter[1:2]",
        "op 0.1 [reduce, ch1, local] r0.input[2:3], r0.hier_scatter[1:2] -> r0.hier_rs_send[0:1]",
        "op 0.2 [copy, ch1, inter] r0.hier_rs_send[0:1] -> r2.hier_rs_recv[0:1]",
        "op 0.3 [copy, ch0, intra] r0.input[1:2] -> r1.hier_scatter[0:1]",
        "op 0.4 [reduce, ch1, local] r0.input[0:1], r0.hier_scatter[0:1], r0.hier_rs_recv[0:1] "
        "-> r0.output[0:1]",
    ]
    # the reduce waits for peer 1's scatter to us; the final for its scatter and rank 2's send
    assert [op.deps for op in ops] == [(), ((1, 0),), ((0, 1),), (), ((1, 3), (2, 2))]


def test_visiting_orders_swizzled_and_plain() -> None:
    topo = small_topology(4, 4)
    pl = Place(topo, rank=6)   # node 1, local rank 2
    assert pl.target_nodes() == [2, 3, 0, 1] and pl.source_nodes() == [0, 3, 2]
    assert pl.local_peers() == [3, 0, 1] and pl.local_peers(include_self=True) == [2, 3, 0, 1]
    plain = Place(topo, rank=6, node_swizzle=False, rank_swizzle=False)
    assert plain.target_nodes() == [0, 1, 2, 3] and plain.local_peers() == [0, 1, 3]
    for p in (pl, plain):
        for t, q in itertools.product(range(4), range(4)):
            assert p.target_nodes().index(t) == p.target_position(t)
            assert p.local_peers(include_self=True).index(q) == p.peer_position(q, include_self=True)


@pytest.mark.parametrize("nics,gateways,clients_of_4", [
    (None, [0, 1, 2, 3, 4, 5, 6, 7], [4]),
    (2, [0, 4], [4, 5, 6, 7]),
    (3, [0, 2, 5], [2, 3, 4]),
])
def test_gateways_with_fewer_nics(nics: int | None, gateways: list[int], clients_of_4: list[int]) -> None:
    """NICs used are spread evenly; a GPU goes through the nearest gateway at or below it."""
    topo = preset("dgx-h100", 2)
    assert rails(topo, nics) == gateways
    pl = Place(topo, rank=12, nics=nics)   # node 1, local rank 4
    assert pl.clients(pl.gateway_of(4)) == clients_of_4
    assert pl.staged == (pl.gateway_of(4) != 4)


CASES = [("hier", k, p) for k in ("reduce_scatter", "all_gather", "all_reduce", "all_to_all")
         for p in ({}, {"nics": 1, "chunks": 2, "node_swizzle": False, "rank_swizzle": False})] + \
        [("hier_2d", k, p) for k in ("reduce_scatter", "all_gather", "all_reduce")
         for p in ({}, {"inter": "direct", "chunks": 2, "node_swizzle": False, "rank_swizzle": False})]


@pytest.mark.parametrize("algorithm,kind,params", CASES, ids=str)
def test_label_formulas_match_built_ranks(algorithm: str, kind: str, params: dict) -> None:
    """`index_of` computes every label peers depend on without building the peer."""
    for nodes, gpus in itertools.product((1, 2, 3), (1, 3)):
        topo = small_topology(nodes, gpus)
        spec = CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="fp32",
                              nbytes=4 * topo.world_size * 3)
        ctx: PlanContext = plan(topo, spec, algorithm, params).source.ctx  # type: ignore[attr-defined]
        needed = {(d.rank, d.label) for r in range(topo.world_size)
                  for d in _peer_deps(ctx, r)}
        for rank, label in needed:
            assert ctx.algorithm.index_of(ctx, rank, label) == ctx.label_map(rank)[label]


def _peer_deps(ctx: PlanContext, rank: int) -> list:  # type: ignore[type-arg]
    b = ctx.new_builder(rank)
    ctx.algorithm.build_rank(ctx, b)
    return [d for p in b.ops for d in p.deps if not isinstance(d, int) and d.rank != rank]


def test_large_cluster_rank_builds_alone() -> None:
    """128 nodes x 8 GPUs: one rank's ops resolve peer labels by formula (no peer builds)."""
    topo = preset("dgx-h100", 128)
    spec = CollectiveSpec(kind="all_reduce", world_size=1024, nbytes=1024 * 1024)
    for algorithm in ("hier", "hier_2d"):
        schedule = plan(topo, spec, algorithm)
        ops = schedule.rank_ops(517)
        assert sum(op.transport == Transport.INTER for op in ops) == 2 * 127   # RS + AG steps
        ctx = schedule.source.ctx  # type: ignore[attr-defined]
        assert set(ctx._labels) <= {517} and not ctx._unfinished   # its own labels kept, no peer's
