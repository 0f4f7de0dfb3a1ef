"""What `hiercoll.torch.Communicator.all_reduce` costs on top of the plan it runs (issue 26
item 3), against NCCL's own call, in one run.

Per size, a CUDA graph of `--calls` back-to-back calls (nccl-tests' graph mode), p50 per call
over `--reps` replays, slowest rank:
- `nccl`: `dist.all_reduce(x)`, in place, what a user runs without hiercoll;
- `comm`: `comm.all_reduce(x)`, in place, with the communicator's own choice of plan (copy into
  its pool, the plan, copy out; or the library call on the caller's tensor);
- `plan`: the same prepared plan run on its own symmetric buffers (no copies): the floor;
- `comm - plan`: the communicator's overhead per call (the issue asks <= 1 us below 1 MiB);
- `empty`: `comm.all_reduce(y)` on `y = comm.empty(...)` (zero-copy: the plan rebased onto `y`,
  in place where the kernels are safe so; `path` says which ran: rebased, LL (any tensor is
  zero-copy), or copies), and `empty - plan`.

    torchrun --nproc-per-node 2 bench/comm_overhead.py --topology bench/gpu/topologies/h200x2.yaml \\
        --out DIR
    python bench/comm_overhead.py --replot DIR/comm_overhead.json    # the PNG again, no GPU
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench.common import stamp  # noqa: E402
from hiercoll.files import write_atomic  # noqa: E402
from hiercoll.units import format_size, parse_size  # noqa: E402


def _time_graph(call: Any, calls: int, reps: int) -> float:
    """p50 us per call of a graph of `calls` calls, the slowest rank's (a collective): the
    harness's own timing (`hiercoll bench`'s graph mode)."""
    from hiercoll.executor.interface import Mode
    from hiercoll.harness.bench import time_call
    t = time_call(call, torch.device("cuda", torch.cuda.current_device()), Mode.GRAPH, reps,
                  graph_calls=calls)
    return round(t.p50_us, 2)


def _plan_alone(comm: Any) -> tuple[Any, str]:
    """The communicator's most recently used plan (the LRU's last entry), as a call on its own
    symmetric buffers; None where it is the library's call (it runs on the caller's tensor)."""
    entries = list(comm.plans.values())
    entry = entries[-1]
    if not entry.pooled:
        return None, entry.algorithm
    prepared = entry.prepared
    inp, out = prepared.input_view, prepared.output_view
    return (lambda: entry.backend.run(prepared, inp, out)), entry.algorithm


def _empty_path(comm: Any) -> str:
    """How the last call on an empty() tensor ran: rebased onto it, LL, or with copies."""
    entry = list(comm.plans.values())[-1]
    if not entry.pooled:
        return "library"
    if entry.prepared.program.ll_half:
        return "LL"
    twins = [t for (prepared, t) in comm._rebased.values() if prepared is entry.prepared]
    return "rebased" if twins and twins[-1] is not None else "copies"


def _check(comm: Any, size: int, calls: int = 20, into: Any = None) -> dict[str, Any]:
    """The communicator's in-place result against an fp32 all-reduce of the same inputs, fresh
    random inputs each call (timing runs reuse one tensor, so they prove nothing). `into`: the
    empty() tensor the inputs are written to (the zero-copy path), else a fresh tensor."""
    worst, bound = 0.0, 0.0
    for _ in range(calls):
        x = torch.randn(size // 2, dtype=torch.bfloat16, device="cuda")
        if into is not None:
            into.copy_(x)
            x = into
        want = x.float()
        dist.all_reduce(want)
        comm.all_reduce(x)
        worst = max(worst, float((x.float() - want).abs().max()))
        bound = max(bound, float(want.abs().max()) * 2 ** -7 + 1e-6)   # one bf16 rounding
    torch.cuda.synchronize()
    return {"max_err": worst, "bound": bound, "ok": worst <= bound}


def plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    """Per size: NCCL, comm.all_reduce through the pool, on a comm.empty tensor, and the plan
    alone (the floor), p50 us per call."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hiercoll.files import save_figure
    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = [r["bytes"] for r in rows]
    for key, label, style in (("nccl_us", "NCCL (dist.all_reduce)", "s-"),
                              ("comm_us", "comm.all_reduce(x), copies through the pool", "o-"),
                              ("empty_us", "comm.all_reduce on comm.empty (no copy)", "^-"),
                              ("plan_us", "the plan alone", "k--")):
        have = [(b, r[key]) for b, r in zip(x, rows, strict=True) if r.get(key) is not None]
        if have:
            ax.plot(*zip(*have, strict=True), style, label=label, ms=4)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(x, [format_size(b) for b in x])
    ax.set_xlabel("all_reduce bytes (bf16)")
    ax.set_ylabel("p50 us per call (graph of 10 calls)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--replot":
        src = Path(sys.argv[2])
        data = json.loads(src.read_text())
        plot(data["rows"], f"Communicator overhead, {data['meta']['gpus']}",
             src.with_suffix(".png"))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default="auto")
    ap.add_argument("--sizes", default="8KiB,64KiB,256KiB,1MiB,16MiB")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import os
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    from hiercoll.torch import Communicator
    comm = Communicator(topology=args.topology)
    rows: list[dict[str, Any]] = []
    for size in [parse_size(s, "--sizes") for s in args.sizes.split(",")]:
        x = torch.randn(size // 2, dtype=torch.bfloat16, device="cuda")
        comm.all_reduce(x)                       # plan, prepare and grow the pool before capture
        torch.cuda.synchronize()
        run_plan, algorithm = _plan_alone(comm)
        row: dict[str, Any] = {"bytes": size, "algorithm": algorithm,
                               "nccl_us": _time_graph(lambda t=x: dist.all_reduce(t), args.calls,
                                                      args.reps),
                               "comm_us": _time_graph(lambda t=x: comm.all_reduce(t), args.calls,
                                                      args.reps)}
        if run_plan is not None:
            row["plan_us"] = _time_graph(run_plan, args.calls, args.reps)
            row["overhead_us"] = round(row["comm_us"] - row["plan_us"], 2)
        row.update(_check(comm, size))
        y = comm.empty(size // 2, dtype=torch.bfloat16)
        y.copy_(x)
        comm.all_reduce(y)                       # its plan and rebased call, before capture
        torch.cuda.synchronize()
        row["empty_path"] = _empty_path(comm)
        row["empty_us"] = _time_graph(lambda t=y: comm.all_reduce(t), args.calls, args.reps)
        if run_plan is not None:
            row["empty_overhead_us"] = round(row["empty_us"] - row["plan_us"], 2)
        row["empty_ok"] = _check(comm, size, into=y)["ok"]
        rows.append(row)
        if dist.get_rank() == 0:
            print(json.dumps(row), flush=True)
    if dist.get_rank() == 0:
        meta = stamp("torchrun bench/comm_overhead.py " + " ".join(sys.argv[1:]))
        meta["gpus"] = f"{dist.get_world_size()} x {torch.cuda.get_device_name()}"
        lines = [f"# Communicator overhead, {meta['gpus']}", "",
                 f"`{meta['command']}`, {meta['date']}, git {meta['git_sha']}. Graph of "
                 f"{args.calls} calls, p50 per call over {args.reps} replays, slowest rank.", "",
                 "| size | plan | NCCL us | comm.all_reduce us | plan alone us | overhead us | "
                 "on comm.empty us (path) | its overhead us | right (20 fresh calls each) |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {format_size(r['bytes'])} | {r['algorithm']} | {r['nccl_us']} | "
                         f"{r['comm_us']} | {r.get('plan_us', '-')} | {r.get('overhead_us', '-')} | "
                         f"{r['empty_us']} ({r['empty_path']}) | "
                         f"{r.get('empty_overhead_us', '-')} | "
                         f"{r['ok'] and r['empty_ok']} (max err {r['max_err']:.3g}) |")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "comm_overhead.json", json.dumps({"meta": meta, "rows": rows}, indent=1))
        write_atomic(out / "comm_overhead.md", "\n".join(lines) + "\n")
        plot(rows, f"Communicator overhead, {meta['gpus']}", out / "comm_overhead.png")
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
