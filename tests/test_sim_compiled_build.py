"""The compiled core's fast build (issue 29): the ring's array form against its built ops, the
tables from arrays, and simulate's array-side bookkeeping (op times, critical path, host
launches) against the Python engine, which stays the reference."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiercoll as hc
from hiercoll.planner.context import PlanContext
from hiercoll.schedule import Schedule
from hiercoll.schedule_arrays import OpArrays, native_op_arrays, op_arrays_from_ops
from hiercoll.sim import simulate
from hiercoll.sim.compiled.tables import tables_from_arrays
from hiercoll.sim.links import Network
from hiercoll.sim.result import OpTimes, SimResult
from hiercoll.sim.simulate import host_launches, launch_counts

pytest.importorskip("numba")

KINDS = ("all_reduce", "reduce_scatter", "all_gather")


def ring(preset: str, nodes: int, kind: str, elems: int, channels: int = 1, chunks: int = 1) -> tuple[hc.Topology, Schedule]:
    topo = hc.load_topology(preset, nodes)
    w = topo.world_size
    if kind != "all_reduce":
        elems = max(elems // w, 1) * w          # per-rank shards of one size
    spec = hc.CollectiveSpec(kind=kind, world_size=w, dtype="bf16", nbytes=2 * elems)
    return topo, hc.plan(topo, spec, "ring", {"channels": channels, "chunks": chunks})


def assert_same_arrays(a: OpArrays, b: OpArrays) -> None:
    assert a.ranks == b.ranks
    for f in ("lens", "channel", "count", "dep_ptr", "dep_rank", "dep_index"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert [a.protos[i] for i in a.proto.tolist()] == [b.protos[i] for i in b.proto.tolist()]


def built(schedule: Schedule, ranks: list[int]) -> OpArrays:
    out = op_arrays_from_ops([schedule.rank_ops(r) for r in ranks], ranks)
    assert out is not None
    return out


def assert_identical(py: SimResult, fast: SimResult) -> None:
    """The compiled run's result is the Python engine's: times to the bit, the same ops (the
    Python engine's dicts are in the order ops ended, the compiled core's in (rank, index)
    order), the same critical path and link loads."""
    assert fast.time_us == py.time_us
    assert sorted(fast.op_end) == list(fast.op_end) == sorted(py.op_end) == sorted(py.op_start)
    assert [fast.op_end[r] for r in py.op_end] == list(py.op_end.values())
    assert [fast.op_start[r] for r in py.op_start] == list(py.op_start.values())
    assert fast.critical_path == py.critical_path
    assert [(l.name, l.bytes, l.busy_us) for l in fast.links] == [(l.name, l.bytes, l.busy_us) for l in py.links]
    assert (fast.bytes_intra, fast.bytes_inter, fast.num_ops) == (py.bytes_intra, py.bytes_inter, py.num_ops)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("nodes,channels,chunks", [(1, 1, 1), (2, 1, 1), (2, 2, 3), (3, 3, 2), (2, 8, 1)])
@pytest.mark.parametrize("elems", [1, 5, 1000, 1 << 20])
def test_ring_arrays_are_its_built_ops(kind: str, nodes: int, channels: int, chunks: int, elems: int) -> None:
    _, sched = ring("dgx-h100", nodes, kind, elems, channels, chunks)
    w = sched.world_size
    for ranks in (list(range(w)), [1, w - 1], [3]):
        fast = native_op_arrays(sched, ranks)
        assert fast is not None
        assert_same_arrays(fast, built(sched, ranks))


def test_ring_arrays_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large world is written a block of ranks at a time; the joined blocks are the whole."""
    _, sched = ring("dgx-h100", 2, "all_reduce", 4096, channels=2)
    whole = native_op_arrays(sched, list(range(16)))
    monkeypatch.setattr("hiercoll.planner.ring.ARRAY_BLOCK_OPS", 100)
    parts = native_op_arrays(sched, list(range(16)))
    assert whole is not None and parts is not None
    assert_same_arrays(parts, whole)
    assert_same_arrays(parts, built(sched, list(range(16))))


def test_no_ranks_no_array_form() -> None:
    _, sched = ring("dgx-h100", 1, "all_reduce", 64)
    assert native_op_arrays(sched, []) is None


@pytest.mark.parametrize("preset,nodes,algo", [
    ("dgx-h100", 2, "ring"), ("h200x4", 1, "ring"), ("h200x4", 1, "direct"),
    ("h100-rail-3tier", 2, "ring"), ("dgx-h100", 2, "hier")])
def test_tables_from_native_and_built_arrays_agree(preset: str, nodes: int, algo: str) -> None:
    topo = hc.load_topology(preset, nodes)
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=topo.world_size, dtype="bf16", nbytes=8 << 20)
    sched = hc.plan(topo, spec, algo, {})
    ranks = list(range(topo.world_size))
    native = native_op_arrays(sched, ranks)
    if native is None:
        assert algo != "ring"
        return
    net_a, net_b = (Network(topo, None, itemsize=2) for _ in range(2))
    a = tables_from_arrays(native, net_a, 2)
    b = tables_from_arrays(built(sched, ranks), net_b, 2)
    for f in ("op_shape", "op_nbytes", "op_delay", "dep_ptr", "dep_idx", "ch_ptr", "ch_ops",
              "sh_ptr", "sh_lid", "sh_w", "op_ce"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert [l.name for l in net_a.links] == [l.name for l in net_b.links]


@pytest.mark.parametrize("preset,nodes,algo,nbytes", [
    ("dgx-h100", 2, "ring", 64 << 20), ("dgx-h100", 2, "direct", 1 << 20),
    ("h200x4", 1, "ring", 256 << 20), ("h200x4", 1, "direct", 256 << 20),     # copy engines
    ("h100-rail-3tier", 2, "ring", 16 << 20), ("dgx-h100", 2, "hier", 64 << 20)])
def test_compiled_results_are_the_python_engines(preset: str, nodes: int, algo: str, nbytes: int) -> None:
    topo = hc.load_topology(preset, nodes)
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=topo.world_size, dtype="bf16", nbytes=nbytes)
    sched = hc.plan(topo, spec, algo, {})
    for call_mode in ("eager", "graph"):
        py = simulate(sched, topo, mode="exact", engine="python", call_mode=call_mode)
        fast = simulate(sched, topo, mode="exact", engine="compiled", call_mode=call_mode)
        assert isinstance(fast.op_end, OpTimes)
        assert_identical(py, fast)


def test_a_ring_simulation_builds_no_op() -> None:
    """The ring's compiled path writes arrays only: building any rank's ops would fail."""
    topo, sched = ring("dgx-h100", 2, "all_reduce", 1 << 20, channels=2)
    py = simulate(sched, topo, mode="exact", engine="python")
    _, fresh = ring("dgx-h100", 2, "all_reduce", 1 << 20, channels=2)
    with mock.patch.object(PlanContext, "build", side_effect=AssertionError("built ops")):
        fast = simulate(fresh, topo, mode="exact", engine="compiled")
    assert_identical(py, fast)


@pytest.mark.parametrize("preset,algo", [("h200x4", "direct"), ("h200x4", "ring"), ("dgx-h100", "hier")])
def test_launch_counts_are_host_launches(preset: str, algo: str) -> None:
    topo = hc.load_topology(preset, 2)
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=topo.world_size, dtype="bf16", nbytes=64 << 20)
    sched = hc.plan(topo, spec, algo, {})
    ranks = list(range(topo.world_size))
    t = tables_from_arrays(built(sched, ranks), Network(topo, None, itemsize=2), 2)
    counts = launch_counts(t)
    thr = topo.costs.ce_threshold_bytes
    assert counts == {r: host_launches(sched.rank_ops(r), 2, thr) for r in ranks}


def test_op_times_reads_as_the_dict() -> None:
    times = OpTimes([0, 1, 2], [2, 0, 1], np.array([1.0, 2.0, 3.0]))
    as_dict = {(0, 0): 1.0, (0, 1): 2.0, (2, 0): 3.0}
    assert list(times) == list(as_dict) and len(times) == 3 and times == as_dict
    assert times[(2, 0)] == 3.0 and (0, 1) in times and (1, 0) not in times and (0, 2) not in times
    assert "x" not in times and (0,) not in times
    with pytest.raises(KeyError):
        times[(5, 0)]
    assert sorted(times) == sorted(as_dict) and dict(times.items()) == as_dict


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preset=st.sampled_from(["dgx-h100", "h200x4", "h100-rail-3tier", "pcie-8gpu"]),
       nodes=st.integers(1, 2), kind=st.sampled_from(KINDS), elems=st.integers(1, 1 << 22),
       channels=st.integers(1, 4), chunks=st.integers(1, 3), data=st.data())
def test_random_rings_build_and_replay_identically(preset: str, nodes: int, kind: str, elems: int,
                                                   channels: int, chunks: int, data: st.DataObject) -> None:
    topo, sched = ring(preset, nodes, kind, elems, channels, chunks)
    w = sched.world_size
    ranks = sorted(data.draw(st.sets(st.integers(0, w - 1), min_size=1, max_size=w)))
    fast_arrays = native_op_arrays(sched, ranks)
    assert fast_arrays is not None
    assert_same_arrays(fast_arrays, built(sched, ranks))
    call_mode = data.draw(st.sampled_from(["eager", "graph"]))
    py = simulate(sched, topo, mode="exact", engine="python", call_mode=call_mode)  # type: ignore[arg-type]
    fast = simulate(sched, topo, mode="exact", engine="compiled", call_mode=call_mode)  # type: ignore[arg-type]
    assert_identical(py, fast)
