"""The fold's symmetry check read off the planner's op arrays (lazy schedules with an array
form): it must say what the check on built ops says, rank by rank and shift by shift, true and
false alike, and a fold it allows must time the schedule as the unfolded run does."""

from __future__ import annotations

import pytest

from hiercoll.collectives import CollectiveSpec
from hiercoll.planner import plan
from hiercoll.sim import simulate, symmetry
from hiercoll.topology import preset


def _by_ops(schedule, rank: int, by: int) -> bool:  # type: ignore[no-untyped-def]
    w = schedule.world_size
    a, b = schedule.rank_ops(rank), schedule.rank_ops((rank + by) % w)
    to, same = symmetry.Shift(by, w), symmetry.Shift(0, w)
    return len(a) == len(b) and all(symmetry.timing_view(x, to) == symmetry.timing_view(y, same)
                                    for x, y in zip(a, b))


@pytest.mark.parametrize(("nodes", "kind", "channels", "outcomes"), [
    (4, "all_reduce", 2, {True, False}), (3, "reduce_scatter", 1, {True}),
    (2, "all_gather", 2, {True, False})])
def test_the_array_check_agrees_with_the_op_check(nodes, kind, channels, outcomes):
    topo = preset("dgx-h100", nodes)
    w = topo.world_size
    s = plan(topo, CollectiveSpec(kind=kind, world_size=w, nbytes=w * 4096), "ring",
             {"channels": channels})
    assert not s.is_expanded
    seen = set()
    for r in range(0, w, 3):
        for by in (1, 3, 8, 16):
            fast = symmetry._shift_maps_arrays(s, r, by)
            assert fast is not None and fast == _by_ops(s, r, by), (r, by)
            seen.add(fast)
    assert seen == outcomes


def test_a_schedule_without_arrays_is_checked_on_its_ops():
    topo = preset("dgx-h100", 2)
    s = plan(topo, CollectiveSpec(kind="all_reduce", world_size=16, nbytes=16 * 4096), "direct")
    assert symmetry._shift_maps_arrays(s, 0, 8) is None


def test_a_fold_checked_on_arrays_times_the_schedule_as_the_unfolded_run():
    topo = preset("dgx-h100", 8)
    w = topo.world_size
    s = plan(topo, CollectiveSpec(kind="all_reduce", world_size=w, nbytes=1 << 24), "ring",
             {"channels": 1})
    folded, exact = simulate(s, topo, "auto"), simulate(s, topo, "exact")
    assert folded.shortcut and len(folded.ranks_simulated) < w
    assert folded.time_us == pytest.approx(exact.time_us, rel=1e-9)
