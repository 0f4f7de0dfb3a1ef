"""Deterministic global orders of a schedule's ops (no torch): the same on every rank.

The gloo backend walks `levels()`: every op of level L only depends (through deps and channel
order) on ops of earlier levels, so all transfers of one level can be posted as one batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from hiercoll.schedule import Op, OpRef, Schedule, predecessor_map


@dataclass(frozen=True)
class Levels:
    """`levels[i]`: the ops whose longest chain of predecessors has length i, by (rank, index)."""

    levels: tuple[tuple[Op, ...], ...]


def levels(schedule: Schedule) -> Levels:
    """Longest-path layering; raises ValueError on a cycle (validate the schedule first)."""
    preds = predecessor_map(schedule)
    depth: dict[OpRef, int] = {}
    for ref in sorted(preds):
        stack = [ref]
        on_path: set[OpRef] = set()
        while stack:
            cur = stack[-1]
            if cur in depth:
                stack.pop()
                continue
            pending = [p for p in preds[cur] if p not in depth]
            if not pending:
                depth[cur] = 1 + max((depth[p] for p in preds[cur]), default=-1)
                on_path.discard(cur)
                stack.pop()
                continue
            if cur in on_path:
                raise ValueError(f"op {cur[0]}.{cur[1]} is on a dependency cycle")
            on_path.add(cur)
            stack.extend(pending)
    out: list[list[Op]] = [[] for _ in range(1 + max(depth.values(), default=-1))]
    for ref in sorted(depth):
        out[depth[ref]].append(schedule.op(ref))
    return Levels(tuple(tuple(level) for level in out))
