"""Copy forwarding (sim/forwarding.py): the schedule the kernels run after a reader of
a copy's scratch is made to read the copy's source is still a correct plan, checked by the same
static checker (no race, postcondition, ranks identical) and the reference executor on fresh
random data, for every family the planner has; and it turns a push-then-reduce into a pull."""

from __future__ import annotations

import numpy as np
import pytest

from hiercoll.collectives import CollectiveSpec
from hiercoll.executor.cuda.lowering import CudaOptions, lowered_schedule
from hiercoll.executor.reference import verify
from hiercoll.planner import applicable, plan
from hiercoll.schedule import INPUT, OpKind
from hiercoll.sim import check
from hiercoll.sim.forwarding import forward_copies
from tests.test_exec_lowering import _spec, _topo

CASES = [(nodes, gpus, kind, algo, params)
         for nodes, gpus in ((1, 2), (1, 4), (2, 2))
         for kind in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")
         for algo in applicable(_topo(nodes, gpus), _spec(kind, nodes * gpus))
         for params in ({}, {"chunks": 3, "channels": 2})]


@pytest.mark.parametrize(("nodes", "gpus", "kind", "algo", "params"), CASES)
def test_forwarded_schedules_pass_the_checker_and_the_reference(nodes, gpus, kind, algo, params):
    try:
        s = plan(_topo(nodes, gpus), _spec(kind, nodes * gpus, 53), algo, params).expand()
    except Exception as exc:          # noqa: BLE001 - a family without these parameters
        pytest.skip(f"{algo} {params}: {exc}")
    fwd = lowered_schedule(s, CudaOptions())
    report = check(fwd)
    assert report.ok and not report.unchecked, report.problems
    seed = int(np.random.default_rng().integers(1 << 30))
    assert verify(fwd, trials=2, seed=seed).ok, seed


def test_direct_all_reduce_becomes_a_pull_of_every_peers_input():
    s = plan(_topo(1, 4), _spec("all_reduce", 4), "direct").expand()
    fwd = forward_copies(s, lambda op, readers: True)
    for r in range(4):
        (op,) = fwd.rank_ops(r)
        assert op.kind == OpKind.REDUCE and op.deps == ()
        assert sorted(reg.rank for reg in op.srcs) == [0, 1, 2, 3]
        assert all(reg.buffer == INPUT for reg in op.srcs)


def test_a_reused_scratch_or_a_copy_into_the_output_is_kept():
    """The ring's receive slots are rewritten every step, and an all-gather's copies write the
    output: neither may be forwarded, so those plans keep every copy."""
    ring = plan(_topo(1, 4), _spec("all_reduce", 4, 53), "ring", {"chunks": 3}).expand()
    kept = forward_copies(ring, lambda op, readers: True)
    copies = sum(op.kind == OpKind.COPY for op in ring.ops())
    assert sum(op.kind == OpKind.COPY for op in kept.ops()) >= copies - 4   # at most the first step
    ag = plan(_topo(1, 4), _spec("all_gather", 4), "direct").expand()
    assert forward_copies(ag, lambda op, readers: True) is ag


def test_forwarding_respects_what_the_lowering_allows():
    """A copy the copy engine would run stays unless only reduces read it (they run on SMs and
    pull it in one pass: push-then-reduce is two passes one after the other)."""
    s = plan(_topo(1, 4), CollectiveSpec(kind="all_reduce", world_size=4, nbytes=4 << 20),
             "direct").expand()
    big = lowered_schedule(s, CudaOptions(ce_threshold_bytes=1 << 20))
    assert big is not s and not any(op.kind == OpKind.COPY for op in big.ops())
    assert lowered_schedule(s, CudaOptions(forward=False, split_channels=False)) is s
    assert lowered_schedule(s, CudaOptions()) is not s
    # bruck's copies feed copies: on the copy engine they stay, on SMs they are forwarded
    a2a = plan(_topo(1, 4), CollectiveSpec(kind="all_to_all", world_size=4, nbytes=4 << 20),
               "bruck").expand()
    assert lowered_schedule(a2a, CudaOptions(ce_threshold_bytes=1 << 10, split_channels=False)) is a2a
    assert lowered_schedule(a2a, CudaOptions(ce_threshold_bytes=1 << 30)) is not a2a
