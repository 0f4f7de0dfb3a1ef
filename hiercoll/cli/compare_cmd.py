"""`hiercoll compare MEAS... -t T`: each measurement beside the simulator's prediction for it.

    hiercoll compare bench/results/calibration/one_gpu_h200-2026-11-25/r0/*.json -t one-gpu-h200x4 --png cmp.png

Per (collective, plan, size, mode): measured p50, predicted, their ratio; per plan the geomean
and worst error. The topology's calibration (or "defaults, uncalibrated") is named, so a number
always travels with where its costs came from.
"""

from __future__ import annotations

import argparse

from hiercoll.cli.calibrate_cmd import add_measurement_args, load_cases
from hiercoll.cli.common import add_json_flag, console, print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="measured times beside the simulator's predictions")
    add_measurement_args(p, optional=True)
    p.add_argument("--timeline", default=None, metavar="FILE",
                   help="a `hiercoll run --profile` timeline: write --trace with the measured "
                   "and the simulated timeline of that call side by side, ops matched by id")
    p.add_argument("--trace", default=None, help="with --timeline: the Perfetto trace to write")
    p.add_argument("--md", default=None, help="write the report as Markdown")
    p.add_argument("--png", default=None, help="write measured (points) vs predicted (lines)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hiercoll.calibration.report import band_errors, by_plan, markdown, plot, row_json, summary
    from hiercoll.calibration.workflow import compare
    from hiercoll.errors import HiercollError
    from hiercoll.files import write_atomic
    if args.timeline:
        return _timeline(args)
    if not args.measurements:
        raise HiercollError("compare: give measurement files (MEAS...) or --timeline FILE")
    topology, cases = load_cases(args)
    rows = compare(cases, topology)
    s = summary(rows)
    title = f"{topology.name} ({topology.calibration_label()}): predicted vs measured"
    lines = [f"`hiercoll compare {' '.join(args.measurements)} -t {args.topology}`",
             f"geomean error {s['all']['geomean_error']:.1%} over {len(rows)} rows "
             f"(>= 1 MiB {_band(s['large'])}, smaller {_band(s['small'])}), "
             f"worst {s['all']['worst_error']:.1%}"]
    bands = band_errors(rows)
    lines.append("by band: " + "; ".join(f"{label} {err:.1%} ({n} rows)" for label, n, err in bands))
    if args.md:
        write_atomic(args.md, markdown(title, lines, rows))
    if args.png:
        plot(rows, args.png, title)
    if args.json:
        print_json({"calibration": topology.calibration_label(), "summary": s,
                    "bands": [{"label": label, "rows": n, "geomean_error": err}
                              for label, n, err in bands],
                    "plans": [vars(p) for p in by_plan(rows)],
                    "rows": [row_json(r) for r in rows]})
        return 0
    print_table(title, ["collective", "plan", "mode", "rows", "geomean error", "worst",
                        "pred/meas"],
                [[p.collective, p.plan, p.mode, p.rows, f"{p.geomean_error:.1%}",
                  f"{p.worst_error:.1%}", f"{p.mean_ratio:.3f}"] for p in by_plan(rows)])
    console.print(lines[1])
    console.print(lines[2], markup=False, highlight=False)
    for path in (args.md, args.png):
        if path:
            console.print(f"wrote {path}")
    return 0


def _timeline(args: argparse.Namespace) -> int:
    from hiercoll.calibration.timeline import load_timeline, overlay
    from hiercoll.files import write_atomic
    from hiercoll.topology import load_topology
    doc = load_timeline(args.timeline)
    topology = load_topology(args.topology, args.nodes)
    trace, pairs, measured_us, simulated_us = overlay(doc, topology)
    if args.trace:
        write_atomic(args.trace, trace)
    worst = pairs[:8]
    if args.json:
        print_json({"measured_call_us": measured_us, "simulated_call_us": simulated_us,
                    "calibration": topology.calibration_label(), "trace": args.trace,
                    "ops": [vars(p) | {"ratio": p.ratio} for p in pairs]})
        return 0
    print_table(f"{doc.plan['algorithm']} {doc.plan['spec']['kind']}: measured call "
                f"{measured_us:.1f} us, simulated {simulated_us:.1f} us "
                f"({topology.calibration_label()})",
                ["op", "rank", "measured us", "simulated us", "sim/meas"],
                [[p.op, p.rank, f"{p.measured_us:.2f}", f"{p.simulated_us:.2f}",
                  f"{p.ratio:.2f}"] for p in worst])
    if args.trace:
        console.print(f"wrote {args.trace} (open in https://ui.perfetto.dev)")
    return 0


def _band(stats: dict[str, float]) -> str:
    """A size band's geomean error, or that no row fell in it (its error is NaN then)."""
    err = stats["geomean_error"]
    return "no rows" if err != err else f"{err:.1%}"
