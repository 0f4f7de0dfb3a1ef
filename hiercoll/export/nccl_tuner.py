"""tuning.json -> the CSV config NCCL's example tuner plugin reads (nccl/ext-tuner/example).

One line per size range where hiercoll's pick is something NCCL itself can run:

    collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks

(`numPipeOps` and `regBuff`, the optional 9th and 10th columns, are left out: any value matches).
hiercoll's `ring` is NCCL's ring with one ring per channel, so a `ring` pick becomes
`ring,simple,<channels>`; the protocol is `simple` because hiercoll's simulator models bulk
copies, not LL/LL128. Every other pick (hier, two_shot, direct, ..., or `nccl`) is a range NCCL
still runs whenever this config is loaded: with the topology given (-t), it gets NCCL's best
algorithm and channel count there by hiercoll's calibrated library model (ring or tree, the
faster under the topology's costs), after a comment saying what hiercoll would run; without a
topology it is a comment and NCCL keeps its own choice.

Sizes: tuning.json's ranges are nccl-tests' S, which is what NCCL passes the tuner as nBytes
(count x type size, times the ranks for all-gather and reduce-scatter). The plugin reads lines
with fgets into a 256-byte buffer, so every line written here is kept shorter than that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hiercoll.collectives import CollectiveSpec, DType, Kind, valid_nbytes
from hiercoll.errors import HiercollError
from hiercoll.planner.library_model import library_model, model_channels
from hiercoll.planner.search.autopick import TuningFile, TuningTable
from hiercoll.schedule import LIBRARY_ALGORITHM
from hiercoll.topology import Topology

# hiercoll collective -> the plugin's collective_type names (parseCollType in plugin.c)
COLLECTIVES = {Kind.ALL_REDUCE: "allreduce", Kind.ALL_GATHER: "allgather",
               Kind.REDUCE_SCATTER: "reducescatter", Kind.BROADCAST: "broadcast", Kind.REDUCE: "reduce"}
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("ll", "ll128", "simple")
MAX_LINE = 255          # the plugin's fgets buffer is 256 bytes, its NUL included
OPEN_ENDED = 1 << 40    # a range reaching past this is the table's open last one
NCCL_RUNNABLE = {"ring"}


@dataclass(frozen=True)
class TunerLine:
    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    nodes: int
    ranks: int

    def csv(self) -> str:
        return (f"{self.collective},{self.min_bytes},{self.max_bytes},{self.algorithm},"
                f"{self.protocol},{self.channels},{self.nodes},{self.ranks}")


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items()) if not isinstance(v, bool) and v is not None)


def _clip(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "..."


# (collective, bytes) -> NCCL's best (algorithm, channels) by the calibrated library model
NcclBest = Callable[[Kind, int], tuple[str, int]]


def nccl_best_on(topology: Topology, dtype: str) -> NcclBest:
    """(collective, bytes) -> NCCL's best (algorithm, channels) by the library model on
    `topology` (its calibrated costs): the plan the model chooses (ring or tree), its channels."""
    def best(kind: Kind, nbytes: int) -> tuple[str, int]:
        dt = DType(dtype)
        spec = CollectiveSpec(kind=kind, world_size=topology.world_size, dtype=dt,
                              nbytes=valid_nbytes(kind, topology.world_size, dt, nbytes))
        chosen = library_model(topology, spec)
        return ("tree" if chosen.meta.algorithm == "tree" else "ring"), model_channels(topology)
    return best


def table_lines(table: TuningTable, nodes: int, ranks: int,
                nccl_best: NcclBest | None = None) -> list[str]:
    """The config lines (and comments) for one tuning table. Where hiercoll's pick is not
    something NCCL runs, NCCL still runs when this config is in use: `nccl_best` (the library
    model on the topology, -t given) gives NCCL's best algorithm there; without it NCCL keeps
    its own choice and the range is a comment."""
    coll = COLLECTIVES.get(table.collective)
    head = f"# {table.collective.value} {table.dtype} on {table.topology} (fingerprint {table.topology_fingerprint})"
    if coll is None:
        return [_clip(head), f"# {table.collective.value}: the tuner plugin has no such collective; nothing written"]
    out = [_clip(head)]
    for e in table.entries:
        if e.algorithm in NCCL_RUNNABLE:
            channels = int(e.params.get("channels", 1))
            out.append(TunerLine(coll, e.min_bytes, e.max_bytes, "ring", "simple", channels, nodes, ranks).csv())
            continue
        why = ("NCCL's own choice (measured fastest)" if e.algorithm == LIBRARY_ALGORITHM else
               f"hiercoll would run {e.algorithm}({_params_text(e.params)})")
        if nccl_best is None:
            out.append(_clip(f"# {e.min_bytes}-{e.max_bytes}: {why}; no override"))
            continue
        hi = e.max_bytes if e.max_bytes < OPEN_ENDED else 4 * max(e.min_bytes, 1)
        size = max(1, int(math.sqrt(max(e.min_bytes, 1) * max(hi, 1))))    # the range's middle
        algo, channels = nccl_best(table.collective, size)
        out.append(_clip(f"# {e.min_bytes}-{e.max_bytes}: {why}; NCCL's best by hiercoll's "
                         f"calibrated library model at {size} B: {algo}, {channels} channels "
                         "(protocol simple: the model times bulk copies, not LL/LL128)"))
        out.append(TunerLine(coll, e.min_bytes, e.max_bytes, algo, "simple", channels, nodes,
                             ranks).csv())
    return out


def select_tables(tuning: TuningFile, fingerprint: str | None, dtype: str | None, source: str) -> list[TuningTable]:
    """The tables to export: of one topology (`fingerprint`, or the file's only one) and one dtype
    per collective (the plugin cannot tell dtypes apart)."""
    tables = [t for t in tuning.tables if fingerprint is None or t.topology_fingerprint == fingerprint]
    if not tables:
        have = sorted({f"{t.topology} ({t.topology_fingerprint})" for t in tuning.tables})
        raise HiercollError(f"{source}: no tuning table for this topology"
                            + (f" (fingerprint {fingerprint}); the file has {', '.join(have)}" if have else
                               "; it has no tables: make one with `hiercoll autopick -o`"))
    prints = sorted({t.topology_fingerprint for t in tables})
    if len(prints) > 1:
        raise HiercollError(f"{source}: tables for {len(prints)} topologies; give -t/--nodes to pick one "
                            "(the tuner config matches node and rank counts)")
    if dtype is not None:
        tables = [t for t in tables if t.dtype == dtype]
        if not tables:
            raise HiercollError(f"--dtype: {source} has no {dtype} table for this topology")
    kinds = [t.collective for t in tables]
    dup = sorted({k.value for k in kinds if kinds.count(k) > 1})
    if dup:
        raise HiercollError(f"--dtype: {source} has tables of several dtypes for {', '.join(dup)}; "
                            "NCCL's tuner cannot tell dtypes apart: pick one with --dtype")
    return tables


def render(tables: list[TuningTable], nodes: int, ranks: int, source: str,
           nccl_best: NcclBest | None = None) -> str:
    any_size = nodes < 0
    lines = ["# NCCL tuner config written by `hiercoll export nccl-tuner` from " + source,
             "# format: collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks",
             "# load: NCCL_TUNER_PLUGIN=<path to libnccl-tuner-example.so> "
             "NCCL_TUNER_CONFIG_FILE=<this file> (see docs/export.md)",
             ("# nNodes/nRanks -1: matches a communicator of any size (no -t given)" if any_size else
              f"# for communicators of {nodes} node(s) and {ranks} ranks")]
    if nccl_best is not None:
        lines.append("# ranges hiercoll would run itself carry NCCL's best by hiercoll's "
                     "calibrated library model (ring or tree), for when NCCL runs them")
    for t in tables:
        lines += table_lines(t, nodes, ranks, nccl_best)
    return "\n".join(_clip(x) for x in lines) + "\n"


def parse_tuner_config(text: str) -> list[TunerLine]:
    """Read a config back as the plugin does (comments and empty lines skipped, 8-10 fields),
    refusing names the plugin does not know (it would silently fall back to its defaults)."""
    out = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if len(raw) > MAX_LINE:
            raise HiercollError(f"line {n}: {len(raw)} characters; the plugin reads at most {MAX_LINE}")
        if not raw or raw.startswith("#"):
            continue
        f = [x.strip() for x in raw.split(",")]
        if not 8 <= len(f) <= 10:
            raise HiercollError(f"line {n}: {len(f)} fields; the plugin wants 8 to 10")
        if f[0] not in COLLECTIVES.values() or f[3] not in ALGORITHMS or f[4] not in PROTOCOLS:
            raise HiercollError(f"line {n}: unknown collective/algorithm/protocol {f[0]}/{f[3]}/{f[4]}")
        out.append(TunerLine(f[0], int(f[1]), int(f[2]), f[3], f[4], int(f[5]), int(f[6]), int(f[7])))
    return out
