"""`hiercoll verify plan.json`: structure on load, the simulator's race/postcondition check when
available, then the reference executor on fresh random data. Exit 0 right, 1 wrong."""

from __future__ import annotations

import argparse

from hiercoll.cli.common import add_json_flag, console, print_json
from hiercoll.executor.reference import verify
from hiercoll.plan_file import load_plan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="check a plan: races, postcondition, reference execution")
    p.add_argument("plan", help="plan file from `hiercoll plan`")
    p.add_argument("--trials", type=int, default=3, help="random inputs x random op orders")
    p.add_argument("--seed", type=int, default=None)
    add_json_flag(p)
    p.set_defaults(func=_run)


def _static_check(schedule):  # type: ignore[no-untyped-def]
    try:
        from hiercoll.sim import check
    except ImportError:
        return None
    return check(schedule)


def _run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    static = _static_check(plan.schedule)
    report = verify(plan.schedule, trials=args.trials, seed=args.seed)
    ok = report.ok and (static is None or static.ok)
    if args.json:
        out = {"ok": ok, "reference": report.to_json()}
        if static is not None:
            out["check"] = static.to_json()
        print_json(out)
        return 0 if ok else 1
    if static is not None and not static.ok:
        for problem in static.problems[:10]:
            console.print(f"[red]problem[/red]: {problem}")
    if report.ok:
        console.print(f"reference executor: {report.trials} trials OK, max abs error "
                      f"{report.max_abs_error:.3g}")
    else:
        console.print(f"[red]MISMATCH[/red] in trial {report.trial}: {report.mismatch}")
    return 0 if ok else 1
