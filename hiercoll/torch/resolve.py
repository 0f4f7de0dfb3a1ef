"""What a Communicator's arguments mean for its process group: the topology ("auto", a preset or
a file, checked against the group's size), the backend ("auto" from the group's torch backend),
the reduce op and the dtype. Every refusal is one HiercollError line naming the argument."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hiercoll.collectives import DType, ReduceOp
from hiercoll.errors import HiercollError
from hiercoll.executor.interface import BackendName, ProcessGroupBackend
from hiercoll.executor.torch_dtypes import TORCH_DTYPE
from hiercoll.topology import Topology, load_topology, preset
from hiercoll.topology.presets import preset_names

AUTO_NODE = "h200x4"       # node type "auto" borrows its costs from (the calibrated one)
# ... unless a preset of the group's GPUs per node ships costs fitted on our own executor
AUTO_NODE_BY_GPUS = {2: "h200x2"}

_DTYPES = {t: d for d, t in TORCH_DTYPE.items()}     # torch's dtype -> ours


def global_ranks(group: Any) -> list[int]:
    n = dist.get_world_size(group)
    return list(range(n)) if group is None else [dist.get_global_rank(group, r) for r in range(n)]


def auto_topology(group: Any) -> Topology:
    """Nodes from LOCAL_WORLD_SIZE (torchrun's ranks per node; default: one node): the group's
    ranks grouped by node, which must hold the same number of them. Costs of an H200 node: of
    `h200x2` for two GPUs a node (fitted on our own executor's runs), else of `h200x4`."""
    ranks = global_ranks(group)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or max(ranks) + 1
    per_node: dict[int, int] = {}
    for g in ranks:
        per_node[g // local] = per_node.get(g // local, 0) + 1
    counts = set(per_node.values())
    if len(counts) != 1:
        raise HiercollError(f"topology='auto': the group's ranks {ranks} are spread unevenly over "
                            f"nodes of {local} (LOCAL_WORLD_SIZE); pass topology= a file for it")
    gpus, nodes = counts.pop(), len(per_node)
    data = preset(AUTO_NODE_BY_GPUS.get(gpus, AUTO_NODE)).model_dump(mode="json")
    data.update(name=f"auto-{nodes}x{gpus}", num_nodes=nodes, gpus_per_node=gpus)
    data["inter"] = dict(data["inter"], num_nics=gpus, nic_affinity=list(range(gpus)))
    return Topology.model_validate(data)


def resolve_topology(topology: str | Path | Topology, group: Any) -> Topology:
    """`topology` for this group; a preset takes as many nodes as the group needs."""
    world = dist.get_world_size(group)
    if isinstance(topology, str) and topology == "auto":
        return auto_topology(group)
    if isinstance(topology, str) and topology in preset_names():
        per = preset(topology, 1).gpus_per_node
        if world % per:
            raise HiercollError(f"topology: preset {topology} has {per} GPUs per node, the group "
                                f"has {world} ranks (not a multiple); use 'auto' or a file")
        return load_topology(topology, nodes=world // per)
    topo = load_topology(topology)
    if topo.world_size != world:
        raise HiercollError(f"topology: {topo.name} has {topo.world_size} ranks "
                            f"({topo.num_nodes} x {topo.gpus_per_node}) but the group has {world}; "
                            "pass a topology of the group's size or 'auto'")
    return topo


def resolve_backend(backend: str, group: Any) -> BackendName:
    """"auto": cuda on an NCCL group, gloo on a gloo group; "nccl": the library's own calls."""
    pg = str(dist.get_backend(group))
    want = {"auto": None, "cuda": BackendName.CUDA, "gloo": BackendName.GLOO,
            "nccl": BackendName.NCCL}
    if backend not in want:
        raise HiercollError(f"backend: unknown {backend!r}; choose auto, cuda, gloo or nccl")
    if pg not in (ProcessGroupBackend.NCCL, ProcessGroupBackend.GLOO):
        raise HiercollError(f"backend: the group's torch backend is {pg!r}; hiercoll runs on "
                            "nccl (cuda) or gloo (cpu) groups")
    name = want[backend]
    if name is None:
        return BackendName.CUDA if pg == ProcessGroupBackend.NCCL else BackendName.GLOO
    if name == BackendName.CUDA and pg != ProcessGroupBackend.NCCL:
        raise HiercollError(f"backend: cuda needs an nccl process group, this one is {pg}; "
                            "use backend='auto' or 'gloo'")
    if name == BackendName.GLOO and pg != ProcessGroupBackend.GLOO:
        raise HiercollError(f"backend: gloo needs a gloo process group, this one is {pg}; "
                            "use backend='auto' or 'cuda'")
    return name


def reduce_op(op: Any) -> ReduceOp:
    """hiercoll's op for a torch ReduceOp, a hiercoll ReduceOp or its name."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp(op.lower())
        except ValueError:
            pass
    else:
        for name in ("SUM", "AVG", "MAX", "MIN"):
            if op == getattr(dist.ReduceOp, name):
                return ReduceOp(name.lower())
    raise HiercollError(f"op: {op!r} is not supported; use SUM, AVG, MAX or MIN")


def dtype_of(tensor: torch.Tensor, name: str) -> DType:
    try:
        return _DTYPES[tensor.dtype]
    except KeyError:
        raise HiercollError(f"{name}: dtype {tensor.dtype} is not supported; use bf16, fp16, fp32 "
                            "or fp64") from None


def dtype_for(tensor: torch.Tensor) -> DType | None:
    """hiercoll's dtype for a tensor, None when it has none (patch() falls back then)."""
    try:
        return dtype_of(tensor, "tensor")
    except HiercollError:
        return None
