"""How long the auto-picker takes: a 21-size sweep (4 KiB to 4 GiB) on 16 nodes x 8 GPUs,
per collective, with an empty simulation cache.

    python bench/autopick_speed.py
"""

from __future__ import annotations

import argparse
import time

from common import command_line, stamp, write_results

from hiercoll.collectives import CollectiveSpec
from hiercoll.planner.search.autopick import sweep
from hiercoll.topology import preset
from hiercoll.units import parse_size_range


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--sizes", default="4KiB:4GiB")
    ap.add_argument("--collectives", default="all_reduce,reduce_scatter")
    ap.add_argument("--jobs", default="1,2", help="worker processes to time, comma list")
    args = ap.parse_args()
    topo = preset("dgx-h100", args.nodes)
    sizes = parse_size_range(args.sizes)
    rows = []
    for kind, jobs in [(k, int(j)) for k in args.collectives.split(",") for j in args.jobs.split(",")]:
        template = CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="bf16", nbytes=0)
        t0 = time.perf_counter()
        picked = sweep(topo, template, sizes, progress=False, cache_path=None, jobs=jobs)
        rows.append({"collective": kind, "jobs": jobs, "sizes": len(sizes),
                     "seconds": round(time.perf_counter() - t0, 1),
                     "simulated": sum(r.simulated for r in picked), "pruned": sum(r.pruned for r in picked),
                     "choices": [[r.bytes, r.algorithm, r.params] for r in picked]})
        print(rows[-1]["collective"], f"jobs={jobs}", rows[-1]["seconds"], "s", rows[-1]["simulated"], "simulated",
              rows[-1]["pruned"], "pruned", flush=True)
    payload = {"topology": topo.name, "rows": rows, "meta": stamp(command_line())}
    md = [f"# Auto-pick speed: {len(sizes)} sizes ({args.sizes}) on {topo.name} "
          f"({topo.world_size} GPUs), empty cache", "", f"Command: `{payload['meta']['command']}`  ",
          f"Date: {payload['meta']['date']}; machine: {payload['meta']['machine']}", "",
          "| collective | worker processes | sizes | seconds | simulated | pruned by bounds |",
          "|---|---|---|---|---|---|"]
    md += [f"| {r['collective']} | {r['jobs']} | {r['sizes']} | {r['seconds']} | {r['simulated']} | {r['pruned']} |"
           for r in rows]
    write_results("autopick_speed", payload, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
