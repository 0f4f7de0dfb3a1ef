"""No silent hang (issue 15): the race check is near-linear, a stopped or killed gloo rank ends
the job with one line naming the rank, the op and the peer, and sizes that cannot fit are
refused before anything is built."""

from __future__ import annotations

import importlib
import time

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec
from hiercoll.schedule import ExpandedOps, Op, OpKind, Region, Schedule, topological_order
from tests.helpers import small_topology

check_mod = importlib.import_module("hiercoll.sim.check")


# ---- verification cost: find_races ----------------------------------------------------------
def _chain(n: int, *, stray_channel: bool = False) -> Schedule:
    """n reduces on one rank and channel, all accumulating into the same region (every pair
    overlaps: the old pairwise sweep was quadratic here); optionally one more on another
    channel with no dependency (a race)."""
    topo = small_topology(1, 2)
    base = hc.plan(topo, CollectiveSpec(kind="all_reduce", world_size=2, dtype="fp32",
                                        nbytes=256), "ring", {}).expand()
    ops = [Op(0, i, 0, OpKind.REDUCE, Region(0, "output", 0, 64), (Region(0, "input", 0, 64),),
              accumulate=True) for i in range(n)]
    if stray_channel:
        ops.append(Op(0, n, 1, OpKind.COPY, Region(0, "output", 32, 8), (Region(0, "input", 0, 8),)))
    return Schedule(base.meta, ExpandedOps((tuple(ops), ()), (base.buffers(0), base.buffers(1))))


def test_race_check_is_near_linear_on_fully_overlapping_accesses():
    s = _chain(50_000)
    order = topological_order(s)
    t0 = time.perf_counter()
    problems = check_mod.find_races(s, order, [])
    assert problems == []
    assert time.perf_counter() - t0 < 20      # the pairwise sweep took ~40 s at 10,000 ops


def test_race_check_still_finds_an_unordered_access_among_many():
    s = _chain(20_000, stray_channel=True)
    problems = check_mod.find_races(s, topological_order(s), [])
    assert problems and all("race (write/write) on r0.output[32:40]" in p and "op 0.20000" in p
                            for p in problems), problems[:3]


def test_large_ring_plan_checks_in_bounded_time():
    topo = small_topology(8, 8)                     # 64 ranks
    spec = CollectiveSpec(kind="all_reduce", world_size=64, dtype="fp32", nbytes=4 * 64 * 12 * 4)
    s = hc.plan(topo, spec, "ring", {"chunks": 12}).expand()
    assert sum(len(s.rank_ops(r)) for r in range(64)) > 90_000
    t0 = time.perf_counter()
    report = hc.sim.check(s)
    assert report.ok, report.problems[:3]
    assert not report.notes                      # the race check ran, it was not skipped
    assert time.perf_counter() - t0 < 20
