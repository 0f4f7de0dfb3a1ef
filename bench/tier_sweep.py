"""Simulated all-reduce busbw versus size on large tiered fabrics (issue 16 s4): h100-rail-3tier
at 1024 and 4096 GPUs and gb200-nvl72 with 8 NVLink domains (576 GPUs), every plannable
all-reduce family, plus an ASTRA-sim analytical (alpha-beta) comparison on 1024 GPUs.

Each point is one family at its default parameters, simulated folded (`mode="auto"`) under a
wall-clock limit per point; a family that times out at one size is not tried at larger sizes
on that topology. The auto-pick is marked as in planner_sweep.py: the fastest family at the
point. (pick_one's parameter search per family does not fit the limit at these scales.)

    python bench/tier_sweep.py --sizes 64KiB:1GiB:16 --limit 20
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import signal
import time
from typing import Any

from common import RESULTS, command_line, stamp, write_results
from planner_sweep import COLOURS

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.units import format_size, parse_size_range

CONFIGS = [("h100-rail-3tier", 128), ("gb200-nvl72", 8), ("h100-rail-3tier", 512)]
ASTRA_CONFIG = ("h100-rail-3tier", 128)
COLOURS = COLOURS | {"hier_tiers": "tab:cyan", "tree": "tab:gray"}


class _Timeout(Exception):
    pass


def _alarm(*_):
    raise _Timeout


def load_config(name: str, nodes: int) -> Any:
    """A preset, or "<preset>+spray": the preset with `inter.routing: spray` instead of ECMP."""
    from hiercoll import load_topology
    topo = load_topology(name.removesuffix("+spray"), nodes=nodes)
    if not name.endswith("+spray"):
        return topo
    data = topo.model_dump(mode="json")
    data["inter"]["routing"] = "spray"
    return type(topo).model_validate(data)


def configs_of(payload: dict) -> list[tuple[str, int]]:
    """The (preset, nodes) a run swept (older results: the default CONFIGS)."""
    return [tuple(c) for c in payload.get("configs", CONFIGS)]  # type: ignore[misc]


def _families(preset_name: str, nodes: int) -> list[str]:
    from hiercoll.planner import applicable
    topo = load_config(preset_name, nodes)
    spec = CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=topo.world_size, dtype="bf16", nbytes=1 << 20)
    return [a for a in applicable(topo, spec) if a != "nccl"]


def _point(job: tuple[str, int, str, int, int]) -> dict:
    """One family at one size; runs in a worker process, under SIGALRM."""
    from hiercoll.planner import plan
    from hiercoll.planner.search.autopick import spec_for_size
    from hiercoll.sim import simulate
    preset_name, nodes, algo, size, limit = job
    topo = load_config(preset_name, nodes)
    spec = spec_for_size(CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=topo.world_size,
                                        dtype="bf16", nbytes=0), size)
    out = {"preset": preset_name, "nodes": nodes, "world": topo.world_size, "algorithm": algo,
           "bytes": spec.total_bytes}
    t0 = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit)
    try:
        res = simulate(plan(topo, spec, algo, {}), topo, mode="auto")
        algbw = spec.total_bytes / res.time_us / 1e3           # GB/s
        w = topo.world_size
        out |= {"status": "ok", "time_us": res.time_us, "algbw_gbps": algbw,
                "busbw_gbps": algbw * 2 * (w - 1) / w,        # nccl-tests' all-reduce busbw
                "sim_busbw_gbps": res.busbw_gbps, "lower_bound_us": res.lower_bound_us,
                "folded": res.shortcut, "notes": res.notes[:2]}
    except _Timeout:
        out |= {"status": f"timeout > {limit} s"}
    except Exception as e:  # noqa: BLE001 - any planner/simulator failure is a row, not a crash
        out |= {"status": f"error: {type(e).__name__}: {str(e)[:160]}"}
    finally:
        signal.alarm(0)
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def run(sizes: list[int], limit: int, jobs: int, budget_s: float, configs: list[tuple[str, int]]) -> dict:
    rows: list[dict] = []
    t_start = time.perf_counter()
    with mp.get_context("fork").Pool(jobs, maxtasksperchild=1) as pool:
        for preset_name, nodes in configs:
            fams = _families(preset_name, nodes)
            dead: dict[str, str] = {}
            for size in sizes:
                if time.perf_counter() - t_start > budget_s:
                    rows += [{"preset": preset_name, "nodes": nodes, "algorithm": a, "bytes": size,
                              "status": "not run (sweep's time budget spent)"} for a in fams]
                    continue
                todo = [a for a in fams if a not in dead]
                for r in pool.imap(_point, [(preset_name, nodes, a, size, limit) for a in todo]):
                    rows.append(r)
                    print(f"{preset_name} x{nodes} {r['algorithm']:10s} {format_size(size):>7s} "
                          f"{r['status']:8s} {r.get('busbw_gbps', float('nan')):8.2f} GB/s "
                          f"{r['seconds']:6.1f} s", flush=True)
                    if r["status"] != "ok":
                        dead[r["algorithm"]] = r["status"]
                rows += [{"preset": preset_name, "nodes": nodes, "algorithm": a, "bytes": size,
                          "status": f"skipped ({dead[a]} at a smaller size)"}
                         for a in fams if a in dead and a not in todo]
    return {"rows": rows, "limit_s": limit, "configs": [list(c) for c in configs]}


def table(payload: dict) -> list[dict]:
    """Per (topology, size): each family's busbw and the auto-pick (fastest simulated family)."""
    out = []
    for preset_name, nodes in configs_of(payload):
        for size in sorted({r["bytes"] for r in payload["rows"]}):
            sel = {r["algorithm"]: r for r in payload["rows"]
                   if r["preset"] == preset_name and r["nodes"] == nodes and r["bytes"] == size}
            ok = {a: r for a, r in sel.items() if r["status"] == "ok"}
            best = min(ok, key=lambda a: ok[a]["time_us"]) if ok else None
            out.append({"preset": preset_name, "nodes": nodes, "bytes": size, "rows": sel, "autopick": best})
    return out


def astra(payload: dict) -> dict:
    """ASTRA-sim analytical backend's closed forms with this topology's constants."""
    config = next((c for c in configs_of(payload) if (c[0].split("+")[0], c[1]) == ASTRA_CONFIG), ASTRA_CONFIG)
    topo = load_config(*config)
    p = topo.world_size
    bw = min(topo.inter.nic_gbps, topo.inter.gpu_nic_gbps or math.inf)   # GB/s = 1e3 bytes/us
    alpha = topo.inter.latency_us
    rows = []
    for size in sorted({r["bytes"] for r in payload["rows"]}):
        beta_n = size / (bw * 1e3)                                        # us
        model = {"ring": 2 * (p - 1) * alpha + 2 * (p - 1) / p * beta_n,
                 "rhd": 2 * math.log2(p) * alpha + 2 * (p - 1) / p * beta_n,
                 "tree": 2 * math.log2(p) * alpha + beta_n}
        for algo, astra_us in model.items():
            sim = next((r for r in payload["rows"] if (r["preset"], r["nodes"]) == tuple(config)
                        and r["bytes"] == size and r["algorithm"] == algo), None)
            sim_us = sim["time_us"] if sim and sim["status"] == "ok" else None
            rows.append({"bytes": size, "algorithm": algo, "astra_us": astra_us, "hiercoll_us": sim_us,
                         "ratio": None if sim_us is None else sim_us / astra_us,
                         "hiercoll_status": sim["status"] if sim else "not run"})
    return {"world": p, "bw_gbps": bw, "alpha_us": alpha, "rows": rows}


def dirty_note() -> str:
    """The planner/simulator sources differ from the commit stamped (others' work in progress)."""
    import subprocess
    out = subprocess.run(["git", "status", "--porcelain", "hiercoll"], capture_output=True, text=True,
                         cwd=RESULTS.parent.parent).stdout.split()
    return f" plus uncommitted changes to {len(out) // 2} file(s) under hiercoll/" if out else ""


def winners(payload: dict) -> list[str]:
    """One line per topology: the fastest family per size, and the busbw at the largest size."""
    out = []
    for preset_name, nodes in configs_of(payload):
        sel = [t for t in table(payload) if (t["preset"], t["nodes"]) == (preset_name, nodes)]
        picks = ", ".join(f"{format_size(t['bytes'])} {t['autopick'] or '-'}"
                          + (f" ({t['rows'][t['autopick']]['busbw_gbps']:.1f} GB/s)" if t["autopick"] else "")
                          for t in sel)
        out.append(f"- {preset_name} x{nodes}: {picks}")
    return out


def markdown(payload: dict) -> str:
    meta = payload["meta"]
    lines = ["# Simulated all-reduce busbw (GB/s) versus size on tiered fabrics (issue 16 s4)", "",
             f"Command: `{meta['command']}`  ", f"Date: {meta['date']}, machine: {meta['machine']}, "
             f"git {meta['git_sha']}{meta.get('tree_note', '')}, {meta['seconds']} s", "",
             "bf16, nccl-tests' busbw (algbw x 2(W-1)/W). Each family at its **default parameters** "
             "(one channel, one chunk; no parameter search: `pick_one`'s search per family did not "
             f"finish one 1 MiB point on 1024 GPUs in 200 s), simulated folded (`mode=\"auto\"`) with a "
             f"limit of {payload['limit_s']} s wall clock per point; a family that timed out or failed at "
             "one size was not tried at larger sizes on that topology (`skip`). `*` marks the auto-pick as "
             "bench/planner_sweep.py takes it: the fastest family at that point. `bound` is the busbw of "
             "the best lower bound the simulator reported among the simulated families.", "",
             "Why timeouts remain: on a tiered fabric a flat ring, `hier_2d`, `direct` and `two_shot` "
             "are symmetric only under translations by the fabric's period (h100-rail-3tier repeats "
             "every leaf group of 32 nodes: 256 of 1024 ranks, 2048 of 4096 simulated); `hier` and "
             "`hier_tiers` also map onto themselves under level shifts, which fold onto one node's 8 "
             "ranks only where routing sprays (`sim.symmetry.choose_fold`; these presets hash ECMP); "
             "gb200-nvl72 x 8 (one rail-leaf group, 8 uplinks, ECMP on the node itself) is not "
             "folded. Where a family timed out, the winners below are "
             "among the families that finished.", "", *([meta["extra_note"], ""] if meta.get("extra_note") else []),
             "Fastest finished family per size (busbw):", "", *winners(payload), ""]
    for preset_name, nodes in configs_of(payload):
        sel = [t for t in table(payload) if (t["preset"], t["nodes"]) == (preset_name, nodes)]
        algos = sorted({a for t in sel for a in t["rows"]})
        world = next((r["world"] for t in sel for r in t["rows"].values() if "world" in r), "?")
        lines += [f"## {preset_name}, {nodes} nodes ({world} GPUs)", "",
                  "| size | " + " | ".join(algos) + " | auto-pick | bound |", "|---" * (len(algos) + 3) + "|"]
        notes = set()
        for t in sel:
            cells, bounds = [], []
            for a in algos:
                r = t["rows"].get(a)
                if r is None:
                    cells.append("-")
                elif r["status"] == "ok":
                    cells.append(f"{r['busbw_gbps']:.1f}" + ("*" if a == t["autopick"] else ""))
                    w = r["world"]
                    bounds.append(t["bytes"] / r["lower_bound_us"] / 1e3 * 2 * (w - 1) / w)
                elif r["status"].startswith("timeout"):
                    cells.append("timeout")
                elif r["status"].startswith("skipped"):
                    cells.append("skip")
                elif r["status"].startswith("not run"):
                    cells.append("not run")
                else:
                    cells.append("error")
                    notes.add(f"{a}: {r['status']}")
            lines.append(f"| {format_size(t['bytes'])} | " + " | ".join(cells) + f" | {t['autopick'] or '-'} | "
                         + (f"{max(bounds):.1f}" if bounds else "-") + " |")
        lines += [""] + [f"- {n}" for n in sorted(notes)] + [""]
    a = payload["astra"]
    lines += [f"## ASTRA-sim analytical closed forms vs hiercoll, {ASTRA_CONFIG[0]} {a['world']} GPUs", "",
              "ASTRA-sim's analytical backend (contention-unaware alpha-beta): ring 2(p-1)a + 2(p-1)/p n b; "
              "halving-doubling 2 log2(p) a + 2(p-1)/p n b; double binary tree ~2 log2(p) a + n b "
              f"(pipelined). Constants from the same topology model: b = 1 / {a['bw_gbps']:g} GB/s (the "
              "bottleneck per-GPU NIC bandwidth, min of inter.nic_gbps and inter.gpu_nic_gbps), "
              f"a = {a['alpha_us']:g} us (inter.latency_us, the inter-node latency; the tiers' 0.5 us "
              f"per switch hop are not in it), p = {a['world']}. hiercoll: ring / rhd / tree at default "
              "parameters from the tables above. ratio = hiercoll / ASTRA.", "",
              "| size | family | ASTRA us | hiercoll us | ratio |", "|---|---|---|---|---|"]
    for r in a["rows"]:
        hc = f"{r['hiercoll_us']:.1f}" if r["hiercoll_us"] is not None else r["hiercoll_status"]
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        lines.append(f"| {format_size(r['bytes'])} | {r['algorithm']} | {r['astra_us']:.1f} | {hc} | {ratio} |")
    lines += ["", "Why they differ: the closed forms charge every step one NIC latency and the full "
              "NIC bandwidth, while hiercoll simulates each op's launch cost (2 us per op), the NVLink hop "
              "inside a node, the reduction's HBM traffic, and flows sharing NICs and oversubscribed "
              "leaf/spine uplinks across the three tiers (contention the analytical backend ignores); and "
              "at default parameters (one chunk) hiercoll's tree is not pipelined, so it pays the "
              "n b of a hop at each of its ~log2(p) levels where the closed form pays it once.", ""]
    return "\n".join(lines) + "\n"


def plot(payload: dict, path: str) -> None:
    import matplotlib

    from hiercoll.files import save_figure
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    configs = configs_of(payload)
    fig, axes = plt.subplots(1, len(configs), figsize=(6 * len(configs), 5), squeeze=False)
    tab = table(payload)
    for ax, (preset_name, nodes) in zip(axes[0], configs):
        sel = [t for t in tab if (t["preset"], t["nodes"]) == (preset_name, nodes)]
        world = "?"
        for a in sorted({a for t in sel for a in t["rows"]}):
            pts = [(t["bytes"], t["rows"][a]["busbw_gbps"]) for t in sel
                   if a in t["rows"] and t["rows"][a]["status"] == "ok"]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=a, color=COLOURS.get(a, "grey"))
        auto = [(t["bytes"], t["rows"][t["autopick"]]["busbw_gbps"]) for t in sel if t["autopick"]]
        for t in sel:
            for r in t["rows"].values():
                world = r.get("world", world)
        ax.scatter([p[0] for p in auto], [p[1] for p in auto], s=90, facecolors="none",
                   edgecolors="red", label="auto-pick", zorder=5)
        ax.set_xscale("log", base=2)
        ticks = sorted({t["bytes"] for t in sel})
        ax.set_xticks(ticks)
        ax.set_xticklabels([format_size(s) for s in ticks], rotation=45, fontsize=7)
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_title(f"{preset_name}, {nodes} nodes ({world} GPUs)")
        ax.set_xlabel("all-reduce size (bytes, bf16)")
        ax.set_ylabel("busbw (GB/s, simulated)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Simulated all-reduce busbw per family (default params, folded); auto-pick circled")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="64KiB:1GiB:16")
    ap.add_argument("--limit", type=int, default=20, help="wall-clock seconds per point")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--budget", type=float, default=1500, help="seconds for the whole sweep")
    ap.add_argument("--replot", action="store_true", help="only redo the Markdown and PNG from the JSON")
    ap.add_argument("--configs", default=None,
                    help="PRESET:NODES,... to sweep (a preset may end in +spray); default: "
                         + ",".join(f"{p}:{n}" for p, n in CONFIGS))
    ap.add_argument("--out", default="tier_sweep", help="results name (bench/results/NAME.{json,md,png})")
    args = ap.parse_args()
    configs = CONFIGS if args.configs is None else [
        (c.rsplit(":", 1)[0], int(c.rsplit(":", 1)[1])) for c in args.configs.split(",")]
    if args.replot:
        import json
        payload = json.loads((RESULTS / f"{args.out}.json").read_text())
    else:
        t0 = time.perf_counter()
        payload = run(parse_size_range(args.sizes), args.limit, args.jobs, args.budget, configs)
        payload["meta"] = stamp(command_line()) | {"seconds": round(time.perf_counter() - t0, 1),
                                                   "tree_note": dirty_note()}
        payload["astra"] = astra(payload)
    write_results(args.out, payload, markdown(payload))
    plot(payload, str(RESULTS / f"{args.out}.png"))


if __name__ == "__main__":
    main()
