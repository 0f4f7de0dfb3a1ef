"""`hiercoll verify plan.json`: structure on load, the simulator's race/postcondition check when
available, then the reference executor on fresh random data. Exit 0 right, 1 wrong."""

from __future__ import annotations

import argparse

from rich.markup import escape

from hiercoll.cli.common import add_json_flag, console, print_json
from hiercoll.executor.reference import DEFAULT_MAX_MEMORY, memory_needed, verify
from hiercoll.plan_file import load_plan
from hiercoll.sim import check
from hiercoll.units import parse_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="check a plan: races, postcondition, reference execution")
    p.add_argument("plan", help="plan file from `hiercoll plan`")
    p.add_argument("--trials", type=int, default=3, help="random inputs x random op orders")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-memory", type=parse_size, default=DEFAULT_MAX_MEMORY,
                   help="largest plan the reference executor runs on data (default 2GiB)")
    add_json_flag(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    static = check(plan.schedule)
    report, skipped = None, None
    if memory_needed(plan.schedule) <= args.max_memory:
        report = verify(plan.schedule, trials=args.trials, seed=args.seed, max_memory=args.max_memory)
    else:
        skipped = (f"reference executor skipped: the plan needs {memory_needed(plan.schedule) / 2**30:.1f} "
                   f"GiB (--max-memory {args.max_memory / 2**30:.1f} GiB); the static check covers it")
    ok = static.ok and (report is None or report.ok)
    if args.json:
        print_json({"ok": ok, "check": static.to_json(),
                    "reference": report.to_json() if report else None, "skipped": skipped})
        return 0 if ok else 1
    for problem in static.problems[:10]:
        console.print(escape(f"problem: {problem}"))
    if static.ok:
        console.print("static check: no deadlock, no race, postcondition holds"
                      + (f" ({'; '.join(static.notes)})" if static.notes else ""))
    if skipped:
        console.print(skipped)
    elif report is not None and report.ok:
        console.print(f"reference executor: {report.trials} trials OK on random data, max abs error "
                      f"{report.max_abs_error:.3g}")
    elif report is not None:
        console.print(escape(f"MISMATCH in trial {report.trial}: {report.mismatch}"))
    return 0 if ok else 1
