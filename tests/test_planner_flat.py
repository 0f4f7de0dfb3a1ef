"""Every algorithm verifies against the naive reference on random data and random topologies
(1-8 nodes x 1-8 GPUs, capped at 24 ranks to keep the suite fast)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiercoll as hc
from hiercoll.collectives import Kind
from hiercoll.executor.reference import verify
from hiercoll.planner import algorithms, applicable
from hiercoll.schedule import ExpandedOps, Schedule, validate_structure
from tests.helpers import random_group_cast, random_group_reduce, small_topology


def make_spec(kind: Kind, world: int, elems: int, dtype="bf16", seed=0, op="sum", root=0):
    if kind == Kind.GROUP_CAST:
        return hc.CollectiveSpec(kind=kind, world_size=world, dtype=dtype, splits=random_group_cast(world, seed))
    if kind == Kind.GROUP_REDUCE:
        return hc.CollectiveSpec(kind=kind, world_size=world, dtype=dtype, reduce_op=op if op in ("sum", "avg") else "sum",
                                 splits=random_group_reduce(world, seed))
    if kind == Kind.ALL_TO_ALL:
        elems = world * max(elems // world, 0)
    isz = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}[dtype]
    return hc.CollectiveSpec(kind=kind, world_size=world, dtype=dtype, nbytes=elems * isz,
                             reduce_op=op, root=root % world)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 8), gpus=st.integers(1, 8), kind=st.sampled_from(list(Kind)),
       elems=st.integers(0, 97), dtype=st.sampled_from(["bf16", "fp16", "fp32", "fp64"]),
       op=st.sampled_from(["sum", "avg", "max", "min"]), chunks=st.integers(1, 3),
       channels=st.integers(1, 2), seed=st.integers(0, 10**6), data=st.data())
def test_every_algorithm_verifies(nodes, gpus, kind, elems, dtype, op, chunks, channels, seed, data):
    if nodes * gpus > 24:
        gpus = max(1, 24 // nodes)
    topo = small_topology(nodes, gpus)
    spec = make_spec(kind, topo.world_size, elems, dtype, seed, op, root=seed)
    algo = data.draw(st.sampled_from(applicable(topo, spec)))   # hierarchical ones too
    params = {"chunks": chunks, "channels": channels}
    if "swizzle" in algorithms()[algo].Params.model_fields:
        params["swizzle"] = data.draw(st.booleans())
    s = hc.plan(topo, spec, algo, params)
    validate_structure(s)
    report = verify(s, trials=2, seed=seed)
    assert report.ok, f"{algo} {params}: {report.mismatch}"


@pytest.mark.parametrize("algo,kind", [("ring", "all_reduce"), ("ring", "reduce_scatter"),
                                       ("ring", "all_gather"), ("direct", "reduce_scatter"),
                                       ("direct", "all_reduce"), ("two_shot", "all_reduce")])
def test_label_formulas_match_built_lists(algo, kind):
    """index_of formulas (used at scale) agree with the labels the recipe actually emits."""
    topo = small_topology(2, 3)
    spec = make_spec(Kind(kind), 6, 50)
    s = hc.plan(topo, spec, algo, {"chunks": 2, "channels": 2})
    ctx = s.source.ctx
    algorithm = algorithms()[algo]
    for r in range(6):
        for label, index in ctx.label_map(r).items():
            assert algorithm.index_of(ctx, r, label) == index


def _drop_dependency(s: Schedule) -> Schedule:
    """Remove the cross-rank dependency of the first op that has one."""
    e = s.expand()
    ops = [list(e.rank_ops(r)) for r in range(e.world_size)]
    for r, lst in enumerate(ops):
        for i, op in enumerate(lst):
            if any(d[0] != r for d in op.deps):
                lst[i] = dataclasses.replace(op, deps=tuple(d for d in op.deps if d[0] == r))
                src = ExpandedOps(tuple(map(tuple, ops)), tuple(e.buffers(q) for q in range(e.world_size)))
                return Schedule(e.meta, src)
    raise AssertionError("no cross-rank dependency")


@pytest.mark.parametrize("algo,kind", [("ring", "all_reduce"), ("direct", "reduce_scatter"),
                                       ("two_shot", "all_reduce")])
def test_reference_executor_catches_a_missing_dependency(algo, kind):
    topo = small_topology(1, 4)
    s = hc.plan(topo, make_spec(Kind(kind), 4, 64, "fp32"), algo)
    assert verify(s, trials=3, seed=1).ok
    broken = _drop_dependency(s)
    validate_structure(broken)  # still well-formed: only the ordering is wrong
    report = verify(broken, trials=20, seed=1)
    assert not report.ok
    assert report.mismatch is not None and "rank" in str(report.mismatch)


def test_execute_with_caller_inputs():
    topo = small_topology(1, 3)
    spec = make_spec(Kind.ALL_GATHER, 3, 7, "fp32")
    s = hc.plan(topo, spec, "ring")
    inputs = [np.full(spec.input_count(r), float(r + 1), dtype=np.float32) for r in range(3)]
    outs = hc.execute(s, inputs)
    np.testing.assert_array_equal(outs[1], [1, 1, 1, 2, 2, 3, 3])
    with pytest.raises(hc.HiercollError, match=r"inputs\[0\]: shape"):
        hc.execute(s, [np.zeros(1)] * 3)


def test_unsupported_combination_is_one_line():
    topo = small_topology(1, 2)
    with pytest.raises(hc.HiercollError, match="ring does not implement all_to_all"):
        hc.plan(topo, make_spec(Kind.ALL_TO_ALL, 2, 8), "ring")
