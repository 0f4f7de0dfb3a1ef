"""`hiercoll simulate plan.json`: predicted time, bandwidth, % of the bound, busiest links."""

from __future__ import annotations

import argparse

from hiercoll.cli.common import (
    add_json_flag,
    console,
    enum_choices,
    print_json,
    print_table,
    require_extra,
)
from hiercoll.executor.interface import Mode
from hiercoll.files import output_target, write_atomic
from hiercoll.plan_file import load_plan
from hiercoll.progress import terminal_bar


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="predict a plan's time and link load (discrete-event)")
    p.add_argument("plan", help="plan file from `hiercoll plan`")
    p.add_argument("--trace", default=None, help="write a Chrome/Perfetto trace JSON here")
    p.add_argument("--png", default=None, help="write a timeline PNG here")
    p.add_argument("--exact", action="store_true", help="simulate every rank (no symmetry folding)")
    p.add_argument("--mode", default="eager", choices=enum_choices(Mode),
                   help="per-call costs of eager launches or CUDA-graph replays (topology costs)")
    add_json_flag(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from hiercoll.sim import simulate
    from hiercoll.sim.trace import timeline_png, trace_json
    for path in (args.trace, args.png):
        if path is not None:
            output_target(path)     # a bad output path fails before the simulation, not after
    if args.png is not None:
        require_extra("matplotlib", "--png")
    plan = load_plan(args.plan)
    with terminal_bar("simulating (ops ended)") as progress:
        res = simulate(plan.schedule, plan.topology, mode="exact" if args.exact else "auto",
                       record=args.trace is not None, call_mode=args.mode, progress=progress)
    if args.trace is not None:
        write_atomic(args.trace, trace_json(plan.schedule, res))
    if args.png is not None:
        timeline_png(plan.schedule, res, args.png)
    if args.json:
        print_json(res.to_json() | {"costs": plan.topology.calibration_label()})
        return 0
    s = plan.schedule
    rows = [["time", f"{res.time_us:.2f} us"], ["algbw", f"{res.algbw_gbps:.1f} GB/s"],
            ["busbw", f"{res.busbw_gbps:.1f} GB/s"],
            ["lower bound", f"{res.lower_bound_us:.2f} us ({res.bound_cut} cut): "
             f"{100 * res.bound_ratio:.0f}% of bound"],
            ["bytes intra / inter", f"{res.bytes_intra / 2**20:.1f} / {res.bytes_inter / 2**20:.1f} MiB"],
            ["ops", f"{res.num_ops}"], ["costs", plan.topology.calibration_label()]]
    if res.shortcut:
        rows.append(["shortcut", res.shortcut])
    rows += [["note", note] for note in res.notes]
    print_table(f"{s.meta.algorithm} {s.spec.kind.value} of {s.spec.total_bytes} B on "
                f"{plan.topology.name}", ["field", "value"], rows)
    print_table("busiest links", ["link", "utilization", "MiB", "busy us"],
                [[l.name + (f" (x{l.copies})" if l.copies > 1 else ""), f"{100 * l.utilization:.0f}%",
                  f"{l.bytes / 2**20:.1f}", f"{l.busy_us:.1f}"] for l in res.busiest_links(6)])
    for path in (args.trace, args.png):
        if path is not None:
            console.print(f"wrote {path}")
    return 0
