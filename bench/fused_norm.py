"""Fused all-reduce + residual add + RMSNorm against the unfused path (our all-reduce + torch add +
torch RMSNorm), per shape, in the same run; p50/p90/p99 of the per-call time from CUDA events.

One GPU, every rank in this process (`OneGpuFusedNorm`; the unfused all-reduce is the cuda
backend's planned all-reduce, `OneGpuCluster`): each rank's graph of CALLS back-to-back calls is
replayed side by side, all ranks released together (a sleep kernel on the caller stream they all
wait on), a start/end event pair on every rank's stream; one sample = the rank-averaged time of a
replay / CALLS. Also times both stages forced, and with --fit refits the stage-choice constants
(`sim/fused_norm_cost.py`) from those rows. Ranks share one GPU's SMs and HBM: the times say what
the kernels cost there, nothing about NVLink.

    CUDA_DEVICE_MAX_CONNECTIONS=32 python3 bench/fused_norm.py --world 4 --out DIR [--fit]

Across GPUs (one process per GPU, symmetric memory; the unfused row is NCCL's all-reduce + torch
add + torch RMSNorm; each process times its own graph replays, samples averaged over ranks):

    torchrun --nproc-per-node W bench/fused_norm.py --group --out DIR [--fit]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import percentiles, rank_average, stamp  # noqa: E402
from hiercoll.files import write_atomic  # noqa: E402
from hiercoll.harness.fused_norm_stress import EPS, HIDDEN, SHAPES  # noqa: E402

CALLS = 10


def _time(replay, world: int, reps: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """replay(events) replays every rank's graph once; per-call microseconds, rank-averaged."""
    samples = []
    for i in range(reps + 3):
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(world)]
        torch.cuda._sleep(20_000)       # every rank's stream waits on this: they start together
        replay(ev)
        torch.cuda.synchronize()
        if i >= 3:
            samples.append(sum(a.elapsed_time(b) for a, b in ev) * 1000 / world / CALLS)
    return percentiles(samples)


def fused_times(world: int, rows: int, hidden: int, stage: int, reps: int) -> dict[str, float]:
    from hiercoll.executor.cuda.fused_norm import OneGpuFusedNorm
    dev = torch.device("cuda")
    cl = OneGpuFusedNorm(world, rows, hidden, torch.bfloat16, dev)
    xs = [torch.randn(rows, hidden, device=dev).to(torch.bfloat16) for _ in range(world)]
    res = [torch.randn(rows, hidden, device=dev).to(torch.bfloat16) for _ in range(world)]
    w = torch.ones(hidden, device=dev, dtype=torch.bfloat16)
    outs = [torch.empty_like(x) for x in xs]
    routs = [torch.empty_like(x) for x in xs]
    graphs = cl.capture(xs, res, w, EPS, outs, routs, stage, calls=CALLS)
    return _time(lambda ev: cl.replay(graphs, ev), world, reps)


def unfused_times(world: int, rows: int, hidden: int, algorithm: str, reps: int) -> dict[str, float]:
    """Our planned all-reduce (cuda backend, single stream) + torch add + torch RMSNorm."""
    from hiercoll.collectives import CollectiveSpec, Kind
    from hiercoll.executor.cuda.backend import enqueue
    from hiercoll.executor.cuda.lowering import CudaOptions
    from hiercoll.executor.cuda.one_gpu import OneGpuCluster
    from hiercoll.planner import plan
    from hiercoll.topology import load_topology
    topo = load_topology("h200x4" if world == 4 else "bench/gpu/topologies/h200x2.yaml")
    spec = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=world, dtype="bf16",
                          nbytes=rows * hidden * 2)
    cluster = OneGpuCluster(plan(topo, spec, algorithm).expand(), CudaOptions(single_stream=True))
    dev = cluster.device
    ins = [torch.randn(rows * hidden, device=dev).to(torch.bfloat16) for _ in range(world)]
    outs = [torch.empty_like(i) for i in ins]
    res = [torch.randn(rows, hidden, device=dev).to(torch.bfloat16) for _ in range(world)]
    w = torch.ones(hidden, device=dev, dtype=torch.bfloat16)

    def one(r: int) -> None:
        enqueue(cluster.prepared[r], ins[r], outs[r])
        new_res = outs[r].view(rows, hidden) + res[r]
        torch.nn.functional.rms_norm(new_res, (hidden,), w, EPS)

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):     # warm-up (compiles), all ranks side by side
        cluster.run(ins, outs)
    torch.cuda.synchronize()
    graphs = []
    for r in range(world):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=cluster.mains[r]):
            for _ in range(CALLS):
                one(r)
        graphs.append(g)
    torch.cuda.synchronize()

    def replay(ev: list[Any]) -> None:
        caller = torch.cuda.current_stream()
        for r, (g, s) in enumerate(zip(graphs, cluster.mains, strict=True)):
            s.wait_stream(caller)
            with torch.cuda.stream(s):
                ev[r][0].record(s)
                g.replay()
                ev[r][1].record(s)
        for s in cluster.mains:
            caller.wait_stream(s)
    return _time(replay, world, reps)


def _group_time(run: Any, reps: int) -> dict[str, float]:
    """This rank's per-call times of `reps` runs of `run` (a graph replay of CALLS calls, or
    CALLS eager calls), averaged over the ranks sample by sample."""
    import torch.distributed as dist
    mine = []
    for i in range(reps + 3):
        dist.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        torch.cuda.synchronize()
        if i >= 3:
            mine.append(a.elapsed_time(b) * 1000 / CALLS)
    return rank_average(mine, torch.device("cuda"))


def _timed(fn: Any, reps: int, mode: str) -> dict[str, float]:
    """fn's per-call time: graph (CALLS calls captured after a warm-up call: NCCL and the JIT
    compile outside the capture) or eager (CALLS calls back to back, after one)."""
    import torch.distributed as dist

    from hiercoll.executor.graphs import capture_calls
    if mode == "eager":
        fn()
        torch.cuda.synchronize()
        dist.barrier()

        def run() -> None:
            for _ in range(CALLS):
                fn()
        return _group_time(run, reps)
    graph = capture_calls(fn, CALLS, warmup=1)
    dist.barrier()
    return _group_time(graph.replay, reps)


def group_row(rows: int, hidden: int, reps: int, modes: tuple[str, ...] = ("graph",),
              topology: str | None = None) -> dict[str, Any]:
    """One shape across the process group: fused (both stages forced, and the auto choice) and
    the unfused paths a user has (NCCL, torch's symmetric-memory one-shot / two-shot, and
    hiercoll's Communicator all-reduce, each + torch add + RMSNorm); each all-reduce alone too."""
    import torch.distributed as dist

    from hiercoll.collectives import CollectiveSpec, Kind
    from hiercoll.executor.cuda.fused_norm import GroupContext, fused_add_rms_norm, reserve, stage_choice
    from hiercoll.harness.peers import peers_for
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    ctx = _CTX.setdefault("ctx", GroupContext(rank, world, None, dev))
    x = torch.randn(rows, hidden, device=dev).to(torch.bfloat16)
    res = torch.randn(rows, hidden, device=dev).to(torch.bfloat16)
    w = torch.ones(hidden, device=dev, dtype=torch.bfloat16)
    out, rout = torch.empty_like(x), torch.empty_like(x)
    reserve(ctx, rows, hidden, x.dtype, stage=0)   # the fallback's buffer too: timed below
    row: dict[str, Any] = {"rows": rows, "hidden": hidden, "bytes": rows * hidden * 2,
                           "world": world, "auto_stage": stage_choice(rows, hidden, world, 2)}
    for st in _stages(rows, hidden):
        row[f"stage{st}"] = _timed(lambda st=st: fused_add_rms_norm(
            ctx, x, res, w, EPS, stage=st, out=out, res_out=rout), reps, "graph")
    # the unfused fallback as shipped, called as its users call it (rms_norm has no out=: given
    # one, the fallback pays a copy into it that the fused forms do not)
    row["stage0"] = _timed(lambda: fused_add_rms_norm(ctx, x, res, w, EPS, stage=0), reps,
                           "graph")
    # what a caller gets (stage None): a fused stage, or the unfused fallback (stage 0)
    row["fused"] = row[f"stage{row['auto_stage']}"] if row["auto_stage"] else _timed(
        lambda: fused_add_rms_norm(ctx, x, res, w, EPS), reps, "graph")
    if "eager" in modes:
        row["fused_eager"] = _timed(lambda: fused_add_rms_norm(ctx, x, res, w, EPS), reps,
                                    "eager")

    def norm_of(ar: torch.Tensor) -> None:
        new_res = ar.view(rows, hidden) + res
        torch.nn.functional.rms_norm(new_res, (hidden,), w, EPS)

    spec = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=world, dtype="bf16",
                          nbytes=rows * hidden * 2)
    unfused = {}
    for peer in peers_for(spec, ("nccl", "torch-one-shot", "torch-two-shot"), dev, torch.bfloat16):
        row[f"{peer.name}_alone"] = _timed(peer.call, reps, "graph")
        unfused[peer.name] = _timed(lambda p=peer: (p.call(), norm_of(p.result)), reps, "graph")
        if "eager" in modes and peer.name == "nccl":
            row["unfused_nccl_eager"] = _timed(lambda p=peer: (p.call(), norm_of(p.result)),
                                               reps, "eager")
    comm = _comm(topology)
    if comm is not None:
        ar = x.clone()
        comm.all_reduce(ar)          # plans and sizes the pool outside any capture
        row["hiercoll_alone"] = _timed(lambda: comm.all_reduce(ar), reps, "graph")
        unfused["hiercoll"] = _timed(lambda: (comm.all_reduce(ar), norm_of(ar)), reps, "graph")
    for name, t in unfused.items():
        row[f"unfused_{name}"] = t
    best = min(unfused, key=lambda n: unfused[n]["p50"])
    row["unfused"] = unfused[best] | {"all_reduce": best}
    row["speedup_p50"] = round(row["unfused"]["p50"] / row["fused"]["p50"], 2)
    return row


def _stages(rows: int, hidden: int) -> tuple[int, ...]:
    """The fused forms a bf16 [rows, hidden] call can take: 1- and 2-stage, and the LL form
    (stage 3) where it applies."""
    from hiercoll.kernels.fused_norm_abi import LL_STAGE, ll_applies
    return (1, 2, LL_STAGE) if ll_applies(rows, hidden, 2) else (1, 2)


def _comm(topology: str | None) -> Any:
    """hiercoll's Communicator on the cuda backend (one per run), or None without a topology."""
    if topology is None:
        return None
    if "comm" not in _CTX:
        from hiercoll.torch import Communicator
        _CTX["comm"] = Communicator(topology=topology, backend="cuda")
    return _CTX["comm"]


_CTX: dict[str, Any] = {}


def main_group(args: argparse.Namespace) -> int:
    import torch.distributed as dist
    for k, v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}.items():
        os.environ.setdefault(k, v)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    meta = stamp("torchrun --nproc-per-node W " + " ".join(sys.argv))
    meta["device"] = f"{dist.get_world_size()} x {torch.cuda.get_device_name()}"
    meta["torch"] = torch.__version__
    rows_out = []
    for h in [int(v) for v in args.hidden.split(",")]:
        for m in [int(v) for v in args.shapes.split(",")]:
            row = group_row(m, h, args.reps, tuple(args.modes.split(",")), args.topology)
            if dist.get_rank() == 0:
                print(json.dumps(row), flush=True)
            rows_out.append(row)
    if dist.get_rank() == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if args.fit:
            _fit(meta, rows_out)
        name = f"fused_norm_w{dist.get_world_size()}"
        write_atomic(out / f"{name}.json", json.dumps({"meta": meta, "rows": rows_out}, indent=1)
                     + "\n")
        write_atomic(out / f"{name}.md", markdown_group(meta, rows_out))
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--shapes", default=",".join(map(str, SHAPES)))
    ap.add_argument("--hidden", default=",".join(map(str, HIDDEN)))
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--out", default=None)
    ap.add_argument("--fit", action="store_true", help="refit the stage-choice constants")
    ap.add_argument("--group", action="store_true",
                    help="under torchrun: one process per GPU (symmetric memory, NCCL unfused)")
    ap.add_argument("--modes", default="graph,eager", help="--group: graph and/or eager")
    ap.add_argument("--topology", default=None,
                    help="--group: also time hiercoll's Communicator all-reduce on this topology")
    ap.add_argument("--refit", default=None, metavar="JSON",
                    help="no GPU: refit a committed result file and rewrite its JSON/Markdown")
    args = ap.parse_args()
    if args.refit:
        return refit(Path(args.refit))
    if not args.out:
        ap.error("--out is required")
    if args.group:
        return main_group(args)
    from hiercoll.executor.cuda.fused_norm import stage_choice
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = stamp("CUDA_DEVICE_MAX_CONNECTIONS=32 python3 " + " ".join(sys.argv))
    meta["device"] = torch.cuda.get_device_name()
    meta["torch"] = torch.__version__
    rows_out: list[dict[str, Any]] = []
    for h in [int(v) for v in args.hidden.split(",")]:
        for m in [int(v) for v in args.shapes.split(",")]:
            auto = stage_choice(m, h, args.world, 2)
            row: dict[str, Any] = {"rows": m, "hidden": h, "bytes": m * h * 2,
                                   "world": args.world, "auto_stage": auto}
            for st in _stages(m, h):
                row[f"stage{st}"] = fused_times(args.world, m, h, st, args.reps)
            row["fused"] = row[f"stage{auto}"]
            un = {a: unfused_times(args.world, m, h, a, args.reps) for a in ("direct", "two_shot")}
            best = min(un, key=lambda a: un[a]["p50"])
            row["unfused"] = un[best] | {"all_reduce": best}
            row["speedup_p50"] = round(row["unfused"]["p50"] / row["fused"]["p50"], 2)
            print(json.dumps(row), flush=True)
            rows_out.append(row)
            write_atomic(out / "fused_norm.json",
                         json.dumps({"meta": meta, "rows": rows_out}, indent=1) + "\n")
    if args.fit:
        _fit(meta, rows_out)
    write_atomic(out / "fused_norm.json", json.dumps({"meta": meta, "rows": rows_out}, indent=1)
                 + "\n")
    write_atomic(out / "fused_norm.md", markdown(meta, rows_out))
    return 0


def _measured(r: dict[str, Any]) -> dict[int, float]:
    """p50 per path of one row: the fused stages forced (LL where it ran), and (across GPUs) the
    unfused fallback (stage 0: torch's two-shot or NCCL all-reduce + add + norm)."""
    got = {st: r[f"stage{st}"]["p50"] for st in (1, 2, 3) if f"stage{st}" in r}
    if "stage0" in r:           # the fallback as shipped, timed
        got[0] = r["stage0"]["p50"]
    elif "unfused_nccl" in r:   # runs from before it was timed: its NCCL form
        got[0] = r["unfused_nccl"]["p50"]
    return got


def _fit(meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Fit the path-choice constants on the p50 of each path; record how well the model then
    predicts and how often it picks the measured fastest path."""
    from hiercoll.executor.cuda.fused_norm import stage_choice
    from hiercoll.sim.fused_norm_cost import fit
    pts = [(st, r["bytes"], r["world"], t) for r in rows for st, t in _measured(r).items()]
    where = ("every rank on one " if "x" not in str(meta["device"]) else "one process per GPU, ")
    costs = fit(pts, f"relative least-squares fit of the p50 of each path (stages forced"
                f"{', NCCL unfused' if any(p[0] == 0 for p in pts) else ''}), {len(rows)} shapes, "
                f"world {rows[0]['world']}, {where}{meta['device']} (torch {meta['torch']}), "
                f"bench/fused_norm.py, {meta['date']}")
    errs = [abs(costs.predict_us(st, n, w) / t - 1) for st, n, w, t in pts]
    picks_best = 0
    for r in rows:
        got = _measured(r)
        pick = stage_choice(r["rows"], r["hidden"], r["world"], 2, costs)
        picks_best += got.get(pick, float("inf")) <= min(got.values())
    meta["fit"] = costs.__dict__ | {"max_rel_error": round(max(errs), 3),
                                    "median_rel_error": round(sorted(errs)[len(errs) // 2], 3),
                                    "picks_faster_stage": f"{picks_best}/{len(rows)}"}
    print(json.dumps({"fit": meta["fit"]}), flush=True)


def refit(path: Path) -> int:
    data = json.loads(path.read_text())
    _fit(data["meta"], data["rows"])
    write_atomic(path, json.dumps(data, indent=1) + "\n")
    write_atomic(path.with_suffix(".md"), markdown(data["meta"], data["rows"]))
    return 0


def _p50(row: dict[str, Any], key: str) -> str:
    return str(row[key]["p50"]) if key in row else "-"


def markdown_group(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The across-GPU table: fused against every unfused path of the same run, and the issue's
    two targets per shape (M <= 16: at most torch's one-shot all-reduce alone + 1 us; every M:
    at most 0.8 x the best unfused path)."""
    world = rows[0]["world"] if rows else "?"
    lines = [f"# Fused all-reduce + residual add + RMSNorm vs unfused, {world} GPUs", "",
             f"- command: `{meta['command']}`", f"- machine: {meta.get('device')}, "
             f"torch {meta.get('torch')}; {meta['machine']}",
             f"- date: {meta['date']}, git {meta['git_sha']}",
             f"- p50 us per call, rank-averaged CUDA events around graph replays of {CALLS} calls "
             "(eager columns: the same number of calls issued back to back)", "",
             "| M | hidden | stage | fused | 1-stage | 2-stage | LL | unfused NCCL | unfused torch "
             "1-shot | unfused torch 2-shot | unfused hiercoll | torch 1-shot AR alone | NCCL AR "
             "alone | fused / best unfused | M<=16 target | fused eager | unfused NCCL eager |",
             "|" + "---|" * 17]
    for r in rows:
        ratio = r["fused"]["p50"] / r["unfused"]["p50"]
        alone = r.get("torch-one-shot_alone", {}).get("p50")
        small = ("-" if r["rows"] > 16 or alone is None else
                 ("met" if r["fused"]["p50"] <= alone + 1 else "missed"))
        lines.append(
            f"| {r['rows']} | {r['hidden']} | {r['auto_stage']} | {r['fused']['p50']} | "
            f"{r['stage1']['p50']} | {r['stage2']['p50']} | {_p50(r, 'stage3')} | "
            f"{_p50(r, 'unfused_nccl')} | {_p50(r, 'unfused_torch-one-shot')} | {_p50(r, 'unfused_torch-two-shot')} | "
            f"{_p50(r, 'unfused_hiercoll')} | {_p50(r, 'torch-one-shot_alone')} | "
            f"{_p50(r, 'nccl_alone')} | {ratio:.2f} ({r['unfused']['all_reduce']}) | {small} | "
            f"{_p50(r, 'fused_eager')} | {_p50(r, 'unfused_nccl_eager')} |")
    if "fit" in meta:
        f = meta["fit"]
        lines += ["", f"Stage-choice fit: a1 = {f['a1_us']:.2f} us, b1 = {f['b1_us_per_mb']:.3f} "
                  f"us/MB, a2 = {f['a2_us']:.2f} us, b2 = {f['b2_us_per_mb']:.3f} us/MB, LL a3 = "
                  f"{f.get('a3_us', float('inf')):.2f} us, b3 = "
                  f"{f.get('b3_us_per_mb', 0.0):.3f} us/MB"
                  + (f"; relative error median {f['median_rel_error']}, max "
                     f"{f['max_rel_error']}; picks the faster stage for "
                     f"{f['picks_faster_stage']} shapes" if "max_rel_error" in f else "")]
    return "\n".join(lines) + "\n"


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]], one_gpu: bool = True) -> str:
    where = ("- every rank in one process on one GPU: the ranks share its SMs and HBM; nothing "
             "here measures NVLink" if one_gpu else "- one process per GPU, symmetric memory; "
             "the unfused all-reduce is NCCL's")
    lines = [f"# Fused all-reduce + residual add + RMSNorm vs unfused ("
             f"{'one GPU, ' if one_gpu else ''}world {rows[0]['world'] if rows else '?'})", "",
             f"- command: `{meta['command']}`", f"- machine: {meta.get('device')}, "
             f"torch {meta.get('torch')}; {meta['machine']}", f"- date: {meta['date']}, git "
             f"{meta['git_sha']}", where, "- per-call microseconds, "
             f"rank-averaged CUDA events around graph replays of {CALLS} calls", "",
             "| M | hidden | bytes | stage | fused p50 | p90 | p99 | unfused p50 | p90 | p99 | "
             "unfused AR | speedup p50 | 1-stage p50 | 2-stage p50 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f, u = r["fused"], r["unfused"]
        lines.append(f"| {r['rows']} | {r['hidden']} | {r['bytes']} | {r['auto_stage']} | "
                     f"{f['p50']} | {f['p90']} | {f['p99']} | {u['p50']} | {u['p90']} | "
                     f"{u['p99']} | {u['all_reduce']} | {r['speedup_p50']} | "
                     f"{r['stage1']['p50']} | {r['stage2']['p50']} |")
    lines += ["", "`stage` is the stage the cost model in use at the time picked (1-stage: every rank "
              "reduces every row; 2-stage: reduce-scatter by rows, add + norm, all-gather); the "
              "unfused row is " + ("the faster of our `direct` and `two_shot` all-reduces" if one_gpu
                                   else "NCCL's all-reduce") + ", then torch add and `rms_norm`."]
    if "fit" in meta:
        f = meta["fit"]
        lines += ["", "Stage-choice fit (`hiercoll/sim/fused_norm_cost.py`, refit with "
                  "`python bench/fused_norm.py --refit <this json>`): "
                  f"a1 = {f['a1_us']:.2f} us, b1 = {f['b1_us_per_mb']:.3f} us/MB (of W x S), "
                  f"a2 = {f['a2_us']:.2f} us, b2 = {f['b2_us_per_mb']:.3f} us/MB (of "
                  "(1 + (W-1)/W) x S)"
                  + (f"; relative error median {f['median_rel_error']}, max "
                     f"{f['max_rel_error']}; picks the faster stage for "
                     f"{f['picks_faster_stage']} shapes" if "max_rel_error" in f else "")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
