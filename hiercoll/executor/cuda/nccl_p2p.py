"""NCCL send/recv for the nccl inter-transport, called on the net stream directly.

Why not torch's `dist.isend`/`dist.irecv`: a profile of an eager `hier` reduce-scatter over this
transport (4 x H200 as 2 nodes x 2, bench/results/gpu/nvshmem/nccl-transport-w4/grid-fix/) spent
~250 us of host time per call inside torch's P2P path (each op a collective of its own to
ProcessGroupNCCL, with its bookkeeping), launching the transfer only after it while the row
kernel, launched first, already spun on the receive's signal: ~300 us a call against ~64 us
over peer mappings. Calling NCCL itself costs microseconds. cupy's NCCL bindings are the ones on
the GPU image (nothing else of cupy is used); without them, or with HIERCOLL_NCCL_DIRECT=0, the
transport keeps torch's path. Every rank must take the same path (a collective decides).

The communicator is this module's own (its unique id broadcast over the group), one per process
group, made when the first plan with sends or receives is prepared, and used only on net
streams: NCCL orders a send or receive after the stream's earlier work, so no event joins are
needed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from hiercoll.executor.cuda.symm import process_group

_COMMS: dict[str, Any] = {}     # process-group name -> DirectNccl (or None: torch's path)


class DirectNccl:
    """A NCCL communicator over a process group's ranks (group ranks), sending and receiving
    bytes on a given CUDA stream."""

    def __init__(self, group: Any) -> None:
        from cupy.cuda import nccl
        self._nccl = nccl
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        uid = [nccl.get_unique_id() if rank == 0 else None]
        dist.broadcast_object_list(uid, src=dist.get_global_rank(process_group(group), 0), group=group)
        self._comm = nccl.NcclCommunicator(world, uid[0], rank)

    def send(self, t: torch.Tensor, peer: int, stream: torch.cuda.Stream) -> None:
        self._comm.send(t.data_ptr(), t.numel() * t.element_size(), self._nccl.NCCL_UINT8, peer,
                        stream.cuda_stream)

    def recv(self, t: torch.Tensor, peer: int, stream: torch.cuda.Stream) -> None:
        self._comm.recv(t.data_ptr(), t.numel() * t.element_size(), self._nccl.NCCL_UINT8, peer,
                        stream.cuda_stream)

    @contextmanager
    def group(self) -> Iterator[None]:
        """Sends and receives issued inside are one NCCL group (ncclGroupStart/End)."""
        self._nccl.groupStart()
        try:
            yield
        finally:
            self._nccl.groupEnd()


def direct_nccl(group: Any, device: torch.device) -> DirectNccl | None:
    """The group's DirectNccl, made on first use (collective: every rank of `group`), or None
    where any rank lacks cupy's NCCL bindings or HIERCOLL_NCCL_DIRECT=0: torch's path then."""
    key = str(process_group(group).group_name)
    if key in _COMMS:
        return _COMMS[key]
    able = torch.tensor([1 if _available() else 0], dtype=torch.int32, device=device)
    dist.all_reduce(able, op=dist.ReduceOp.MIN, group=group)
    _COMMS[key] = DirectNccl(group) if int(able.item()) else None
    return _COMMS[key]


def _available() -> bool:
    if os.environ.get("HIERCOLL_NCCL_DIRECT", "1") == "0":
        return False
    try:
        from cupy.cuda import nccl  # noqa: F401
    except Exception:       # noqa: BLE001  (ImportError, or a cupy that finds no CUDA)
        return False
    return True

