"""Simulated busbw versus size on dgx-h100 (2, 4, 16 nodes): flat ring, direct, and every
hierarchical family, best parameters per algorithm, the auto-picked choice and the lower bound.

    python bench/planner_sweep.py --nodes 2,4 --sizes 64KiB:1GiB:4 --name planner_sweep_2_4n
    python bench/planner_sweep.py --nodes 16 --sizes 64KiB:1GiB:4 --name planner_sweep_16n
"""

from __future__ import annotations

import argparse
import time

from common import command_line, stamp, write_results

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.planner import algorithms, applicable
from hiercoll.planner.search.autopick import SimCache, default_cache_path, pick_one, spec_for_size
from hiercoll.topology import preset
from hiercoll.units import format_size, parse_size_range

KINDS = [Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_REDUCE, Kind.ALL_TO_ALL]
COLOURS = {"ring": "tab:red", "direct": "tab:blue", "two_shot": "tab:purple", "hier": "tab:orange",
           "hier_2d": "tab:green", "rhd": "tab:brown", "rd": "tab:pink", "bruck": "tab:olive"}


def run(nodes: list[int], sizes: list[int], preset_name: str) -> dict:
    cache = SimCache(default_cache_path())
    out = []
    for n in nodes:
        topo = preset(preset_name, n)
        for kind in KINDS:
            template = CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="bf16", nbytes=0)
            for size in sizes:
                spec = spec_for_size(template, size)
                t0 = time.perf_counter()
                per_algo = {}
                for algo in applicable(topo, spec):
                    if not getattr(algorithms()[algo], "searched", True):
                        continue       # plannable by name only (NCCL's tree stands for the library)
                    row = pick_one(topo, spec, cache, only=[algo])
                    per_algo[algo] = {"time_us": row.time_us, "busbw_gbps": row.busbw_gbps,
                                      "params": row.params, "lower_bound_us": row.lower_bound_us}
                best = min(per_algo, key=lambda a: per_algo[a]["time_us"])
                lb = min(v["lower_bound_us"] for v in per_algo.values())
                out.append({"nodes": n, "world": topo.world_size, "collective": kind.value,
                            "bytes": spec.total_bytes, "algorithms": per_algo, "autopick": best,
                            "lower_bound_us": lb, "lower_bound_busbw_gbps": spec.bandwidths_gbps(lb)[1],
                            "seconds": round(time.perf_counter() - t0, 3)})
                print(f"{preset_name} x{n} {kind.value:15s} {format_size(spec.total_bytes):>7s} -> "
                      f"{best} {per_algo[best]['busbw_gbps']:.1f} GB/s", flush=True)
    cache.save()
    return {"preset": preset_name, "rows": out}


def markdown(payload: dict) -> str:
    meta = payload["meta"]
    lines = [f"# Simulated busbw (GB/s) versus size, {payload['preset']}",
             "", f"Command: `{meta['command']}`  ", f"Date: {meta['date']}, machine: {meta['machine']}, "
             f"git {meta['git_sha']}", "", "`*` marks the auto-picked algorithm; `bound` is the busbw "
             "ceiling: the busbw of the collective's time lower bound on this topology (no plan "
             "can exceed it).", ""]
    rows = payload["rows"]
    for n in sorted({r["nodes"] for r in rows}):
        for kind in KINDS:
            sel = [r for r in rows if r["nodes"] == n and r["collective"] == kind.value]
            if not sel:
                continue
            algos = sorted({a for r in sel for a in r["algorithms"]})
            lines += [f"## {kind.value}, {n} nodes x 8 GPUs", "",
                      "| size | " + " | ".join(algos) + " | bound |",
                      "|---" * (len(algos) + 2) + "|"]
            for r in sel:
                cells = []
                for a in algos:
                    v = r["algorithms"].get(a)
                    cells.append("-" if v is None else f"{v['busbw_gbps']:.1f}" + ("*" if a == r["autopick"] else ""))
                lines.append(f"| {format_size(r['bytes'])} | " + " | ".join(cells)
                             + f" | {r['lower_bound_busbw_gbps']:.1f} |")
            lines.append("")
    return "\n".join(lines) + "\n"


CEILING_LABEL = "busbw ceiling (time lower bound)"
MIN_POINTS = 6      # sizes per curve; fewer and a log axis shows a few dots joined by lines


def size_axis(ax, sizes: list[int]) -> None:
    """Log2 size axis, a tick at each measured size labelled as people write sizes."""
    if len(set(sizes)) < MIN_POINTS:
        raise SystemExit(f"planner_sweep: {len(set(sizes))} sizes per curve; give at least "
                         f"{MIN_POINTS} (e.g. --sizes 64KiB:1GiB:4)")
    ax.set_xscale("log", base=2)
    ticks = sorted(set(sizes))
    ax.set_xticks(ticks)
    ax.set_xticklabels([format_size(s) for s in ticks], rotation=45, fontsize=7)
    ax.minorticks_off()


def plot(payload: dict, path_prefix: str) -> list[str]:
    import matplotlib

    from hiercoll.files import save_figure
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []
    rows = payload["rows"]
    for n in sorted({r["nodes"] for r in rows}):
        fig, axes = plt.subplots(2, 2, figsize=(12, 8.5), sharex=True)
        for ax, kind in zip(axes.flat, KINDS):
            sel = [r for r in rows if r["nodes"] == n and r["collective"] == kind.value]
            xs = [r["bytes"] for r in sel]
            for a in sorted({a for r in sel for a in r["algorithms"]}):
                pts = [(r["bytes"], r["algorithms"][a]["busbw_gbps"]) for r in sel if a in r["algorithms"]]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=a,
                        color=COLOURS.get(a, "grey"))
            # the time's lower bound, drawn as bandwidth: a ceiling no plan's busbw can pass
            ax.plot(xs, [r["lower_bound_busbw_gbps"] for r in sel], "k--", lw=1, label=CEILING_LABEL)
            ax.scatter(xs, [r["algorithms"][r["autopick"]]["busbw_gbps"] for r in sel], s=90,
                       facecolors="none", edgecolors="red", label="auto-pick", zorder=5)
            size_axis(ax, xs)
            ax.set_title(f"{kind.value}")
            ax.set_ylabel("busbw (GB/s, simulated)")
            ax.grid(alpha=0.3)
        for ax in axes[1]:
            ax.set_xlabel("size S (bytes)")
        handles = {}
        for ax in axes.flat:
            for h, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, h)
        fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=9)
        fig.subplots_adjust(bottom=0.1)
        fig.suptitle(f"{payload['preset']}, {n} nodes x 8 GPUs: simulated busbw per algorithm")
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        path = f"{path_prefix}_{n}n.png"
        save_figure(fig, path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", default="2,4,16")
    ap.add_argument("--sizes", default="64KiB:1GiB:4")
    ap.add_argument("--preset", default="dgx-h100")
    ap.add_argument("--name", default="planner_sweep", help="results file stem under bench/results")
    ap.add_argument("--replot", action="store_true", help="only redraw the PNGs from the JSON")
    args = ap.parse_args()
    if args.replot:
        import json

        from common import RESULTS
        print(plot(json.loads((RESULTS / f"{args.name}.json").read_text()), str(RESULTS / "planner_sweep")))
        return
    t0 = time.perf_counter()
    payload = run([int(x) for x in args.nodes.split(",")], parse_size_range(args.sizes), args.preset)
    payload["meta"] = stamp(command_line()) | {"seconds": round(time.perf_counter() - t0, 1)}
    write_results(args.name, payload, markdown(payload))
    from common import RESULTS
    print(plot(payload, str(RESULTS / "planner_sweep")))


if __name__ == "__main__":
    main()
