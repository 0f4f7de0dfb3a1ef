"""A small tensor-parallel transformer (randomly initialised, torch only, nothing downloaded) run
three ways on the same inputs, every step:

- `nccl`: the unedited model, `dist.all_reduce` of each row-parallel partial sum, then torch's
  residual add and `rms_norm` (what a user runs without hiercoll);
- `fused`: the same weights, each all-reduce + add + RMSNorm one
  `Communicator.fused_add_rms_norm` call (the fused kernel on cuda, or its measured fallback);
- `patched`: the unedited `nccl` model after `hiercoll.torch.patch(comm)`: its `dist.all_reduce`
  calls go through the communicator's plans;
- `empty`: the row-parallel matmuls write into one `comm.empty` buffer, all-reduced in place by
  `comm.all_reduce` (the plan rebased onto it: no copy), then torch's add and `rms_norm` (the
  unfused hiercoll path as a user who allocates from the communicator writes it).

Each layer is pre-norm attention (column-parallel QKV, causal SDPA over this rank's heads,
row-parallel output projection) and a SwiGLU MLP (column-parallel gate/up, row-parallel down):
two all-reduces per layer, each followed by a residual add and an RMSNorm. Every step draws a
fresh input (same seed on every rank: the residual stream is replicated); the outputs of
`fused` and `patched` are compared with `nccl`'s (max |diff|, bound per dtype) and the ranks'
outputs with each other. Time per forward: CUDA-graph replays on cuda (a graph of one forward,
p50 over replays, rank-averaged) and eager forwards; eager only on gloo.

    torchrun --nproc-per-node 4 bench/tp_model.py --out DIR          # GPUs: 4096 hidden, 2 layers
    torchrun --nproc-per-node 2 bench/tp_model.py --backend gloo --hidden 64 --ffn 128 --heads 4 \\
        --tokens 8 --steps 3 --out DIR                                   # CPU (the test)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.common import rank_average, stamp  # noqa: E402
from hiercoll.files import write_atomic  # noqa: E402

# max |output - nccl path| allowed per dtype: each all-reduce may round its sum differently
# (NCCL's bf16 partial sums vs one fp32 sum rounded once), a bf16 ulp at |x| ~ 4 is 1/32, and the
# difference passes through every later layer's norm
BOUND = {torch.bfloat16: 0.25, torch.float32: 1e-3}


class TPLayer(torch.nn.Module):
    """One pre-norm layer's weights for this TP rank (its heads and its slice of the MLP)."""

    def __init__(self, hidden: int, ffn: int, heads: int, tp: int, gen: torch.Generator,
                 rank: int) -> None:
        super().__init__()
        hd, hl, fl = hidden // heads, heads // tp, ffn // tp

        def shard(rows: int, cols: int, take_rows: bool) -> torch.nn.Parameter:
            full = torch.randn(rows, cols, generator=gen) / cols ** 0.5   # same on every rank
            part = (full[rank * (rows // tp):(rank + 1) * (rows // tp)] if take_rows
                    else full[:, rank * (cols // tp):(rank + 1) * (cols // tp)])
            return torch.nn.Parameter(part.contiguous())
        self.heads, self.hd = hl, hd
        self.qkv = torch.nn.ParameterList([shard(hidden, hidden, True) for _ in range(3)])
        self.o = shard(hidden, hidden, False)        # [hidden, hidden/tp]: row-parallel
        self.gate, self.up = shard(ffn, hidden, True), shard(ffn, hidden, True)
        self.down = shard(hidden, ffn, False)
        self.attn_norm = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden, generator=gen))
        self.mlp_norm = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden, generator=gen))
        assert hl * tp == heads and fl * tp == ffn

    def attention_partial(self, h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        t = h.shape[0]
        q, k, v = (F.linear(h, w).view(t, self.heads, self.hd).transpose(0, 1) for w in self.qkv)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return _row_parallel(a.transpose(0, 1).reshape(t, self.heads * self.hd), self.o, out)

    def mlp_partial(self, h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return _row_parallel(F.silu(F.linear(h, self.gate)) * F.linear(h, self.up), self.down,
                             out)


def _row_parallel(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The row-parallel matmul's partial sum, into `out` when given (a comm.empty buffer)."""
    return F.linear(a, w) if out is None else torch.matmul(a, w.t(), out=out)


class TPModel(torch.nn.Module):
    """Layers whose row-parallel outputs are all-reduced, then added to the residual and
    normalised: by torch.distributed (`comm` None: the unedited model), by
    `comm.fused_add_rms_norm`, or (`buffer`: a comm.empty tensor the partial sums are written
    into) by `comm.all_reduce` in place on it and torch's add and norm."""

    def __init__(self, layers: list[TPLayer], final_norm: torch.nn.Parameter, eps: float,
                 group: Any, comm: Any = None, buffer: torch.Tensor | None = None) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)
        self.final_norm, self.eps, self.group, self.comm = final_norm, eps, group, comm
        self.buffer = buffer

    def _reduce_add_norm(self, partial: torch.Tensor, residual: torch.Tensor,
                         weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.buffer is not None:
            self.comm.all_reduce(partial)
        elif self.comm is not None:
            return self.comm.fused_add_rms_norm(partial, residual, weight, self.eps)
        else:
            dist.all_reduce(partial, group=self.group)
        residual = partial + residual
        return F.rms_norm(residual, (residual.shape[-1],), weight, self.eps), residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        h = F.rms_norm(x, (x.shape[-1],), self.layers[0].attn_norm, self.eps)
        for i, layer in enumerate(self.layers):
            h, residual = self._reduce_add_norm(layer.attention_partial(h, self.buffer),
                                                residual, layer.mlp_norm)
            nxt = (self.layers[i + 1].attn_norm if i + 1 < len(self.layers)
                   else self.final_norm)
            h, residual = self._reduce_add_norm(layer.mlp_partial(h, self.buffer), residual, nxt)
        return h


def build(args: argparse.Namespace, rank: int, tp: int, dev: torch.device,
          dtype: torch.dtype) -> tuple[list[TPLayer], torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(args.seed)
    layers = [TPLayer(args.hidden, args.ffn, args.heads, tp, gen, rank).to(dev, dtype)
              for _ in range(args.layers)]
    final = torch.nn.Parameter((1 + 0.1 * torch.randn(args.hidden, generator=gen)).to(dev, dtype))
    return layers, final


def _comm_calls(comm: Any) -> int:
    """Collectives the communicator has looked a plan up for so far."""
    st = comm.stats()
    return int(st["plan_hits"] + st["plan_misses"])


def time_forward(model: TPModel, x: torch.Tensor, reps: int, graph: bool) -> list[float]:
    """This rank's per-forward microseconds over `reps` (cuda: CUDA events around a graph replay
    or an eager forward; CPU: wall clock); `rank_average` makes them one figure."""
    cuda = x.is_cuda
    run: Any = lambda: model(x)  # noqa: E731
    if graph:
        from hiercoll.executor.graphs import capture_calls
        # a warm-up forward first: plans, pools, NCCL and the JIT outside the capture
        run = capture_calls(lambda: model(x), 1, warmup=1).replay
    mine = []
    for i in range(reps + 2):
        dist.barrier()
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            torch.cuda.synchronize()
            us = a.elapsed_time(b) * 1000
        else:
            t0 = time.perf_counter()
            run()
            us = (time.perf_counter() - t0) * 1e6
        if i >= 2:
            mine.append(us)
    return mine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=14336)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128, help="rows of the residual stream")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--topology", default="auto")
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-patched", action="store_true",
                    help="run the fused path alone (tells a fault of the fused kernel from an "
                         "interaction with the communicator's other plans)")
    args = ap.parse_args()
    for k, v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}.items():
        os.environ.setdefault(k, v)
    cuda = args.backend == "nccl"
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        dev, dtype = torch.device("cuda", local), torch.bfloat16
    else:
        dist.init_process_group("gloo")
        dev, dtype = torch.device("cpu"), torch.float32
    rank, tp = dist.get_rank(), dist.get_world_size()
    from hiercoll.torch import Communicator, patch
    from hiercoll.torch.patching import unpatch
    comm = Communicator(topology=args.topology)
    layers, final = build(args, rank, tp, dev, dtype)
    nccl_model = TPModel(layers, final, 1e-6, None)
    fused_model = TPModel(layers, final, 1e-6, None, comm)
    empty_model = TPModel(layers, final, 1e-6, None, comm,
                          comm.empty(args.tokens, args.hidden, dtype=dtype))
    gen = torch.Generator().manual_seed(args.seed + 1)
    worst = {"fused": 0.0, "empty": 0.0} | ({} if args.skip_patched else {"patched": 0.0})
    first_over: dict[str, int] = {}       # the first step whose output broke the bound, per path
    ranks_identical = True
    routed = []          # all-reduces the communicator ran per patched forward (proof it routed)
    with torch.no_grad():
        for step in range(args.steps):
            x = torch.randn(args.tokens, args.hidden, generator=gen).to(dev, dtype)
            ref = nccl_model(x.clone())
            outs = {"fused": fused_model(x.clone()), "empty": empty_model(x.clone())}
            calls = _comm_calls(comm)
            if not args.skip_patched:
                patch(comm)
                try:
                    outs["patched"] = nccl_model(x.clone())
                finally:
                    unpatch()
                routed.append(_comm_calls(comm) - calls)
            for name, out in outs.items():
                err = float((out.float() - ref.float()).abs().max())
                worst[name] = max(worst[name], err)
                if err > BOUND[dtype]:
                    first_over.setdefault(name, step)
            mine = torch.cat([ref.reshape(-1)] + [o.reshape(-1) for o in outs.values()]).float()
            first = mine.clone()
            dist.broadcast(first, 0)
            same = torch.tensor([float(torch.equal(first, mine))], device=dev)
            dist.all_reduce(same, op=dist.ReduceOp.MIN)
            ranks_identical &= bool(same.item())
        x = torch.randn(args.tokens, args.hidden, generator=gen).to(dev, dtype)
        times: dict[str, Any] = {}
        for mode in (("graph", "eager") if cuda else ("eager",)):
            raw = {"nccl": time_forward(nccl_model, x, args.reps, mode == "graph"),
                   "fused": time_forward(fused_model, x, args.reps, mode == "graph"),
                   "empty": time_forward(empty_model, x, args.reps, mode == "graph")}
            if not args.skip_patched:
                patch(comm)
                try:
                    raw["patched"] = time_forward(nccl_model, x, args.reps, mode == "graph")
                finally:
                    unpatch()
            times[mode] = {k: rank_average(v, dev) for k, v in raw.items()}
    bound = BOUND[dtype]
    result = {"config": {k: getattr(args, k) for k in ("hidden", "ffn", "heads", "layers",
                                                        "tokens", "steps", "seed")}
              | {"tp": tp, "dtype": str(dtype).replace("torch.", ""), "backend": args.backend},
              "max_abs_diff_vs_nccl": {k: round(v, 6) for k, v in worst.items()},
              "bound": bound, "ranks_identical": ranks_identical, "first_step_over_bound": first_over,
              "patched_all_reduces_per_forward": sorted(set(routed)),
              "ok": (ranks_identical and all(v <= bound for v in worst.values())
                     and (args.skip_patched or set(routed) == {2 * args.layers})),
              "us_per_forward": times}
    if rank == 0:
        meta = stamp(f"torchrun --nproc-per-node {tp} " + " ".join(sys.argv))
        meta["device"] = (f"{tp} x {torch.cuda.get_device_name()}" if cuda else "cpu")
        meta["torch"] = torch.__version__
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        name = f"tp_model_{args.backend}_tp{tp}"
        write_atomic(out / f"{name}.json", json.dumps({"meta": meta} | result, indent=1) + "\n")
        write_atomic(out / f"{name}.md", markdown(meta, result))
        print(json.dumps(result), flush=True)
    comm.close()
    dist.destroy_process_group()
    return 0 if result["ok"] else 1


def markdown(meta: dict[str, Any], r: dict[str, Any]) -> str:
    c = r["config"]
    lines = [f"# A tensor-parallel transformer, TP {c['tp']}: NCCL vs hiercoll", "",
             f"- command: `{meta['command']}`", f"- machine: {meta['device']}, torch "
             f"{meta['torch']}; date {meta['date']}, git {meta['git_sha']}",
             f"- model: {c['layers']} layers, hidden {c['hidden']}, ffn {c['ffn']}, {c['heads']} "
             f"heads, {c['tokens']} tokens, {c['dtype']}, random weights (seed {c['seed']})",
             f"- {c['steps']} steps, fresh inputs each: max |output - NCCL path| fused "
             f"{r['max_abs_diff_vs_nccl']['fused']}, comm.empty "
             f"{r['max_abs_diff_vs_nccl'].get('empty', 'not run')}, patched "
             f"{r['max_abs_diff_vs_nccl'].get('patched', 'not run')} (bound {r['bound']}); ranks "
             f"identical: {r['ranks_identical']}; first step over the bound: "
             f"{r['first_step_over_bound'] or 'none'}", "",
             "| mode | NCCL path p50 us | fused p50 us | comm.empty + all_reduce p50 us | "
             "patched p50 us | fused / NCCL | comm.empty / NCCL |", "|---|---|---|---|---|---|---|"]
    for mode, t in r["us_per_forward"].items():
        empty, base = t.get("empty", {}).get("p50"), t["nccl"]["p50"]
        ratio = "-" if empty is None else f"{empty / base:.2f}"
        lines.append(f"| {mode} | {base} | {t['fused']['p50']} | {empty or '-'} | "
                     f"{t.get('patched', {}).get('p50', '-')} | "
                     f"{t['fused']['p50'] / base:.2f} | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
