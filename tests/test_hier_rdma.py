"""What crosses the network. For each hierarchical family the RDMA (Transport.INTER) element
count read off the schedule equals the de-duplicated count derived by hand, and is compared
with the flat algorithms' counts (N nodes, L GPUs per node, W = N*L, S = count elements)."""

from __future__ import annotations

import pytest
from helpers import random_group_cast, random_group_reduce, small_topology

from hiercoll.collectives import CollectiveSpec, GroupSplits, RankSplits, Split
from hiercoll.executor.reference import verify
from hiercoll.planner import plan
from hiercoll.planner.hier.common import rails
from hiercoll.planner.hier.group import reduce_atoms
from hiercoll.schedule import Schedule, Transport
from hiercoll.topology import Topology, preset


def inter_elements(schedule: Schedule) -> int:
    return sum(op.dst.count for op in schedule.ops() if op.transport == Transport.INTER)


def inter_ops(schedule: Schedule) -> int:
    return sum(1 for op in schedule.ops() if op.transport == Transport.INTER)


def sharded(kind: str, topo: Topology, count: int) -> CollectiveSpec:
    return CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="fp32", nbytes=4 * count)


def ring_crossings(topo: Topology, spec: CollectiveSpec) -> int:
    """Flat ring: the N edges r = (a, L-1) -> (a+1, 0) each carry W-1 blocks: all but block r
    (reduce-scatter: r keeps its own) or block r+1 (all-gather: r+1 started with it)."""
    if topo.num_nodes == 1:
        return 0
    skip = 1 if spec.kind == "all_gather" else 0
    senders = [topo.rank_of(a, topo.gpus_per_node - 1) for a in range(topo.num_nodes)]
    return sum(spec.count - spec.shard((r + skip) % spec.world_size)[1] for r in senders)


@pytest.mark.parametrize("nodes,gpus", [(2, 4), (3, 2), (4, 3), (2, 1), (1, 4)])
@pytest.mark.parametrize("count", [97, 240])
def test_sharded_kinds_cross_once_per_node(nodes: int, gpus: int, count: int) -> None:
    """hier RS/AG: (N-1)*S, each byte once and (RS) already reduced by L; direct: L*(N-1)*S;
    ring: N*(W-1)/W*S. all_reduce doubles the first two; hier_2d matches hier with a ring or
    direct rail, and its one-shot rail all-reduce sends N*(N-1)*S."""
    topo = small_topology(nodes, gpus)
    n, l = nodes, gpus
    for kind in ("reduce_scatter", "all_gather"):
        spec = sharded(kind, topo, count)
        assert inter_elements(plan(topo, spec, "hier")) == (n - 1) * count
        assert inter_elements(plan(topo, spec, "hier", {"nics": 1, "chunks": 3})) == (n - 1) * count
        for inter in ("ring", "direct"):
            assert inter_elements(plan(topo, spec, "hier_2d", {"inter": inter})) == (n - 1) * count
        assert inter_elements(plan(topo, spec, "direct")) == l * (n - 1) * count
        assert inter_elements(plan(topo, spec, "ring")) == ring_crossings(topo, spec)
        if l > 1 and n > 1:
            assert (n - 1) * count < ring_crossings(topo, spec) < l * (n - 1) * count
    spec = sharded("all_reduce", topo, count)
    assert inter_elements(plan(topo, spec, "hier")) == 2 * (n - 1) * count
    assert inter_elements(plan(topo, spec, "hier_2d")) == 2 * (n - 1) * count
    assert inter_elements(plan(topo, spec, "hier_2d", {"inter": "direct"})) == n * (n - 1) * count
    assert inter_elements(plan(topo, spec, "two_shot")) == 2 * l * (n - 1) * count
    ring_ar = ring_crossings(topo, sharded("reduce_scatter", topo, count)) + \
        ring_crossings(topo, sharded("all_gather", topo, count))
    assert inter_elements(plan(topo, spec, "ring")) == ring_ar


def test_all_to_all_aggregates_messages_not_bytes() -> None:
    """all_to_all has nothing to de-duplicate: same (N-1)/N * S per rank as direct, but one
    message per (rank, remote node, chunk) instead of one per (rank, remote rank, chunk)."""
    topo = small_topology(3, 4)
    spec = CollectiveSpec(kind="all_to_all", world_size=12, dtype="fp32", nbytes=4 * 12 * 5)
    hier, direct = plan(topo, spec, "hier", {"chunks": 2}), plan(topo, spec, "direct", {"chunks": 2})
    assert inter_elements(hier) == inter_elements(direct) == 12 * 8 * 5
    assert inter_ops(hier) == 12 * 2 * 2 and inter_ops(direct) == 12 * 8 * 2


def cast_dedup_count(topo: Topology, spec: CollectiveSpec) -> tuple[int, int]:
    """(de-duplicated, flat): per split, size x remote nodes holding destinations / x remote
    destinations."""
    assert spec.splits is not None
    dedup = flat = 0
    for s, rs in enumerate(spec.splits.ranks):
        for sp in rs.input:
            remote = [d for d in sp.peers if not topo.same_node(s, d)]
            dedup += sp.size * len({topo.node_of(d) for d in remote})
            flat += sp.size * len(remote)
    return dedup, flat


def reduce_dedup_count(topo: Topology, spec: CollectiveSpec) -> tuple[int, int]:
    """(de-duplicated, flat): per output atom, count x remote source nodes / x remote sources."""
    dedup = flat = 0
    for d in range(spec.world_size):
        for atom in reduce_atoms(spec, d):
            remote = [s for s, _ in atom.inputs if not topo.same_node(s, d)]
            dedup += atom.count * len({topo.node_of(s) for s in remote})
            flat += atom.count * len(remote)
    return dedup, flat


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("params", [{}, {"nics": 1, "chunks": 2}], ids=str)
def test_group_cast_and_reduce_cross_once_per_node(seed: int, params: dict) -> None:
    topo = small_topology(3, 3)
    for make, count in ((random_group_cast, cast_dedup_count), (random_group_reduce, reduce_dedup_count)):
        kind = "group_cast" if make is random_group_cast else "group_reduce"
        spec = CollectiveSpec(kind=kind, world_size=9, dtype="fp32", splits=make(9, seed, max_size=9))
        dedup, flat = count(topo, spec)
        assert inter_elements(plan(topo, spec, "hier", params)) == dedup
        assert inter_elements(plan(topo, spec, "direct")) == flat
        assert dedup <= flat


def test_inter_node_ops_run_between_gateways_only() -> None:
    """With fewer NICs than GPUs (pcie-8gpu: NICs next to local ranks 0 and 4) every RDMA op
    reads and writes GPUs next to a NIC; the others stage over NVLink."""
    topo = preset("pcie-8gpu", 2)
    gateways = set(rails(topo, None))
    assert gateways == {0, 4}
    splits = random_group_cast(16, 3, max_size=5)
    for kind in ("reduce_scatter", "all_gather", "all_reduce", "all_to_all", "group_cast"):
        spec = (CollectiveSpec(kind=kind, world_size=16, dtype="fp32", splits=splits)
                if kind == "group_cast" else sharded(kind, topo, 16 * 3))
        schedule = plan(topo, spec, "hier").expand()
        assert verify(schedule, trials=1, seed=0).ok
        for op in schedule.ops():
            if op.transport == Transport.INTER:
                ends = {op.dst.rank, *(s.rank for s in op.srcs)}
                assert {topo.local_rank_of(r) for r in ends} <= gateways, op.describe()


def causal_kv_splits(nodes: int, gpus: int, tokens: int) -> GroupSplits:
    """Context-parallel causal attention: rank i holds the KV of token block i and needs the KV
    of every earlier block j < i (all-gather-free, zero-redundancy group_cast)."""
    world = nodes * gpus
    ranks = []
    for r in range(world):
        later = list(range(r + 1, world))
        ranks.append(RankSplits(input=[Split(size=tokens, peers=later)] if later else [],
                                output=[Split(size=tokens, peers=[j]) for j in range(r)]))
    return GroupSplits(ranks=ranks)


def test_cp_attention_group_cast_dedups_rdma() -> None:
    """2 nodes x 4 GPUs (h200x4, a NIC per GPU), 512 KV elements per block: node 0's four
    blocks are each needed by all four ranks of node 1. Flat sends 4 x 4 blocks over RDMA, the
    de-duplicated plan 4 (one per source block), 4x fewer bytes."""
    topo = preset("h200x4", 2)
    spec = CollectiveSpec(kind="group_cast", world_size=8, dtype="bf16",
                          splits=causal_kv_splits(2, 4, tokens=512))
    hier, flat = plan(topo, spec, "hier", {"chunks": 2}), plan(topo, spec, "direct")
    assert verify(hier, trials=3, seed=0).ok
    isz = spec.dtype.itemsize
    hier_bytes, flat_bytes = inter_elements(hier) * isz, inter_elements(flat) * isz
    print(f"\nCP causal group_cast 2x4, 512 elements/block: RDMA bytes hier {hier_bytes}, "
          f"flat {flat_bytes} ({flat_bytes / hier_bytes:.1f}x)")
    assert (hier_bytes, flat_bytes) == (4 * 512 * isz, 16 * 512 * isz)
