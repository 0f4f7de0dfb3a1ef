"""Rank-identical all-reduce results (issue 14 s2): every family gives every rank the same
expression tree (sim/reduction_order.py) and the same bits through the reference executor and
the cuda emulator; a plan whose ranks sum in their own order is flagged by both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiercoll as hc
from hiercoll.collectives import CollectiveSpec, DType, first_rank_difference, wide_inputs
from hiercoll.executor.cuda.emulate import emulate
from hiercoll.executor.cuda.lowering import CudaOptions
from hiercoll.executor.reference import execute, verify
from hiercoll.plan_file import save_plan
from hiercoll.planner import applicable
from hiercoll.schedule import ExpandedOps, Op, OpKind, Region, Schedule, ScheduleMeta, Transport
from hiercoll.sim import check
from tests.helpers import small_topology

FAMILIES = ["ring", "direct", "two_shot", "hier", "hier_2d"]


def _params(algo: str, draw: st.DataObject) -> dict[str, object]:
    p: dict[str, object] = {"chunks": draw.draw(st.integers(1, 3)),
                            "channels": draw.draw(st.integers(1, 2))}
    if algo in ("direct", "two_shot"):
        p["swizzle"] = draw.draw(st.booleans())
    if algo in ("hier", "hier_2d"):
        p["node_swizzle"] = draw.draw(st.booleans())
        p["rank_swizzle"] = draw.draw(st.booleans())
    if algo == "hier_2d":
        p["inter"] = draw.draw(st.sampled_from(["ring", "direct"]))
    return p


def _bits_identical(outs: list[np.ndarray], spec: CollectiveSpec) -> bool:
    return first_rank_difference(spec, outs) is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 3), gpus=st.integers(1, 4), algo=st.sampled_from(FAMILIES),
       elems=st.integers(1, 300), dtype=st.sampled_from(["bf16", "fp32"]),
       op=st.sampled_from(["sum", "avg"]), seed=st.integers(0, 2**31), data=st.data())
def test_every_family_is_rank_identical(nodes, gpus, algo, elems, dtype, op, seed, data):
    topo = small_topology(nodes, gpus)
    spec = CollectiveSpec(kind="all_reduce", world_size=topo.world_size, dtype=dtype,
                          nbytes=elems * DType(dtype).itemsize, reduce_op=op)
    if algo not in applicable(topo, spec):
        return
    s = hc.plan(topo, spec, algo, _params(algo, data)).expand()
    report = check(s)
    assert report.ok, report.problems
    assert report.ranks_identical is (topo.world_size > 1 or None)
    rng = np.random.default_rng(seed)
    outs = execute(s, wide_inputs(spec, rng), seed=seed)
    assert _bits_identical(outs, spec)


def _own_order_plan(w: int, n: int, dtype: str, two_stage: bool = False) -> Schedule:
    """Each rank gets every peer's input and sums in its own order: itself first (what direct did
    before the fix). `two_stage`: (mine + next) is rounded to the dtype before the rest is added,
    so the order shows in bf16 too (fp32 accumulation of a few bf16 values is mostly exact)."""
    spec = CollectiveSpec(kind="all_reduce", world_size=w, dtype=dtype,
                          nbytes=n * DType(dtype).itemsize)
    ops, bufs = [], []
    for r in range(w):
        peers = [(r + k) % w for k in range(1, w)]
        lst = [Op(r, j, 0, OpKind.COPY, Region(r, "slots", j * n, n), (Region(s, "input", 0, n),),
                  transport=Transport.INTRA) for j, s in enumerate(peers)]
        mine = Region(r, "input", 0, n)
        slots = [Region(r, "slots", j * n, n) for j in range(w - 1)]
        if two_stage:
            lst.append(Op(r, len(lst), 0, OpKind.REDUCE, Region(r, "part", 0, n), (mine, slots[0])))
            lst.append(Op(r, len(lst), 0, OpKind.REDUCE, Region(r, "output", 0, n),
                          (Region(r, "part", 0, n), *slots[1:])))
        else:
            lst.append(Op(r, len(lst), 0, OpKind.REDUCE, Region(r, "output", 0, n), (mine, *slots)))
        ops.append(tuple(lst))
        bufs.append({"input": n, "output": n, "slots": (w - 1) * n, "part": n})
    return Schedule(ScheduleMeta("own_order", {}, spec, "test"), ExpandedOps(tuple(ops), tuple(bufs)))


@pytest.mark.parametrize(("dtype", "two_stage"), [("fp32", False), ("bf16", True), ("fp32", True)])
def test_ranks_summing_in_their_own_order_are_flagged(dtype, two_stage):
    s = _own_order_plan(4, 500, dtype, two_stage)
    report = check(s)
    assert not report.ok and report.ranks_identical is False
    assert any(p.startswith("ranks differ: r") and "written by op" in p for p in report.problems)
    relaxed = check(s, require_ranks_identical=False)       # the terms are right: only reported
    assert relaxed.ok and relaxed.ranks_identical is False
    v = verify(s, trials=2, seed=int(np.random.default_rng().integers(2**31)))
    assert not v.ok and v.ranks_identical is False and v.mismatch is None
    assert v.rank_difference is not None and v.rank_difference.startswith("ranks differ: rank")


def test_same_order_everywhere_passes_and_two_terms_commute():
    # w = 2: a + b == b + a, so "mine first" on two ranks is the same tree (and the same bits)
    s = _own_order_plan(2, 64, "fp32")
    assert check(s).ranks_identical is True
    assert verify(s, trials=2).ranks_identical is True


def test_direct_and_hier_2d_one_shot_sum_in_rank_order():
    """The two families that summed 'mine first' (every owner, every rail rank) now name their
    sources in rank (node) order."""
    topo = small_topology(1, 4)
    spec = CollectiveSpec(kind="all_reduce", world_size=4, dtype="fp32", nbytes=400)
    red = [op for op in hc.plan(topo, spec, "direct").rank_ops(2) if op.kind == OpKind.REDUCE]
    assert [reg.rank if reg.buffer == "input" else None for reg in red[0].srcs] == [None, None, 2, None]
    topo3 = small_topology(3, 2)
    spec3 = CollectiveSpec(kind="all_reduce", world_size=6, dtype="fp32", nbytes=600)
    s = hc.plan(topo3, spec3, "hier_2d", {"inter": "direct"})
    assert check(s).ranks_identical is True


def test_emulated_cuda_program_gives_every_rank_the_same_bits():
    topo = small_topology(2, 2)
    rng = np.random.default_rng()
    for algo in FAMILIES:
        spec = CollectiveSpec(kind="all_reduce", world_size=4, dtype="fp32", nbytes=4 * 37)
        s = hc.plan(topo, spec, algo).expand()
        calls = [wide_inputs(spec, rng) for _ in range(2)]
        before = [[np.full(spec.output_count(r), np.nan) for r in range(4)] for _ in calls]
        for single in (False, True):
            outs = emulate(s, calls, before, CudaOptions(single_stream=single), seed=int(rng.integers(1000)))
            for call in outs:
                assert _bits_identical(call, spec), (algo, single)
    bad = _own_order_plan(4, 50, "fp32")
    calls = [wide_inputs(bad.spec, rng)]
    outs = emulate(bad, calls, [[np.full(50, np.nan)] * 4])
    assert not _bits_identical(outs[0], bad.spec)


def test_check_json_and_kinds_without_shared_outputs():
    topo = small_topology(1, 4)
    rs = CollectiveSpec(kind="reduce_scatter", world_size=4, dtype="bf16", nbytes=800)
    report = check(hc.plan(topo, rs, "direct"))
    assert report.ok and report.ranks_identical is None and report.to_json()["ranks_identical"] is None
    ag = CollectiveSpec(kind="all_gather", world_size=4, dtype="bf16", nbytes=800)
    assert check(hc.plan(topo, ag, "ring")).to_json()["ranks_identical"] is True


# ---- the numeric side on real processes (gloo) and in one process (harness/identical.py) -------
def _torchrun(*args: str, nproc: int) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={nproc}", "-m", "hiercoll", *args],
                          capture_output=True, text=True, env=env, timeout=180, check=False)


def _last_json(proc: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_run_check_json_reports_ranks_identical_on_gloo(tmp_path: Path):
    topo = small_topology(1, 3)
    good = hc.plan(topo, CollectiveSpec(kind="all_reduce", world_size=3, dtype="bf16",
                                        nbytes=2 * 777), "direct")
    save_plan(tmp_path / "good.json", good, topo)
    proc = _torchrun("run", str(tmp_path / "good.json"), "--backend", "gloo", "--check",
                     "--iters", "2", "--json", nproc=3)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _last_json(proc)["ranks_identical"] is True
    # each rank rounds (mine + next) to bf16 before adding the rest: different bits per rank
    bad = _own_order_plan(3, 777, "bf16", two_stage=True)
    bad = Schedule(ScheduleMeta("own_order", {}, bad.spec, topo.fingerprint()), bad.source)
    save_plan(tmp_path / "bad.json", bad, topo)
    proc = _torchrun("run", str(tmp_path / "bad.json"), "--backend", "gloo", "--check",
                     "--iters", "2", "--json", nproc=3)
    report = _last_json(proc)
    assert proc.returncode == 1 and report["ranks_identical"] is False and not report["ok"]
    assert report["first_bad_iteration"] is None      # every value within the error bound


def test_bitwise_helpers_see_one_flipped_bit():
    import torch

    from hiercoll.harness.identical import fingerprint, same_bits
    a = torch.randn(1000).to(torch.bfloat16)
    b = a.clone()
    assert same_bits(a, b) and fingerprint(a) == fingerprint(b)
    i = int(torch.randint(0, 1000, ()).item())
    b.view(torch.int16)[i] ^= 1
    assert not same_bits(a, b) and fingerprint(a) != fingerprint(b)
    nan = torch.full((4,), float("nan"))
    assert same_bits(nan, nan.clone())
    assert not same_bits(torch.zeros(1), -torch.zeros(1))


def test_the_gpu_sweep_builds_its_cases_with_a_dtype_override(tmp_path: Path):
    """bench/gpu/rank_identical.sh passes --dtype (bf16, fp32) to `stress`; the sweep took it
    as a string and failed with a traceback before any case ran."""
    from hiercoll.harness.sweep import SweepRequest, cases_for
    from hiercoll.units import parse_size_range
    dtype = str(np.random.default_rng().choice(["bf16", "fp32"]))
    cases = cases_for(SweepRequest(collective="all_reduce", topology="h200x4",
                                   algorithms="ring,direct,two_shot,hier,hier_2d", dtype=dtype,
                                   reduce_op="avg", sizes=parse_size_range("8KiB,2MiB")))
    assert len(cases) == 10
    assert {(c.schedule.spec.dtype, c.schedule.spec.reduce_op) for c in cases} == {(DType(dtype), "avg")}
    topo = small_topology(4, 1)
    save_plan(tmp_path / "p.json", hc.plan(topo, CollectiveSpec(kind="all_reduce", world_size=4,
                                                                 nbytes=64), "hier_2d",
                                           {"inter": "direct"}), topo)
    (case,) = cases_for(SweepRequest(plan=str(tmp_path / "p.json"), dtype="fp32", sizes=[4096]))
    assert case.schedule.meta.params["inter"] == "direct" and case.schedule.spec.count == 1024
    assert check(case.schedule).ranks_identical is True


def test_stress_prints_ranks_identical_per_case_on_gloo():
    proc = _torchrun("stress", "-c", "all_reduce", "-t", "bench/gpu/topologies/h200x2.yaml",
                     "--algorithms", "direct,ring", "--sizes", "4KiB", "--dtype", "fp32",
                     "--backend", "gloo", "--iters", "2", nproc=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ok")]
    assert len(lines) == 2 and all("ranks_identical=true" in ln for ln in lines)
    assert "ranks not identical" in proc.stdout


def test_a_batch_of_checks_settles_the_first_bad_iteration_rank_and_bits(monkeypatch):
    """The stress settles its checks every CHECK_EVERY iterations with one all-gather: the first
    iteration any rank got wrong (counted from the batch's first), the highest rank wrong there,
    and whether every rank held the same bits in every iteration. Three ranks, faked."""
    import torch

    from hiercoll.harness import stress as st
    ranks = {0: ([True, True, False, True], [5, 6, 7, 8]),
             1: ([True, True, True, True], [5, 6, 7, 8]),
             2: ([True, True, False, False], [5, 6, 7, 8])}

    def gather(out, mine, group=None):  # type: ignore[no-untyped-def]
        for r, (oks, prints) in ranks.items():
            out[r].copy_(torch.tensor([float(not o) for o in oks] + [float(p) for p in prints],
                                      dtype=torch.float64))
    monkeypatch.setattr(st.dist, "get_world_size", lambda group=None: 3)
    monkeypatch.setattr(st.dist, "all_gather", gather)
    batch = st._Batch()
    for ok, p in zip(*ranks[0]):
        batch.add(ok, p)
    got = batch.settle(64, torch.device("cpu"), None)
    assert (got.first_bad, got.bad_rank, got.identical) == (66, 2, True)
    assert batch.ok == [] and batch.prints == []
    ranks[1] = ([True] * 4, [5, 6, 9, 8])        # rank 1's third output differs
    ranks[0] = ranks[2] = ([True] * 4, [5, 6, 7, 8])
    for ok, p in zip(*ranks[0]):
        batch.add(ok, p)
    got = batch.settle(0, torch.device("cpu"), None)
    assert (got.first_bad, got.bad_rank, got.identical) == (None, None, False)
    # a 48-bit fingerprint survives the float64 round trip exactly
    big = (1 << 48) - 3
    assert float(big) == big and int(torch.tensor([float(big)], dtype=torch.float64).item()) == big


def test_the_stress_catches_a_wrong_call_past_a_batch_boundary(tmp_path):
    """End to end on a one-rank gloo group: a backend that is right except on call 70 is caught
    at iteration 70 (the second batch of checks), and the stress stops there."""
    import torch
    import torch.distributed as dist

    from hiercoll.executor.interface import BackendName
    from hiercoll.harness.inputs import NumpyCase, RefKind
    from hiercoll.harness.stress import CHECK_EVERY, stress
    spec = CollectiveSpec(kind="all_reduce", world_size=2, dtype="fp32", nbytes=256)
    schedule = hc.plan(small_topology(2, 1), spec, "direct")

    class Wrong:
        calls = 0

        def run(self, prepared, inp, out):  # type: ignore[no-untyped-def]
            case = NumpyCase.draw(spec, self.calls)        # seed 0: the stress draws the same
            out.copy_(torch.from_numpy(case.expected.outputs[0]).to(out.dtype))
            if self.calls == 70:
                out[3] += 1.0
            self.calls += 1

    prepared = type("P", (), {"schedule": schedule, "rank": 0, "backend": BackendName.GLOO})()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        assert CHECK_EVERY < 70 + 1 <= 2 * CHECK_EVERY
        report = stress(Wrong(), prepared, torch.device("cpu"), 500, RefKind.NUMPY)  # type: ignore[arg-type]
    finally:
        dist.destroy_process_group()
    assert report.first_bad_iteration == 70 and report.first_bad_rank == 0
    assert report.iterations == 71 and not report.ok and report.max_abs_error >= 0.9


def test_initial_outputs_drawn_on_the_device_are_nan_or_accumulated_values():
    """The library-reference stress draws one rank's outputs-before on the device: NaN where
    the collective overwrites (an unwritten element fails), fresh values where it accumulates."""
    import torch

    from hiercoll.harness.inputs import device_initial_output
    gen = torch.Generator().manual_seed(0)
    ar = CollectiveSpec(kind="all_reduce", world_size=2, dtype="bf16", nbytes=4096)
    out = device_initial_output(ar, 1, torch.device("cpu"), gen)
    assert out.dtype == torch.bfloat16 and out.numel() == ar.output_count(1) and out.isnan().all()
    from helpers import random_group_reduce
    gr = CollectiveSpec(kind="group_reduce", world_size=4, dtype="fp32",
                        splits=random_group_reduce(4, 0, 9))
    a = device_initial_output(gr, 2, torch.device("cpu"), gen)
    b = device_initial_output(gr, 2, torch.device("cpu"), gen)
    assert a.numel() == gr.output_count(2) and torch.isfinite(a).all() and (a.abs() <= 1).all()
    assert not torch.equal(a, b)      # fresh every iteration


def test_the_library_reference_stress_runs_on_gloo():
    proc = _torchrun("stress", "-c", "all_reduce,reduce_scatter", "-t", "bench/gpu/topologies/h200x2.yaml",
                     "--algorithms", "direct,ring", "--sizes", "64KiB", "--dtype", "fp32",
                     "--backend", "gloo", "--iters", "3", "--reference", "library", nproc=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("ok", "FAIL"))]
    assert len(lines) == 4 and all(ln.startswith("ok") for ln in lines)


def test_the_device_reference_stress_runs_on_gloo():
    """`--reference device`: every rank draws every rank's input from one seed and checks its
    own output against the float64 sum there (CPU tensors under gloo, GPU memory under cuda)."""
    proc = _torchrun("stress", "-c", "all_reduce,reduce_scatter,all_gather,all_to_all",
                     "-t", "bench/gpu/topologies/h200x2.yaml", "--algorithms", "direct,ring",
                     "--sizes", "64KiB", "--backend", "gloo", "--iters", "3",
                     "--reference", "device", nproc=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("ok", "FAIL"))]
    assert len(lines) == 7 and all(ln.startswith("ok") for ln in lines), proc.stdout[-2000:]


def test_the_device_reference_catches_a_wrong_output():
    """The check is real: a backend whose output is off by one element's rounding step fails,
    the right one passes, each on fresh inputs."""
    import torch

    from hiercoll.harness.stress import _device_checked

    class Fake:
        def __init__(self, wrong: bool):
            self.wrong = wrong

        def run(self, prepared, inp, out):  # type: ignore[no-untyped-def]
            out.copy_(inp)
            if self.wrong:
                out[7] += 0.5

    spec = CollectiveSpec(kind="all_reduce", world_size=1, dtype="bf16", nbytes=1 << 16)
    topo = small_topology(1, 1)
    prepared = SimpleNamespace(schedule=hc.plan(topo, spec, "direct"), rank=0,
                               backend=SimpleNamespace(value="fake"))
    cpu = torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    seen = []
    for _ in range(5):
        for wrong in (False, True):
            inp, out, got = _device_checked(Fake(wrong), prepared, cpu, gen, [], True)  # type: ignore[arg-type]
            assert got.ok != wrong and (got.first_bad_index == 7) == wrong
            seen.append(inp.clone())
    assert not torch.equal(seen[0], seen[2])       # fresh inputs every iteration
