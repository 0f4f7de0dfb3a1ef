"""How far a simulated time moves under changes of a rounding's size: every max-min rate scaled
by 1 +- 1e-13, or every latency (so every event time, not the rates) by 1 +- 1e-13. A contended
unfolded run (ECMP over a spine: flows of hundreds of dependent steps share spine links)
against runs without shared bottlenecks, in both engines. Evidence for docs/simulator.md's
"Known limits".

    python bench/sim_rounding.py            # every case, both engines, two worker processes

The Python engine's rates are scaled by wrapping `fluid.max_min_rates`, the compiled core's by
its `replay(..., rate_scale)`; latencies through `simulate(..., costs_from=)` (the same plan).
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
ENGINES = ("python", "compiled")
# (what is scaled, by 1 + this)
CHANGES = (("none", 0.0), ("rates", 1e-13), ("rates", -1e-13), ("latencies", 1e-13), ("latencies", -1e-13))


def scaled_latencies(topo: Any, scale: float) -> Any:
    """`topo` with every latency (intra, inter, each fabric tier) x (1 + scale)."""
    data = topo.model_dump(mode="json")
    data["intra"]["latency_us"] *= 1 + scale
    if data.get("inter"):
        data["inter"]["latency_us"] *= 1 + scale
        for tier in data["inter"].get("tiers") or []:
            tier["latency_us"] *= 1 + scale
    return type(topo).model_validate(data)


def one(case: tuple[str, str, int, str, str, str], engine: str, what: str, scale: float) -> dict[str, Any]:
    """Simulate `case` on `engine` with `what` (rates or latencies) multiplied by 1 + scale."""
    from sim_scale import irregular_group_cast, topology

    import hiercoll as hc
    import hiercoll.sim.compiled.core as core
    import hiercoll.sim.fluid as fluid
    label, topo_name, nodes, algo, kind, mode = case
    solve, replay = fluid.max_min_rates, core.replay
    if what == "rates":
        def scaled(*args: Any) -> dict[Any, float]:
            return {f: r * (1 + scale) for f, r in solve(*args).items()}

        def replay_scaled(*args: Any) -> int:
            return int(replay(*args, 1.0 + scale))
        fluid.max_min_rates = scaled       # FluidNetwork.settle looks it up at each call
        core.replay = replay_scaled        # compiled.replay_tables imports it at each call
    try:
        topo = topology(topo_name, nodes)
        w = topo.world_size
        spec = (hc.CollectiveSpec(kind="group_cast", world_size=w, dtype="bf16", splits=irregular_group_cast(w))
                if kind == "group_cast" else
                hc.CollectiveSpec(kind=kind, world_size=w, dtype="bf16", nbytes=1 << 30))
        schedule = hc.plan(topo, spec, algo)
        costs = scaled_latencies(topo, scale) if what == "latencies" else None
        t0 = time.process_time()
        res = hc.simulate(schedule, topo, mode=mode, engine=engine, costs_from=costs)  # type: ignore[arg-type]
        return {"label": label, "engine": engine, "what": what, "scale": scale, "time_us": res.time_us,
                "cpu_s": round(time.process_time() - t0, 1), "ranks_simulated": len(res.ranks_simulated),
                "num_ops": res.num_ops}
    finally:
        fluid.max_min_rates, core.replay = solve, replay


def spread(xs: list[float], base: float) -> str:
    return f"{100 * (max(xs) - min(xs)) / base:.3g} %"


def render(payload: dict[str, Any]) -> str:
    meta = payload["meta"]
    md = ["# Rounding sensitivity: simulated time with every max-min rate, or every latency, "
          "scaled by 1 +- 1e-13", "",
          *provenance(meta), "",
          "all_reduce of 1 GiB bf16 (group_cast: bench/sim_scale.py's irregular one). `rates x` "
          "scales what the max-min filling gives (the Python engine's `fluid.max_min_rates`, the "
          "compiled core's `replay(rate_scale=)`); `latencies x` scales every latency of the "
          "topology the plan is simulated on (`simulate(costs_from=)`), which moves event times "
          "and no rate. `spread` is (largest - smallest) / unperturbed time over the unperturbed "
          "run and the two perturbed ones. CPU s: the unperturbed run's simulation (plan excluded; "
          "the compiled core's includes loading it from numba's cache).", "",
          "| case | engine | ranks simulated | unperturbed us | rates x (1 + 1e-13) us | rates x (1 - 1e-13) us "
          "| spread | latencies x (1 + 1e-13) us | latencies x (1 - 1e-13) us | spread | CPU s |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, *_ in CASES:
        for engine in ENGINES:
            rows = {(r["what"], r["scale"]): r for r in payload["rows"]
                    if r["label"] == label and r["engine"] == engine}
            if not rows:
                continue
            base = rows[("none", 0.0)]
            t = {k: r["time_us"] for k, r in rows.items()}
            b = base["time_us"]
            rates = [b, t[("rates", 1e-13)], t[("rates", -1e-13)]]
            lats = [b, t[("latencies", 1e-13)], t[("latencies", -1e-13)]]
            md.append(f"| {label} | {engine} | {base['ranks_simulated']} | {b:.4f} | {rates[1]:.4f} | "
                      f"{rates[2]:.4f} | {spread(rates, b)} | {lats[1]:.4f} | {lats[2]:.4f} | "
                      f"{spread(lats, b)} | {base['cpu_s']} |")
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated: python, compiled")
    args = ap.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    # the 512-GPU Python runs first (two minutes each), so the short ones fill in around them
    runs = sorted(((c, e, w, s) for c in CASES for e in engines for w, s in CHANGES),
                  key=lambda r: not (r[0] is CASES[0] and r[1] == "python"))
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, *zip(*runs)))
    for r in rows:
        print(f"{r['label']:40s} {r['engine']:8s} {r['what']:9s} {r['scale']:+.0e} {r['time_us']:.4f} us "
              f"{r['cpu_s']} s", flush=True)
    payload = {"rows": rows, "meta": stamp(command_line())}
    write_results("sim_rounding", payload, render(payload))


if __name__ == "__main__":
    main()
