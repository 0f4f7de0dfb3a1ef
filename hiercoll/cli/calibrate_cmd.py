"""`hiercoll calibrate MEAS... -t T -o calibrated.yaml`: fit the topology's costs to measured runs.

    hiercoll calibrate all_reduce_perf.log reduce_scatter_perf.log -t my_cluster.yaml -o cal.yaml
    hiercoll calibrate out/bench/*.json -t one-gpu-h200x4 --holdout 0.3 --json

MEAS are nccl-tests logs or `hiercoll bench` JSON files. The calibrated file is a topology file
(same schema) with a `calibration` block saying from what and how well; load it anywhere a
topology is taken.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from hiercoll.cli.common import (
    add_json_flag,
    add_topology_args,
    console,
    enum_choices,
    err_console,
    print_json,
    print_table,
)
from hiercoll.collectives import GROUPED, Kind

if TYPE_CHECKING:
    from hiercoll.calibration.predict import Case
    from hiercoll.topology import Topology


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="fit a topology's costs to measurements (nccl-tests "
                       "logs, hiercoll bench JSON)")
    add_measurement_args(p)
    p.add_argument("--output", "-o", default=None, help="write the calibrated topology (YAML)")
    p.add_argument("--folds", type=int, default=None, metavar="K",
                   help="also report k-fold cross-validated held-out error (K fits: each row "
                   "held out once), mean and spread over folds, per size band, hiercoll's plans "
                   "and NCCL's library model apart")
    p.add_argument("--holdout", type=float, default=0.3,
                   help="share of each plan's sizes kept out of the fit to measure its error")
    p.add_argument("--fix", default="", metavar="PATH[,PATH...]",
                   help="parameters to keep at the topology's values, not fit (e.g. "
                   "costs.sm_op_gbps: what you know, or a term the rows would bend to stand in "
                   "for another)")
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                   help="worker processes predicting the rows (default: the CPUs this process "
                   "may use, capped at 16); the fit is the same for any N")
    p.add_argument("--md", default=None, help="write the error report as Markdown")
    p.add_argument("--png", default=None, help="write measured vs predicted as a log-log PNG")
    add_json_flag(p)
    p.set_defaults(func=run)


def add_measurement_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument("measurements", nargs="*" if optional else "+", metavar="MEAS",
                   help="nccl-tests logs (*_perf output) or hiercoll bench JSON files")
    add_topology_args(p)
    sized = [k for k in enum_choices(Kind) if Kind(k) not in GROUPED]   # nccl-tests' kinds
    p.add_argument("--collective", "-c", default=None, choices=sized,
                   help="for nccl-tests logs whose collective the file name does not tell "
                   "(group_cast/group_reduce take their sizes from splits, not a log)")
    p.add_argument("--allow-wrong", action="store_true",
                   help="keep nccl-tests rows with a non-zero #wrong (flagged in the report)")


def load_cases(args: argparse.Namespace) -> tuple[Topology, list[Case]]:
    from hiercoll.calibration.workflow import load_rows
    from hiercoll.topology import load_topology
    topology = load_topology(args.topology, args.nodes)
    kind = Kind(args.collective) if args.collective else None
    return topology, load_rows(args.measurements, topology, collective=kind,
                               allow_wrong=args.allow_wrong)


PIPED_EVERY = 50     # simulations between progress lines of a piped calibrate


def run(args: argparse.Namespace) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from hiercoll.calibration.parallel import default_jobs
    from hiercoll.calibration.params import BY_PATH
    from hiercoll.calibration.report import headline, markdown, plot, summary
    from hiercoll.calibration.workflow import calibrate, result_json, write_topology
    from hiercoll.errors import HiercollError
    from hiercoll.files import write_atomic
    if not 0 <= args.holdout < 1:
        raise HiercollError(f"--holdout: {args.holdout} must be in [0, 1)")
    fixed = [f.strip() for f in args.fix.split(",") if f.strip()]
    unknown = [f for f in fixed if f not in BY_PATH]
    if unknown:
        raise HiercollError(f"--fix: {', '.join(unknown)} is not a calibration parameter; give "
                            f"some of {', '.join(BY_PATH)}")
    if args.jobs is not None and args.jobs < 1:
        raise HiercollError(f"--jobs: {args.jobs}; give at least 1")
    jobs = default_jobs() if args.jobs is None else args.jobs
    topology, cases = load_cases(args)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err_console, transient=True, disable=args.json) as bar:
        task = bar.add_task(f"fitting {len(cases)} rows", total=None)
        piped = not err_console.is_terminal and not args.json

        def progress(n: int) -> None:
            bar.update(task, description=f"fitting {len(cases)} rows: {n} simulations")
            if piped and n % PIPED_EVERY == 0:     # a piped fit is not silent for minutes
                err_console.print(f"calibrate: {n} simulations", markup=False, highlight=False)
        result = calibrate(cases, topology, args.holdout, args.measurements, progress=progress,
                           fixed=fixed, jobs=jobs)
    if args.output:
        write_topology(result.topology, args.output)
    cv = []
    if args.folds is not None:
        from hiercoll.calibration.crossval import cross_validate
        cv = cross_validate(cases, topology, args.folds, fixed=fixed, jobs=jobs)
    from hiercoll.calibration.spread import spreads
    spread = spreads(cases)
    s = summary(result.rows)
    title = f"calibration of {topology.name} on {len(cases)} rows"
    flags = "".join([f" --fix {','.join(fixed)}" if fixed else "",
                     f" --folds {args.folds}" if args.folds is not None else ""])
    lines = [f"`hiercoll calibrate {' '.join(args.measurements)} -t {args.topology}{flags}`",
             headline(s),
             "fitted: " + ", ".join(f"{k} = {v:.4g}" for k, v in result.fitted.items()),
             "not constrained by these rows (kept): " + (", ".join(sorted(result.unconstrained))
                                                         or "none")]
    if cv:
        lines.append(f"{args.folds}-fold cross-validated held-out geomean error: "
                     + "; ".join(f.text() for f in cv))
    if spread:
        lines.append("the rows' own spread where one program was measured twice at a point "
                     "(floor: no model is nearer on average): "
                     + "; ".join(f.text() for f in spread))
    if args.md:
        write_atomic(args.md, markdown(title, lines, result.rows))
    if args.png:
        plot(result.rows, args.png, title)
    if args.json:
        print_json(result_json(result) | ({"cross_validation": {
            "folds": args.folds, "figures": [vars(f) for f in cv]}} if cv else {})
            | {"spread": [vars(f) for f in spread]})
        return 0
    print_table(title, ["parameter", "value", "unit", "was"],
                [[k, f"{v:.4g}", BY_PATH[k].unit, _fmt(BY_PATH[k].get(topology))]
                 for k, v in result.fitted.items()]
                + [[k, "not constrained", BY_PATH[k].unit, _fmt(v)]
                   for k, v in sorted(result.unconstrained.items())])
    print_table("error |pred/meas - 1|", ["rows", "count", "geomean", "worst"],
                [[name, s[key]["rows"], f"{s[key]['geomean_error']:.1%}",
                  f"{s[key]['worst_error']:.1%}"]
                 for name, key in (("fit", "fit"), ("held out", "held_out"),
                                   ("held out >= 1 MiB", "held_out_large"),
                                   ("held out < 1 MiB", "held_out_small"),
                                   ("held out, graph mode", "held_out_graph"),
                                   ("held out, eager mode", "held_out_eager")) if key in s])
    if cv:
        print_table(f"{args.folds}-fold cross-validated held-out geomean error (each row held "
                    "out once)", ["rows", "count", "mean", "folds min-max"],
                    [[f.label, f.rows, f"{f.mean:.1%}", f"{f.low:.1%}-{f.high:.1%}"] for f in cv])
    if spread:
        print_table("the rows' own spread: one program measured twice at a point (floor: half "
                    "the mean gap, no model is nearer on average)",
                    ["rows", "pairs", "apart (geomean)", "worst pair", "floor"],
                    [[f.label, f.pairs, f"{f.spread:.1%}", f"{f.worst:.1%}", f"{f.floor:.1%}"]
                     for f in spread])
    for path in (args.output, args.md, args.png):
        if path:
            console.print(f"wrote {path}")
    return 0


def _fmt(value: float | None) -> str:
    return "unset" if value is None else f"{value:.4g}"
