"""A size-reduced copy of a plan for the reference executor: same ops, same dependencies, every
count and offset divided by one factor.

Why this is the same check: copies and reductions act element by element, and the reference
result of every sized collective is element-wise too (element i of an output depends only on
element i's counterparts). If every offset, count and buffer size of the plan, and every shard
boundary of its spec, is a multiple of d, the plan only ever moves whole blocks of d elements,
all blocks alike; dividing by d maps each block to one element, keeps which regions overlap (so
races and orders are unchanged) and keeps what each element receives. The copy is right exactly
when the original is. When no factor > 1 divides everything (odd shard sizes, group splits), or
the copy still does not fit, there is no copy (None) and the caller says so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from pydantic import ValidationError

from hiercoll.collectives import CollectiveSpec
from hiercoll.errors import HiercollError
from hiercoll.schedule import ExpandedOps, Op, Region, Schedule


def _spec_sizes(spec: CollectiveSpec) -> list[int]:
    """Every layout size the spec's reference depends on (per-rank counts, shard boundaries)."""
    sizes = [spec.count]
    for r in range(spec.world_size):
        sizes += [spec.input_count(r), spec.output_count(r), *spec.shard(r)]
    return sizes


def _layout_scales(spec: CollectiveSpec, small: CollectiveSpec, d: int) -> bool:
    return [x * d for x in _spec_sizes(small)] == _spec_sizes(spec)


def _region(r: Region, d: int) -> Region:
    return Region(r.rank, r.buffer, r.offset // d, r.count // d)


def common_factor(schedule: Schedule) -> int:
    """The largest d dividing every offset, count and buffer size of the plan and its spec's
    layout (0 for a plan with nothing in it)."""
    def numbers() -> Iterable[int]:
        yield from _spec_sizes(schedule.spec)
        for r in range(schedule.world_size):
            yield from schedule.buffers(r).values()
        for op in schedule.ops():
            for reg in (op.dst, *op.srcs):
                yield reg.offset
                yield reg.count
    g = 0
    for n in numbers():
        g = math.gcd(g, n)
        if g == 1:
            break
    return g


def shrink(schedule: Schedule, factor: int) -> Schedule | None:
    """The plan with every size divided by `factor`, or None when that is not the same plan
    (a size not a multiple of it, group splits, a spec whose layout does not scale)."""
    spec = schedule.spec
    if factor <= 1 or spec.splits is not None or schedule.is_library_call:
        return None
    if spec.nbytes % factor:
        return None
    try:
        small_spec = spec.resized(spec.nbytes // factor)
    except (ValidationError, HiercollError):
        return None
    if not _layout_scales(spec, small_spec, factor):
        return None
    ops, buffers = [], []
    for r in range(schedule.world_size):
        sizes = schedule.buffers(r)
        if any(n % factor for n in sizes.values()):
            return None
        buffers.append({name: n // factor for name, n in sizes.items()})
        rank_ops: list[Op] = []
        for op in schedule.rank_ops(r):
            regs = (op.dst, *op.srcs)
            if any(x.offset % factor or x.count % factor for x in regs):
                return None
            rank_ops.append(dataclasses.replace(op, dst=_region(op.dst, factor),
                                                srcs=tuple(_region(s, factor) for s in op.srcs)))
        ops.append(tuple(rank_ops))
    meta = dataclasses.replace(schedule.meta, spec=small_spec)
    return Schedule(meta, ExpandedOps(tuple(ops), tuple(buffers)))
