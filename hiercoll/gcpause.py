"""Pause Python's cyclic garbage collector around bulk allocation.

Planning, simulating and building a dense exchange's arguments allocate millions of small
acyclic objects (ops, events, splits); the cyclic collector would rescan them over and over (a
third of a 4096-GPU simulation; two thirds of building a 1024-rank all-to-all-v's splits). A
timed GPU loop pauses it too: a collection inside a host-bound call is not the plan's cost.
Reference counting still frees everything; cycles made meanwhile wait for the next collection.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def without_cyclic_gc() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
