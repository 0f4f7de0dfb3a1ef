"""The stress loop of one-GPU runs (every rank in this process, `one_gpu.OneGpuCluster`): fresh
random inputs every iteration, the device reference for the four flat collectives (numpy would
cost more than the run) and the numpy reference for the rest, the worst error and the first bad
iteration, eager or graph replay; and, where ranks share outputs, whether every rank got the same
bits (`ranks_identical`)."""

from __future__ import annotations

import time

import torch

from hiercoll.executor.cuda.one_gpu import OneGpuCluster
from hiercoll.executor.interface import Mode
from hiercoll.executor.torch_dtypes import torch_dtype
from hiercoll.harness.device_reference import COVERED, device_expected
from hiercoll.harness.identical import same_bits, shares_outputs
from hiercoll.harness.inputs import Check, NumpyCase, compare_tensors, device_inputs, device_wide_inputs
from hiercoll.harness.stress import StressReport

WIDE_CALLS = 2   # calls on wide inputs after the stress loop (ranks-identical check only)


def stress_one_gpu(cluster: OneGpuCluster, iters: int, mode: str = "eager", seed: int = 0,
                   max_seconds: float | None = None, stop_on_error: bool = True,
                   numpy_reference: bool = False) -> StressReport:
    """Run up to `iters` iterations (fewer if `max_seconds` runs out: the report says how many).
    `numpy_reference`: check against numpy even where the device reference covers the kind."""
    spec, dev = cluster.schedule.spec, cluster.device
    w, dt = spec.world_size, torch_dtype(spec.dtype)
    use_numpy = numpy_reference or spec.kind not in COVERED
    ins = [torch.empty(spec.input_count(r), dtype=dt, device=dev) for r in range(w)]
    outs = [torch.full((spec.output_count(r),), float("nan"), dtype=dt, device=dev)
            for r in range(w)]
    graph = cluster.capture(ins, outs) if Mode(mode) == Mode.GRAPH else None
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    worst, bound = 0.0, 0.0
    first_bad: int | None = None
    bad_rank: int | None = None
    identical: bool | None = True if shares_outputs(spec) else None
    done = 0
    t0 = time.perf_counter()
    for it in range(iters):
        if max_seconds is not None and it and time.perf_counter() - t0 > max_seconds:
            break
        case = NumpyCase.draw(spec, seed * 1_000_003 + it) if use_numpy else None
        for r in range(w):
            if case is not None:
                i, o = case.tensors(r, dev)
                ins[r].copy_(i)
                outs[r].copy_(o)
            else:
                ins[r].copy_(device_inputs(spec, r, dev, gen))
                outs[r].fill_(float("nan"))
        expected = None if case is not None else device_expected(spec, ins)
        if graph is not None:
            graph.replay()
        else:
            cluster.run(ins, outs)
        if cluster.options.debug_timeout_ms:
            cluster.check_timeouts()
        done = it + 1
        for r in range(w):
            check: Check = (case.check(r, outs[r]) if case is not None else
                            compare_tensors(outs[r], expected.outputs[r],  # type: ignore[union-attr]
                                            expected.bounds[r]))  # type: ignore[union-attr]
            worst, bound = max(worst, check.max_abs_error), max(bound, check.bound)
            if not check.ok and first_bad is None:
                first_bad, bad_rank = it, r
        if identical and not all(same_bits(outs[r], outs[0]) for r in range(1, w)):
            identical = False     # every rank in one process: compare the bits directly
        if first_bad is not None and stop_on_error:
            break
    if identical and first_bad is None:
        # the stress inputs (+-[0.25, 1)) sum exactly in fp32 in bf16, so any order gives the
        # same bits; a few calls on wide inputs, whose sums round, show a second order
        for _ in range(WIDE_CALLS):
            for r in range(w):
                ins[r].copy_(device_wide_inputs(spec, r, dev, gen))
                outs[r].fill_(float("nan"))
            if graph is not None:
                graph.replay()
            else:
                cluster.run(ins, outs)
            if not all(same_bits(outs[r], outs[0]) for r in range(1, w)):
                identical = False
                break
    return StressReport(cluster.schedule.meta.algorithm, spec.kind.value, spec.dtype.value,
                        spec.total_bytes, w, "cuda-one-gpu", mode,
                        "numpy" if use_numpy else "device", done, worst, bound, first_bad,
                        bad_rank, time.perf_counter() - t0, identical)
