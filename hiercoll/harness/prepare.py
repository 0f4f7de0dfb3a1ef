"""Which backend a run uses and how it is prepared per mode: shared by run, stress and bench.

Graph mode takes the single-stream lowering: capture turns a rank's streams into branches of one
graph, and CUDA may run independent branches one after another, so a kernel spinning on a
sibling branch never returns (seen on an H200: one-GPU runs of all-reduce plans timed out on
their first replay with channel streams, and passed with one stream).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hiercoll.executor.interface import Backend, BackendName, Mode, Prepared
from hiercoll.schedule import Schedule


@dataclass(frozen=True)
class BackendChoice:
    """The backend the user asked for, and its (validated) cuda options."""

    name: BackendName
    cuda: dict[str, Any] = field(default_factory=dict)

    def options(self, mode: Mode | str) -> dict[str, Any]:
        """The backend's options for one mode (graph: single stream)."""
        if self.name != BackendName.CUDA:
            return {}
        return self.cuda | ({"single_stream": True} if Mode(mode) == Mode.GRAPH else {})

    @property
    def nvshmem(self) -> bool:
        """Does this choice put inter-node copies on NVSHMEM (the process's allocations must)?"""
        return self.name == BackendName.CUDA and str(self.cuda.get("inter_transport")) == "nvshmem"

    def with_tuning(self, executor: dict[str, Any]) -> BackendChoice:
        """The tuning file's knobs for the plan (`TuningEntry.executor`) where the user left
        the flag at its default; a flag given another value wins."""
        if self.name != BackendName.CUDA or not executor:
            return self
        from dataclasses import asdict

        from hiercoll.executor.cuda.lowering import CudaOptions
        defaults = asdict(CudaOptions())
        mine = {k: v for k, v in executor.items()
                if k not in self.cuda or self.cuda[k] == defaults.get(k)}
        tuned = CudaOptions(**self.cuda).tuned(mine)       # validates the knobs
        return BackendChoice(self.name, {**self.cuda, **{k: getattr(tuned, k) for k in mine}})

    def for_schedule(self, schedule: Schedule) -> BackendName:
        """A library plan runs on the library backend whatever was asked."""
        return BackendName.NCCL if schedule.is_library_call else self.name


PrepareCache = dict[tuple[BackendName, tuple[tuple[str, Any], ...]], tuple[Backend, Prepared]]


def prepare_for_mode(schedule: Schedule, choice: BackendChoice, mode: Mode | str,
                     cache: PrepareCache) -> tuple[Backend, Prepared]:
    """(backend, prepared) for one mode of one case. Modes whose backend options are the same
    share one prepare (one set of symmetric allocations) through the caller's `cache`."""
    from hiercoll.executor.backends import get_backend
    name = choice.for_schedule(schedule)
    opts = choice.options(mode) if name == choice.name else {}
    key = (name, tuple(sorted(opts.items())))
    if key not in cache:
        backend = get_backend(name.value, **opts)
        cache[key] = (backend, backend.prepare(schedule))
    return cache[key]
