"""hiercoll.torch.Communicator on gloo: 2 processes on WORLD, 4 processes split into two TP
groups of 2 (and WORLD over two "nodes" of 2). Every collective against torch.distributed's own
result on the same group, async handles, rank-identical bf16 outputs, the plan cache and the
buffer pool, patch()/unpatch(), the topology refusal and fused_add_rms_norm against the unfused
reference.

Each world is started once (process start dominates); every rank runs all checks on fresh random
inputs and writes what it saw to a JSON file the tests below read.
"""

from __future__ import annotations

import json
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")


def _close(a: Any, b: Any, dtype: Any) -> bool:
    """Within a few ulps of the dtype (sums in another order round differently)."""
    tol = {torch.bfloat16: 2 ** -6, torch.float16: 2 ** -9, torch.float32: 1e-6}[dtype]
    return bool(torch.allclose(a.double(), b.double(), rtol=tol, atol=tol))


def _same_on_every_rank(t: Any, group: Any) -> bool:
    import torch.distributed as dist
    w = dist.get_world_size(group)
    every = [torch.empty_like(t) for _ in range(w)]
    dist.all_gather(every, t.contiguous(), group=group)
    return all(torch.equal(every[0], e) for e in every)


def _collectives(comm: Any, group: Any, rank: int, out: dict[str, Any], tag: str) -> None:
    """Every collective of `comm` vs torch's own on `group`, bf16 (and fp32 max)."""
    import torch.distributed as dist
    w, dev = comm.world_size, comm.device
    g = torch.Generator().manual_seed(int(torch.randint(0, 1 << 30, ()).item()) + rank)

    def rnd(*shape: int, dtype: Any = torch.bfloat16) -> Any:
        return torch.randn(*shape, generator=g).to(dtype).to(dev)

    def check(name: str, fn: Callable[[], bool]) -> None:
        try:
            out[f"{tag}:{name}"] = bool(fn())
        except Exception:       # noqa: BLE001 - recorded for the test to show
            out[f"{tag}:{name}"] = traceback.format_exc(limit=4)

    def all_reduce() -> bool:
        x = rnd(3, 333)                      # odd size: padded into its bucket
        mine, ref = x.clone(), x.clone()
        assert comm.all_reduce(mine) is None
        dist.all_reduce(ref, group=group)
        return _close(mine, ref, torch.bfloat16) and _same_on_every_rank(mine, group)

    def all_reduce_max_fp32() -> bool:
        x = rnd(1000, dtype=torch.float32)
        mine, ref = x.clone(), x.clone()
        comm.all_reduce(mine, op=dist.ReduceOp.MAX)
        dist.all_reduce(ref, op=dist.ReduceOp.MAX, group=group)
        return torch.equal(mine, ref)

    def all_reduce_avg() -> bool:
        x = rnd(77, dtype=torch.float32)
        mine, ref = x.clone(), x.clone()
        comm.all_reduce(mine, op="avg")
        dist.all_reduce(ref, group=group)
        return _close(mine, ref / w, torch.float32)

    def reduce_scatter() -> bool:
        x = rnd(w * 129)
        mine, ref = torch.empty(129, dtype=torch.bfloat16, device=dev), torch.empty_like(x[:129])
        comm.reduce_scatter_tensor(mine, x)
        full = x.float().clone()
        dist.all_reduce(full, group=group)
        ref.copy_(full.view(w, 129)[dist.get_rank(group)])
        return _close(mine, ref, torch.bfloat16)

    def all_gather() -> bool:
        x = rnd(2, 50)
        mine = torch.empty(w * 2, 50, dtype=torch.bfloat16, device=dev)
        ref = torch.empty_like(mine)
        comm.all_gather_into_tensor(mine, x)
        dist.all_gather_into_tensor(ref, x, group=group)
        return torch.equal(mine, ref)

    def all_to_all() -> bool:
        x = rnd(w * 3, 7)
        mine, ref = torch.empty_like(x), torch.empty_like(x)
        comm.all_to_all_single(mine, x)
        dist.all_to_all_single(ref, x, group=group)
        return torch.equal(mine, ref)

    def all_to_all_uneven() -> bool:
        me = dist.get_rank(group)
        sends = [(me + d) % 3 + 1 for d in range(w)]          # rows to each destination
        counts = torch.tensor(sends, device=dev)
        every = [torch.empty_like(counts) for _ in range(w)]
        dist.all_gather(every, counts, group=group)
        recvs = [int(every[s][me]) for s in range(w)]
        x = rnd(sum(sends), 5)
        mine = torch.empty(sum(recvs), 5, dtype=torch.bfloat16, device=dev)
        ref = torch.empty_like(mine)
        comm.all_to_all_single(mine, x, recvs, sends)
        dist.all_to_all_single(ref, x, recvs, sends, group=group)
        return torch.equal(mine, ref)

    def async_handle() -> bool:
        x = rnd(500)
        mine, ref = x.clone(), x.clone()
        work = comm.all_reduce(mine, async_op=True)
        ok = work is not None and work.wait()
        if dev.type == "cuda":     # wait() orders the current stream (as NCCL's): no host sync
            torch.cuda.current_stream().synchronize()
        ok = ok and work is not None and work.is_completed()
        dist.all_reduce(ref, group=group)
        return bool(ok) and _close(mine, ref, torch.bfloat16)

    def group_cast_and_reduce() -> bool:
        # piece d of every rank's input goes to rank d and to rank 0: rank 0 receives every
        # (source, piece) in that order, rank d != 0 piece d of every source
        size, me = 4, dist.get_rank(group)
        ranks = [{"input": [{"size": size, "peers": sorted({d, 0})} for d in range(w)],
                  "output": [{"size": size, "peers": [s]} for s in range(w)
                             for _ in range(w if r == 0 else 1)]} for r in range(w)]
        splits = {"ranks": ranks}
        x = rnd(w * size)
        out_n = size * w * (w if me == 0 else 1)
        got = torch.zeros(out_n, dtype=torch.bfloat16, device=dev)
        comm.group_cast(got, x, splits)
        every = [torch.empty_like(x) for _ in range(w)]
        dist.all_gather(every, x, group=group)
        pieces = range(w) if me == 0 else [me]
        want = torch.cat([every[s][d * size:(d + 1) * size] for s in range(w) for d in pieces])
        cast_ok = torch.equal(got, want)
        # group_reduce, its transpose: every received piece comes back, summed onto its owner
        from hiercoll.collectives import GroupSplits, transpose
        back = transpose(GroupSplits.model_validate(splits))
        base = rnd(w * size, dtype=torch.float32)
        acc = base.clone()
        comm.group_reduce(acc, got.float(), back)
        padded = torch.zeros(size * w * w, device=dev)
        padded[:out_n] = got.float()
        held = [torch.zeros(size * w * w, device=dev) for _ in range(w)]
        dist.all_gather(held, padded, group=group)
        want_acc = base.clone()
        for d in range(w):
            for holder in sorted({d, 0}):
                off = (me * w + d) * size if holder == 0 else me * size
                want_acc[d * size:(d + 1) * size] += held[holder][off:off + size]
        return cast_ok and _close(acc, want_acc, torch.float32)

    def fused_norm() -> bool:
        from hiercoll.torch.reference import unfused_add_rms_norm
        x = rnd(4, 64)
        shared = torch.randint(0, 1 << 30, (1,), device=dev)          # residual and weight are replicated
        dist.broadcast(shared, dist.get_global_rank(group, 0) if group else 0, group=group)
        gs = torch.Generator().manual_seed(int(shared))
        residual = torch.randn(4, 64, generator=gs).bfloat16().to(dev)
        weight = torch.randn(64, generator=gs).bfloat16().to(dev)
        normed, new_res = comm.fused_add_rms_norm(x, residual, weight, 1e-6)
        every = [torch.empty_like(x) for _ in range(w)]
        dist.all_gather(every, x, group=group)
        want_n, want_r = unfused_add_rms_norm(every, residual, weight, 1e-6)
        return (_close(normed, want_n, torch.bfloat16) and _close(new_res, want_r, torch.bfloat16)
                and _same_on_every_rank(normed, group))

    def empty_tensors() -> bool:
        """comm.empty: the shape and dtype asked, collectives on it right (a plain tensor on
        gloo, nothing to skip: it counts no symmetric tensor there)."""
        y = comm.empty(3, 333, dtype=torch.float32)
        z = comm.empty((w, 50), dtype=torch.bfloat16)
        ok = y.shape == (3, 333) and y.dtype == torch.float32 and y.device.type == dev.type
        ok = ok and z.shape == (w, 50) and z.dtype == torch.bfloat16
        x = rnd(3, 333, dtype=torch.float32)
        y.copy_(x)
        comm.all_reduce(y)
        dist.all_reduce(x, group=group)
        shard = torch.empty(50, dtype=torch.bfloat16, device=dev)
        z.copy_(rnd(w, 50))
        want = torch.empty_like(shard)
        comm.reduce_scatter_tensor(shard, z)
        dist.reduce_scatter_tensor(want, z.clone().view(-1), group=group)
        counted = comm.stats()["empty_tensors"] == (2 if dev.type == "cuda" else 0)
        return (ok and counted and _close(y, x, torch.float32)
                and _close(shard, want, torch.bfloat16))

    for name, fn in [("all_reduce", all_reduce), ("all_reduce_max_fp32", all_reduce_max_fp32),
                     ("all_reduce_avg", all_reduce_avg), ("reduce_scatter", reduce_scatter),
                     ("all_gather", all_gather), ("all_to_all", all_to_all),
                     ("all_to_all_uneven", all_to_all_uneven), ("async", async_handle),
                     ("group_cast_reduce", group_cast_and_reduce), ("fused_norm", fused_norm),
                     ("empty", empty_tensors)]:
        check(name, fn)


def _cache_pool_patch(comm: Any, rank: int, out: dict[str, Any]) -> None:
    import torch.distributed as dist

    import hiercoll.torch as ht
    x = torch.randn(1000).bfloat16()
    comm.all_reduce(x.clone())
    before = comm.stats()
    comm.all_reduce(x.clone())                   # same size: a hit
    comm.all_reduce(torch.randn(700).bfloat16())  # same bucket (1024): a hit, no new plan
    after = comm.stats()
    out["cache_hits"] = [before["plan_hits"], after["plan_hits"]]
    out["cache_misses"] = [before["plan_misses"], after["plan_misses"]]
    out["cache_plans"] = [len(before["plans"]), len(after["plans"])]
    comm.all_reduce(torch.randn(1 << 19).bfloat16())        # 1 MiB: the pool grows
    grown = comm.stats()
    comm.all_reduce(torch.randn(3000).bfloat16())           # smaller: reuses it
    small = comm.stats()
    out["pool"] = [grown["pool_bytes"], grown["pool_allocations"],
                   small["pool_bytes"], small["pool_allocations"]]
    # patch(): dist.all_reduce goes through the communicator; int32 falls back to torch
    original = dist.all_reduce
    ht.patch(comm)
    y = torch.randn(300).bfloat16()
    ref = y.float().clone()
    original(ref)
    misses = comm.stats()["plan_misses"] + comm.stats()["plan_hits"]
    dist.all_reduce(y)
    w = dist.get_world_size()
    x = torch.randn(w * 64).bfloat16()
    calls = [lambda: dist.reduce_scatter_tensor(torch.empty(64).bfloat16(), x),
             lambda: dist.all_gather_into_tensor(torch.empty(w * w * 64).bfloat16(), x),
             lambda: dist.all_to_all_single(torch.empty_like(x), x)]
    if hasattr(dist, "all_gather_single"):      # torch 2.13's names
        calls += [lambda: dist.reduce_scatter_single(torch.empty(64).bfloat16(), x),
                  lambda: dist.all_gather_single(torch.empty(w * w * 64).bfloat16(), x)]
    for call in calls:
        call()
    routed = comm.stats()["plan_misses"] + comm.stats()["plan_hits"] - misses
    out["patch_calls"] = 1 + len(calls)
    ints = torch.arange(5, dtype=torch.int32) + rank
    dist.all_reduce(ints)
    other = dist.new_group(list(range(w)))          # a group with no communicator: torch's
    z = torch.ones(8).bfloat16()
    dist.all_reduce(z, group=other)
    out["other_group_ok"] = z.tolist() == [float(w)] * 8
    fell_back = comm.stats()["plan_misses"] + comm.stats()["plan_hits"] - misses - routed
    ht.unpatch()
    out["patch"] = {"routed": routed, "fell_back": fell_back,
                    "value_ok": _close(y, ref, torch.bfloat16),
                    "int_ok": ints.tolist() == [w * i + sum(range(w)) for i in range(5)],
                    "restored": dist.all_reduce is original}


DOCS = Path(__file__).resolve().parents[1] / "docs" / "torch.md"


def _doc_example_tp_mlp(comm: Any, out: dict[str, Any]) -> None:
    """docs/torch.md's TP MLP block, as written there, on small sizes: the sharded block on the
    group equals the unsharded MLP + add + RMSNorm computed by every rank alone."""
    import torch.distributed as dist

    from hiercoll.torch.reference import unfused_add_rms_norm
    text = DOCS.read_text()
    code = text.split("## Example: a tensor-parallel MLP block")[1].split("```python")[1]
    code = code.split("tp_groups =")[0]                  # imports + the class
    scope: dict[str, Any] = {}
    exec(compile(code, str(DOCS), "exec"), scope)        # noqa: S102 - our own docs
    hidden, ffn, tp, r = 64, 256, comm.world_size, comm.rank
    shared = torch.Generator().manual_seed(1234)
    up = torch.randn(ffn, hidden, generator=shared) / 8
    down = torch.randn(hidden, ffn, generator=shared) / 16
    x = torch.randn(5, hidden, generator=shared).bfloat16()
    residual = torch.randn(5, hidden, generator=shared).bfloat16()
    block = scope["TPMLP"](hidden, ffn, comm).to(comm.device, torch.bfloat16)
    part = ffn // tp
    with torch.no_grad():
        block.up.weight.copy_(up[r * part:(r + 1) * part])
        block.down.weight.copy_(down[:, r * part:(r + 1) * part])
        normed, new_res = block(x, residual)
        partials = [torch.nn.functional.linear(
            torch.nn.functional.silu(torch.nn.functional.linear(x, up[q * part:(q + 1) * part]
                                                                .bfloat16())),
            down[:, q * part:(q + 1) * part].bfloat16()) for q in range(tp)]
    want_n, want_r = unfused_add_rms_norm(partials, residual, torch.ones(hidden).bfloat16(),
                                          1e-6)
    out["doc_example"] = (_close(normed, want_n, torch.bfloat16)
                          and _close(new_res, want_r, torch.bfloat16)
                          and _same_on_every_rank(normed, None)
                          and dist.get_world_size() == tp)


def _tuning_file(comm: Any, out: dict[str, Any], tmp: str) -> None:
    """A tuning file for the group's topology picks the plan: ring below 4 KiB, direct above."""
    from hiercoll.planner.search.autopick import TuningEntry, TuningTable, write_tuning
    from hiercoll.torch import Communicator
    table = TuningTable(topology_fingerprint=comm.topology.fingerprint(),
                        topology=comm.topology.name, collective="all_reduce", dtype="bf16",
                        entries=[TuningEntry(min_bytes=0, max_bytes=4096, algorithm="ring",
                                             params={}),
                                 TuningEntry(min_bytes=4097, max_bytes=2 ** 62,
                                             algorithm="direct", params={})])
    path = Path(tmp, f"tuning{comm.rank}.json")
    write_tuning(path, table)
    with Communicator(tuning=path) as tuned:
        for n in (1000, 100_000):
            x = torch.randn(n).bfloat16()
            tuned.all_reduce(x)
        out["tuned"] = sorted((k, v["algorithm"], v["how"].split(" /")[0])
                              for k, v in tuned.stats()["plans"].items())


def _refusals(out: dict[str, Any], world: int, tmp: str) -> None:
    from hiercoll.errors import HiercollError
    from hiercoll.topology import load_topology
    from hiercoll.torch import Communicator
    # one file per rank: ranks writing one shared file race (a reader saw it half-written)
    path = Path(tmp, f"eight{torch.distributed.get_rank()}.json")
    path.write_text(load_topology("dgx-h100", nodes=1).model_dump_json())
    msgs = []
    for topo in (str(path), "dgx-h100"):
        try:
            Communicator(topology=topo)
            msgs.append(None)
        except HiercollError as exc:
            msgs.append(str(exc))
    out["refusals"] = msgs
    bad = []
    comm = Communicator()
    for call in (lambda: comm.all_reduce(torch.ones(4, 6).t()),          # not contiguous
                 lambda: comm.all_reduce(torch.ones(4, dtype=torch.int32)),
                 lambda: comm.reduce_scatter_tensor(torch.ones(3), torch.ones(world * 3 + 1))):
        try:
            call()
            bad.append(None)
        except HiercollError as exc:
            bad.append(str(exc))
    comm.close()
    try:
        comm.all_reduce(torch.ones(4))
        bad.append(None)
    except HiercollError as exc:
        bad.append(str(exc))
    out["bad_calls"] = bad


def _replicated_residual(comm: Any, rank: int, out: dict[str, Any]) -> None:
    """check_replicated: a residual that differs on rank 1 is one line naming rank 1; the same
    residual everywhere passes (and the environment variable turns the check on too)."""
    from hiercoll.errors import HiercollError
    x, w = torch.ones(3, 8), torch.ones(8)
    same = torch.arange(24.0).view(3, 8)
    comm.fused_add_rms_norm(x, same, w, check_replicated=True)
    differs = same + rank
    msgs = []
    for kwargs, env in (({"check_replicated": True}, None), ({}, "1")):
        if env:
            os.environ["HIERCOLL_CHECK_REPLICATED"] = env
        try:
            comm.fused_add_rms_norm(x, differs, w, **kwargs)
            msgs.append(None)
        except HiercollError as exc:
            msgs.append(str(exc))
        finally:
            os.environ.pop("HIERCOLL_CHECK_REPLICATED", None)
    out["replicated"] = msgs


def test_a_residual_that_is_not_replicated_is_named_when_asked(w2: list[dict[str, Any]]) -> None:
    for r in w2:
        assert r["replicated"] == ["fused_add_rms_norm: residual differs between rank 0 and "
                                   "rank 1 (it must be replicated on every rank of the group: "
                                   "pass the full residual stream, not a shard)"] * 2


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from hiercoll.torch import Communicator
    os.environ["HIERCOLL_NO_CACHE"] = "1"
    if world == 4:
        os.environ["LOCAL_WORLD_SIZE"] = "2"      # topology "auto": 2 nodes x 2
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    out: dict[str, Any] = {}
    try:
        comm = Communicator()
        out["topology"] = [comm.topology.num_nodes, comm.topology.gpus_per_node]
        out["sync_us"] = comm.topology.costs.sync_us
        _collectives(comm, None, rank, out, "world")
        if world == 4:
            tps = [dist.new_group([0, 1]), dist.new_group([2, 3])]
            tp = tps[rank // 2]
            with Communicator(group=tp) as sub:
                out["tp_topology"] = [sub.topology.num_nodes, sub.topology.gpus_per_node]
                out["tp_rank"] = sub.rank
                _collectives(sub, tp, rank, out, "tp")
        else:
            _cache_pool_patch(comm, rank, out)
            _replicated_residual(comm, rank, out)
            _doc_example_tp_mlp(comm, out)
            _tuning_file(comm, out, out_dir)
        _refusals(out, world, out_dir)
        out["algorithms"] = sorted({v["algorithm"] for v in comm.stats()["plans"].values()})
        comm.close()
    except Exception:       # noqa: BLE001
        out["crash"] = traceback.format_exc()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def _run_world(world: int) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        mp.spawn(_worker, args=(world, init, tmp), nprocs=world, join=True)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def w2() -> list[dict[str, Any]]:
    return _run_world(2)


@pytest.fixture(scope="module")
def w4() -> list[dict[str, Any]]:
    return _run_world(4)


NAMES = ("all_reduce", "all_reduce_max_fp32", "all_reduce_avg", "reduce_scatter", "all_gather",
         "all_to_all", "all_to_all_uneven", "async", "group_cast_reduce", "fused_norm", "empty")


def _failures(ranks: list[dict[str, Any]], tag: str) -> list[Any]:
    assert not any("crash" in r for r in ranks), [r.get("crash") for r in ranks]
    return [(i, n, r.get(f"{tag}:{n}")) for i, r in enumerate(ranks) for n in NAMES
            if r.get(f"{tag}:{n}") is not True]


def test_every_collective_matches_torch_on_two_ranks(w2: list[dict[str, Any]]) -> None:
    assert _failures(w2, "world") == []
    assert w2[0]["topology"] == [1, 2]


def test_every_collective_matches_torch_on_four_ranks_two_nodes(w4: list[dict[str, Any]]) -> None:
    assert _failures(w4, "world") == []
    assert w4[0]["topology"] == [2, 2]         # LOCAL_WORLD_SIZE=2


def test_hiercoll_plans_ran_not_only_the_library(w2: list[dict[str, Any]],
                                                 w4: list[dict[str, Any]]) -> None:
    for r in w2 + w4:
        assert set(r["algorithms"]) - {"nccl"}, r["algorithms"]


def test_every_collective_matches_torch_on_tp_subgroups(w4: list[dict[str, Any]]) -> None:
    assert _failures(w4, "tp") == []
    assert [r["tp_rank"] for r in w4] == [0, 1, 0, 1]
    assert all(r["tp_topology"] == [1, 2] for r in w4)


def test_plan_cache_hits_for_the_same_bucket(w2: list[dict[str, Any]]) -> None:
    for r in w2:
        h0, h1 = r["cache_hits"]
        m0, m1 = r["cache_misses"]
        assert h1 - h0 == 2 and m1 == m0
        assert r["cache_plans"][0] == r["cache_plans"][1]


def test_the_pool_grows_once_and_is_reused_for_smaller_sizes(w2: list[dict[str, Any]]) -> None:
    for r in w2:
        grown_bytes, grown_allocs, small_bytes, small_allocs = r["pool"]
        assert grown_bytes >= 2 * (1 << 20)        # input + output of a 1 MiB bf16 bucket
        assert (small_bytes, small_allocs) == (grown_bytes, grown_allocs)


def test_patch_routes_supported_calls_and_falls_back_otherwise(w2: list[dict[str, Any]]) -> None:
    for r in w2:
        p = r["patch"]
        assert r["other_group_ok"] is True
        assert p == {"routed": r["patch_calls"], "fell_back": 0, "value_ok": True,
                     "int_ok": True, "restored": True}


def test_auto_takes_the_costs_fitted_on_our_executor_for_two_gpus_a_node(
        w2: list[dict[str, Any]], w4: list[dict[str, Any]]) -> None:
    """topology='auto' on one node of 2: the h200x2 preset's costs (fitted on our own runs,
    protocol terms included); 2 nodes x 2 (w4) too; other shapes keep h200x4's."""
    from hiercoll.topology import load_topology
    want = load_topology("h200x2").costs.sync_us
    assert want > 0
    assert all(r["sync_us"] == want for r in w2 + w4), [r["sync_us"] for r in w2 + w4]


def test_a_topology_of_another_size_is_refused_in_one_line(w2: list[dict[str, Any]],
                                                          w4: list[dict[str, Any]]) -> None:
    for r in w2 + w4:
        file_msg, preset_msg = r["refusals"]
        assert file_msg is not None and "topology" in file_msg and "8 ranks" in file_msg
        assert preset_msg is not None and "8 GPUs per node" in preset_msg
        assert "\n" not in file_msg + preset_msg


# ---- GPUs (the lead runs these; skipped on CPU) ----------------------------------------------
def _zero_copy(dev: Any, world: int) -> list[list[Any]]:
    """Calls on comm.empty tensors, per plan: [algorithm, all_reduce in place bit-equal to the
    same plan's copying call on an ordinary tensor (eager and from a replayed graph, fresh
    inputs), reduce_scatter likewise (None: no such plan), both within the bf16 bound of NCCL's
    fp32 result, which calls ran rebased onto the tensors]."""
    import torch.distributed as dist

    from hiercoll.torch import Communicator
    results = []
    n = 1 << 19
    u = 2.0 ** -8                              # bf16's unit roundoff
    for algo in ("ring", "two_shot", "direct"):
        scatter = algo != "two_shot"            # two_shot is an all_reduce plan only
        with Communicator(algorithm=algo, cuda_options={"protocol": "simple"}) as comm:
            y = comm.empty(n, dtype=torch.bfloat16)
            rs_in, rs_out = comm.empty(world, n // world), comm.empty(n // world)
            same_ar, same_rs, bounded = True, True, True
            graph = None
            for call in range(4):
                x = torch.randn(n, device=dev).bfloat16()
                xs = torch.randn(world, n // world, device=dev).bfloat16()
                copied, copied_rs = x.clone(), torch.empty(n // world, device=dev).bfloat16()
                comm.all_reduce(copied)                    # the plan through its copies
                if scatter:
                    comm.reduce_scatter_tensor(copied_rs, xs.clone())
                y.copy_(x)
                rs_in.copy_(xs)
                if call == 2:                 # capture after eager calls prepared everything
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        comm.all_reduce(y)
                        if scatter:
                            comm.reduce_scatter_tensor(rs_out, rs_in)
                if graph is None:
                    comm.all_reduce(y)
                    if scatter:
                        comm.reduce_scatter_tensor(rs_out, rs_in)
                else:
                    graph.replay()
                want, absum = x.float(), x.float().abs()
                dist.all_reduce(want)
                dist.all_reduce(absum)
                torch.cuda.synchronize()
                same_ar = same_ar and torch.equal(y, copied)
                bounded = bounded and bool(((y.float() - want).abs()
                                            <= world * u * absum + 1e-6).all())
                if scatter:
                    same_rs = same_rs and torch.equal(rs_out, copied_rs)
            twins = [t is not None for _, t in comm._rebased.values()]
            results.append([algo, same_ar, same_rs if scatter else None, bounded, twins])
    return results


def _gpu_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    from hiercoll.harness.launch import set_safe_cuda_env
    set_safe_cuda_env()
    import torch.distributed as dist

    from hiercoll.torch import Communicator
    os.environ["HIERCOLL_NO_CACHE"] = "1"
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, device_id=dev)
    out: dict[str, Any] = {}
    try:
        with Communicator() as comm:
            _collectives(comm, None, rank, out, "world")
            out["algorithms"] = sorted({v["algorithm"] for v in comm.stats()["plans"].values()})
        with Communicator(algorithm="direct") as comm:     # the cuda backend, not the library
            x = torch.randn(3000, device=dev).bfloat16()
            comm.all_reduce(x.clone())                     # prepares the plan (warm-up)
            static = x.clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                comm.all_reduce(static)
            fresh = torch.randn(3000, device=dev).bfloat16()
            static.copy_(fresh)
            graph.replay()
            ref = fresh.float().clone()
            dist.all_reduce(ref)
            torch.cuda.synchronize()
            out["graph"] = _close(static, ref.bfloat16(), torch.bfloat16)
            comm.all_reduce(torch.randn(1 << 20, device=dev).bfloat16())
            big = comm.stats()
            comm.all_reduce(torch.randn(5000, device=dev).bfloat16())
            small = comm.stats()
            out["pool"] = [big["pool_allocations"], small["pool_allocations"],
                           big["pool_bytes"], small["pool_bytes"]]
            work = comm.all_reduce(fresh.clone(), async_op=True)
            assert work is not None
            work.wait()
            torch.cuda.synchronize()
            out["async"] = work.is_completed()
        out["empty"] = _zero_copy(dev, world)
        if world == 4:
            tps = [dist.new_group([0, 1]), dist.new_group([2, 3])]
            with Communicator(group=tps[rank // 2]) as sub:
                _collectives(sub, tps[rank // 2], rank, out, "tp")
    except Exception:       # noqa: BLE001
        out["crash"] = traceback.format_exc()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def test_the_docs_tp_mlp_example_matches_the_unsharded_block(w2: list[dict[str, Any]]) -> None:
    assert [r["doc_example"] for r in w2] == [True, True]


def test_a_tuning_file_picks_the_plan_per_size(w2: list[dict[str, Any]]) -> None:
    for r in w2:
        (k1, a1, how1), (k2, a2, how2) = r["tuned"]
        assert (k1, a1) == ("all_reduce bf16 sum bucket 1024", "ring")
        assert (k2, a2) == ("all_reduce bf16 sum bucket 131072", "direct")
        assert how1.startswith("tuning file") and how2.startswith("tuning file")


def test_bad_calls_are_one_line_naming_the_argument(w2: list[dict[str, Any]]) -> None:
    for r in w2:
        contiguous, dtype, sizes, closed = r["bad_calls"]
        assert contiguous.startswith("tensor: must be contiguous")
        assert dtype.startswith("tensor: dtype torch.int32")
        assert sizes.startswith("input: ") and "world_size x output" in sizes
        assert "closed" in closed


@pytest.mark.gpu
def test_gpu_communicator_on_every_visible_gpu() -> None:
    """World = min(4, GPUs): every collective against NCCL, a captured and replayed all-reduce,
    the pool reused for a smaller size, an async handle; with 4 GPUs also two TP subgroups.
    With one GPU it is a world of one (the cuda backend's path, symmetric memory, graphs)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA GPUs")
    import torch.multiprocessing as mp
    world = min(4, torch.cuda.device_count())
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_gpu_worker, args=(world, os.path.join(tmp, "init"), tmp), nprocs=world,
                 join=True)
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    assert _failures(ranks, "world") == []
    if world == 4:
        assert _failures(ranks, "tp") == []
    for r in ranks:
        assert r["graph"] is True and r["async"] is True
        # ring and two_shot run rebased onto the empty() tensors (all_reduce in place,
        # reduce_scatter in and out); direct's all_reduce is not safe in place where it has
        # peers (it copies and makes no rebased call; a world of one reads no peer), its
        # reduce_scatter is rebased
        direct = [True, True] if world == 1 else [True]
        assert r["empty"] == [["ring", True, True, True, [True, True]],
                              ["two_shot", True, None, True, [True]],
                              ["direct", True, True, True, direct]], r["empty"]
        assert r["pool"][0] == r["pool"][1] and r["pool"][2] == r["pool"][3]
