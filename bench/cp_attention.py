"""Context-parallel attention KV group_cast (causal, 2 nodes x 4 GPUs): inter-node bytes and
simulated time, RDMA-de-duplicated `hier` versus flat `direct`.

    python bench/cp_attention.py --kv-per-chunk 4MiB
"""

from __future__ import annotations

import argparse

from common import command_line, stamp, write_results

import hiercoll as hc
from hiercoll.planner.search.autopick import SimCache, pick_one
from hiercoll.schedule import Transport
from hiercoll.units import format_size, parse_size
from hiercoll.workloads import causal_kv_group_cast


def inter_bytes(schedule) -> int:  # type: ignore[no-untyped-def]
    isz = schedule.spec.dtype.itemsize
    return sum(op.dst.count * isz for op in schedule.ops() if op.transport == Transport.INTER)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="h200x4")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--kv-per-chunk", default="4MiB", help="KV bytes of one rank's chunk")
    args = ap.parse_args()
    topo = hc.load_topology(args.preset, args.nodes)
    rows = []
    for layout in ("contiguous", "zigzag"):
        elems = parse_size(args.kv_per_chunk) // 2
        spec = hc.CollectiveSpec(kind="group_cast", world_size=topo.world_size, dtype="bf16",
                                 splits=causal_kv_group_cast(topo.world_size, elems, layout))
        for algo in ("direct", "hier"):
            row = pick_one(topo, spec, SimCache(None), only=[algo])
            sched = hc.plan(topo, spec, algo, row.params)
            rows.append({"layout": layout, "algorithm": algo, "params": row.params,
                         "inter_bytes": inter_bytes(sched), "time_us": row.time_us})
    payload = {"topology": topo.name, "kv_per_chunk": args.kv_per_chunk, "rows": rows,
               "meta": stamp(command_line())}
    md = [f"# CP attention KV group_cast on {topo.name} ({topo.num_nodes} nodes x {topo.gpus_per_node} GPUs)",
          "", f"Command: `{payload['meta']['command']}`  ",
          f"Date: {payload['meta']['date']}, machine: {payload['meta']['machine']}", "",
          "| layout | algorithm | inter-node bytes | simulated time (us) |", "|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['layout']} | {r['algorithm']} | {format_size(r['inter_bytes'])} "
                  f"({r['inter_bytes']}) | {r['time_us']:.1f} |")
    write_results("cp_attention", payload, "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
