"""The simulator's per-link bytes agree with the schedule's RDMA count for every hierarchical
family, and show the de-duplication against the flat algorithm on the same network."""

import pytest

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec
from hiercoll.schedule import Transport
from hiercoll.sim import simulate
from tests.helpers import random_group_cast, random_group_reduce, small_topology


def schedule_inter_bytes(s) -> int:  # type: ignore[no-untyped-def]
    return sum(op.dst.count for op in s.ops() if op.transport == Transport.INTER) * s.spec.dtype.itemsize


@pytest.mark.parametrize("kind,algo,flat", [
    ("reduce_scatter", "hier", "direct"), ("all_gather", "hier", "direct"),
    ("all_reduce", "hier", "two_shot"), ("all_reduce", "hier_2d", "two_shot"),
    ("all_to_all", "hier", "direct"),
])
def test_sharded_families(kind, algo, flat):
    topo = small_topology(3, 4)
    spec = CollectiveSpec(kind=kind, world_size=12, dtype="bf16", nbytes=12 * 2 * 4096)
    s, f = hc.plan(topo, spec, algo), hc.plan(topo, spec, flat)
    rs, rf = simulate(s, topo), simulate(f, topo)
    assert rs.bytes_inter == schedule_inter_bytes(s)
    assert rf.bytes_inter == schedule_inter_bytes(f)
    if kind == "all_to_all":
        assert rs.bytes_inter == rf.bytes_inter        # same bytes, fewer and larger messages
    else:
        assert rs.bytes_inter < rf.bytes_inter


@pytest.mark.parametrize("kind", ["group_cast", "group_reduce"])
def test_group_families(kind):
    topo = small_topology(2, 3)
    maker = random_group_cast if kind == "group_cast" else random_group_reduce
    spec = CollectiveSpec(kind=kind, world_size=6, dtype="bf16", splits=maker(6, 11, max_size=64))
    s, f = hc.plan(topo, spec, "hier"), hc.plan(topo, spec, "direct")
    rs, rf = simulate(s, topo), simulate(f, topo)
    assert rs.bytes_inter == schedule_inter_bytes(s)
    assert rf.bytes_inter == schedule_inter_bytes(f)
    assert rs.bytes_inter <= rf.bytes_inter
