"""The static checker names the ops, ranks and regions of deadlocks, races and wrong results."""

import dataclasses

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec
from hiercoll.schedule import ExpandedOps, Schedule
from hiercoll.sim import check
from tests.helpers import small_topology


def _plan(kind="all_reduce", algo="ring", nodes=1, gpus=4, elems=64, **params):
    topo = small_topology(nodes, gpus)
    spec = CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="fp32", nbytes=4 * elems)
    return hc.plan(topo, spec, algo, params).expand()


def _edit(s: Schedule, rank: int, index: int, **changes) -> Schedule:
    ops = [list(s.rank_ops(r)) for r in range(s.world_size)]
    ops[rank][index] = dataclasses.replace(ops[rank][index], **changes)
    return Schedule(s.meta, ExpandedOps(tuple(map(tuple, ops)), tuple(s.buffers(r) for r in range(s.world_size))))


def _drop(s: Schedule, rank: int, index: int) -> Schedule:
    ops = [list(s.rank_ops(r)) for r in range(s.world_size)]
    del ops[rank][index]
    return Schedule(s.meta, ExpandedOps(tuple(map(tuple, ops)), tuple(s.buffers(r) for r in range(s.world_size))))


def test_every_planned_schedule_checks_clean():
    for kind, algo in [("all_reduce", "ring"), ("all_reduce", "hier"), ("reduce_scatter", "direct"),
                       ("all_gather", "hier_2d"), ("all_to_all", "hier"), ("all_reduce", "two_shot")]:
        report = check(_plan(kind, algo, nodes=2, gpus=2, chunks=2))
        assert report.ok, (kind, algo, report.problems)


def test_missing_dependency_is_a_race_naming_both_ops():
    s = _plan("all_reduce", "ring")
    op = s.rank_ops(1)[1]          # step 1 reduce: depends on rank 0's step-0 copy into its slot
    assert any(d[0] == 0 for d in op.deps)
    broken = _edit(s, 1, 1, deps=tuple(d for d in op.deps if d[0] != 0))
    report = check(broken)
    assert not report.ok
    assert any("race" in p and "op 1.1" in p and "op 0.0" in p and "r1.ring_recv" in p
               for p in report.problems), report.problems


def test_overwrite_before_peer_read_is_a_race():
    s = _plan("reduce_scatter", "ring", elems=64)    # slots are reused every two steps
    op = s.rank_ops(0)[2]
    credit = [d for d in op.deps if d[0] == 1]
    assert credit, "ring step 2 waits for the reader of the slot it overwrites"
    report = check(_edit(s, 0, 2, deps=tuple(d for d in op.deps if d[0] != 1)))
    assert any("race" in p and "op 0.2" in p for p in report.problems), report.problems


def test_doubled_contribution_is_reported():
    s = _plan("all_reduce", "direct", gpus=3, elems=12)
    final = next(op for op in s.rank_ops(0) if op.kind.value == "reduce")
    doubled = _edit(s, 0, final.index, srcs=final.srcs + (final.srcs[0],))
    report = check(doubled)
    assert any("postcondition" in p and "counted twice" in p and "r0.output" in p
               for p in report.problems), report.problems


def test_missing_copy_is_reported():
    s = _plan("all_gather", "direct", gpus=3, elems=12)
    last = len(s.rank_ops(2)) - 1
    report = check(_drop(s, 2, last))
    assert any("postcondition" in p and "holds nothing" in p for p in report.problems), report.problems


def test_deadlock_is_reported():
    s = _plan("all_reduce", "ring")
    last = len(s.rank_ops(0)) - 1
    report = check(_edit(s, 0, 0, deps=((0, last),)))
    assert not report.ok and report.problems[0].startswith("deadlock: op 0.")


def test_check_rejects_a_reduce_with_no_sources():
    """A source-less reduce (a planner bug once made them for group-reduce splits nobody sends
    to) must not pass the checker and reach an executor."""
    from hiercoll.schedule import OpKind
    s = _plan("all_reduce", "ring")
    r, i = next((r, i) for r in range(s.world_size) for i, op in enumerate(s.rank_ops(r))
                if op.kind == OpKind.REDUCE)
    report = check(_edit(s, r, i, srcs=()))
    assert not report.ok and report.problems == [
        f"op {r}.{i}: a reduce with no sources (nothing to read; a split nobody sends needs no op)"]
