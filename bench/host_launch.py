"""Host cost of launching the cuda backend's work: where an eager call's time goes when the host
(one Python thread for every rank, on one GPU) is slower than the device.

    python bench/host_launch.py            # CPU: the JIT's dispatch vs a bound launch, per launch,
                                           # through a fake driver (tests/fake_triton.py)
    python bench/host_launch.py --gpu --out DIR   # one GPU: the same on the real launcher, the
                                           # other per-op host costs, and whole eager calls
                                           # (host enqueue and event time) with and without
                                           # bound launches

Writes bench/results/host_launch.{json,md} (CPU) or DIR/host_launch_gpu.{json,md}.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.common import RESULTS, command_line, stamp  # noqa: E402
from hiercoll.files import write_atomic  # noqa: E402
from hiercoll.kernels.abi import ERR_WORDS, RowSpan  # noqa: E402
from hiercoll.kernels.fused_norm import _fused_norm_kernel  # noqa: E402  (before TRITON_INTERPRET)
from hiercoll.kernels.program import KernelState, _program_kernel, bind_launch, launch_rows, warm_up  # noqa: E402


def per_call_us(fn: Callable[[], None], n: int, sync: Callable[[], None] | None = None) -> float:
    """Median host microseconds of `fn` over 5 batches of `n` calls."""
    meds = []
    for _ in range(5):
        if sync:
            sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        meds.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(meds)[2]


def _state(device: str) -> KernelState:
    n = 4096
    return KernelState(table=torch.zeros(n, dtype=torch.int64, device=device),
                       data=torch.zeros(n, dtype=torch.bfloat16, device=device),
                       sig=torch.zeros(n, dtype=torch.int32, device=device),
                       epoch=torch.zeros(1, dtype=torch.int32, device=device),
                       err=torch.zeros(ERR_WORDS, dtype=torch.int64, device=device))


def dispatch_costs(device: str, n: int) -> dict[str, float]:
    """Per launch of an empty span (no rows: nothing runs on the device): JIT vs bound."""
    state = _state(device)
    span = RowSpan(0, 0, 4, True)
    compiled = warm_up(state, "sum")
    bound = bind_launch(state, span, compiled, reduce_op="sum")
    assert bound is not None
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0

    def jit() -> None:
        launch_rows(state, span, reduce_op="sum")
    sync = torch.cuda.synchronize if device == "cuda" else None
    return {"jit_dispatch_us": per_call_us(jit, n, sync),
            "bound_launch_us": per_call_us(lambda: bound(stream), n, sync)}


def fused_norm_costs(n: int) -> dict[str, float]:
    """Per eager call of the fused all-reduce + RMSNorm (M = 4, hidden 4096, bf16, 2 ranks),
    host side only: through the JIT's dispatch every call, and through its bound binary."""
    from hiercoll.kernels.fused_norm import _BOUND, launch
    from tests.fake_triton import fused_norm_state
    hidden = 4096
    state = fused_norm_state(stride=1 << 16, grid=8)
    x, res, out, res_out = (torch.zeros(4, hidden, dtype=torch.bfloat16) for _ in range(4))
    w = torch.ones(hidden, dtype=torch.bfloat16)

    def call() -> None:
        launch(state, x, res, w, out, res_out, 1e-6, 1)

    def jit_call() -> None:
        _BOUND.clear()          # every call dispatches through the JIT, as before
        call()
    costs = {"fused_norm_jit_us": per_call_us(jit_call, n)}
    call()
    costs["fused_norm_bound_us"] = per_call_us(call, n)
    return costs


def cpu(args: argparse.Namespace) -> None:
    os.environ["TRITON_INTERPRET"] = "1"     # only for the CUDA-tensor check of the arguments
    from tests.fake_triton import fake_triton
    with fake_triton(_program_kernel):
        costs = dispatch_costs("cpu", args.n)
    with fake_triton(_fused_norm_kernel):
        costs.update(fused_norm_costs(args.n))
    meta = stamp(command_line())
    payload = {"meta": meta, "cpu_fake_launcher": costs}
    md = (f"# Host cost per kernel launch (CPU, fake launcher)\n\n`{meta['command']}`  \n"
          f"{meta['date']}, {meta['machine']}, git {meta['git_sha']}\n\n"
          "The launcher itself is a no-op here: these are the Python costs in front of it.\n\n"
          "| path | us per launch |\n|---|---|\n"
          f"| Triton JIT dispatch (`kernel[grid](...)`) | {costs['jit_dispatch_us']:.2f} |\n"
          f"| bound launch (`BoundLaunch`) | {costs['bound_launch_us']:.2f} |\n"
          "| fused all-reduce + RMSNorm, `kernels.fused_norm.launch` through the JIT's dispatch "
          f"| {costs['fused_norm_jit_us']:.2f} |\n"
          "| the same through its bound binary (`_BOUND`) "
          f"| {costs['fused_norm_bound_us']:.2f} |\n")
    write_atomic(RESULTS / "host_launch.json", json.dumps(payload, indent=1, sort_keys=True) + "\n")
    write_atomic(RESULTS / "host_launch.md", md)
    print(md)


def primitive_costs(n: int) -> dict[str, float]:
    """Other host work of an eager call, per operation."""
    dev = torch.device("cuda")
    a, b = torch.zeros(4096, device=dev), torch.zeros(4096, device=dev)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    ev = torch.cuda.Event()

    def ctx() -> None:
        with torch.cuda.stream(s1):
            pass
    sync = torch.cuda.synchronize
    return {"copy_us": per_call_us(lambda: a.copy_(b, non_blocking=True), n, sync),
            "wait_stream_us": per_call_us(lambda: s1.wait_stream(s2), n, sync),
            "stream_context_us": per_call_us(ctx, n, sync),
            "event_record_us": per_call_us(lambda: ev.record(), n, sync),
            "current_stream_us": per_call_us(torch.cuda.current_stream, n, sync)}


CALLS = [("all_reduce", "ring", "64KiB"), ("all_reduce", "direct", "64KiB"),
         ("all_reduce", "two_shot", "64KiB"), ("all_to_all", "direct", "64KiB"),
         ("reduce_scatter", "ring", "64KiB"), ("all_gather", "direct", "64KiB"),
         ("all_reduce", "direct", "16MiB"), ("all_gather", "ring", "16MiB")]


def whole_calls(iters: int) -> list[dict[str, object]]:
    """Eager one-GPU calls (4 ranks, bf16): host enqueue time and event time per call, with
    bound launches and with the JIT's dispatch."""
    from hiercoll.collectives import CollectiveSpec, Kind
    from hiercoll.executor.cuda.lowering import CudaOptions, lower
    from hiercoll.executor.cuda.one_gpu import OneGpuCluster
    from hiercoll.executor.interface import Mode
    from hiercoll.harness.one_gpu_bench import time_one_gpu
    from hiercoll.planner import plan
    from hiercoll.topology import load_topology
    from hiercoll.units import parse_size
    topo = load_topology("h200x4")
    out = []
    for kind, algo, size in CALLS:
        spec = CollectiveSpec(kind=Kind(kind), world_size=4, dtype="bf16", nbytes=parse_size(size))
        sched = plan(topo, spec, algo).expand()
        cluster = OneGpuCluster(sched, CudaOptions())
        programs = [lower(sched, r, CudaOptions()) for r in range(4)]
        launches = sum(len(v) for p in programs for v in p.streams.values())
        ins = [p.input_view.clone() for p in cluster.prepared]
        outs = [p.output_view.clone() for p in cluster.prepared]
        row: dict[str, object] = {"collective": kind, "algorithm": algo, "size": size,
                                  "ops": sum(len(sched.rank_ops(r)) for r in range(4)),
                                  "stream_launches": launches}
        saved = [dict(p.bound) for p in cluster.prepared]
        for name, bound in (("bound", True), ("jit", False)):
            for p, s in zip(cluster.prepared, saved, strict=True):
                p.bound.clear()
                if bound:
                    p.bound.update(s)
            call = functools.partial(cluster.run, ins, outs)
            call()
            row[f"{name}_host_us"] = per_call_us(call, 10, torch.cuda.synchronize)
            torch.cuda.synchronize()
            row[f"{name}_event_p50_us"] = time_one_gpu(cluster, Mode.EAGER, iters).p50_us
        print(row, flush=True)
        out.append(row)
        del cluster
    return out


def gpu(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = stamp(command_line()) | {"device": torch.cuda.get_device_name()}
    payload = {"meta": meta, "launch": dispatch_costs("cuda", args.n),
               "primitives": primitive_costs(args.n), "calls": whole_calls(args.iters)}
    print(json.dumps(payload["launch"]), json.dumps(payload["primitives"]), flush=True)
    lines = [f"# Host cost of eager launches on one GPU ({meta['device']})", "",
             f"`{meta['command']}`  ", f"{meta['date']}, git {meta['git_sha']}", "",
             "| per operation | host us |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in {**payload["launch"], **payload["primitives"]}.items()]
    lines += ["", "Eager calls, 4 ranks on one GPU, bf16 (host: enqueue of every rank's call; "
              "event: p50 per call, back to back):", "",
              "| call | ops | launches | host us bound | host us JIT | event us bound | event us JIT |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {c['collective']} {c['algorithm']} {c['size']} | {c['ops']} | "
              f"{c['stream_launches']} | {c['bound_host_us']:.0f} | {c['jit_host_us']:.0f} | "
              f"{c['bound_event_p50_us']:.0f} | {c['jit_event_p50_us']:.0f} |"
              for c in payload["calls"]]
    write_atomic(out / "host_launch_gpu.json", json.dumps(payload, indent=1, sort_keys=True) + "\n")
    write_atomic(out / "host_launch_gpu.md", "\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--out", default="/tmp/out")
    ap.add_argument("-n", type=int, default=2000, help="launches per timed batch")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    (gpu if args.gpu else cpu)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
