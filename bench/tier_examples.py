"""The tiered-fabric examples the docs quote (docs/simulator.md "What it shows", the `hier_tiers`
table of docs/algorithms.md), simulated and committed so each number has a command behind it.

    python bench/tier_examples.py        # writes bench/results/tier_examples.{json,md}

Every row is one `hc.plan` + `hc.simulate` (default mode: folded where a symmetry holds) of a
bf16 collective of 256 MiB; `ranks sim.` says how many ranks the simulator ran.
"""

from __future__ import annotations

import time
from typing import Any

from common import command_line, provenance, stamp, write_results
from rich.progress import track

S = 256 << 20
RAIL3 = "h100-rail-3tier"


def fabric(name: str, nodes: int, leaf: int | None = None, spine: int | None = None,
           leaf_oversubscription: float | None = None, routing: str | None = None,
           leaf_uplinks: int | None = None) -> Any:
    """A preset with its tiers' group sizes / leaf uplinks / leaf oversubscription / routing
    changed."""
    import hiercoll as hc
    topo = hc.load_topology(name, nodes)
    data = topo.model_dump(mode="json")
    tiers = data["inter"]["tiers"]
    if leaf is not None:
        tiers[0]["group_size"] = leaf
    if spine is not None:
        tiers[1]["group_size"] = spine
    if leaf_uplinks is not None:
        tiers[0]["uplinks"] = leaf_uplinks
    if leaf_oversubscription is not None:
        tiers[0]["oversubscription"] = leaf_oversubscription
    if routing is not None:
        data["inter"]["routing"] = routing
    return type(topo).model_validate(data)


# (section, fabric label, fabric kwargs, collective, algorithm, params)
ROWS: list[tuple[str, str, dict[str, Any], str, str, dict[str, Any]]] = [
    ("ring", "dgx-h100 -n 64", {"name": "dgx-h100", "nodes": 64}, "all_reduce", "ring", {}),
    ("ring", f"{RAIL3} -n 64 (ECMP)", {"name": RAIL3, "nodes": 64}, "all_reduce", "ring", {}),
    ("ring", f"{RAIL3} -n 64 (spray)", {"name": RAIL3, "nodes": 64, "routing": "spray"}, "all_reduce", "ring", {}),
    ("ring", f"{RAIL3} -n 64 (ECMP)", {"name": RAIL3, "nodes": 64}, "all_reduce", "hier", {}),
]
TIER_FABRICS: list[tuple[str, dict[str, Any]]] = [
    (f"{RAIL3} -n 64 (levels 32 x 2)", {"name": RAIL3, "nodes": 64}),
    (f"{RAIL3} -n 64, leaf 4:1", {"name": RAIL3, "nodes": 64, "leaf_oversubscription": 4.0}),
    (f"{RAIL3} -n 16, leaf 4 nodes (4 uplinks, 1:1) / spine 2 (7:1) / aggregation (levels 4 x 2 x 2)",
     {"name": RAIL3, "nodes": 16, "leaf": 4, "leaf_uplinks": 4, "spine": 2}),
]
for label, kw in TIER_FABRICS:
    ROWS += [("hier_tiers", label, kw, "all_reduce", "hier", {}),
             ("hier_tiers", label, kw, "all_reduce", "hier_tiers", {"inner": "direct"}),
             ("hier_tiers", label, kw, "all_reduce", "hier_tiers", {"inner": "ring"})]
ROWS += [("hier_tiers", TIER_FABRICS[2][0], TIER_FABRICS[2][1], "all_reduce", "hier_2d", {}),
         ("hier_tiers", TIER_FABRICS[2][0], TIER_FABRICS[2][1], "all_reduce", "ring", {}),
         ("hier_tiers", TIER_FABRICS[0][0], TIER_FABRICS[0][1], "all_gather", "hier", {}),
         ("hier_tiers", TIER_FABRICS[0][0], TIER_FABRICS[0][1], "all_gather", "hier_tiers", {})]


def run_row(row: tuple[str, str, dict[str, Any], str, str, dict[str, Any]]) -> dict[str, Any]:
    import hiercoll as hc
    section, label, kw, kind, algo, params = row
    topo = fabric(**kw)
    spec = hc.CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="bf16", nbytes=S)
    t0 = time.process_time()
    res = hc.simulate(hc.plan(topo, spec, algo, params), topo)
    busiest = max((l for l in res.links if l.name.startswith("leaf_up")),
                  key=lambda l: l.utilization, default=None)
    return {"section": section, "fabric": label, "collective": kind, "algorithm": algo,
            "params": params, "gpus": topo.world_size, "time_us": res.time_us,
            "bound_us": res.lower_bound_us, "ranks_simulated": len(res.ranks_simulated),
            "busiest_leaf_uplink": None if busiest is None else round(busiest.utilization, 3),
            "cpu_s": time.process_time() - t0}


def render(payload: dict[str, Any]) -> str:
    meta = payload["meta"]
    md = ["# Tiered-fabric examples (the numbers docs/simulator.md and docs/algorithms.md quote)", "",
          *provenance(meta), "",
          "256 MiB bf16, default parameters unless named, default simulation mode (folded where a "
          "symmetry holds). `busiest leaf uplink`: the highest utilisation of any leaf uplink over "
          "the call.", "",
          "| fabric | collective | algorithm | GPUs | simulated us | bound us | ranks sim. | "
          "busiest leaf uplink | CPU s |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in payload["rows"]:
        algo = r["algorithm"] + (" " + ", ".join(f"{k}={v}" for k, v in r["params"].items())
                                 if r["params"] else "")
        util = "" if r["busiest_leaf_uplink"] is None else f"{100 * r['busiest_leaf_uplink']:.0f}%"
        md.append(f"| {r['fabric']} | {r['collective']} | {algo} | {r['gpus']} | {r['time_us']:.1f} | "
                  f"{r['bound_us']:.1f} | {r['ranks_simulated']} | {util} | {r['cpu_s']:.1f} |")
    return "\n".join(md) + "\n"


def main() -> None:
    rows = [run_row(r) for r in track(ROWS, description="tier examples")]
    payload = {"rows": rows, "meta": stamp(command_line()), "bytes": S}
    write_results("tier_examples", payload, render(payload))
    print(render(payload))


if __name__ == "__main__":
    main()
