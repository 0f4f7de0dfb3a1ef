"""One buffer per communicator, grown geometrically to the largest call seen, reused by every
plan and size, bounded, released at `close()`.

Why one allocation: torch's symmetric memory cannot be freed reliably while others are made
(pytorch #190977: a freed block handed to a later allocation differently on each rank pairs the
wrong buffers at rendezvous, silently), and every allocation is a collective rendezvous. So the
pool makes a new allocation only to grow (at least doubling, so a run makes O(log size) of them),
keeps the superseded ones until `close()` (work already queued may still read them; the total
stays below twice the final size), and frees everything there, collectively.

Plans share the pool's bytes: every call copies its data in and out, and calls of one
communicator run one after another on one stream, fenced by the plans' own start/end barriers.
A plan records the pool's `generation`; growing bumps it, and the communicator re-prepares
plans made against an older allocation.

On gloo (CPU) the pool is a plain tensor (staging for padded calls); on cuda a symmetric
allocation over the communicator's group (`symm.allocate(..., keep_alive=False)`).
"""

from __future__ import annotations

from typing import Any

import torch

from hiercoll.errors import HiercollError

ALIGN = 256                 # bytes: every region starts on this boundary
MIN_BYTES = 1 << 20


def align(nbytes: int) -> int:
    return -(-int(nbytes) // ALIGN) * ALIGN


class PoolLimit(HiercollError):
    """A call needs more than the pool may hold (`max_pool_bytes`)."""


class BufferPool:
    def __init__(self, device: torch.device, group: Any = None, symmetric: bool = False,
                 max_bytes: int = 1 << 30, min_bytes: int = MIN_BYTES, what: str = "data") -> None:
        if max_bytes < ALIGN:
            raise HiercollError(f"max_pool_bytes: {max_bytes} is below {ALIGN} bytes")
        self.device, self.group, self.symmetric = device, group, symmetric
        self.max_bytes, self.min_bytes, self.what = int(max_bytes), int(min_bytes), what
        self.generation = 0          # bumped by every (re)allocation
        self.allocations = 0         # how many allocations this pool made
        self._tensor: torch.Tensor | None = None
        self._symm: Any = None       # symm.SymmetricTensor when symmetric
        self._retired: list[Any] = []
        self.closed = False

    @property
    def capacity(self) -> int:
        return 0 if self._tensor is None else self._tensor.numel()

    def reserve(self, nbytes: int) -> bool:
        """Make sure `nbytes` fit (collective on a symmetric pool: every rank asks for the same
        sizes in the same order). True when it (re)allocated: plans of older generations must
        be prepared again."""
        if self.closed:
            raise HiercollError("communicator: closed; make a new Communicator")
        need = align(max(nbytes, 1))
        if need <= self.capacity:
            return False
        if need > self.max_bytes:
            raise PoolLimit(f"max_pool_bytes: a call needs {need} bytes of {self.what} buffer, the "
                            f"limit is {self.max_bytes}; raise max_pool_bytes")
        if torch.cuda.is_available() and self.device.type == "cuda" \
                and torch.cuda.is_current_stream_capturing():
            raise HiercollError(f"communicator: the {self.what} buffer must grow to {need} bytes "
                                "during CUDA-graph capture; call once with the largest size "
                                "before capturing")
        new = min(max(need, 2 * self.capacity, self.min_bytes), self.max_bytes)
        if self._tensor is not None:
            self._retired.append(self._symm if self.symmetric else self._tensor)
        if self.symmetric:
            from hiercoll.executor.cuda.symm import allocate
            torch.cuda.synchronize(self.device)   # queued work is done with the old one
            self._symm = allocate(new, torch.uint8, self.device, self.group, keep_alive=False)
            self._tensor = self._symm.tensor
        else:
            self._tensor = torch.zeros(new, dtype=torch.uint8, device=self.device)
        self.allocations += 1
        self.generation += 1
        return True

    def bytes(self, offset: int, nbytes: int) -> torch.Tensor:
        assert self._tensor is not None and offset + nbytes <= self.capacity
        return self._tensor[offset:offset + nbytes]

    def typed(self, byte_offset: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """`numel` elements of `dtype` at `byte_offset` (aligned) of the current allocation."""
        isz = torch.empty((), dtype=dtype).element_size()
        return self.bytes(byte_offset, numel * isz).view(dtype)

    def symmetric_view(self, byte_offset: int, numel: int, dtype: torch.dtype) -> Any:
        """A `symm.SymmetricView` (tensor, every rank's base, peer views) for a cuda plan."""
        from hiercoll.executor.cuda.symm import SymmetricView
        assert self.symmetric and self._symm is not None
        assert byte_offset + numel * torch.empty((), dtype=dtype).element_size() <= self.capacity
        return SymmetricView(self._symm, byte_offset, numel, dtype)

    def close(self) -> None:
        """Drop every allocation (the caller fences the group first on a symmetric pool)."""
        self._tensor, self._symm = None, None
        self._retired.clear()
        self.closed = True


class SlotArena:
    """Signal slots of cuda plans inside an int32 symmetric pool: each prepared plan owns a
    zeroed range (its slots count up from 0 with its own epoch, so plans cannot share slots).
    A bump allocator: `take` fails when full, and the communicator then `reset`s it (dropping
    every plan, zeroing the slots) or grows the pool."""

    def __init__(self, pool: BufferPool) -> None:
        self.pool = pool
        self.used = 0             # bytes handed out since the last reset

    def take(self, slots: int) -> int | None:
        nbytes = align(4 * max(slots, 1))
        if self.used + nbytes > self.pool.capacity:
            return None
        offset, self.used = self.used, self.used + nbytes
        return offset

    def reset(self) -> None:
        """Every range free and zero (no plan may use the slots any more)."""
        self.used = 0
        if self.pool.capacity:
            self.pool.bytes(0, self.pool.capacity).zero_()
