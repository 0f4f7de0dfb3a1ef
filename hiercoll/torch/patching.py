"""`hiercoll.torch.patch()` / `unpatch()` (this module is `patching`: a submodule named `patch`
would hide the function). Opt-in: route `torch.distributed.all_reduce`, `reduce_scatter_tensor`,
`all_gather_into_tensor`, `all_to_all_single` (and torch 2.13's `reduce_scatter_single`,
`all_gather_single`) through Communicators, for a model that cannot be edited.

    comm = hiercoll.torch.patch()          # a Communicator for WORLD (or patch(comm_a, comm_b))
    ...model runs; its dist.all_reduce(t, group=tp) goes through the communicator of `tp`...
    hiercoll.torch.unpatch()

A call goes to the communicator registered for its group (None/WORLD: the WORLD one); it falls
back to torch's own function for a group with no communicator, a dtype, op or device the
communicator does not take, or a non-contiguous tensor (decided on the arguments alone, so every
rank decides alike). Calls a communicator makes itself (the library `nccl` plans call
torch.distributed) always reach torch's functions. Only the names on the `torch.distributed`
module are replaced: code that imported a function by name before patch() keeps the original.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hiercoll.errors import HiercollError


class Communicator(Protocol):
    """What the wrappers need of a registered communicator (hiercoll.torch.Communicator is
    one): its group and device, and the four collectives they route to it."""

    @property
    def group(self) -> Any: ...

    @property
    def device(self) -> torch.device: ...

    def all_reduce(self, tensor: torch.Tensor, op: Any = ..., async_op: bool = ...) -> Any: ...

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op: Any = ...,
                              async_op: bool = ...) -> Any: ...

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor,
                               async_op: bool = ...) -> Any: ...

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, *args: Any,
                          **kwargs: Any) -> Any: ...

PATCHED = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single",
           "reduce_scatter_single", "all_gather_single")

_originals: dict[str, Callable[..., Any]] = {}
_comms: dict[Any, Communicator] = {}        # group (None for WORLD) -> communicator
_state = threading.local()


@contextmanager
def inside() -> Iterator[None]:
    """While a communicator runs a call: patched names go straight to torch."""
    before = getattr(_state, "depth", 0)
    _state.depth = before + 1
    try:
        yield
    finally:
        _state.depth = before


def forget(comm: Communicator) -> None:
    """A closed communicator takes no more calls."""
    for g in [g for g, c in _comms.items() if c is comm]:
        del _comms[g]


def install(*comms: Communicator) -> None:
    """Install the wrappers (idempotent) and register `comms` by group (`hiercoll.torch.patch`
    makes a WORLD communicator first when given none)."""
    for c in comms:
        _comms[c.group] = c
    if not _originals:
        for name in PATCHED:
            if hasattr(dist, name):
                _originals[name] = getattr(dist, name)
                setattr(dist, name, functools.wraps(_originals[name])(_WRAPPERS[name]))


def unpatch() -> None:
    """Put torch's functions back and forget the registered communicators (not closed)."""
    for name, fn in _originals.items():
        setattr(dist, name, fn)
    _originals.clear()
    _comms.clear()


def is_patched() -> bool:
    return bool(_originals)


def _comm_for(group: Any, tensors: tuple[torch.Tensor, ...]) -> Communicator | None:
    if getattr(_state, "depth", 0):
        return None
    key = None if group is None or group == dist.group.WORLD else group
    comm = _comms.get(key)
    if comm is None:
        return None
    from hiercoll.torch.resolve import dtype_for
    for t in tensors:
        if (not isinstance(t, torch.Tensor) or t.device.type != comm.device.type
                or not t.is_contiguous() or dtype_for(t) is None or t.dtype != tensors[0].dtype):
            return None
    return comm


def _op_ok(op: Any) -> bool:
    from hiercoll.torch.resolve import reduce_op
    try:
        reduce_op(op)
    except HiercollError:
        return False
    return True


def _all_reduce(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None,
                async_op: bool = False) -> Any:
    comm = _comm_for(group, (tensor,))
    if comm is None or not _op_ok(op):
        return _originals["all_reduce"](tensor, op=op, group=group, async_op=async_op)
    return comm.all_reduce(tensor, op, async_op=async_op)


def _reduce_scatter(name: str) -> Callable[..., Any]:
    def reduce_scatter(output: torch.Tensor, input: torch.Tensor, op: Any = dist.ReduceOp.SUM,
                       group: Any = None, async_op: bool = False) -> Any:
        comm = _comm_for(group, (output, input))
        if comm is None or not _op_ok(op):
            return _originals[name](output, input, op=op, group=group, async_op=async_op)
        return comm.reduce_scatter_tensor(output, input, op, async_op=async_op)
    return reduce_scatter


def _all_gather(name: str) -> Callable[..., Any]:
    def all_gather(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None,
                   async_op: bool = False) -> Any:
        comm = _comm_for(group, (output_tensor, input_tensor))
        if comm is None:
            return _originals[name](output_tensor, input_tensor, group=group, async_op=async_op)
        return comm.all_gather_into_tensor(output_tensor, input_tensor, async_op=async_op)
    return all_gather


def _all_to_all_single(output: torch.Tensor, input: torch.Tensor,
                       output_split_sizes: list[int] | None = None,
                       input_split_sizes: list[int] | None = None, group: Any = None,
                       async_op: bool = False) -> Any:
    comm = _comm_for(group, (output, input))
    if comm is None:
        return _originals["all_to_all_single"](output, input, output_split_sizes,
                                               input_split_sizes, group=group, async_op=async_op)
    return comm.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                  async_op=async_op)


# torch 2.13 renames the single-tensor reduce-scatter/all-gather (`*_single`; the old names
# warn and remain): both names are routed where both exist.
_WRAPPERS: dict[str, Callable[..., Any]] = {
    "all_reduce": _all_reduce,
    "reduce_scatter_tensor": _reduce_scatter("reduce_scatter_tensor"),
    "reduce_scatter_single": _reduce_scatter("reduce_scatter_single"),
    "all_gather_into_tensor": _all_gather("all_gather_into_tensor"),
    "all_gather_single": _all_gather("all_gather_single"),
    "all_to_all_single": _all_to_all_single}
