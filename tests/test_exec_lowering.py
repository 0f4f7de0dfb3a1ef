"""The cuda lowering on CPU: what would be launched, in which order, with which signals; and the
emulator that runs every rank's lowered program with random interleavings against numpy."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import bf16_spec, check_emulation, h200_topology, lowering_cases

from hiercoll.errors import HiercollError, VerificationError
from hiercoll.executor.cuda import emulate as emu
from hiercoll.executor.cuda.lowering import (
    Addr,
    CopyLaunch,
    CudaOptions,
    KernelLaunch,
    RecvLaunch,
    SendLaunch,
    Signal,
    Wait,
    lower,
    symmetric_layout,
)
from hiercoll.executor.cuda.table import encode, float_bits
from hiercoll.kernels.abi import (
    F_COUNT,
    F_DST,
    F_NSIG,
    F_NWAIT,
    F_RELAXED,
    F_SIG,
    F_SRC,
    F_WAIT,
    ROW_WORDS,
    WAIT_WORDS,
)
from hiercoll.planner import applicable, plan

_topo, _spec = h200_topology, bf16_spec


def test_layout_is_the_same_on_every_rank_and_aligned():
    s = plan(_topo(1, 4), _spec("reduce_scatter", 4), "ring")
    lay = symmetric_layout(s)
    assert list(lay.offsets)[:2] == ["input", "output"]
    assert all(off % 128 == 0 for off in lay.offsets.values())   # 256 B of bf16
    assert lay.sizes["output"] == 37 and lay.sizes["input"] == 148


def test_direct_all_gather_on_two_ranks_worked_by_hand():
    """Rank 0: push to rank 1 (ch0) and the local copy (a channel of its own, so it runs beside
    the push); nobody waits on either op, so the only signals are the two barriers'."""
    s = plan(_topo(1, 2), _spec("all_gather", 2, 8), "direct").expand()
    ops = s.rank_ops(0)
    prog = lower(s, 0, CudaOptions(ctas=2, fuse=False, forward=False))   # the multi-stream form
    out = prog.layout.offsets["output"]
    launches = [x for items in prog.streams.values() for x in items]
    assert all(isinstance(x, KernelLaunch) and x.grid == 2 for x in launches)
    rows = [r for x in launches for r in x.rows]
    assert sorted(r.op for r in rows) == sorted(o.id for o in ops)
    assert len(prog.streams) == 2 and all(not r.signals and not r.waits for r in rows)
    pushed = next(r for r in rows if r.dst and r.dst.rank == 1)
    assert pushed.srcs == (Addr(0, 0),) and pushed.dst == Addr(1, out)
    # barriers: arrive signals slot num_ops + rank on both ranks, wait needs both arrivals
    n = len(s.rank_ops(0)) + len(s.rank_ops(1))
    assert prog.start_barrier is not None
    arrive, wait = prog.start_barrier.rows
    assert arrive.signals == (Signal(0, n + 0), Signal(1, n + 0))
    assert [w.slot for w in wait.waits] == [n, n + 1]
    end_arrive, _ = prog.end_barrier.rows
    assert end_arrive.signals == (Signal(0, n + 2), Signal(1, n + 2))


def test_cross_rank_dependency_becomes_a_signal_to_the_waiting_rank():
    s = plan(_topo(1, 4), _spec("all_reduce", 4), "direct").expand()
    p1 = lower(s, 1, CudaOptions(ctas=4, fuse=False, forward=False))
    reduce_row = next(r for items in p1.streams.values() for x in items for r in x.rows if r.reduce)
    reduce_op = next(o for o in s.rank_ops(1) if o.kind.value == "reduce")
    base = {r: sum(len(s.rank_ops(q)) for q in range(r)) for r in range(4)}
    want = {Wait(base[d[0]] + d[1], 4, f"{d[0]}.{d[1]}") for d in reduce_op.deps}
    assert want <= set(reduce_row.waits)
    for dr, di in reduce_op.deps:   # each producer signals rank 1's copy of its slot
        prod = lower(s, dr, CudaOptions(ctas=4, fuse=False, forward=False))
        row = next(r for items in prod.streams.values() for x in items for r in x.rows
                   if r.op == f"{dr}.{di}")
        assert Signal(1, base[dr] + di) in row.signals


def test_big_copies_go_to_the_copy_engine_between_a_wait_and_a_signal_row():
    s = plan(_topo(1, 2), _spec("all_gather", 2, 1024), "direct").expand()
    prog = lower(s, 0, CudaOptions(ce_threshold_bytes=1024))
    items = [x for xs in prog.streams.values() for x in xs]
    ce = [i for i, x in enumerate(items) if isinstance(x, CopyLaunch)]
    assert len(ce) == 1
    before, after = items[ce[0] - 1], items[ce[0] + 1]
    assert isinstance(before, KernelLaunch) and before.rows[0].op.endswith(":wait")
    assert isinstance(after, KernelLaunch) and after.rows[0].op.endswith(":signal")
    assert items[ce[0]].count == 1024


def test_table_encodes_rows_relative_to_this_ranks_base():
    s = plan(_topo(1, 2), _spec("all_reduce", 2, 16), "direct").expand()
    prog = lower(s, 0, CudaOptions(ctas=1, fuse=False, forward=False))
    data_delta, sig_delta = [0, 1000], [0, 50]
    t = encode(prog, data_delta, sig_delta)
    rows = [r for x in ([prog.start_barrier] + [y for v in prog.streams.values() for y in v]
                        + [prog.end_barrier]) for r in x.rows]
    assert t.row_names == [r.op for r in rows]
    for i, row in enumerate(rows):
        w = t.words[i * ROW_WORDS:(i + 1) * ROW_WORDS]
        assert w[F_COUNT] == row.count and w[F_NWAIT] == len(row.waits)
        if row.dst:
            assert w[F_DST] == data_delta[row.dst.rank] + row.dst.offset
            assert t.words[w[F_SRC]] == data_delta[row.srcs[0].rank] + row.srcs[0].offset
        sigs = t.words[w[F_SIG]:w[F_SIG] + w[F_NSIG]]
        assert sigs == [sig_delta[x.rank] + x.slot for x in row.signals]
        waits = t.words[w[F_WAIT]:w[F_WAIT] + WAIT_WORDS * w[F_NWAIT]]
        assert waits[0::2] == [x.slot for x in row.waits]   # own slots: delta 0 on rank 0
    assert float_bits(0.25) == 0x3E800000


@pytest.mark.parametrize(("field", "value", "match"), [
    ("ctas", 0, "ctas: 0 must be in 1..132"),
    ("max_ctas", 0, "max_ctas: 0 must be in 1..132"),
    ("max_ctas", 264, "max_ctas: 264 must be in 1..132"),
    ("ce_threshold_bytes", -1, "ce_threshold_bytes: -1 must be >= 0"),
    ("debug_timeout_ms", -5.0, "debug_timeout_ms"),
    ("inter_transport", "rdma", "inter_transport: 'rdma' should be one of peer, nccl"),
])
def test_options_are_validated(field, value, match):
    with pytest.raises(HiercollError, match=match):
        CudaOptions(**{field: value})


CASES = lowering_cases(((1, 2), (1, 4), (2, 2)))


@pytest.mark.parametrize(("nodes", "gpus", "kind", "algo"), CASES)
def test_emulated_lowering_matches_numpy_over_several_calls(nodes, gpus, kind, algo):
    s = plan(_topo(nodes, gpus), _spec(kind, nodes * gpus), algo).expand()
    for seed, opts in enumerate((CudaOptions(ctas=3), CudaOptions(ctas=2, ce_threshold_bytes=64),
                                 CudaOptions(ctas=1), CudaOptions(ctas=1, single_stream=True),
                                 CudaOptions(ctas=2, protocol="simple"))):
        check_emulation(s, opts, seed)


def test_one_cta_launches_order_rows_without_signals_and_share_release_fences():
    """One CTA walks its rows in order (a CTA barrier between rows), so channel order costs no
    signal round trip; the direct all-reduce's three small pushes leave behind one release (the
    last push's row carries all three signals) and the reduce waits for the three peers."""
    from hiercoll.executor.cuda.lowering import fused_launch
    s = plan(_topo(1, 4), _spec("all_reduce", 4), "direct").expand()
    for r in range(4):
        rows = [row for row in fused_launch(lower(s, r, CudaOptions(
                    ctas=1, single_stream=True, forward=False, split_channels=False,
                    protocol="simple"))).rows
                if row.count]
        pushes, reduce = rows[:3], rows[3]
        assert [len(x.signals) for x in pushes] == [0, 0, 3], r
        assert all(w.producer.startswith("barrier:start") for w in pushes[0].waits)
        assert not pushes[1].waits and not pushes[2].waits
        own = {f"{r}.{i}" for i in range(4)}
        assert {w.producer for w in reduce.waits} & own == set()     # no wait on its own rows
        assert len(reduce.waits) == 3
    several = lower(s, 0, CudaOptions(ctas=2, single_stream=True, forward=False,
                                      split_channels=False, protocol="simple"))
    # the pushes share no region: each CTA orders its own elements, no grid-wide wait
    assert not any(w.producer == "0.0" for row in fused_launch(several).rows for w in row.waits)
    # rows on different CTA splits do need one (hier's level of two pushes after a reduce)
    hier = plan(_topo(2, 2), _spec("all_reduce", 4), "hier").expand()
    rows = fused_launch(lower(hier, 0, CudaOptions(ctas=4, single_stream=True,
                                                   protocol="simple"))).rows
    assert any(w.producer == "0.1" and w.per_epoch == 4 for row in rows for w in row.waits)
    check_emulation(hier, CudaOptions(ctas=4, single_stream=True, protocol="simple"), seed=3)


def test_emulator_catches_a_missing_start_barrier(monkeypatch):
    """Without the start barrier a fast rank's next call overwrites a slow rank's output before
    the slow rank copied it out; some interleaving must show it."""
    s = plan(_topo(1, 4), _spec("all_gather", 4), "direct").expand()
    real = emu.lower
    monkeypatch.setattr(emu, "lower", lambda *a: dataclasses.replace(real(*a), start_barrier=None))
    failures = 0
    for seed in range(12):
        try:
            check_emulation(s, CudaOptions(ctas=2, fuse=False), seed)   # the multi-stream form
        except AssertionError:
            failures += 1
    assert failures > 0


def test_emulator_reports_a_deadlock_when_a_signal_is_lost(monkeypatch):
    s = plan(_topo(1, 2), _spec("all_reduce", 2), "direct").expand()
    real = emu.lower

    def drop_signals(*args):  # type: ignore[no-untyped-def]
        prog = real(*args)
        streams = {ch: tuple(dataclasses.replace(x, rows=tuple(dataclasses.replace(r, signals=())
                                                               for r in x.rows))
                             if isinstance(x, KernelLaunch) else x for x in items)
                   for ch, items in prog.streams.items()}
        return dataclasses.replace(prog, streams=streams)

    monkeypatch.setattr(emu, "lower", drop_signals)
    with pytest.raises(VerificationError, match="deadlocks: rank 0 call 0 step join"):
        check_emulation(s, CudaOptions(ctas=1, fuse=False, forward=False), 0, calls=1)


PARAM_CASES = [(kind, algo) for kind in ("all_reduce", "reduce_scatter", "all_gather")
               for algo in applicable(_topo(2, 2), _spec(kind, 4))]


@pytest.mark.parametrize(("kind", "algo"), PARAM_CASES)
def test_emulated_lowering_with_chunks_and_channels(kind, algo):
    """Pipelined chunks on several channels: more streams per rank, more cross-stream waits."""
    s = plan(_topo(2, 2), _spec(kind, 4, 53), algo, {"chunks": 3, "channels": 2}).expand()
    assert max(len({o.channel for o in s.rank_ops(r)}) for r in range(4)) >= 2
    check_emulation(s, CudaOptions(ctas=2, ce_threshold_bytes=40), seed=7, calls=2)


@pytest.mark.parametrize(("kind", "algo"), PARAM_CASES)
def test_single_stream_lowering_is_one_stream_and_still_right(kind, algo):
    """single_stream (what graph capture uses): one stream per rank in a global topological
    order; the emulator would report a deadlock if that order could block."""
    s = plan(_topo(2, 2), _spec(kind, 4, 53), algo, {"chunks": 3, "channels": 2}).expand()
    opts = CudaOptions(ctas=2, ce_threshold_bytes=40, single_stream=True)
    assert all(list(lower(s, r, opts).streams) == [0] for r in range(4))
    check_emulation(s, opts, seed=3, calls=2)


NET = CudaOptions(ctas=2, inter_transport="nccl")


def test_inter_node_copies_become_matched_sends_and_receives():
    """2 nodes x 2 GPUs, hierarchical all-gather: rank 0 and rank 2 (same local rank) exchange
    over the net stream; each send follows a wait row, each receive precedes a signal row, and
    both ranks post their pair's operations in the same order (NCCL matches them FIFO)."""
    s = plan(_topo(2, 2), _spec("all_gather", 4, 8), "hier").expand()
    progs = [lower(s, r, NET) for r in range(4)]
    inter = [o for o in s.ops() if o.transport.value == "inter"]
    assert inter and all(not any(r.op == o.id for items in progs[o.rank].streams.values()
                                 for x in items if isinstance(x, KernelLaunch) for r in x.rows)
                         for o in inter)
    net0 = progs[0].net
    for i, item in enumerate(net0):
        if isinstance(item, SendLaunch):
            assert net0[i - 1].rows[0].op == f"{item.op}:wait"
        if isinstance(item, RecvLaunch):
            assert net0[i + 1].rows[0].op == f"{item.op}:signal"

    def pair_order(rank, peer):  # type: ignore[no-untyped-def]
        return [x.op for x in progs[rank].net
                if isinstance(x, (SendLaunch, RecvLaunch)) and x.peer == peer]
    assert pair_order(0, 2) == pair_order(2, 0) and pair_order(0, 2)
    assert pair_order(1, 3) == pair_order(3, 1)


@pytest.mark.parametrize(("kind", "algo"), [(k, a) for k in ("all_reduce", "reduce_scatter",
                                                             "all_gather", "all_to_all")
                                            for a in applicable(_topo(2, 2), _spec(k, 4))])
def test_emulated_nccl_inter_transport_matches_numpy(kind, algo):
    s = plan(_topo(2, 2), _spec(kind, 4, 41), algo, {"chunks": 2}).expand()
    check_emulation(s, NET, seed=5)
    check_emulation(s, dataclasses.replace(NET, ce_threshold_bytes=32), seed=6, calls=2)


def test_levels_put_every_op_after_its_dependencies_and_channel_predecessor():
    from hiercoll.executor.order import levels
    from hiercoll.schedule import predecessor_map as predecessors
    s = plan(_topo(1, 4), _spec("all_reduce", 4), "ring", {"chunks": 2}).expand()
    layered = levels(s)
    where = {op.ref: i for i, lv in enumerate(layered.levels) for op in lv}
    assert len(where) == s.num_ops
    for ref, preds in predecessors(s).items():
        assert all(where[p] < where[ref] for p in preds)
    # ring step 0 copies depend on nothing: all of them are in level 0
    assert {op.ref for op in layered.levels[0]} >= {(r, 0) for r in range(4)}


@pytest.mark.parametrize(("nodes", "gpus", "kind", "algo"), CASES)
def test_fused_lowering_is_one_launch_with_both_barriers_and_still_right(nodes, gpus, kind, algo):
    """single_stream with no copy-engine op: one kernel per call, barriers as its rows."""
    s = plan(_topo(nodes, gpus), _spec(kind, nodes * gpus), algo).expand()
    opts = CudaOptions(ctas=3, single_stream=True, protocol="simple")
    for r in range(s.world_size):
        prog = lower(s, r, opts)
        (launch,) = prog.streams[0]
        assert prog.fused and prog.start_barrier is None and not prog.end_barrier.rows
        assert launch.rows[0].op == "barrier:start:arrive"
        assert launch.rows[-1].op == "barrier:end:wait"
        assert all(w.per_epoch == 3 for w in launch.rows[-1].waits)
        ops = [row for row in launch.rows if not row.op.startswith("barrier")]
        # the barriers ride on the first and last op rows (two rows fewer per call) where every
        # CTA runs them; a row on part of the grid keeps them as rows of their own
        first, last = ops[0].ctas is None, ops[-1].ctas is None
        assert len(launch.rows) == len(ops) + 4 - first - last
        start = {f"barrier:start@{q}" for q in range(s.world_size)}
        head = ops[0] if first else launch.rows[1]
        assert {w.producer for w in head.waits} >= start and head.ctas is None
        tail = ops[-1] if last else launch.rows[-2]
        assert {g.rank for g in tail.signals} >= set(range(s.world_size)) and tail.ctas is None
    check_emulation(s, opts, seed=5, calls=3)


def test_copy_engine_ops_keep_the_unfused_lowering():
    s = plan(_topo(1, 2), _spec("all_gather", 2), "direct").expand()
    prog = lower(s, 0, CudaOptions(ctas=2, single_stream=True, ce_threshold_bytes=8))
    assert not prog.fused and prog.start_barrier is not None


def test_emulator_catches_a_fused_program_without_its_start_barrier(monkeypatch):
    """The start-barrier rows of the fused launch are load-bearing, as the launch was."""
    s = plan(_topo(1, 4), _spec("all_gather", 4), "direct").expand()
    real = emu.lower

    def strip(*args):  # type: ignore[no-untyped-def]
        prog = real(*args)
        (launch,) = prog.streams[0]
        first = dataclasses.replace(launch.rows[1], waits=tuple(
            w for w in launch.rows[1].waits if not w.producer.startswith("barrier:start")))
        return dataclasses.replace(prog, streams={0: (dataclasses.replace(
            launch, rows=(first, *launch.rows[2:])),)})

    monkeypatch.setattr(emu, "lower", strip)
    failures = 0
    for seed in range(12):
        try:
            check_emulation(s, CudaOptions(ctas=2, single_stream=True), seed)
        except AssertionError:
            failures += 1
    assert failures > 0


@pytest.mark.parametrize(("kind", "algo"), PARAM_CASES)
def test_launch_per_op_lowering_is_one_op_per_launch_and_still_right(kind, algo):
    """What `run --profile` times: each SM op its own launch (stream order keeps the channel's
    order), never fused."""
    from hiercoll.executor.cuda.lowering import KernelLaunch, launch_label
    s = plan(_topo(2, 2), _spec(kind, 4, 53), algo, {"chunks": 3, "channels": 2}).expand()
    opts = CudaOptions(ctas=2, launch_per_op=True, single_stream=True)
    for r in range(4):
        prog = lower(s, r, opts)
        assert not prog.fused
        launches = [x for items in prog.streams.values() for x in items
                    if isinstance(x, KernelLaunch)]
        assert all(sum(1 for row in x.rows if row.count) <= 1 for x in launches)
        ops = {label for x in launches for label in launch_label(x).split(",") if label[:1].isdigit()}
        assert ops == {op.id for op in s.rank_ops(r) if op.dst.count}
    check_emulation(s, opts, seed=3, calls=2)


def test_debug_timeout_is_one_spin_limit_for_every_kernel():
    """--debug-timeout-ms means the same polls for the collective kernel and the fused
    RMSNorm stress (which once took any positive value as 2,000,000 polls)."""
    from hiercoll.executor.cuda.lowering import spin_limit_for
    assert spin_limit_for(0) == 0 and spin_limit_for(5000) == 5_000_000 and spin_limit_for(0.0005) == 1


@pytest.mark.parametrize(("kind", "algo", "end_relaxed"), [
    ("all_reduce", "direct", True),        # forwarded: a pull into this rank's own output
    ("all_reduce", "two_shot", False),     # pushes into peers' outputs: the end must release
    ("all_gather", "direct", False),
])
def test_fused_arrivals_are_relaxed_only_where_no_store_is_announced(kind, algo, end_relaxed):
    """The start arrival never follows a store of the kernel; the end arrival does only where
    the rank stored into a peer; every op row that signals a consumer keeps its release."""
    s = plan(_topo(1, 4), _spec(kind, 4), algo).expand()
    for r in range(4):
        (launch,) = lower(s, r, CudaOptions(single_stream=True, protocol="simple")).streams[0]
        assert launch.rows[0].op == "barrier:start:arrive" and launch.rows[0].relaxed
        assert launch.rows[-2].relaxed is end_relaxed
        remote = any(a.rank != r for row in launch.rows for a in (row.dst, *row.also)
                     if a is not None)
        assert remote is not end_relaxed
        assert not any(row.relaxed for row in launch.rows[1:-2])
        words = encode(lower(s, r, CudaOptions(single_stream=True, protocol="simple")), [0] * 4,
                           [0] * 4).words
        assert [words[i * ROW_WORDS + F_RELAXED] for i in range(len(launch.rows))] == \
            [int(row.relaxed) for row in launch.rows]


def test_cta_local_dependencies_need_no_signal():
    """two_shot's push of its reduced shard reads exactly what the same CTAs just wrote (same
    count, same CTAs, so CTA c owns element i of both rows): the CTAs order it by themselves, so
    the push needs no grid-wide signal and wait, and it folds into the reduce row as one more
    destination of each step's result (`Row.also`). The emulator runs every CTA interleaving."""
    from hiercoll.executor.cuda.lowering import fused_launch
    s = plan(_topo(1, 2), _spec("all_reduce", 2, 4096), "two_shot").expand()
    opts = CudaOptions(ctas=3, single_stream=True, protocol="simple")
    (row,) = [r for r in fused_launch(lower(s, 0, opts)).rows if r.count]
    assert row.reduce and [a.rank for a in row.also] == [1] and row.also[0].offset == row.dst.offset
    assert not row.relaxed, "it announces a store into the peer: release"
    for seed in range(3):
        check_emulation(s, opts, seed=seed)


@pytest.mark.parametrize("world", [2, 4])
def test_copies_of_a_rows_result_fold_into_it_only_where_the_ctas_order_them(world):
    """Unmerged (`_merge_result_copies` skipped), two_shot's pushes follow its reduce as rows
    that read the reduce's destination and wait for nothing; merged, they are the reduce's
    `also`, in the same order, with their signals on it. A row the CTAs cannot order (a level's
    ops on parts of the grid, hier) keeps its own row."""
    import hiercoll.executor.cuda.lowering as lw
    s = plan(_topo(1, world), _spec("all_reduce", world, 64 << 10), "two_shot").expand()
    opts = CudaOptions(ctas=4, single_stream=True, protocol="simple")
    merged = [r for r in lw.fused_launch(lower(s, 0, opts)).rows if r.count]
    real = lw._merge_result_copies
    try:
        lw._merge_result_copies = lambda rows, itemsize, rank: list(rows)
        plain = [r for r in lw.fused_launch(lower(s, 0, opts)).rows if r.count]
    finally:
        lw._merge_result_copies = real
    reduce, pushes = plain[0], plain[1:]
    assert len(pushes) == world - 1 and all(p.srcs == (reduce.dst,) and not p.waits for p in pushes)
    assert len(merged) == 1 and merged[0].also == tuple(p.dst for p in pushes)
    assert set(merged[0].signals) == {x for r in plain for x in r.signals}
    check_emulation(s, opts, seed=world)
    h = plan(_topo(2, 2), _spec("all_reduce", 4), "hier").expand()
    split = [r for r in lw.fused_launch(lower(h, 0, CudaOptions(
        ctas=4, single_stream=True, protocol="simple"))).rows if r.ctas is not None]
    assert split and not any(r.also for r in split)
    # reduce rows past MERGE_MAX_BYTES stream their result and its copies in passes of their
    # own; a copy row takes its copies at any size (all_gather rhd: the self copy, then its push)
    big = plan(_topo(1, world), _spec("all_reduce", world, 8 << 20), "two_shot").expand()
    rows = [r for r in lw.fused_launch(lower(big, 0, opts)).rows if r.count]
    assert len(rows) == world and not any(r.also for r in rows)
    ag = plan(_topo(1, 2), _spec("all_gather", 2, 64 << 20), "rhd").expand()
    (row,) = [r for r in lw.fused_launch(lower(ag, 0, opts)).rows if r.count]
    assert not row.reduce and [a.rank for a in row.also] == [1]
    check_emulation(plan(_topo(1, 2), _spec("all_gather", 2, 4096), "rhd").expand(), opts, seed=1)


def test_a_level_with_more_ops_than_ctas_keeps_the_whole_grid():
    """hier's level of two pushes splits a grid of 4 CTAs in two; on one CTA it cannot split,
    and both rows run on the whole (one-CTA) grid, in order."""
    from hiercoll.executor.cuda.lowering import fused_launch
    s = plan(_topo(2, 2), _spec("all_reduce", 4), "hier").expand()
    split = [r.ctas for r in fused_launch(lower(s, 0, CudaOptions(
        ctas=4, single_stream=True, protocol="simple"))).rows if r.count]
    assert (0, 2) in split and (2, 4) in split
    one = CudaOptions(ctas=1, single_stream=True, protocol="simple")
    assert all(r.ctas is None for r in fused_launch(lower(s, 0, one)).rows)
    check_emulation(s, one, seed=4)


def test_the_auto_grid_leaves_sms_free_only_where_other_work_runs_beside_it():
    """Every SM (`max_ctas`) where every op is a row kernel's; SIDE_WORK_SMS fewer where the
    one-CTA launches around copy-engine copies must run beside spinning rows; half beside NCCL's
    send/recv kernels."""
    from hiercoll.executor.cuda.lowering import DEFAULT_MAX_CTAS, SIDE_WORK_SMS
    s = plan(_topo(2, 2), _spec("all_reduce", 4, 64 << 20), "hier").expand()

    def grids(**kw):  # type: ignore[no-untyped-def]
        p = lower(s, 0, CudaOptions(**kw))
        return {x.grid for v in p.streams.values() for x in v if isinstance(x, KernelLaunch)}
    assert grids(single_stream=True) == {DEFAULT_MAX_CTAS}
    # beside NCCL's send/recv kernel, half the SMs: its channels' CTAs must all find one
    assert grids(single_stream=True, inter_transport="nccl") == {DEFAULT_MAX_CTAS // 2}
    assert grids(single_stream=True, inter_transport="nccl", max_ctas=40) == {20}
    assert max(grids(ce_threshold_bytes=1 << 20)) <= DEFAULT_MAX_CTAS - SIDE_WORK_SMS
    assert grids(single_stream=True, max_ctas=40) == {40}


def test_a_copy_folds_into_a_row_only_where_its_stores_meet_nothing_else_of_the_row():
    """`_merge_result_copies`' guards, on rows built by hand: a copy of the row's destination
    folds in; one that would overwrite part of what the row reads does not (`_clobbers`); past
    MERGE_MAX_BYTES a copy row folds its copy in only when it reads this rank's own memory (a
    pulled copy mixes remote reads and stores like a reduce), a reduce row never."""
    from hiercoll.executor.cuda.lowering import (
        MERGE_MAX_BYTES,
        Addr,
        Row,
        _merge_result_copies,
    )

    def row(count, dst, srcs, reduce=False):  # type: ignore[no-untyped-def]
        return Row("0.0", count, dst, tuple(srcs), reduce, False, 1.0, (), ())

    def push(count, src, dst):  # type: ignore[no-untyped-def]
        return row(count, dst, [src])
    small = 1024
    red = row(small, Addr(0, 0), [Addr(0, 4096), Addr(1, 4096)], reduce=True)
    assert len(_merge_result_copies([red, push(small, Addr(0, 0), Addr(1, 0))], 2, 0)) == 1
    # the copy's stores land on half of what the reduce reads: kept apart
    clash = push(small, Addr(0, 0), Addr(0, 4096 + small // 2))
    assert len(_merge_result_copies([red, clash], 2, 0)) == 2
    big = MERGE_MAX_BYTES // 2 + 8                         # elements of 2 bytes past the limit
    local = row(big, Addr(0, 0), [Addr(0, 1 << 22)])
    pulled = row(big, Addr(0, 0), [Addr(1, 1 << 22)])
    bigred = row(big, Addr(0, 0), [Addr(0, 1 << 22), Addr(1, 1 << 22)], reduce=True)
    out = push(big, Addr(0, 0), Addr(1, 0))
    assert [len(_merge_result_copies([p, out], 2, 0)) for p in (local, pulled, bigred)] == [1, 2, 2]



def test_the_nccl_transport_warms_up_one_exchange_with_every_net_peer(monkeypatch):
    """Before any call, each rank exchanges a few bytes with every rank its net stream sends to
    or receives from, in one batch (NCCL's send/recv kernel loaded before the row kernels spin
    on a receive: without it every nccl-transport call hung on 4 x H200)."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    import torch.distributed as dist

    from hiercoll.executor.cuda import backend
    s = plan(_topo(2, 2), _spec("reduce_scatter", 4, 8), "hier").expand()
    posted: list[tuple[object, int]] = []

    class Work:
        def wait(self) -> None:
            pass

    def batch(ops):  # type: ignore[no-untyped-def]
        posted.extend((op.op, op.peer) for op in ops)
        return [Work() for _ in ops]
    monkeypatch.setattr(dist, "batch_isend_irecv", batch)
    monkeypatch.setattr(dist, "P2POp", lambda op, tensor, peer, group: SimpleNamespace(
        op=op, peer=peer))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    for rank in range(4):
        posted.clear()
        program = lower(s, rank, NET)
        peers = {x.peer for x in program.net if isinstance(x, (SendLaunch, RecvLaunch))}
        assert peers == {rank ^ 2}           # the same local rank on the other node
        backend._warm_up_net(program, torch.device("cpu"), None)
        assert sorted(posted, key=lambda p: p[0] is dist.irecv) == [
            (dist.isend, rank ^ 2), (dist.irecv, rank ^ 2)]


class _FakeNccl:
    """cupy.cuda.nccl's surface that nccl_p2p uses, recording the calls."""

    NCCL_UINT8 = 7

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        outer = self

        class Comm:
            def __init__(self, world: int, uid: object, rank: int) -> None:
                outer.calls.append(("init", world, uid, rank))

            def send(self, ptr: int, nbytes: int, dtype: int, peer: int, stream: int) -> None:
                outer.calls.append(("send", nbytes, dtype, peer, stream))

            def recv(self, ptr: int, nbytes: int, dtype: int, peer: int, stream: int) -> None:
                outer.calls.append(("recv", nbytes, dtype, peer, stream))
        self.NcclCommunicator = Comm

    def get_unique_id(self) -> tuple:
        return (1, 2, 3)

    def groupStart(self) -> None:  # noqa: N802 (cupy's name)
        self.calls.append(("groupStart",))

    def groupEnd(self) -> None:  # noqa: N802
        self.calls.append(("groupEnd",))


def _fake_cupy(monkeypatch) -> _FakeNccl:  # type: ignore[no-untyped-def]
    import sys
    import types
    fake = _FakeNccl()
    cuda = types.ModuleType("cupy.cuda")
    cuda.nccl = fake  # type: ignore[attr-defined]
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", fake)
    return fake


def _fake_group(monkeypatch, rank: int, able: int = 1):  # type: ignore[no-untyped-def]
    """torch.distributed as nccl_p2p sees it on `rank` of 4: the availability vote's minimum is
    `able`, the unique id broadcast is a no-op (rank 0's stands)."""
    from types import SimpleNamespace

    import torch.distributed as dist
    group = SimpleNamespace(group_name=f"fake{rank}-{able}")
    monkeypatch.setattr(dist, "get_rank", lambda g=None: rank)
    monkeypatch.setattr(dist, "get_world_size", lambda g=None: 4)
    monkeypatch.setattr(dist, "get_global_rank", lambda g, r: r)
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None: t.fill_(
        min(int(t.item()), able)))
    monkeypatch.setattr(dist, "broadcast_object_list", lambda objs, src=0, group=None: objs.__setitem__(
        0, objs[0] if objs[0] is not None else (1, 2, 3)))
    return group


def test_the_nccl_transport_calls_nccl_itself_where_every_rank_can(monkeypatch):
    """With cupy's NCCL bindings on every rank, sends and receives go to a NCCL communicator of
    the group's own on the net stream (group ranks, bytes), not through torch's P2P path; the
    warm-up exchanges a few bytes with each net peer in one NCCL group. One rank without the
    bindings (the vote's minimum) or HIERCOLL_NCCL_DIRECT=0: torch's path for everyone."""
    torch = pytest.importorskip("torch")
    import contextlib
    from types import SimpleNamespace

    import torch.distributed as dist

    from hiercoll.executor.cuda import backend, nccl_p2p
    fake = _fake_cupy(monkeypatch)
    s = plan(_topo(2, 2), _spec("reduce_scatter", 4, 4096), "hier").expand()
    program = lower(s, 0, NET)
    direct = nccl_p2p.direct_nccl(_fake_group(monkeypatch, 0), torch.device("cpu"))
    assert isinstance(direct, nccl_p2p.DirectNccl)
    assert fake.calls == [("init", 4, (1, 2, 3), 0)]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(
        cuda_stream=11))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    backend._warm_up_net(program, torch.device("cpu"), None, direct)
    assert fake.calls[1:] == [("groupStart",), ("send", 4, 7, 2, 11), ("recv", 4, 7, 2, 11),
                              ("groupEnd",)]
    fake.calls.clear()

    def no_torch_p2p(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("torch's P2P path was taken")
    monkeypatch.setattr(dist, "isend", no_torch_p2p)
    monkeypatch.setattr(dist, "irecv", no_torch_p2p)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(backend, "_kernel", lambda *a, **k: None)
    net = SimpleNamespace(wait_stream=lambda other: None, cuda_stream=22)
    views = {id(x): torch.zeros(x.count, dtype=torch.bfloat16) for x in program.net
             if isinstance(x, (SendLaunch, RecvLaunch))}
    prepared = SimpleNamespace(net_stream=net, program=program, group=None, puts={},
                               net_views=views, nccl=direct)
    backend.CudaBackend.net_hook(prepared, net)  # type: ignore[arg-type]
    moves = [x for x in program.net if isinstance(x, (SendLaunch, RecvLaunch))]
    assert len(moves) == 2 and fake.calls == [
        ("send" if isinstance(x, SendLaunch) else "recv", 2 * x.count, 7, x.peer, 22)
        for x in moves]                      # bf16 bytes, on the net stream, in program order
    assert nccl_p2p.direct_nccl(_fake_group(monkeypatch, 1, able=0), torch.device("cpu")) is None
    monkeypatch.setenv("HIERCOLL_NCCL_DIRECT", "0")
    assert not nccl_p2p._available()
