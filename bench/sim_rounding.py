"""How far a simulated time moves when every max-min rate is scaled by 1 +- 1e-13: a contended
unfolded run (ECMP over a spine: flows of hundreds of dependent steps share spine links) against
runs without shared bottlenecks. Evidence for docs/simulator.md's "Known limits".

    python bench/sim_rounding.py            # every case, two worker processes
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from common import command_line, provenance, stamp, write_results

# (label, topology as bench/sim_scale.py names it, nodes, algorithm, collective, mode)
CASES = [
    ("512 hier exact, ECMP spine", "h100-rail-3tier", 64, "hier", "all_reduce", "exact"),
    ("4096 hier folded, spray", "h100-rail-3tier+spray", 512, "hier", "all_reduce", "auto"),
    ("1024 group_cast hier exact, one switch", "dgx-h100", 128, "hier", "group_cast", "exact"),
]
SCALES = (0.0, 1e-13, -1e-13)


def one(case: tuple[str, str, int, str, str, str], scale: float) -> dict[str, Any]:
    """Simulate `case` with every rate the network solves multiplied by 1 + scale."""
    from sim_scale import irregular_group_cast, topology

    import hiercoll as hc
    import hiercoll.sim.fluid as fluid
    label, topo_name, nodes, algo, kind, mode = case
    solve = fluid.max_min_rates
    if scale:
        def scaled(*args: Any) -> dict[Any, float]:
            return {f: r * (1 + scale) for f, r in solve(*args).items()}
        fluid.max_min_rates = scaled       # FluidNetwork.settle looks it up at each call
    try:
        topo = topology(topo_name, nodes)
        w = topo.world_size
        spec = (hc.CollectiveSpec(kind="group_cast", world_size=w, dtype="bf16", splits=irregular_group_cast(w))
                if kind == "group_cast" else
                hc.CollectiveSpec(kind=kind, world_size=w, dtype="bf16", nbytes=1 << 30))
        t0 = time.process_time()
        res = hc.simulate(hc.plan(topo, spec, algo), topo, mode=mode)  # type: ignore[arg-type]
        return {"label": label, "scale": scale, "time_us": res.time_us,
                "cpu_s": round(time.process_time() - t0, 1), "ranks_simulated": len(res.ranks_simulated)}
    finally:
        fluid.max_min_rates = solve


def render(payload: dict[str, Any]) -> str:
    meta = payload["meta"]
    md = ["# Rounding sensitivity: simulated time with every max-min rate scaled by 1 +- 1e-13", "",
          *provenance(meta), "",
          "all_reduce of 1 GiB bf16 (group_cast: bench/sim_scale.py's irregular one). `spread` is "
          "(largest - smallest) / unscaled time over the three runs of a case.", "",
          "| case | ranks simulated | unscaled us | x (1 + 1e-13) us | x (1 - 1e-13) us | spread | CPU s (unscaled) |",
          "|---|---|---|---|---|---|---|"]
    for label, *_ in CASES:
        rows = {r["scale"]: r for r in payload["rows"] if r["label"] == label}
        base, up, down = (rows[s]["time_us"] for s in SCALES)
        spread = (max(base, up, down) - min(base, up, down)) / base
        md.append(f"| {label} | {rows[0.0]['ranks_simulated']} | {base:.4f} | {up:.4f} | {down:.4f} "
                  f"| {100 * spread:.3g} % | {rows[0.0]['cpu_s']} |")
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    args = ap.parse_args()
    runs = [(c, s) for c in CASES for s in SCALES]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, *zip(*runs)))
    for r in rows:
        print(f"{r['label']:40s} {r['scale']:+.0e} {r['time_us']:.4f} us {r['cpu_s']} s", flush=True)
    payload = {"rows": rows, "meta": stamp(command_line())}
    write_results("sim_rounding", payload, render(payload))


if __name__ == "__main__":
    main()
