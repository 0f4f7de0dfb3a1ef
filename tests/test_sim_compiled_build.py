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


def check_written_in_blocks(sched: Schedule, block_setting: str, ranks: list[int],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrays written a few ops at a time (`block_setting`: the module constant that bounds a
    block) are the arrays written at once, and the built ops' arrays."""
    whole = native_op_arrays(sched, ranks)
    monkeypatch.setattr(block_setting, 100)
    parts = native_op_arrays(sched, ranks)
    assert whole is not None and parts is not None
    assert_same_arrays(parts, whole)
    assert_same_arrays(parts, built(sched, ranks))


def test_ring_arrays_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large world is written a block of ranks at a time; the joined blocks are the whole."""
    _, sched = ring("dgx-h100", 2, "all_reduce", 4096, channels=2)
    check_written_in_blocks(sched, "hiercoll.planner.ring.ARRAY_BLOCK_OPS", list(range(16)),
                            monkeypatch)


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
    for f in TABLE_FIELDS:
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


def group_cast(preset: str, nodes: int, counts: list[list[int]] | None = None, seed: int = 0,
               **params: int) -> tuple[hc.Topology, Schedule]:
    """A dense all-to-all-v (random 1-99 elements a pair, or `counts`) as a direct group_cast."""
    from hiercoll.collectives import GroupSplits
    topo = hc.load_topology(preset, nodes)
    w = topo.world_size
    rng = np.random.default_rng(seed)
    m = rng.integers(1, 100, (w, w)).tolist() if counts is None else counts
    spec = hc.CollectiveSpec(kind="group_cast", world_size=w, dtype="bf16", splits=GroupSplits.from_counts(m))
    return topo, hc.plan(topo, spec, "direct", dict(params))


@pytest.mark.parametrize("preset,nodes,params", [
    ("dgx-h100", 2, {}), ("dgx-h100", 2, {"swizzle": False}), ("h200x4", 1, {"chunks": 3, "channels": 2}),
    ("h100-rail-3tier", 2, {"chunks": 2})])
def test_group_cast_arrays_are_its_built_ops(preset: str, nodes: int, params: dict[str, int]) -> None:
    topo, sched = group_cast(preset, nodes, **params)
    w = topo.world_size
    for ranks in (list(range(w)), [0, w - 1]):
        fast = native_op_arrays(sched, ranks)
        assert fast is not None
        assert_same_arrays(fast, built(sched, ranks))
    py = simulate(sched, topo, mode="exact", engine="python")
    with mock.patch.object(PlanContext, "build", side_effect=AssertionError("built ops")):
        fast_res = simulate(sched, topo, mode="exact", engine="compiled")
    assert_identical(py, fast_res)


def test_only_group_cast_has_a_direct_array_form() -> None:
    topo = hc.load_topology("dgx-h100", 1)
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=8, dtype="bf16", nbytes=1 << 20)
    assert native_op_arrays(hc.plan(topo, spec, "direct", {}), list(range(8))) is None
    _, sched = group_cast("dgx-h100", 1)
    assert native_op_arrays(sched, []) is None


def test_gather_refuses_blocks_of_another_size() -> None:
    from hiercoll.schedule_arrays import gather
    _, sched = ring("dgx-h100", 1, "all_reduce", 64)
    a = native_op_arrays(sched, [0])
    assert a is not None
    assert_same_arrays(gather([a], a.num_ops, int(a.dep_ptr[-1])), a)
    with pytest.raises(ValueError):
        gather([a], a.num_ops - 1, int(a.dep_ptr[-1]))
    with pytest.raises(ValueError):
        gather([a], a.num_ops + 1, int(a.dep_ptr[-1]))
    with pytest.raises(ValueError):
        gather([a], a.num_ops, int(a.dep_ptr[-1]) - 1)


TABLE_FIELDS = ("op_shape", "op_nbytes", "op_delay", "dep_ptr", "dep_idx", "ch_ptr", "ch_ops",
                "sh_ptr", "sh_lid", "sh_w", "op_ce")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preset=st.sampled_from(["dgx-h100", "h200x4", "h100-rail-3tier"]), nodes=st.integers(1, 2),
       zeros=st.floats(0.0, 0.9), seed=st.integers(0, 1 << 16), chunks=st.integers(1, 3),
       channels=st.integers(1, 3), swizzle=st.booleans(), chunk_ops=st.integers(1, 200), data=st.data())
def test_random_group_casts_build_and_replay_identically(
        preset: str, nodes: int, zeros: float, seed: int, chunks: int, channels: int, swizzle: bool,
        chunk_ops: int, data: st.DataObject) -> None:
    """Sparse or dense exchanges (pairs with nothing to send, ranks that send nothing), any
    chunking; the tables built a few rows at a time are the tables built in one go."""
    topo = hc.load_topology(preset, nodes)
    w = topo.world_size
    rng = np.random.default_rng(seed)
    m = np.where(rng.random((w, w)) < zeros, 0, rng.integers(1, 3000, (w, w))).tolist()
    _, sched = group_cast(preset, nodes, m, chunks=chunks, channels=channels, swizzle=swizzle)
    ranks = sorted(data.draw(st.sets(st.integers(0, w - 1), min_size=1, max_size=w)))
    fast = native_op_arrays(sched, ranks)
    assert fast is not None
    slow = built(sched, ranks)
    assert_same_arrays(fast, slow)
    whole = tables_from_arrays(slow, Network(topo, None, itemsize=2), 2)
    with mock.patch("hiercoll.sim.compiled.tables.CHUNK_OPS", chunk_ops):
        parts = tables_from_arrays(fast, Network(topo, None, itemsize=2), 2)
        fast_res = simulate(sched, topo, mode="exact", engine="compiled")
    for f in TABLE_FIELDS:
        assert np.array_equal(getattr(parts, f), getattr(whole, f)), f
    assert_identical(simulate(sched, topo, mode="exact", engine="python"), fast_res)


@pytest.mark.parametrize("preset,nodes,algo", [("dgx-h100", 2, "ring"), ("h200x4", 1, "direct"),
                                               ("h100-rail-3tier", 2, "ring"), ("dgx-h100", 2, "hier")])
def test_tables_in_chunks_are_the_whole(monkeypatch: pytest.MonkeyPatch, preset: str, nodes: int, algo: str) -> None:
    """tables_from_arrays works a few ranks at a time (bounded temporaries); any chunking gives
    the same tables, and the same simulation."""
    topo = hc.load_topology(preset, nodes)
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=topo.world_size, dtype="bf16", nbytes=8 << 20)
    sched = hc.plan(topo, spec, algo, {"channels": 2} if algo == "ring" else {})
    a = built(sched, list(range(topo.world_size)))
    whole = tables_from_arrays(a, Network(topo, None, itemsize=2), 2)
    py = simulate(sched, topo, mode="exact", engine="python")
    for chunk, dense in ((1, 1 << 22), (37, 1 << 22), (37, 0)):      # dense 0: keys numbered by a sort
        monkeypatch.setattr("hiercoll.sim.compiled.tables.CHUNK_OPS", chunk)
        monkeypatch.setattr("hiercoll.sim.compiled.tables.DENSE_KEYS", dense)
        part = tables_from_arrays(a, Network(topo, None, itemsize=2), 2)
        for f in TABLE_FIELDS:
            assert np.array_equal(getattr(part, f), getattr(whole, f)), (chunk, f)
        assert_identical(py, simulate(sched, topo, mode="exact", engine="compiled"))


@pytest.mark.parametrize("preset,nodes,algo,chunk", [("dgx-h100", 2, "ring", None), ("h200x4", 1, "direct", 37),
                                                     ("h100-rail-3tier", 2, "ring", 37), ("dgx-h100", 2, "hier", 1)])
def test_tables_over_consumed_arrays_are_the_same(monkeypatch: pytest.MonkeyPatch, preset: str, nodes: int,
                                                  algo: str, chunk: int | None) -> None:
    """consume=True writes the keys and dependency rows over the arrays' own columns (what
    simulate does with arrays it drops): the same tables as into new arrays, in any chunking."""
    topo = hc.load_topology(preset, nodes)
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=topo.world_size, dtype="bf16", nbytes=8 << 20)
    sched = hc.plan(topo, spec, algo, {"channels": 2} if algo == "ring" else {})
    ranks = list(range(topo.world_size))
    if chunk is not None:
        monkeypatch.setattr("hiercoll.sim.compiled.tables.CHUNK_OPS", chunk)
    kept = tables_from_arrays(built(sched, ranks), Network(topo, None, itemsize=2), 2)
    for arrays in (built(sched, ranks), native_op_arrays(sched, ranks)):
        if arrays is None:
            continue
        proto = arrays.proto
        eaten = tables_from_arrays(arrays, Network(topo, None, itemsize=2), 2, consume=True)
        assert np.shares_memory(eaten.op_key, proto)
        for f in TABLE_FIELDS:
            assert np.array_equal(getattr(eaten, f), getattr(kept, f)), f


def test_array_forms_are_int32_where_they_fit() -> None:
    """What keeps a 33M-op run's arrays and tables under the issue's 4 GB."""
    topo, sched = ring("h100-rail-3tier", 2, "all_reduce", 1 << 16)
    a = native_op_arrays(sched, list(range(16)))
    assert a is not None
    assert {a.proto.dtype, a.channel.dtype, a.dep_rank.dtype, a.dep_index.dtype} == {np.dtype(np.int32)}
    t = tables_from_arrays(a, Network(topo, None, itemsize=2), 2)
    assert {t.op_key.dtype, t.dep_ptr.dtype, t.dep_idx.dtype, t.ch_ptr.dtype, t.ch_ops.dtype} == {np.dtype(np.int32)}


@pytest.mark.parametrize("nodes,params,chunk", [(2, {}, None), (4, {"chunks": 2, "channels": 2}, None),
                                                 (3, {"swizzle": False}, 500)])
def test_pair_keys_made_at_once_equal_keys_made_one_by_one(monkeypatch: pytest.MonkeyPatch, nodes: int,
                                                           params: dict[str, int], chunk: int | None) -> None:
    """A dense all-to-all-v's tables with its pair copies' keys made at once (`copy_links_batch`)
    are the tables made key by key, array for array, and the network's links come out in the
    same order; also across table chunks (a pair met again in a later chunk keeps its shape)."""
    from hiercoll.sim.compiled import tables as tb
    topo, sched = group_cast("dgx-h100", nodes, seed=nodes, **params)
    arrays = native_op_arrays(sched, list(range(topo.world_size)))
    assert arrays is not None
    if chunk is not None:
        monkeypatch.setattr(tb, "CHUNK_OPS", chunk)
    calls: list[int] = []
    real = tb.copy_links_batch

    def counted(net, a, b, ask=None):  # type: ignore[no-untyped-def]
        calls.append(len(a))
        return real(net, a, b, ask)
    monkeypatch.setattr(tb, "copy_links_batch", counted)
    net_fast = Network(topo, itemsize=2)
    fast = tables_from_arrays(arrays, net_fast, 2)
    assert calls and max(calls) > 1
    monkeypatch.setattr(tb, "copy_links_batch", lambda net, a, b, ask=None: None)
    net_slow = Network(topo, itemsize=2)
    slow = tables_from_arrays(arrays, net_slow, 2)
    for name in fast.__dataclass_fields__:
        x, y = getattr(fast, name), getattr(slow, name)
        assert np.array_equal(np.asarray(x), np.asarray(y)), name
    assert net_fast.links == net_slow.links


@pytest.mark.parametrize("preset,nodes", [("dgx-h100", 2), ("h100-rail-3tier", 2), ("h200x4", 1)])
@pytest.mark.parametrize("kind", ["group_cast", "group_reduce"])
def test_dense_splits_bound_like_the_same_splits_read_one_by_one(preset: str, nodes: int, kind: str) -> None:
    """The lower bound of `from_counts` splits reads their matrix (no pair stream, no split
    walked); the same splits loaded from a dump (no matrix) read split by split: the same cut
    bytes on every cut, and the same bound."""
    from hiercoll.collectives import GroupSplits
    from hiercoll.sim.bounds import _group_part_bytes, cuts, lower_bound
    topo = hc.load_topology(preset, nodes)
    w = topo.world_size
    m = np.random.default_rng(w).integers(0, 50, (w, w))
    m[0, 1] = 0                      # a pair that sends nothing
    dense = GroupSplits.from_counts(m.tolist())
    plain = GroupSplits.model_validate(dense.model_dump())
    specs = [hc.CollectiveSpec(kind=kind, world_size=w, dtype="bf16", splits=s) for s in (dense, plain)]
    for cut in cuts(topo):
        assert _group_part_bytes(specs[0], cut) == pytest.approx(_group_part_bytes(specs[1], cut), rel=1e-12)
    a, b = lower_bound(specs[0], topo), lower_bound(specs[1], topo)
    assert a.time_us == pytest.approx(b.time_us, rel=1e-12)


@pytest.mark.parametrize("preset,nodes,algo", [("h100-rail-3tier", 4, "hier"), ("dgx-h100", 2, "hier"),
                                               ("h200x4", 1, "direct")])
def test_tables_kept_as_chunks_or_in_a_dict_are_the_same(monkeypatch: pytest.MonkeyPatch, preset: str,
                                                         nodes: int, algo: str) -> None:
    """The shape and key columns are numpy chunks (scalars wait in a short tail) and pair
    shapes a dense table where world^2 is small, a dict above: any tail length and either
    lookup give the same tables."""
    from hiercoll.sim.compiled import tables as tb
    topo = hc.load_topology(preset, nodes)
    spec = hc.CollectiveSpec(kind="all_reduce", world_size=topo.world_size, dtype="bf16", nbytes=8 << 20)
    sched = hc.plan(topo, spec, algo, {})
    a = built(sched, list(range(topo.world_size)))
    whole = tables_from_arrays(a, Network(topo, None, itemsize=2), 2)
    monkeypatch.setattr(tb._PairShapes, "DENSE", 0)
    monkeypatch.setattr(tb._Column, "TAIL", 3)
    other = tables_from_arrays(a, Network(topo, None, itemsize=2), 2)
    for f in TABLE_FIELDS:
        assert np.array_equal(getattr(other, f), getattr(whole, f)), f
        assert getattr(other, f).dtype == getattr(whole, f).dtype, f
