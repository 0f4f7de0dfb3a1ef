"""Where two runs of one simulation part when every max-min rate is scaled by 1 + 1e-13: the
first simulated instant whose event count or time differs by more than 1e-9 relative, with the
instants around it (issue 29: the 512-GPU ECMP `hier` all-reduce moves by 1 % under such a
perturbation; this finds why). Optionally with an instant taken as every event within
--coalesce (relative) of its first, in scheduling order (the fix the issue proposes), and with
RATE_RTOL set to 0 (every recomputed rate reschedules its flow's end).

    python bench/sim_divergence.py [--nodes 64] [--coalesce 1e-9] [--no-rate-rtol]
"""

from __future__ import annotations

import argparse
import heapq
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from common import command_line, provenance, stamp, write_results

Instant = tuple[float, int]          # (time us, events in it)


def one(nodes: int, scale: float, coalesce: float, rate_rtol: bool) -> dict[str, Any]:
    """The run's instants, recorded by a copy of EventClock.run (coalescing if asked)."""
    from sim_scale import topology

    import hiercoll as hc
    import hiercoll.sim.fluid as fluid
    solve, clock_run, rtol = fluid.max_min_rates, fluid.EventClock.run, fluid.RATE_RTOL
    log: list[Instant] = []

    def run(self: Any, settle: Callable[[], None], tick: Any = None) -> None:
        heap = self._heap
        while heap:
            t = heap[0][0]
            self.now = t
            horizon = t + coalesce * max(abs(t), 1.0)
            n = 0
            while heap and heap[0][0] <= horizon:
                batch = [heapq.heappop(heap)]
                while heap and heap[0][0] <= horizon:
                    batch.append(heapq.heappop(heap))
                batch.sort(key=lambda e: e[1])
                for _, _, fn, arg in batch:
                    fn(arg)
                    n += 1
            log.append((t, n))
            settle()

    if scale:
        fluid.max_min_rates = lambda *a: {f: r * (1 + scale) for f, r in solve(*a).items()}
    fluid.EventClock.run = run            # type: ignore[method-assign]
    if not rate_rtol:
        fluid.RATE_RTOL = 0.0
    try:
        topo = topology("h100-rail-3tier", nodes)
        spec = hc.CollectiveSpec(kind="all_reduce", world_size=topo.world_size, dtype="bf16",
                                 nbytes=1 << 30)
        t0 = time.process_time()
        res = hc.simulate(hc.plan(topo, spec, "hier"), topo, mode="exact")
        return {"scale": scale, "time_us": res.time_us, "instants": log,
                "cpu_s": round(time.process_time() - t0, 1)}
    finally:
        fluid.max_min_rates, fluid.EventClock.run, fluid.RATE_RTOL = solve, clock_run, rtol


def first_divergence(a: list[Instant], b: list[Instant], rtol: float = 1e-9) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x[1] != y[1] or abs(x[0] - y[0]) > rtol * max(abs(x[0]), 1.0):
            return i
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--coalesce", type=float, default=0.0)
    ap.add_argument("--no-rate-rtol", action="store_true")
    ap.add_argument("--name", default="sim_divergence")
    args = ap.parse_args()
    with ProcessPoolExecutor(2) as pool:
        base, up = pool.map(one, [args.nodes] * 2, [0.0, 1e-13], [args.coalesce] * 2,
                            [not args.no_rate_rtol] * 2)
    i = first_divergence(base["instants"], up["instants"])
    rows = []
    if i is not None:
        for j in range(max(0, i - 3), min(i + 4, len(base["instants"]), len(up["instants"]))):
            (ta, na), (tb, nb) = base["instants"][j], up["instants"][j]
            rows.append({"instant": j, "time_us": ta, "events": na, "time_us_scaled": tb,
                         "events_scaled": nb, "rel_diff": (tb - ta) / ta if ta else 0.0})
    payload = {"meta": stamp(command_line()), "nodes": args.nodes, "coalesce": args.coalesce,
               "rate_rtol": not args.no_rate_rtol, "time_us": base["time_us"],
               "time_us_scaled": up["time_us"], "instants": len(base["instants"]),
               "first_divergence": i, "around": rows, "cpu_s": base["cpu_s"]}
    spread = abs(up["time_us"] - base["time_us"]) / base["time_us"]
    md = [f"# Where a x(1 + 1e-13) rate perturbation parts from the run: {8 * args.nodes} GPUs",
          "", *provenance(payload["meta"]), "",
          f"`hier` all-reduce of 1 GiB bf16 on h100-rail-3tier x {args.nodes} nodes, unfolded; "
          f"instant = events within {args.coalesce:g} (relative) of its first; RATE_RTOL "
          f"{'on' if payload['rate_rtol'] else '0'}. Time {base['time_us']:.3f} us, scaled "
          f"{up['time_us']:.3f} us ({100 * spread:.3g} %); {len(base['instants'])} instants; "
          f"first instant that differs (count, or time by > 1e-9): {i}.", "",
          "| instant | time us | events | time us (scaled) | events (scaled) | relative difference |",
          "|---|---|---|---|---|---|"]
    md += [f"| {r['instant']} | {r['time_us']:.9f} | {r['events']} | {r['time_us_scaled']:.9f} | "
           f"{r['events_scaled']} | {r['rel_diff']:.2e} |" for r in rows]
    write_results(args.name, payload, "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
