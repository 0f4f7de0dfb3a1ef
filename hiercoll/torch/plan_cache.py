"""Prepared plans, kept per (collective, dtype, reduce op, size bucket) in a bounded LRU.

Why buckets: a schedule is for one size, and preparing one (planning, lowering, on cuda the row
table, kernel warm-up and a barrier) costs far more than a call. Sizes are rounded up to a power
of two (at least `MIN_BUCKET` elements), so a model whose token count varies from step to step
prepares a handful of plans, not one per size; the call pads its data into the bucket (every
collective here is element-wise, so the padding only ever meets padding). Grouped collectives
(group_cast/group_reduce) have exact sizes: their key carries a digest of the splits instead.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

MIN_BUCKET = 256           # elements: small calls share one plan


def size_bucket(count: int, minimum: int = MIN_BUCKET) -> int:
    """The power of two >= `count` (and >= `minimum`) a call of `count` elements runs at."""
    n = max(int(count), int(minimum), 1)
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class PlanKey:
    collective: str
    dtype: str
    reduce_op: str
    bucket: int               # elements per unit (rank's shard/chunk) after rounding; 0: exact
    splits: str = ""          # grouped kinds: digest of the splits
    # on comm.empty tensors: the plan runs on them (no copies), which can change the choice
    # between a plan and the library's call (torch/staging.py)
    placed: bool = False

    def __str__(self) -> str:
        tail = f" splits {self.splits[:8]}" if self.splits else f" bucket {self.bucket}"
        return f"{self.collective} {self.dtype} {self.reduce_op}{tail}" + (
            " (comm.empty)" if self.placed else "")


V = TypeVar("V")


class PlanCache(Generic[V]):
    """An LRU of at most `max_entries` values; `on_evict` is told of each value dropped (so its
    owner can give back what the value holds). Counts hits, misses and evictions (tests and
    `Communicator.stats()` read them)."""

    def __init__(self, max_entries: int, on_evict: Callable[[V], None] | None = None) -> None:
        if max_entries < 1:
            raise ValueError(f"max_plans: {max_entries} must be >= 1")
        self.max_entries = max_entries
        self._items: OrderedDict[PlanKey, V] = OrderedDict()
        self._on_evict = on_evict
        self.hits = self.misses = self.evictions = 0

    def get(self, key: PlanKey) -> V | None:
        value = self._items.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return value

    def put(self, key: PlanKey, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.max_entries:
            _, old = self._items.popitem(last=False)
            self.evictions += 1
            if self._on_evict is not None:
                self._on_evict(old)

    def clear(self) -> None:
        """Drop every value (no eviction callbacks: the owner is resetting what they hold)."""
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def values(self) -> Iterator[V]:
        return iter(list(self._items.values()))
