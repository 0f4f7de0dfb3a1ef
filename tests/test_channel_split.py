"""The channel split (sim/channel_split.py): a channel's independent head ops go to channels of
their own; whoever was ordered after them stays ordered after every one of them; ops that
depend on something or touch the same memory keep the plan's order. Every family's lowered
schedule (forwarded and split) passes the checker and the reference executor in
tests/test_exec_forwarding.py; these pin the rule itself."""

from __future__ import annotations

import dataclasses

import numpy as np

from hiercoll.executor.cuda.lowering import CudaOptions, lowered_schedule
from hiercoll.executor.reference import verify
from hiercoll.planner import plan
from hiercoll.schedule import ExpandedOps, OpKind, Schedule, predecessor_map
from hiercoll.sim import check
from hiercoll.sim.channel_split import split_independent_heads
from tests.test_exec_lowering import _spec, _topo


def _ok(s: Schedule) -> None:
    report = check(s)
    assert report.ok and not report.unchecked, report.problems
    seed = int(np.random.default_rng().integers(1 << 30))
    assert verify(s, trials=2, seed=seed).ok, seed


def test_direct_all_gather_pushes_every_peer_at_once():
    """The swizzled pushes of `direct` shared one channel: each now has its own, nothing else
    changed, and no op of a rank is ordered before another."""
    s = plan(_topo(1, 4), _spec("all_gather", 4), "direct").expand()
    split = split_independent_heads(s)
    for r in range(4):
        ops = list(split.rank_ops(r))
        assert len({op.channel for op in ops}) == 4
        assert [dataclasses.replace(op, channel=0) for op in ops] == [
            dataclasses.replace(op, channel=0) for op in s.rank_ops(r)]
    assert all(not p for p in predecessor_map(split).values())
    _ok(split)


def test_who_followed_a_moved_op_waits_for_every_op_ahead_of_it():
    """Unforwarded `direct` reduce-scatter: each owner's reduce depended on one push of every
    peer, and channel order had put that push after the peer's earlier pushes; it now depends
    on those pushes explicitly."""
    s = plan(_topo(1, 4), _spec("reduce_scatter", 4), "direct").expand()
    split = split_independent_heads(s)
    before, after = predecessor_map(s), predecessor_map(split)
    moved = {a.ref for a, b in zip(s.ops(), split.ops()) if a.channel != b.channel}
    assert moved
    for ref, preds in before.items():   # only a moved op lost what was ahead of it on its channel
        if ref not in moved:
            assert _closure(before, ref) <= _closure(after, ref)
        else:
            assert all(p[0] == ref[0] for p in preds) and not after[ref]
    assert any(len(after[op.ref]) > len(before[op.ref])
               for op in split.ops() if op.kind == OpKind.REDUCE)
    _ok(split)
    assert split_independent_heads(split) is split            # nothing left to split


def _closure(preds: dict, ref: tuple[int, int]) -> set:  # type: ignore[type-arg]
    seen: set = set()  # type: ignore[type-arg]
    todo = list(preds[ref])
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(preds[p])
    return seen


def test_ops_touching_the_same_memory_or_with_dependencies_keep_their_order():
    s = plan(_topo(1, 4), _spec("all_gather", 4), "direct").expand()
    ops = [list(s.rank_ops(r)) for r in range(4)]
    heads = [op for op in ops[0] if op.channel == 0]       # rank 0's pushes, in order
    assert len(heads) == 3
    # the second push writes where the first does: the run ends at the first push
    i = heads[1].index
    ops[0][i] = dataclasses.replace(ops[0][i], dst=heads[0].dst)
    clash = Schedule(s.meta, ExpandedOps(tuple(tuple(o) for o in ops),
                                         tuple(s.buffers(r) for r in range(4))))
    kept = split_independent_heads(clash)
    assert [op.channel for op in kept.rank_ops(0)] == [op.channel for op in clash.rank_ops(0)]
    # ring all-reduce: every op after the first of a channel depends on a peer's
    ring = plan(_topo(1, 4), _spec("all_reduce", 4, 53), "ring").expand()
    assert split_independent_heads(ring) is ring


def test_the_knob_turns_it_off_and_bench_rows_name_it():
    s = plan(_topo(1, 4), _spec("all_to_all", 4), "direct").expand()
    on = lowered_schedule(s, CudaOptions())
    off = lowered_schedule(s, CudaOptions(split_channels=False))
    assert off is s and on is not s
    assert max(op.channel for op in on.ops()) > max(op.channel for op in s.ops())
    # the flags a bench takes become its rows' options (BackendChoice.options)
    import argparse

    from hiercoll.cli.backend_args import add_cuda_args, backend_choice
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="cuda")
    add_cuda_args(p)
    rows = backend_choice(p.parse_args(["--no-split-channels", "--ll-unpack-peers", "3"]))
    assert rows.options("graph")["split_channels"] is False
    assert rows.options("graph")["ll_unpack_peers"] == 3
    assert backend_choice(p.parse_args([])).options("eager")["split_channels"] is True


def test_calibration_prices_each_bench_row_as_it_ran():
    """A bench row records the lowering's knobs: rows from before the split (no
    `split_channels`) or the unpack rule (no `ll_unpack_peers`) are priced as they ran
    then, rows of this lowering as it runs now."""
    from hiercoll.calibration.predict import lowered, protocol_of
    from hiercoll.topology import preset
    topo = preset("h200x4")
    s = plan(topo, _spec("all_gather", 4, 40), "direct").expand()     # whole 4-byte words
    old = {"forward": True, "fuse": True, "single_stream": True, "protocol": "auto",
           "ll_threshold_bytes": 256 << 10}
    new = old | dataclasses.asdict(CudaOptions()) | {"single_stream": True}
    assert lowered(s, topo, old) is s
    assert lowered(s, topo, new) is not s
    assert protocol_of(s, topo, old).ll and not protocol_of(s, topo, new).ll
    assert lowered(s, topo, new | {"split_channels": False}) is s
    # rows of 84b9a30 / 2e0de52 recorded the unpack rule as a byte threshold
    recorded = {k: v for k, v in new.items() if k != "ll_unpack_peers"}
    assert not protocol_of(s, topo, recorded | {"ll_unpack_threshold_bytes": 0}).ll
    assert protocol_of(s, topo, recorded | {"ll_unpack_threshold_bytes": 256 << 10}).ll
    # ... and split every run of two ops: a lone push beside a local copy (2 ranks) too
    two = preset("h200x2")
    a2a = plan(two, _spec("all_to_all", 2, 40), "hier").expand()
    assert lowered(a2a, two, new) is a2a                               # one peer: not split now
    assert lowered(a2a, two, recorded | {"ll_unpack_threshold_bytes": 0}) is not a2a


def test_a_lone_push_beside_local_work_keeps_its_channel():
    """2 ranks: the run [local copy, push] loads one peer's links; the kernel already walks it CTA
    by CTA without a wait, and split it lost 1.1 us at 1 MiB (2 x H200, one A/B run)."""
    from hiercoll.topology import preset
    s = plan(preset("h200x2"), _spec("all_to_all", 2, 40), "hier").expand()
    assert split_independent_heads(s) is s
    assert split_independent_heads(s, min_push_peers=0) is not s
