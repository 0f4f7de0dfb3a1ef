"""The (algorithm, params) pairs worth simulating for one call, and a cheap bound to prune them.

Candidates come from each applicable algorithm's own parameter model: every choice of a
Literal/enum field, chunk counts that keep pieces large enough to pipeline, one or two channels
(and one per GPU of a node on several nodes: NCCL's one ring per NIC);
boolean switches stay at their defaults (the swizzles are on because they are better).
"""

from __future__ import annotations

import itertools
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.planner.builder import transport_between
from hiercoll.planner.registry import algorithms, applicable, estimate_ops, max_ops, parse_params
from hiercoll.schedule import Op, OpKind, Schedule, Transport
from hiercoll.topology import Topology

MIN_CHUNK_BYTES = 256 * 1024
CHUNK_CHOICES = (1, 2, 4)
CHANNEL_CHOICES = (1, 2)


@dataclass(frozen=True)
class Candidate:
    algorithm: str
    params: dict[str, Any]

    def label(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in sorted(self.params.items())
                         if k in ("chunks", "channels") or not isinstance(v, bool))
        return f"{self.algorithm}({extra})"


def _choices(annotation: Any) -> list[Any] | None:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return [m.value for m in annotation]
    return None


def candidates(topology: Topology, spec: CollectiveSpec, only: list[str] | None = None) -> list[Candidate]:
    return candidates_and_oversized(topology, spec, only)[0]


def candidates_and_oversized(topology: Topology, spec: CollectiveSpec,
                             only: list[str] | None = None) -> tuple[list[Candidate], int]:
    """The candidates, and how many were left out because plan() would refuse them as above
    HIERCOLL_MAX_OPS (so an empty search can say why)."""
    out = []
    oversized = 0
    size = spec.total_bytes
    chunk_opts = [c for c in CHUNK_CHOICES if c == 1 or size // c >= MIN_CHUNK_BYTES]
    limit = max_ops()
    for name in applicable(topology, spec):
        if only is not None and name not in only:
            continue
        algo = algorithms()[name]
        if not getattr(algo, "searched", True):
            continue     # plannable by name only (NCCL's tree stands for the library)
        if only is None and getattr(algo, "duplicate_of", lambda _: None)(topology):
            continue     # plans another candidate's ops here (hier_tiers on one level: hier)
        fields = algo.Params.model_fields
        channels = sorted(set(CHANNEL_CHOICES) | ({topology.gpus_per_node} if topology.num_nodes > 1 else set()))
        axes: dict[str, list[Any]] = {"chunks": chunk_opts, "channels": channels}
        for fname, f in fields.items():
            opts = _choices(f.annotation)
            if opts:
                axes[fname] = opts
        keys = list(axes)
        for combo in itertools.product(*(axes[k] for k in keys)):
            params = dict(zip(keys, combo))
            pieces = params["chunks"] * params["channels"]
            if algo.channels_carry_chunks:
                if params["channels"] > params["chunks"]:
                    continue   # idle channels: the same schedule as channels == chunks
            elif params["chunks"] > 1 and size // pieces < MIN_CHUNK_BYTES:
                continue       # a ring pipelines only pieces that stay large (its channels count)
            p = parse_params(algo, params)
            if estimate_ops(topology, spec, algo, p) > limit:
                oversized += 1
                continue       # too large to walk (HIERCOLL_MAX_OPS), bounds need it: flat direct at 4096
            if algo.unsupported(topology, spec, p) is None:
                out.append(Candidate(name, p.model_dump(mode="json")))
    return out, oversized


def rank_key(time_us: float, rows: int, label: str) -> tuple[float, int, str]:
    """How candidates are ranked: by simulated time; where two are timed alike (to 9
    significant digits: the simulator resolves events within 1e-9 relative as one instant), by
    the rows their kernel walks (fewer: each row is a CTA barrier and a release, and a rank's
    pushes of one source split over rows run on parts of the grid; 4 x H200 all_gather,
    `hier_2d`'s one row of four stores against `direct`'s four rows: 7.8 / 9.9 us at 8 KiB,
    46.7 / 49.7 at 16 MiB, bench/results/gpu/regret); then by label, so the pick never depends
    on the order."""
    return (float(f"{time_us:.9g}"), rows, label)


def baseline_algorithm(spec: CollectiveSpec) -> str:
    """What NCCL would roughly do: a flat ring, or direct point-to-point for all-to-all/group."""
    return "ring" if spec.kind in (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_GATHER) else "direct"


def rank_bound_us(schedule: Schedule, topology: Topology, rank: int = 0) -> float:
    """A cheap lower bound from one rank's own ops (only that rank is built): its channels run
    their ops one after another, each taking at least launch + latency + bytes at the best rate
    its path allows; and the bytes it sends or receives per tier need that tier's bandwidth."""
    from hiercoll.sim.engine import LinkCache
    from hiercoll.sim.links import Network
    paths = LinkCache(Network(topology, itemsize=schedule.spec.dtype.itemsize))
    isz = schedule.spec.dtype.itemsize
    intra_bw, inter_bw = topology.gpu_intra_gbps(), topology.gpu_inter_gbps()
    out_bytes = {Transport.INTRA: 0, Transport.INTER: 0}
    in_bytes = {Transport.INTRA: 0, Transport.INTER: 0}
    per_channel: dict[int, float] = {}
    for op in schedule.rank_ops(rank):
        nbytes = op.dst.count * isz
        per_channel[op.channel] = per_channel.get(op.channel, 0.0) + paths.alone_us(op)
        for a, b in _flows(op, rank):
            if a == rank and b != rank:
                out_bytes[transport_between(topology, a, b)] += nbytes
            elif b == rank and a != rank:
                in_bytes[transport_between(topology, a, b)] += nbytes
    moved = {k: max(out_bytes[k], in_bytes[k]) for k in out_bytes}
    volume = max(moved[Transport.INTRA] / (intra_bw * 1e3) if intra_bw else 0.0,
                 moved[Transport.INTER] / (inter_bw * 1e3) if inter_bw else 0.0)
    return max(max(per_channel.values(), default=0.0), volume)


def _flows(op: Op, issuer: int) -> list[tuple[int, int]]:
    """(from, to) rank pairs an op moves data between: a copy goes straight from source to
    destination; a reduce (or a relayed copy) reads its sources into the issuer and writes the
    result out."""
    if op.kind == OpKind.COPY and not op.relayed:
        return [(op.srcs[0].rank, op.dst.rank)]
    return [(s.rank, issuer) for s in op.srcs] + [(issuer, op.dst.rank)]
