"""A plan -> one Chakra execution trace per rank (ASTRA-sim's workload input).

Each op becomes nodes on the ranks its data touches, the way the simulator moves it
(`sim.engine.op_links`): a copy between ranks is a COMM_SEND_NODE on the source
rank and a COMM_RECV_NODE on the destination; a reduce receives its remote sources on the
issuing rank, computes there (a COMP_NODE) and sends the result on when the destination is a
peer; a copy within a rank is a COMP_NODE (a memory copy). The op's *entry* nodes (the sends of
its sources, its local copy or compute) carry its dependencies; its *exit* node (where its
result lands) is what later ops depend on.

Dependencies (the op's deps and the previous op of its channel: `schedule.predecessor_map`)
become `data_deps` when the predecessor's exit node is on the same rank; otherwise a sync
message: a SYNC_BYTES send from the predecessor's exit rank (after its exit node) to a receive
the entry node waits on. That is how executors lower a cross-rank dependency too (a flag write).
Tags are unique per message, so ASTRA-sim matches every send with its receive.

Attributes follow Chakra's feeder (et_feeder_node.cpp): `comm_src`/`comm_dst`/`comm_tag`
int32, `comm_size` int64, `is_cpu_op` bool (false: GPU work), `num_ops` int64 and
`tensor_size` uint64 on compute nodes, whose `duration_micros` is the bytes they read and write
over the topology's HBM bandwidth x reduce_efficiency. Every node also names its op
(`hiercoll_op`, "rank.index") so a decoded trace can be checked against the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hiercoll.errors import HiercollError
from hiercoll.export.chakra_proto import NODE_TYPES, encode_stream, messages
from hiercoll.schedule import Op, OpKind, OpRef, Schedule, predecessor_map, topological_order
from hiercoll.topology import Topology

CHAKRA_VERSION = "0.0.4"
SYNC_BYTES = 8                      # a cross-rank dependency without data: one flag word
MAX_TAG = 2**31 - 1                 # comm_tag is read as int32


@dataclass
class _Trace:
    nodes: list[Any] = field(default_factory=list)

    def add(self, node_type: str, name: str, op: Op | OpRef, deps: list[int] | None = None) -> Any:
        ref = op.ref if isinstance(op, Op) else op
        n = messages()["Node"](id=len(self.nodes) + 1, name=name, type=NODE_TYPES[node_type])
        n.data_deps.extend(deps or [])
        n.attr.add(name="is_cpu_op", bool_val=False)
        n.attr.add(name="hiercoll_op", string_val=f"{ref[0]}.{ref[1]}")
        self.nodes.append(n)
        return n


class _Builder:
    def __init__(self, schedule: Schedule, topology: Topology):
        schedule.check_walk("exporting it")
        self.schedule, self.topology = schedule, topology
        self.itemsize = schedule.spec.dtype.itemsize
        self.traces = [_Trace() for _ in range(schedule.world_size)]
        self.exit: dict[OpRef, tuple[int, int]] = {}           # op -> (rank, node id)
        self.syncs: dict[tuple[OpRef, int], int] = {}           # (op, rank) -> recv node id there
        self.tag = 0

    def _message(self, src: int, dst: int, nbytes: int, name: str, send_op: OpRef, recv_op: OpRef,
                 send_deps: list[int]) -> tuple[Any, Any]:
        self.tag += 1
        if self.tag > MAX_TAG:
            raise HiercollError(f"export chakra: more than {MAX_TAG} messages; comm_tag is int32")
        s = self.traces[src].add("COMM_SEND_NODE", f"send {name} r{src}->r{dst}", send_op, send_deps)
        r = self.traces[dst].add("COMM_RECV_NODE", f"recv {name} r{src}->r{dst}", recv_op)
        for node in (s, r):
            node.attr.add(name="comm_src", int32_val=src)
            node.attr.add(name="comm_dst", int32_val=dst)
            node.attr.add(name="comm_size", int64_val=nbytes)
            node.attr.add(name="comm_tag", int32_val=self.tag)
        return s, r

    def _compute(self, rank: int, op: Op, what: str, read_bytes: int, write_bytes: int, elem_ops: int,
                 deps: list[int]) -> Any:
        n = self.traces[rank].add("COMP_NODE", f"{what} op {op.id}", op, deps)
        moved = read_bytes + write_bytes
        n.attr.add(name="num_ops", int64_val=elem_ops)
        n.attr.add(name="tensor_size", uint64_val=moved)
        gbps = self.topology.gpu.hbm_gbps * self.topology.costs.reduce_efficiency
        n.duration_micros = max(1, math.ceil(moved / (gbps * 1e3)))
        return n

    def _dep_ids(self, preds: tuple[OpRef, ...], rank: int) -> list[int]:
        """Node ids on `rank` an entry node of an op with these predecessors waits on."""
        ids = []
        for p in preds:
            prank, pid = self.exit[p]
            if prank == rank:
                ids.append(pid)
                continue
            key = (p, rank)
            if key not in self.syncs:
                _, recv = self._message(prank, rank, SYNC_BYTES, f"sync after {p[0]}.{p[1]}", p, p, [pid])
                recv.attr.add(name="hiercoll_sync", bool_val=True)
                self.syncs[key] = recv.id
            ids.append(self.syncs[key])
        return sorted(set(ids))

    def op(self, op: Op, preds: tuple[OpRef, ...]) -> None:
        count = op.dst.count
        nbytes = count * self.itemsize
        if op.kind == OpKind.COPY:
            src = op.srcs[0].rank
            dst = op.dst.rank
            if src == dst:
                node = self._compute(src, op, "copy", nbytes, nbytes, 0, self._dep_ids(preds, src))
                self.exit[op.ref] = (src, node.id)
            else:
                _, recv = self._message(src, dst, nbytes, f"op {op.id}", op.ref, op.ref,
                                        self._dep_ids(preds, src))
                self.exit[op.ref] = (dst, recv.id)
            return
        here = op.rank
        inbound = []
        for region in op.srcs:
            a = region.rank
            if a != here:
                _, recv = self._message(a, here, region.count * self.itemsize, f"op {op.id}",
                                        op.ref, op.ref, self._dep_ids(preds, a))
                inbound.append(recv.id)
        reads = len(op.srcs) + (1 if op.accumulate else 0)
        comp = self._compute(here, op, "reduce", reads * nbytes, nbytes, max(0, reads - 1) * count,
                             sorted(set(self._dep_ids(preds, here) + inbound)))
        if op.dst.rank == here:
            self.exit[op.ref] = (here, comp.id)
        else:
            _, recv = self._message(here, op.dst.rank, nbytes, f"op {op.id} result", op.ref, op.ref, [comp.id])
            self.exit[op.ref] = (op.dst.rank, recv.id)


def build_traces(schedule: Schedule, topology: Topology) -> list[list[Any]]:
    """Per rank, the Chakra nodes of the plan (in an order where every dependency comes first)."""
    schedule.refuse_library_call("export chakra")
    preds = predecessor_map(schedule)
    b = _Builder(schedule, topology)
    for op in topological_order(schedule):
        b.op(op, preds[op.ref])
    return [t.nodes for t in b.traces]


def trace_files(schedule: Schedule, topology: Topology, prefix: str = "hiercoll") -> dict[str, bytes]:
    """File name -> bytes: `{prefix}.{rank}.et`, ASTRA-sim's per-rank workload files (give
    ASTRA-sim `--workload-configuration=DIR/{prefix}`)."""
    meta = messages()["GlobalMetadata"](version=CHAKRA_VERSION)
    m = schedule.meta
    for key, value in (("hiercoll_algorithm", m.algorithm), ("hiercoll_collective", m.spec.kind.value),
                       ("hiercoll_topology_fingerprint", m.topology_fingerprint)):
        meta.attr.add(name=key, string_val=value)
    meta.attr.add(name="hiercoll_bytes", int64_val=m.spec.total_bytes)
    return {f"{prefix}.{r}.et": encode_stream([meta, *nodes])
            for r, nodes in enumerate(build_traces(schedule, topology))}


def write_traces(directory: str | Path, schedule: Schedule, topology: Topology,
                 prefix: str = "hiercoll") -> list[Path]:
    from hiercoll.files import write_atomic
    out = []
    for name, data in trace_files(schedule, topology, prefix).items():
        path = Path(directory) / name
        write_atomic(path, data)
        out.append(path)
    return out
