"""The gloo backend and the nccl pseudo-backend on CPU, 2 and 4 processes (torch spawn).

Each world is started once per module (starting processes dominates the cost); every rank runs
all cases on fresh random inputs, twice per case (scratch reuse), and writes what it saw to a
JSON file that the tests below read.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hiercoll.collectives import CollectiveSpec  # noqa: E402
from hiercoll.planner import applicable, plan  # noqa: E402
from hiercoll.topology import Topology, preset  # noqa: E402


def _topo(nodes: int, gpus: int) -> Topology:
    data = preset("h200x4").model_dump(mode="json")
    data.update(name=f"test{nodes}x{gpus}", num_nodes=nodes, gpus_per_node=gpus)
    data["inter"] = dict(data["inter"], num_nics=gpus, nic_affinity=list(range(gpus)))
    return Topology.model_validate(data)


KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def _cases(nodes: int, gpus: int) -> list[dict]:
    """Every kind x applicable algorithm in bf16 sum, plus other dtypes/ops on all-reduce and
    reduce-scatter; odd element counts so shards are uneven."""
    w = nodes * gpus
    topo = _topo(nodes, gpus)
    combos = [(kind, "bf16", "sum", None) for kind in KINDS]
    if nodes == 1:   # other dtypes/ops once; the two-node world is about hierarchical plans
        combos += [("all_reduce", "fp32", "max", ["ring", "nccl"]),
                   ("all_reduce", "fp16", "avg", ["direct", "nccl"]),
                   ("reduce_scatter", "fp64", "min", ["direct", "nccl"])]
    out = []
    for kind, dtype, op, algos in combos:
        probe = CollectiveSpec(kind=kind, world_size=w, dtype=dtype)
        count = 4 * 1031 + (0 if kind == "all_to_all" else 1)
        spec = CollectiveSpec(kind=kind, world_size=w, dtype=dtype, reduce_op=op,
                              nbytes=count * probe.dtype.itemsize)
        for algo in algos or applicable(topo, spec) + ["nccl"]:
            out.append({"nodes": nodes, "gpus": gpus, "algo": algo,
                        "spec": spec.model_dump(mode="json")})
    return out


def _worker(rank: int, world: int, init_file: str, out_dir: str, nodes: int, gpus: int) -> None:
    import torch.distributed as dist

    from hiercoll.errors import HiercollError
    from hiercoll.executor.backends import get_backend
    from hiercoll.harness.inputs import NumpyCase

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = []
    topo = _topo(nodes, gpus)
    for i, case in enumerate(_cases(nodes, gpus)):
        spec = CollectiveSpec.model_validate(case["spec"])
        if case["algo"] == "nccl":
            from hiercoll.harness.sweep import LIBRARY, Case  # noqa: F401
            from hiercoll.schedule import ExpandedOps, Schedule, ScheduleMeta
            bufs = tuple({"input": spec.input_count(r), "output": spec.output_count(r)}
                         for r in range(world))
            sched = Schedule(ScheduleMeta("nccl", {}, spec, topo.fingerprint()),
                             ExpandedOps(tuple(() for _ in bufs), bufs))
            backend = get_backend("nccl")
        else:
            sched = plan(topo, spec, case["algo"])
            backend = get_backend("gloo")
        prepared = backend.prepare(sched)
        worst, ok, notes = 0.0, True, list(prepared.notes)
        for trial in range(2):
            nc = NumpyCase.draw(spec, seed=1000 * i + trial)
            inp, out = nc.tensors(rank, torch.device("cpu"))
            backend.run(prepared, inp, out)
            chk = nc.check(rank, out)
            worst, ok = max(worst, chk.max_abs_error), ok and chk.ok
        results.append({"case": i, "algo": case["algo"], "kind": spec.kind.value,
                        "dtype": spec.dtype.value, "op": spec.reduce_op.value, "ok": ok,
                        "max_abs_error": worst, "notes": notes})
    # a plan for another world size is refused on every rank, before any communication
    wrong = plan(_topo(1, world * 2), CollectiveSpec(kind="all_reduce", world_size=world * 2,
                                                     nbytes=64), "ring")
    try:
        get_backend("gloo").prepare(wrong)
        refusal = None
    except HiercollError as exc:
        refusal = str(exc)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"results": results,
                                                             "refusal": refusal}))
    dist.barrier()
    dist.destroy_process_group()


def _run_world(nodes: int, gpus: int) -> list[dict]:
    import torch.multiprocessing as mp
    world = nodes * gpus
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        mp.spawn(_worker, args=(world, init, tmp, nodes, gpus), nprocs=world, join=True)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module", params=[(1, 2), (2, 2)], ids=["w2", "2nodes-x2"])
def world(request):  # type: ignore[no-untyped-def]
    return request.param, _run_world(*request.param)


def test_every_case_matches_the_numpy_reference_on_every_rank(world):
    (nodes, gpus), ranks = world
    cases = _cases(nodes, gpus)
    assert len(ranks[0]["results"]) == len(cases)
    bad = [(r, res) for r, rank in enumerate(ranks) for res in rank["results"] if not res["ok"]]
    assert not bad, bad[:3]
    algos = {res["algo"] for res in ranks[0]["results"]}
    assert {"ring", "direct", "nccl"} <= algos


def test_exact_kinds_are_bit_exact(world):
    _, ranks = world
    for rank in ranks:
        for res in rank["results"]:
            if res["kind"] in ("all_gather", "all_to_all") or res["op"] in ("max", "min"):
                assert res["max_abs_error"] == 0.0, res


def test_uneven_library_lowering_is_recorded_not_silent(world):
    _, ranks = world
    rs = [r for r in ranks[0]["results"] if r["algo"] == "nccl" and r["kind"] == "reduce_scatter"
          and r["dtype"] == "bf16"]
    assert rs and all(any("uneven" in n for n in r["notes"]) for r in rs)
    avg = [r for r in ranks[0]["results"] if r["algo"] == "nccl" and r["op"] == "avg"]
    assert all(any("no AVG" in n for n in r["notes"]) for r in avg)


def test_a_plan_for_another_world_size_is_refused_on_every_rank(world):
    (nodes, gpus), ranks = world
    w = nodes * gpus
    msgs = {rank["refusal"] for rank in ranks}
    assert len(msgs) == 1
    msg = msgs.pop()
    assert msg is not None and f"planned for {2 * w} ranks but launched with {w}" in msg


def test_lowering_sends_before_the_receiving_rank_reduces():
    """Pure lowering check: in a 2-rank direct all-reduce, each rank's input piece is sent in
    the level before the peer's reduce runs, and the reduce receives it from that peer."""
    from hiercoll.executor.gloo import lower_for_rank
    spec = CollectiveSpec(kind="all_reduce", world_size=2, nbytes=64)
    s = plan(_topo(1, 2), spec, "direct").expand()
    steps = lower_for_rank(s, 0)
    send_level = next(i for i, st in enumerate(steps) if st.sends)
    reduce_level = next(i for i, st in enumerate(steps)
                        if any(op.kind.value == "reduce" for op in st.local_ops))
    assert send_level <= reduce_level
    recv = [r for st in steps for r in st.recvs]
    assert recv and all(r.peer == 1 for r in recv)
    assert np.all([st.sends[0].peer == 1 for st in steps if st.sends])
