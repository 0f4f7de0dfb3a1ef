"""The one interface every backend implements, and the launch checks they share.

`prepare(schedule, group) -> Prepared` does everything that can be done once (allocation,
lowering, optional CUDA-graph capture); `run(prepared, input, output) -> RunResult` executes one
call. No torch here: backends import torch themselves, so `import hiercoll.executor` works on a
machine without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from hiercoll.errors import HiercollError
from hiercoll.schedule import Schedule


class BackendName(StrEnum):
    REFERENCE = "reference"   # numpy, one process (hiercoll.executor.reference)
    GLOO = "gloo"             # CPU, one process per rank, send/recv
    CUDA = "cuda"             # symmetric memory + Triton + copy engine
    NCCL = "nccl"             # one library call (the NCCL row of every benchmark)


class ProcessGroupBackend(StrEnum):
    """torch.distributed's own backend names (what `dist.get_backend` returns). Not to be confused
    with BackendName.NCCL (our library backend), the `nccl` pseudo-algorithm
    (schedule.LIBRARY_ALGORITHM) or the lowering's InterTransport.NCCL."""

    NCCL = "nccl"
    GLOO = "gloo"


class Mode(StrEnum):
    EAGER = "eager"
    GRAPH = "graph"           # the cuda backend replays a captured CUDA graph


@dataclass(frozen=True)
class RunResult:
    """What one `run` did. `output` is the tensor the result was written to (rank-local)."""

    backend: BackendName
    rank: int
    output: Any
    mode: Mode = Mode.EAGER


@dataclass
class Prepared:
    """Base of every backend's prepared state; backends subclass it with their own fields."""

    schedule: Schedule
    rank: int
    world_size: int
    backend: BackendName
    notes: list[str] = field(default_factory=list)   # lowering decisions worth printing

    @property
    def ran_on(self) -> str:
        """What result rows call the backend that ran: its name (the library backend says
        which process group it called through: gloo is not nccl)."""
        return self.backend.value


class Backend(Protocol):
    name: BackendName

    def prepare(self, schedule: Schedule, group: Any = None) -> Prepared:
        """Collective over `group` (default WORLD): every rank must call it with the same plan."""
        ...

    def run(self, prepared: Prepared, input: Any, output: Any) -> RunResult:
        """`input`: this rank's input, 1-D, `spec.input_count(rank)` elements of the spec's
        dtype, on the backend's device. `output`: 1-D, `spec.output_count(rank)` elements."""
        ...


def check_launch(schedule: Schedule, world_size: int, expect_fingerprint: str | None = None,
                 what: str = "plan") -> None:
    """Refuse a plan that does not fit the launch, with the same one line on every rank.

    Every check uses only the plan and launch-wide facts (world size, the topology the user named),
    so all ranks raise the same error before any collective is issued.
    """
    if schedule.world_size != world_size:
        raise HiercollError(f"{what}: planned for {schedule.world_size} ranks but launched with "
                            f"{world_size}; use --nproc-per-node/--nnodes that multiply to "
                            f"{schedule.world_size}")
    schedule.check_walk("running it")
    fp = schedule.meta.topology_fingerprint
    if expect_fingerprint is not None and fp != expect_fingerprint:
        raise HiercollError(f"{what}: planned for topology {fp}, this launch is topology "
                            f"{expect_fingerprint}; re-plan with `hiercoll plan` for this cluster")


def check_tensor(name: str, tensor: Any, count: int, dtype: Any, device_type: str) -> None:
    """Shape, dtype, device and contiguity of a user tensor (torch duck-typed)."""
    if tuple(tensor.shape) != (count,):
        raise HiercollError(f"{name}: shape {tuple(tensor.shape)}, the plan needs ({count},)")
    if tensor.dtype != dtype:
        raise HiercollError(f"{name}: dtype {tensor.dtype}, the plan's dtype is {dtype}")
    if tensor.device.type != device_type:
        raise HiercollError(f"{name}: on {tensor.device}, this backend needs {device_type} tensors")
    if not tensor.is_contiguous():
        raise HiercollError(f"{name}: must be contiguous")
