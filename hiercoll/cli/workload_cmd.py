"""`hiercoll workload ...`: from the model's point of view (cu_seqlens, a mask, a router) to plans.

    hiercoll workload llama3-cp --cu-seqlens 0,3,9,12,16 -t h200x4 --row-bytes 1KiB
    hiercoll workload attention --mask mask.yaml --chunk-size 512 -t dgx-h100 -n 2
    hiercoll workload moe --tokens 4096 --topk 8 --experts 256 -t dgx-h100 -n 4 --row-bytes 14KiB

Each writes the plans (flat and hier; `--out DIR`, recipe form), prints bytes over each tier and
the simulated time per plan (with the topology's calibration), and with `--json` the per-rank
layouts too. A PNG of bytes and time goes to DIR.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hiercoll.cli.common import add_json_flag, add_topology_args, console, enum_choices, print_json, print_table
from hiercoll.collectives import CollectiveSpec, DType, Kind
from hiercoll.errors import HiercollError
from hiercoll.topology import Topology
from hiercoll.units import format_size, parse_size


@dataclass(frozen=True)
class PlanRow:
    """One way to move the workload's rows: which collective and plan, bytes per tier, time."""

    method: str          # all_gather, group_cast (needed only), group_reduce (the transpose)
    algorithm: str
    bytes_intra: float
    bytes_inter: float
    time_us: float
    plan_file: str | None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("workload", help="plans from cu_seqlens, attention masks or MoE routers")
    kinds = p.add_subparsers(dest="workload", required=True, parser_class=type(p))
    llama = kinds.add_parser("llama3-cp", help="llama3-style context parallelism (varlen)")
    llama.add_argument("--cu-seqlens", required=True, help="cumulative offsets: 0,3,9,12,16")
    llama.add_argument("--full", action="store_true", help="bidirectional (default causal)")
    _common(llama)
    llama.set_defaults(func=_llama3)
    attn = kinds.add_parser("attention", help="mask -> dispatch -> zero-redundancy group-cast")
    attn.add_argument("--mask", default=None, help="mask file (YAML/JSON list of {q, k, type})")
    attn.add_argument("--cu-seqlens", default=None, help="or a varlen mask from cu_seqlens")
    attn.add_argument("--full", action="store_true", help="with --cu-seqlens: full, not causal")
    attn.add_argument("--total-seqlen", type=int, default=None,
                      help="with --mask: tokens in all (default: the mask's last query/key)")
    attn.add_argument("--chunk-size", type=int, required=True)
    attn.add_argument("--solver", default="greedy")
    _common(attn)
    attn.set_defaults(func=_attention)
    moe = kinds.add_parser("moe", help="MoE dispatch (group-cast) and combine (group-reduce)")
    moe.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    moe.add_argument("--topk", type=int, default=8)
    moe.add_argument("--experts", type=int, default=256)
    moe.add_argument("--router", default=None, help="router file (.npy [W,T,k] or JSON)")
    moe.add_argument("--seed", type=int, default=0)
    moe.add_argument("--drop-prob", type=float, default=0.0)
    moe.add_argument("--packing", choices=("node", "token"), default="node",
                     help="dispatch input layout: node = each token once per destination node, "
                          "grouped by its ranks there (DeepEP's send buffer; splits bounded by "
                          "nodes x 2^gpus); token = token order, about one split per token "
                          "(slow beyond a few hundred tokens a rank) (default: node)")
    _common(moe)
    moe.set_defaults(func=_moe)


def _common(p: argparse.ArgumentParser) -> None:
    add_topology_args(p)
    p.add_argument("--row-bytes", default="1KiB", help="bytes one token moves (e.g. K and V of "
                   "all KV heads; a MoE hidden state)")
    p.add_argument("--dtype", default="bf16", choices=enum_choices(DType))
    p.add_argument("--out", default=None, help="directory for plans, JSON and PNG")
    p.add_argument("--png", default=None, help="the bytes/time plot here (without --out too)")
    add_json_flag(p)


def _row_elems(args: argparse.Namespace) -> int:
    row = parse_size(args.row_bytes, "--row-bytes")
    item = DType(args.dtype).itemsize
    if row < item or row % item:
        raise HiercollError(f"--row-bytes: {row} is not a whole number of {args.dtype} elements")
    return row // item


def _cu_seqlens(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise HiercollError(f"--cu-seqlens: {text!r} should be integers like 0,3,9,12") from None


def _evaluate(topology: Topology, method: str, spec: CollectiveSpec, algorithms: list[str],
              out: Path | None) -> list[PlanRow]:
    """Plan, simulate and (with --out) save each applicable algorithm."""
    from hiercoll.plan_file import save_plan
    from hiercoll.planner import applicable, plan
    from hiercoll.progress import terminal_bar
    from hiercoll.sim import simulate
    ok = applicable(topology, spec)
    todo = [a for a in algorithms if a in ok]
    rows = []
    # a big workload plans and simulates for minutes: say how far it is (a line per plan when
    # piped, a bar on a terminal)
    with terminal_bar(f"{method}: plans simulated", lines=True) as report:
        for k, algo in enumerate(todo, 1):
            schedule = plan(topology, spec, algo)
            res = simulate(schedule, topology)
            path = None
            if out is not None:
                path = str(out / f"{method}.{algo}.json")
                save_plan(path, schedule, topology, "recipe")
            rows.append(PlanRow(method, algo, res.bytes_intra, res.bytes_inter, res.time_us, path))
            report(k, len(todo))
    return rows


def _report(args: argparse.Namespace, topology: Topology, title: str, rows: list[PlanRow],
            layouts: dict[str, Any]) -> int:
    out = Path(args.out) if args.out else None
    if out is not None:
        from hiercoll.files import write_atomic
        body = {"workload": args.workload, "topology": topology.name,
                "costs": topology.calibration_label(), "rows": [vars(r) for r in rows],
                "layouts": layouts}
        write_atomic(out / "workload.json", json.dumps(body, indent=1, default=_plain) + "\n")
        _plot(rows, out / "workload.png", title)
    if args.png:
        _plot(rows, Path(args.png), title)
    if args.json:
        print_json({"title": title, "costs": topology.calibration_label(),
                    "rows": [vars(r) for r in rows], "layouts": layouts})
        return 0
    print_table(title, ["method", "algorithm", "intra", "inter", "us"],
                [[r.method, r.algorithm, format_size(int(r.bytes_intra)),
                  format_size(int(r.bytes_inter)), f"{r.time_us:.1f}"] for r in rows])
    console.print(f"simulated costs: {topology.calibration_label()}")
    if out is not None:
        console.print(f"wrote {out}/ (plans, workload.json, workload.png)")
    return 0


def _plain(x: Any) -> Any:
    """numpy scalars and arrays in the layouts, as JSON."""
    return x.tolist() if hasattr(x, "tolist") else str(x)


def _plot(rows: list[PlanRow], path: Path, title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hiercoll.files import fit_title, save_figure
    labels = [f"{r.method}\n{r.algorithm}" for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    xs = range(len(rows))
    a.bar(xs, [r.bytes_intra / 2**20 for r in rows], label="intra-node")
    a.bar(xs, [r.bytes_inter / 2**20 for r in rows], bottom=[r.bytes_intra / 2**20 for r in rows],
          label="inter-node")
    a.set_ylabel("MiB moved")
    a.legend(fontsize=7)
    b.bar(xs, [r.time_us for r in rows], color="C2")
    b.set_ylabel("simulated us")
    for ax in (a, b):
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(fit_title(fig, title, 9), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=90)
    plt.close(fig)


def _prepare_out(args: argparse.Namespace) -> Path | None:
    if not args.out:
        return None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out


# ---- the three workloads ------------------------------------------------------------------------
def _llama3(args: argparse.Namespace) -> int:
    from hiercoll.topology import load_topology
    from hiercoll.workloads import llama3_cp
    topology = load_topology(args.topology, args.nodes)
    cu, w, row, causal = _cu_seqlens(args.cu_seqlens), topology.world_size, _row_elems(args), not args.full
    shards = [llama3_cp.prepare(cu, r, w, causal) for r in range(w)]
    out = _prepare_out(args)
    dt = DType(args.dtype)
    gather = CollectiveSpec(kind=Kind.ALL_GATHER, world_size=w, dtype=dt,
                            nbytes=cu[-1] * row * dt.itemsize)
    cast = CollectiveSpec(kind=Kind.GROUP_CAST, world_size=w, dtype=dt,
                          splits=llama3_cp.needed_kv_group_cast(cu, w, row, causal))
    rows = (_evaluate(topology, "all_gather", gather, ["ring", "hier"], out)
            + _evaluate(topology, "group_cast", cast, ["direct", "hier"], out))
    layouts = {"shards": [_shard(s) for s in shards]}
    title = (f"llama3 CP, {cu[-1]} tokens, {len(cu) - 1} documents, "
             f"{'causal' if causal else 'full'}, {w} ranks on {topology.name}")
    return _report(args, topology, title, rows, layouts)


def _shard(s: Any) -> dict[str, Any]:
    return {k: getattr(s, k) for k in ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                        "max_seqlen_k", "local_k_slice")}


def _moe(args: argparse.Namespace) -> int:
    from hiercoll.topology import load_topology
    from hiercoll.workloads import moe
    topology = load_topology(args.topology, args.nodes)
    w, row = topology.world_size, _row_elems(args)
    router = (moe.load_router(args.router) if args.router else
              moe.random_router(args.tokens, args.topk, args.experts, w, args.seed,
                                drop_prob=args.drop_prob))
    lay = moe.layout(router, args.experts, w, topology.gpus_per_node)
    out = _prepare_out(args)
    dispatch = moe.spec_for(lay, row, args.dtype, "dispatch", args.packing)
    combine = moe.spec_for(lay, row, args.dtype, "combine", args.packing)
    tokens = sum(lay.num_tokens(r) for r in range(w))
    dt = DType(args.dtype)
    gather = CollectiveSpec(kind=Kind.ALL_GATHER, world_size=w, dtype=dt,
                            nbytes=tokens * row * dt.itemsize) if tokens % w == 0 else None
    rows = (_evaluate(topology, "group_cast", dispatch, ["direct", "hier"], out)
            + _evaluate(topology, "group_reduce", combine, ["direct", "hier"], out)
            + (_evaluate(topology, "all_gather", gather, ["ring", "hier"], out) if gather else []))
    floor = moe.min_inter_bytes(lay, row, dt)
    layouts = {"min_inter_bytes": floor, "tokens_per_rank": lay.tokens_per_rank.tolist(),
               "tokens_per_node": lay.tokens_per_node.tolist(),
               "tokens_per_expert": lay.tokens_per_expert.tolist()}
    title = (f"MoE dispatch/combine, {args.tokens} tokens/rank, top-{args.topk} of {args.experts} "
             f"experts, {w} ranks on {topology.name} (RDMA minimum {format_size(floor)})")
    return _report(args, topology, title, rows, layouts)


def _attention(args: argparse.Namespace) -> int:
    from hiercoll.topology import load_topology
    from hiercoll.workloads import attention
    topology = load_topology(args.topology, args.nodes)
    w, row = topology.world_size, _row_elems(args)
    if (args.mask is None) == (args.cu_seqlens is None):
        raise HiercollError("attention: give --mask FILE or --cu-seqlens (one of them)")
    if args.mask is not None:
        mask = attention.load_mask(args.mask)
        total = args.total_seqlen or max(max(s.q[1], s.k[1]) for s in mask)
    else:
        cu = _cu_seqlens(args.cu_seqlens)
        mask, total = attention.mask_from_cu_seqlens(cu, causal=not args.full), cu[-1]
    solved = attention.solve(mask, total, args.chunk_size, w, solver=args.solver)
    out = _prepare_out(args)
    dt = DType(args.dtype)
    cast = CollectiveSpec(kind=Kind.GROUP_CAST, world_size=w, dtype=dt,
                          splits=solved.group_cast_splits(row))
    gather = CollectiveSpec(kind=Kind.ALL_GATHER, world_size=w, dtype=dt,
                            nbytes=total * row * dt.itemsize)
    rows = (_evaluate(topology, "all_gather", gather, ["ring", "hier"], out)
            + _evaluate(topology, "group_cast", cast, ["direct", "hier"], out))
    layouts = {"host_ranges": solved.host_ranges, "remote_ranges": solved.remote_ranges,
               "imbalance": solved.imbalance}
    title = (f"attention dispatch, {total} tokens, chunks of {args.chunk_size}, {w} ranks on "
             f"{topology.name} (area imbalance {solved.imbalance:.3f})")
    return _report(args, topology, title, rows, layouts)
