"""The hierarchical families compute exactly what the flat definitions do: every schedule runs
through the reference executor (random valid op orders, fresh random data) over a grid of
kinds x nodes x GPUs per node x odd sizes x parameters, plus a bounded hypothesis search."""

from __future__ import annotations

import itertools

import pytest
from helpers import random_group_cast, random_group_reduce, small_topology
from hypothesis import given, settings
from hypothesis import strategies as st

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.errors import HiercollError
from hiercoll.executor.reference import verify
from hiercoll.planner import applicable, plan
from hiercoll.schedule import Transport, validate_structure
from hiercoll.topology import preset

SHARDED = ("reduce_scatter", "all_gather", "all_reduce")
HIER_PARAMS = [
    {},
    {"chunks": 2, "channels": 2},
    {"node_swizzle": False, "rank_swizzle": False, "chunks": 3},
    {"nics": 1},
    {"nics": 2, "chunks": 2, "node_swizzle": False},
]
HIER_2D_PARAMS = [{}, {"inter": "direct"}, {"chunks": 2, "channels": 2},
                  {"inter": "direct", "node_swizzle": False, "rank_swizzle": False, "chunks": 3}]
SHAPES = list(itertools.product((1, 2, 3), (1, 2, 3, 4)))   # (nodes, GPUs per node)


def make_spec(kind: str, world: int, seed: int = 0, reduce_op: str = "sum") -> CollectiveSpec:
    """A spec with an awkward size: W*3+1 elements (not divisible by W), or random splits."""
    if kind == "group_cast":
        return CollectiveSpec(kind=kind, world_size=world, dtype="fp32",
                              splits=random_group_cast(world, seed))
    if kind == "group_reduce":
        return CollectiveSpec(kind=kind, world_size=world, dtype="fp32", reduce_op=reduce_op,
                              splits=random_group_reduce(world, seed))
    elems = world * (2 + seed) if kind == "all_to_all" else world * 3 + 1 + seed
    op = "sum" if kind in ("all_gather", "all_to_all") else reduce_op
    return CollectiveSpec(kind=kind, world_size=world, dtype="fp32", nbytes=4 * elems, reduce_op=op)


def check(nodes: int, gpus: int, kind: str, algorithm: str, params: dict, seed: int = 0,
          reduce_op: str = "sum") -> None:
    topo = small_topology(nodes, gpus)
    if params.get("nics", 0) > gpus:   # one NIC per GPU at most: nothing to check
        params = {k: v for k, v in params.items() if k != "nics"}
    schedule = plan(topo, make_spec(kind, nodes * gpus, seed, reduce_op), algorithm, params).expand()
    validate_structure(schedule)
    report = verify(schedule, trials=2, seed=seed)
    assert report.ok, f"{algorithm} {kind} {nodes}x{gpus} {params}: {report.mismatch}"


@pytest.mark.parametrize("kind", SHARDED + ("all_to_all",))
@pytest.mark.parametrize("params", HIER_PARAMS, ids=str)
def test_hier_sharded_and_all_to_all_grid(kind: str, params: dict) -> None:
    for nodes, gpus in SHAPES:
        check(nodes, gpus, kind, "hier", params, reduce_op="avg")


@pytest.mark.parametrize("kind", ("group_cast", "group_reduce"))
@pytest.mark.parametrize("params", HIER_PARAMS, ids=str)
def test_hier_group_grid(kind: str, params: dict) -> None:
    for (nodes, gpus), seed in itertools.product(SHAPES, (0, 1)):
        check(nodes, gpus, kind, "hier", params, seed, reduce_op=("sum", "avg")[seed])


@pytest.mark.parametrize("kind", SHARDED)
@pytest.mark.parametrize("params", HIER_2D_PARAMS, ids=str)
def test_hier_2d_grid(kind: str, params: dict) -> None:
    for nodes, gpus in SHAPES + [(4, 2)]:
        check(nodes, gpus, kind, "hier_2d", params, reduce_op="avg")


@pytest.mark.parametrize("reduce_op", ["max", "min"])
def test_hier_reductions_other_than_sum(reduce_op: str) -> None:
    for algo in ("hier", "hier_2d"):
        check(2, 3, "all_reduce", algo, {"chunks": 2}, reduce_op=reduce_op)


def test_zero_size_splits_and_tiny_sizes() -> None:
    """Sizes below W (empty shards and chunks) and group splits of size 0 still verify."""
    topo = small_topology(2, 3)
    for kind in SHARDED:
        spec = CollectiveSpec(kind=kind, world_size=6, dtype="fp32", nbytes=4 * 4)
        for algo, params in (("hier", {"chunks": 3}), ("hier_2d", {"chunks": 2})):
            assert verify(plan(topo, spec, algo, params), trials=2, seed=0).ok
    from hiercoll.collectives import GroupSplits, RankSplits, Split
    ranks = [RankSplits(input=[Split(size=0, peers=[3, 4]), Split(size=2, peers=[3, 4])],
                        output=[]) if r == 0 else
             RankSplits(output=[Split(size=0, peers=[0]), Split(size=2, peers=[0])]) if r in (3, 4)
             else RankSplits() for r in range(6)]
    spec = CollectiveSpec(kind="group_cast", world_size=6, dtype="fp32", splits=GroupSplits(ranks=ranks))
    schedule = plan(topo, spec, "hier")
    assert verify(schedule, trials=3, seed=0).ok
    assert sum(o.dst.count for o in schedule.ops() if o.transport == Transport.INTER) == 2


def test_degenerate_hierarchies() -> None:
    """One node: no RDMA at all. One GPU per node: no NVLink at all (pure inter-node)."""
    for algo, kind in [("hier", k) for k in SHARDED + ("all_to_all",)] + \
                      [("hier_2d", k) for k in SHARDED]:
        one_node = plan(small_topology(1, 4), make_spec(kind, 4), algo)
        assert not [o for o in one_node.ops() if o.transport == Transport.INTER]
        one_gpu = plan(small_topology(3, 1), make_spec(kind, 3), algo)
        assert not [o for o in one_gpu.ops() if o.transport == Transport.INTRA]


@settings(max_examples=30, deadline=None)
@given(nodes=st.integers(1, 3), gpus=st.integers(1, 4), seed=st.integers(0, 50),
       kind=st.sampled_from(SHARDED + ("all_to_all", "group_cast", "group_reduce")),
       chunks=st.integers(1, 3), channels=st.integers(1, 2), swizzle=st.booleans(),
       nics=st.integers(1, 4))
def test_hier_property(nodes: int, gpus: int, seed: int, kind: str, chunks: int, channels: int,
                       swizzle: bool, nics: int) -> None:
    params = {"chunks": chunks, "channels": channels, "node_swizzle": swizzle,
              "rank_swizzle": not swizzle, "nics": min(nics, gpus)}
    spec = make_spec(kind, nodes * gpus, seed, reduce_op=("sum", "avg")[seed % 2])
    report = verify(plan(small_topology(nodes, gpus), spec, "hier", params), trials=2, seed=seed)
    assert report.ok, report.mismatch


def test_registered_and_applicable() -> None:
    topo = preset("dgx-h100", 2)
    spec = CollectiveSpec(kind="all_reduce", world_size=16, nbytes=1 << 20)
    assert {"hier", "hier_2d"} <= set(applicable(topo, spec))
    a2a = CollectiveSpec(kind="all_to_all", world_size=16, nbytes=1 << 20)
    assert "hier" in applicable(topo, a2a) and "hier_2d" not in applicable(topo, a2a)


def test_unsupported_cases_say_why() -> None:
    topo = preset("pcie-8gpu", 2)   # 2 NICs per node
    spec = CollectiveSpec(kind="all_reduce", world_size=16, nbytes=1 << 20)
    with pytest.raises(HiercollError, match=r"nics=4 but the topology has 2 NICs per node"):
        plan(topo, spec, "hier", {"nics": 4})
    with pytest.raises(HiercollError, match=r"hier_2d does not implement broadcast"):
        plan(topo, CollectiveSpec(kind=Kind.BROADCAST, world_size=16, nbytes=64), "hier_2d")
    with pytest.raises(HiercollError, match=r"--param \(hier_2d\): inter: Input should be 'ring' or 'direct'"):
        plan(topo, spec, "hier_2d", {"inter": "tree"})
    with pytest.raises(HiercollError, match=r"--param \(hier\): nics: Input should be greater"):
        plan(topo, spec, "hier", {"nics": 0})


@settings(max_examples=20, deadline=None)
@given(nodes=st.integers(1, 4), gpus=st.integers(1, 3), seed=st.integers(0, 50),
       kind=st.sampled_from(SHARDED), chunks=st.integers(1, 3), channels=st.integers(1, 2),
       inter=st.sampled_from(["ring", "direct"]), swizzle=st.booleans())
def test_hier_2d_property(nodes: int, gpus: int, seed: int, kind: str, chunks: int, channels: int,
                          inter: str, swizzle: bool) -> None:
    params = {"chunks": chunks, "channels": channels, "inter": inter, "node_swizzle": swizzle,
              "rank_swizzle": swizzle}
    spec = make_spec(kind, nodes * gpus, seed, reduce_op=("sum", "avg")[seed % 2])
    report = verify(plan(small_topology(nodes, gpus), spec, "hier_2d", params), trials=2, seed=seed)
    assert report.ok, report.mismatch
