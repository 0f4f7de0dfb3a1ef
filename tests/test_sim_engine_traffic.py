"""The per-op engine cap counts accesses to other ranks' memory, not a rank's own HBM traffic:
a local copy is bound by HBM alone, a push or a pull by the cap, a pull-reduce from three peers
three times over."""

from __future__ import annotations

import pytest

from hiercoll.schedule import Op, OpKind, Region
from hiercoll.sim.engine import engine_traffic


def _op(kind: OpKind, dst: int, srcs: tuple[int, ...], accumulate: bool = False) -> Op:
    return Op(0, 0, 0, kind, Region(dst, "output", 0, 8),
              tuple(Region(s, "input", 0, 8) for s in srcs), accumulate=accumulate)


@pytest.mark.parametrize(("kind", "dst", "srcs", "accumulate", "units"), [
    (OpKind.COPY, 0, (0,), False, 0.0),            # a self copy: HBM only
    (OpKind.COPY, 1, (0,), False, 1.0),            # a push
    (OpKind.COPY, 0, (2,), False, 1.0),            # a pull
    (OpKind.COPY, 3, (2,), False, 2.0),            # relayed: both ends are other ranks
    (OpKind.REDUCE, 1, (0, 0), False, 1.0),        # a ring step: two local reads, a push
    (OpKind.REDUCE, 0, (0, 1, 2, 3), False, 3.0),  # a one-shot pull-reduce from three peers
    (OpKind.REDUCE, 1, (0,), True, 2.0),           # accumulating into a peer: read and write
    (OpKind.REDUCE, 0, (0, 0), True, 0.0),         # a local accumulate
])
def test_engine_traffic_counts_remote_accesses(kind, dst, srcs, accumulate, units):
    assert engine_traffic(_op(kind, dst, srcs, accumulate)) == units


def test_a_large_local_copy_is_not_held_to_the_sm_cap():
    """4 x H200 ring all_gather of 1 GiB: its self copy of 256 MiB was timed at the SM cap
    (401 GB/s: 670 us); at HBM rate it is a fraction of one 256 MiB push over NVLink."""
    from hiercoll.collectives import CollectiveSpec, Kind
    from hiercoll.planner import plan
    from hiercoll.sim import simulate
    from hiercoll.topology import load_topology
    topo = load_topology("h200x4").with_costs(ce_threshold_bytes=1 << 40)   # SMs only
    spec = CollectiveSpec(kind=Kind.ALL_GATHER, world_size=4, dtype="bf16", nbytes=1 << 30)
    s = plan(topo, spec, "ring")
    res = simulate(s, topo, mode="exact", call_mode="graph")
    self_copy = next(op for op in s.rank_ops(0) if op.dst.rank == 0 and op.srcs[0].rank == 0)
    push = next(op for op in s.rank_ops(0) if op.dst.rank != 0 and not op.deps)
    took = {o.ref: res.op_end[o.ref] - res.op_start[o.ref] for o in (self_copy, push)}
    assert took[self_copy.ref] < 0.5 * took[push.ref]
