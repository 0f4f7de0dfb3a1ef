"""What the small-message probes (profile_small.py, trace_small.py) share: their arguments, the
process group, and each size's all-reduce plans prepared on the cuda backend (single stream,
input filled with random values), then rank 0 writing every rank's rows."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hiercoll.collectives import CollectiveSpec, Kind  # noqa: E402
from hiercoll.executor.cuda.backend import CudaBackend  # noqa: E402
from hiercoll.planner import plan  # noqa: E402
from hiercoll.topology import load_topology  # noqa: E402


@dataclass
class Probe:
    args: argparse.Namespace
    rank: int
    world: int
    device: torch.device


@dataclass
class Case:
    nbytes: int
    spec: CollectiveSpec
    algorithm: str
    backend: CudaBackend
    prepared: Any

    def call(self) -> None:
        self.backend.run(self.prepared, self.prepared.input_view, self.prepared.output_view)


def start(doc: str | None) -> Probe:
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes", default="8192,262144")
    ap.add_argument("--algorithms", default="direct,two_shot,rd")
    ap.add_argument("--kind", default="all_reduce", help="the collective (all_reduce, reduce_scatter, ...)")
    ap.add_argument("--ctas", default="auto",
                    help="comma list of CTA counts to run each plan with (auto: the lowering's)")
    ap.add_argument("--protocol", default="auto", choices=["auto", "simple", "ll"],
                    help="the cuda lowering's protocol (auto: LL where the plan is small enough)")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    args.out.mkdir(parents=True, exist_ok=True)
    return Probe(args, rank, world, torch.device("cuda", rank))


def sizes(probe: Probe) -> Iterator[tuple[int, CollectiveSpec]]:
    for n in (int(x) for x in probe.args.sizes.split(",")):
        yield n, CollectiveSpec(kind=Kind(probe.args.kind), world_size=probe.world, dtype="bf16",
                                nbytes=n)


def cases(probe: Probe, n: int, spec: CollectiveSpec) -> Iterator[Case]:
    """Each algorithm's plan for this size, prepared, its input random."""
    topo = load_topology("h200x4" if probe.world == 4 else "bench/gpu/topologies/h200x2.yaml")
    for algo in probe.args.algorithms.split(","):
        for ctas in probe.args.ctas.split(","):
            backend = CudaBackend(single_stream=True, ctas=None if ctas == "auto" else int(ctas),
                                  protocol=probe.args.protocol)
            prepared = backend.prepare(plan(topo, spec, algo).expand())
            inp = prepared.input_view
            inp.copy_(torch.randn(inp.numel(), device=probe.device).to(inp.dtype))
            label = algo if ctas == "auto" else f"{algo}@{ctas}"
            yield Case(n, spec, label, backend, prepared)


def finish(probe: Probe, rows: list[dict[str, Any]], name: str, show_ranks: set[int] | None = None) -> None:
    """Every rank's rows to rank 0, written to OUT/name and printed (`show_ranks`: only those)."""
    gathered: list[Any] = [None] * probe.world
    dist.all_gather_object(gathered, rows)
    if probe.rank == 0:
        flat = [r for rs in gathered for r in rs]
        (probe.args.out / name).write_text(json.dumps(flat, indent=1) + "\n")
        for r in flat:
            if show_ranks is None or r["rank"] in show_ranks:
                print(json.dumps(r))
    dist.destroy_process_group()
