"""Process-group setup for `hiercoll run/stress/bench` under torchrun (imports torch lazily).

NVLink multicast is turned off before torch is imported: the lent GPU hosts are shared and a
multicast object can take them out of service; nothing in hiercoll uses multimem.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hiercoll.errors import HiercollError
from hiercoll.executor.interface import ProcessGroupBackend
from hiercoll.harness.startup import started

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class Launch:
    rank: int
    world_size: int
    local_rank: int
    device: Any          # torch.device
    pg_backend: ProcessGroupBackend


# Enough hardware queues for every stream a rank (or, --one-gpu, every rank) uses: with fewer,
# two streams share a queue and a kernel spinning on a peer can sit in front of the kernel it
# waits for. Read when the CUDA context is created, so it is set before torch touches CUDA.
CUDA_CONNECTIONS = {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}


def set_safe_cuda_env() -> None:
    """Called by the commands (never at import): set the NVLS-off variables (and the CUDA
    queue count, see CUDA_CONNECTIONS) if unset."""
    for k, v in (NO_MULTICAST | CUDA_CONNECTIONS).items():
        os.environ.setdefault(k, v)


DEFAULT_TIMEOUT_S = 300.0      # `--timeout`: torch's own default is 30 minutes


def init_from_env(device_type: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                  nvshmem: bool = False) -> Launch:
    """Join (or create) the default process group from torchrun's variables.

    `nvshmem` (`--inter-transport nvshmem`): every symmetric allocation of the process is NVSHMEM
    memory, chosen here, before any (the peers' rows or a plan) is made.

    `timeout_s` bounds every collective and point-to-point wait (the gloo backend names the op
    and the peer when one expires) and the joining itself.

    Without torchrun (no RANK/WORLD_SIZE) it starts a one-rank group, which only fits one-rank
    plans; check_launch then says how to launch.
    """
    if not timeout_s > 0:
        raise HiercollError(f"--timeout: {timeout_s} must be a positive number of seconds")
    set_safe_cuda_env()
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        if not torch.cuda.is_available():
            raise HiercollError("--backend: this backend needs CUDA GPUs; none are visible "
                                "(use --backend gloo on CPU)")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        pg_backend = ProcessGroupBackend.NCCL
    else:
        device, pg_backend = torch.device("cpu"), ProcessGroupBackend.GLOO
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        kwargs: dict[str, Any] = {"backend": pg_backend, "rank": rank, "world_size": world,
                                  "timeout": timedelta(seconds=timeout_s)}
        if device_type == "cuda":
            kwargs["device_id"] = device
        try:
            dist.init_process_group(**kwargs)
        except (RuntimeError, ValueError) as exc:      # DistNetworkError/DistStoreError included
            first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()),
                         type(exc).__name__)
            raise HiercollError(f"rank {rank}: joining the process group of {world} ranks failed "
                                f"or timed out (--timeout {timeout_s:g} s): {first}") from None
    if nvshmem and device_type == "cuda":
        from hiercoll.executor.cuda.symm import use_nvshmem
        use_nvshmem(device)
    started()
    return Launch(rank, world, local_rank, device, pg_backend)


def shutdown() -> None:
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def peer_failures(rank: int) -> Iterator[None]:
    """A rank that stops or dies makes torch.distributed calls anywhere in the harness raise
    (RuntimeError and its DistBackendError): one line naming this rank instead of a traceback.
    Either way, ranks of this host that are stopped (SIGSTOP) are ended: torchrun would wait 30 s
    before killing them itself, after our one line had already said what happened."""
    try:
        yield
    except HiercollError:
        end_stopped_local_ranks()
        raise
    except RuntimeError as exc:
        end_stopped_local_ranks()
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()),
                     type(exc).__name__)
        raise HiercollError(f"rank {rank}: a call with the other ranks failed (a rank stopped "
                            f"or died?): {first}") from None


def end_stopped_local_ranks() -> list[int]:
    """SIGKILL the stopped siblings of this process under torchrun (the other workers of its
    agent; Linux /proc): the pids ended."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not os.path.isdir("/proc"):
        return []
    parent, ended = os.getppid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid == parent and state in ("T", "t"):
            try:
                os.kill(int(entry), signal.SIGKILL)
                ended.append(int(entry))
            except OSError:
                pass
    return ended
