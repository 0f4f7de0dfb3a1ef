"""Thin adapter over torch's symmetric memory (alpha API; 2.11 on the GPUs, 2.13 in CI).

Everything version-specific lives here: allocation, rendezvous and peer views. The multicast
pointer must be 0 (NVLS is off on the shared hosts); nothing here calls multimem operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hiercoll.errors import HiercollError

# Every symmetric allocation stays alive for the life of the process. Freeing one lets torch's
# pool hand the block to a later allocation, and if that reuse differs between ranks the
# rendezvous pairs different buffers (pytorch #190977: silent corruption). Deliberately a module
# list, not per-backend state: a sweep drops backends, the memory must not go with them.
_KEEP_ALIVE: list[Any] = []
_ALLOCATIONS = 0     # symmetric allocations this process made (the backend is fixed after one)


def use_nvshmem(device: torch.device) -> None:
    """Make this process's symmetric allocations NVSHMEM memory (torch's NVSHMEM backend), what
    `--inter-transport nvshmem` puts into and signals. Once per process, before its first
    symmetric allocation: torch cannot change the backend after one. NVSHMEM memory is peer-mapped
    on one node like the CUDA backend's, so every other plan of the process runs on it too."""
    import torch.distributed._symmetric_memory as symm_mem
    available = getattr(symm_mem, "is_nvshmem_available", None)
    if available is None or not hasattr(symm_mem, "set_backend") or not available():
        raise HiercollError("inter_transport nvshmem: this torch has no NVSHMEM (torch.distributed."
                            "_symmetric_memory.is_nvshmem_available() is False); install the "
                            "nvidia-nvshmem wheel torch was built with, or use --inter-transport "
                            "nccl")
    if symm_mem.get_backend(device) == "NVSHMEM":
        return
    if _ALLOCATIONS:
        raise HiercollError("inter_transport nvshmem: this process already made symmetric "
                            "allocations with torch's CUDA backend, which cannot change after "
                            "the first; ask for nvshmem in the process's first plan or "
                            "Communicator")
    symm_mem.set_backend("NVSHMEM")


class SymmetricBuffer(Protocol):
    """What the lowering needs of a rank's symmetric allocation: its tensor, every rank's base
    address, and a local view of any rank's elements (SymmetricTensor across GPUs; one_gpu.Slab
    when every rank lives on one GPU)."""

    @property
    def tensor(self) -> torch.Tensor: ...

    @property
    def base_ptrs(self) -> list[int]: ...

    def peer_view(self, rank: int, offset: int, count: int) -> torch.Tensor: ...


@dataclass
class SymmetricTensor:
    """This rank's allocation, its handle, and every rank's base address."""

    tensor: torch.Tensor         # 1-D, `numel` elements of `dtype` on this rank's GPU
    handle: Any                  # torch _SymmetricMemory
    base_ptrs: list[int]

    def peer_view(self, rank: int, offset: int, count: int) -> torch.Tensor:
        """`count` elements at element `offset` of `rank`'s allocation (a local tensor view that
        maps the peer's memory: copy_ into it is a copy-engine peer write)."""
        return self.handle.get_buffer(rank, (count,), self.tensor.dtype, offset)


# torch's symmetric-memory all-reduce / reduce-scatter kernels (2.11): sum only, bf16/fp32 only,
# world 2/4/8, 16-byte multiples per rank
TORCH_SYMM_DTYPES = (torch.bfloat16, torch.float32)
TORCH_SYMM_WORLDS = (2, 4, 8)


def torch_symm_fits(nbytes: int, dtype: torch.dtype, world: int) -> bool:
    """Whether torch's symmetric-memory kernels take a sum of `nbytes` of `dtype` over `world`
    ranks (the bench's peers and the fused norm's fallback ask the same rule)."""
    return (dtype in TORCH_SYMM_DTYPES and world in TORCH_SYMM_WORLDS
            and nbytes % (16 * world) == 0)


def process_group(group: Any) -> Any:
    """The process group itself (None means WORLD): what torch's symmetric-memory ops and
    NCCL's own communicators are named by."""
    pg = group or dist.group.WORLD
    assert pg is not None, "needs an initialised process group (dist.init_process_group)"
    return pg


def allocate(numel: int, dtype: torch.dtype, device: torch.device, group: Any,
             keep_alive: bool = True) -> SymmetricTensor:
    """Collective over `group` (WORLD or a subgroup): call in the same order on every rank, and
    never free mid-run. `keep_alive=False`: the caller owns the memory (hiercoll.torch's pool
    holds it until its collective close()).

    Subgroups: torch (2.11; pytorch #196082) numbers rendezvous per process, not per group, so
    every rank of the world must make the same number of rendezvous over its life (one
    communicator per TP group on every rank, used alike), or a later rendezvous hangs."""
    import torch.distributed._symmetric_memory as symm_mem
    global _ALLOCATIONS
    _ALLOCATIONS += 1
    tensor = symm_mem.empty(numel, dtype=dtype, device=device)
    tensor.zero_()
    handle = symm_mem.rendezvous(tensor, group=process_group(group).group_name)
    if keep_alive:
        _KEEP_ALIVE.append((tensor, handle))
    if int(getattr(handle, "multicast_ptr", 0) or 0) != 0:
        raise HiercollError("symmetric memory: a multicast object was created; set "
                            "TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (NVLS must stay off here)")
    return SymmetricTensor(tensor, handle, [int(p) for p in handle.buffer_ptrs])


@dataclass
class SymmetricView:
    """`numel` elements of `dtype` at `byte_offset` of a byte (uint8) symmetric allocation: what
    a pool hands each prepared plan, so plans of every size and dtype share one allocation.
    `byte_offset` must be a multiple of the dtype's size (pools align to 256 bytes)."""

    parent: SymmetricTensor
    byte_offset: int
    numel: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        isz = torch.empty((), dtype=self.dtype).element_size()
        if self.byte_offset % isz:
            raise HiercollError(f"symmetric view: byte offset {self.byte_offset} is not a "
                                f"multiple of {self.dtype}'s {isz} bytes")
        self._itemsize = isz
        raw = self.parent.tensor.view(torch.uint8)
        self._tensor = raw[self.byte_offset:self.byte_offset + self.numel * isz].view(self.dtype)

    @property
    def tensor(self) -> torch.Tensor:
        return self._tensor

    @property
    def base_ptrs(self) -> list[int]:
        return [p + self.byte_offset for p in self.parent.base_ptrs]

    def peer_view(self, rank: int, offset: int, count: int) -> torch.Tensor:
        # get_buffer's storage offset counts elements of the dtype asked for
        return self.parent.handle.get_buffer(rank, (count,), self.dtype,
                                             self.byte_offset // self._itemsize + offset)


def deltas(alloc: SymmetricBuffer, rank: int, itemsize: int) -> list[int]:
    """(base of rank r - my base) in elements, for every r."""
    mine = alloc.base_ptrs[rank]
    out = []
    for p in alloc.base_ptrs:
        d = p - mine
        if d % itemsize:
            raise HiercollError("symmetric memory: peer mappings are not element-aligned")
        out.append(d // itemsize)
    return out
