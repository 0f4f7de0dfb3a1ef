"""The stress loop (the AITER regression method): fresh random inputs every iteration, an
independent reference, the worst error and the first bad iteration. Collective over the group."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hiercoll.executor.interface import Backend, Prepared
from hiercoll.harness.device_reference import device_expected
from hiercoll.harness.identical import fingerprint, shares_outputs
from hiercoll.harness.inputs import (
    Check,
    NumpyCase,
    RefKind,
    compare_tensors,
    device_initial_output,
    device_inputs,
    library_bound,
)


@dataclass(frozen=True)
class StressReport:
    """Worst error over all iterations and ranks; `first_bad_iteration` is None when all passed."""

    algorithm: str
    collective: str
    dtype: str
    nbytes: int
    world_size: int
    backend: str
    mode: str
    reference: str
    iterations: int
    max_abs_error: float
    bound: float
    first_bad_iteration: int | None
    first_bad_rank: int | None
    seconds: float
    # kinds whose ranks share outputs, when checked: every call gave every rank the same bits
    # (harness/identical.py); None: not checked or not applicable. False fails the report.
    ranks_identical: bool | None = None
    # the median call, wall clock from the host with the device synchronised around it, slowest
    # rank (what one call costs a user calling it alone; `hiercoll bench` times like nccl-tests)
    p50_us: float | None = None

    @property
    def ok(self) -> bool:
        return self.first_bad_iteration is None and self.ranks_identical is not False

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["ok"] = self.ok
        return d


def stress(backend: Backend, prepared: Prepared, device: torch.device, iters: int,
           ref: RefKind, seed: int = 0, mode: str = "eager", group: Any = None,
           ref_prepared: Prepared | None = None, ref_backend: Backend | None = None,
           stop_on_error: bool = True, check: bool = True) -> StressReport:
    """Run `iters` iterations; every rank returns the same (all-reduced) report."""
    spec, rank = prepared.schedule.spec, prepared.rank
    gen = torch.Generator(device=device)
    # the device reference draws every rank's input on every rank: one seed for all of them
    gen.manual_seed(seed * 1_000_003 + (0 if ref == RefKind.DEVICE else rank))
    worst, bound = 0.0, 0.0
    first_bad: int | None = None
    bad_rank: int | None = None
    identical: bool | None = True if check and shares_outputs(spec) else None
    calls_us: list[float] = []
    batch = _Batch()
    t0 = time.perf_counter()
    it = 0
    while it < iters:
        if ref == RefKind.NUMPY:
            case = NumpyCase.draw(spec, seed * 1_000_003 + it)
            inp, out = case.tensors(rank, device)
            calls_us.append(_timed_run(backend, prepared, inp, out, device))
            result: Check = case.check(rank, out) if check else Check(0.0, 0.0, True, None)
        elif ref == RefKind.DEVICE:
            inp, out, result = _device_checked(backend, prepared, device, gen, calls_us, check)
        else:
            assert ref_backend is not None and ref_prepared is not None
            inp = device_inputs(spec, rank, device, gen)
            before = device_initial_output(spec, rank, device, gen)
            out, want = before.clone(), before.clone()
            calls_us.append(_timed_run(backend, prepared, inp, out, device))
            ref_backend.run(ref_prepared, inp, want)
            result = compare_tensors(out, want, library_bound(spec))
        worst, bound = max(worst, result.max_abs_error), result.bound
        it += 1
        if not check:
            continue
        batch.add(result.ok, fingerprint(out) if identical is not None else 0)
        if len(batch.ok) < CHECK_EVERY and it < iters:
            continue
        settled = batch.settle(it - len(batch.ok), device, group)
        if identical and not settled.identical:
            identical = False
        if settled.first_bad is not None and first_bad is None:
            first_bad, bad_rank = settled.first_bad, settled.bad_rank
            if stop_on_error:
                iters = first_bad + 1
                break
    worst = _max_everywhere(worst, device, group)
    return StressReport(prepared.schedule.meta.algorithm, spec.kind.value, spec.dtype.value,
                        spec.total_bytes, spec.world_size, prepared.backend.value, mode, ref.value,
                        iters, worst, bound, first_bad, bad_rank, time.perf_counter() - t0,
                        identical, _max_everywhere(statistics.median(calls_us), device, group)
                        if calls_us else None)


def _device_checked(backend: Backend, prepared: Prepared, device: torch.device,
                    gen: torch.Generator, calls_us: list[float], check: bool,
                    ) -> tuple[torch.Tensor, torch.Tensor, Check]:
    """One iteration against the device reference: every rank's input drawn here in rank order
    from the generator every rank seeded alike (so each rank holds the same inputs and runs
    with its own), the float64 reference of them on this GPU. Why: the numpy reference draws
    and sums every rank's input on the host each iteration, ~50 ms at 4 MiB on 4 ranks, so a
    2000-iteration TP-shape case took minutes (bench/results/gpu/nvshmem/w4-2x2-graph)."""
    spec, rank = prepared.schedule.spec, prepared.rank
    ins = [device_inputs(spec, r, device, gen) for r in range(spec.world_size)]
    out = device_initial_output(spec, rank, device, gen)    # NaN: the covered kinds overwrite
    calls_us.append(_timed_run(backend, prepared, ins[rank], out, device))
    if not check:
        return ins[rank], out, Check(0.0, 0.0, True, None)
    expected = device_expected(spec, ins)
    return ins[rank], out, compare_tensors(out, expected.outputs[rank], expected.bounds[rank])


# iterations whose checks one collective settles: a 2000-iteration TP-shape stress spent more of
# its time in two small collectives per iteration (is it right everywhere? the same bits
# everywhere?) than in the calls under test (cProfile of `stress --backend gloo -c all_reduce -t
# h200x2 --shapes 1 --hidden 2880 --iters 300` on 2 ranks: 4.1 of 6.7 ms an iteration; 3.4 ms
# an iteration settled in batches)
CHECK_EVERY = 64


@dataclass
class _Settled:
    first_bad: int | None        # the first iteration some rank got wrong
    bad_rank: int | None         # the highest rank wrong there
    identical: bool              # every iteration gave every rank the same bits


@dataclass
class _Batch:
    """Each iteration's verdict and output fingerprint since the last settling."""

    ok: list[bool] = field(default_factory=list)
    prints: list[int] = field(default_factory=list)

    def add(self, ok: bool, print_: int) -> None:
        self.ok.append(ok)
        self.prints.append(print_)

    def settle(self, first_it: int, device: torch.device, group: Any) -> _Settled:
        """Collective over the group: one all-gather of every rank's verdicts and fingerprints
        (48 bits: exact in a float64) of iterations first_it.. of this batch; then empty."""
        world = dist.get_world_size(group)
        mine = torch.tensor([float(not ok) for ok in self.ok] + [float(p) for p in self.prints],
                            dtype=torch.float64, device=device)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=group)
        n = len(self.ok)
        table = torch.stack(every).cpu()          # [world, 2n]: wrong flags, then fingerprints
        wrong, prints = table[:, :n] > 0, table[:, n:]
        self.ok, self.prints = [], []
        bad_its = torch.nonzero(wrong.any(dim=0)).flatten().tolist()
        first = bad_its[0] if bad_its else None
        bad_rank = None if first is None else int(torch.nonzero(wrong[:, first]).max())
        return _Settled(None if first is None else first_it + first, bad_rank,
                        bool((prints == prints[0]).all()))


def _timed_run(backend: Backend, prepared: Prepared, inp: torch.Tensor, out: torch.Tensor,
               device: torch.device) -> float:
    """Microseconds of one call, the device synchronised before and after it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    backend.run(prepared, inp, out)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1e6


def _max_everywhere(x: float, device: torch.device, group: Any) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())
