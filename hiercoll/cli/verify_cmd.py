"""`hiercoll verify plan.json`: structure on load, the simulator's race/postcondition check when
available, then the reference executor on fresh random data (on a size-reduced copy of the plan
when the plan itself does not fit in memory: executor/shrink.py). Exit 0 right, 1 wrong, 3 when
the reference executor could not run at all or the race check was skipped (0 with --allow-skip):
a skipped check is not a pass. A random op order that happens to come out right says nothing about
the orders it did not try, so only the race check vouches for every legal order."""

from __future__ import annotations

import argparse

from rich.markup import escape

from hiercoll.cli.common import add_json_flag, console, err_console, print_json
from hiercoll.errors import ReferenceTooLarge
from hiercoll.executor.reference import DEFAULT_MAX_MEMORY, verify
from hiercoll.plan_file import load_plan
from hiercoll.sim import check
from hiercoll.sim.check import in_place_problems
from hiercoll.units import format_size, parse_size

EXIT_SKIPPED = 3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="check a plan: races, postcondition, reference execution",
                       description="Exit 0 right, 1 wrong, 3 a check skipped (the reference executor: "
                       "a plan with no size-reduced copy that fits --max-memory; the race check: "
                       "a plan of over 1e9 ops x streams) unless --allow-skip.")
    p.add_argument("plan", help="plan file from `hiercoll plan`")
    p.add_argument("--trials", type=int, default=3, help="random inputs x random op orders")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the random inputs and op orders (default: fresh each run)")
    p.add_argument("--max-memory", type=parse_size, default=DEFAULT_MAX_MEMORY,
                   help="largest plan the reference executor runs on data, e.g. 512MiB (larger "
                   f"plans run as a size-reduced copy; default {format_size(DEFAULT_MAX_MEMORY)})")
    p.add_argument("--in-place", action="store_true",
                   help="also require the plan to be right with every rank's output where its "
                   "input is (one tensor, as an in-place all_reduce runs): no race and the right "
                   "result with the output renamed onto the input")
    p.add_argument("--allow-skip", action="store_true",
                   help="exit 0 when a check was skipped (the reference executor or the race check) and "
                   "the checks that ran passed")
    add_json_flag(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    static = check(plan.schedule)
    in_place = in_place_problems(plan.schedule) if args.in_place else None
    report, skipped = None, None
    try:
        report = verify(plan.schedule, trials=args.trials, seed=args.seed, max_memory=args.max_memory)
    except ReferenceTooLarge as exc:
        skipped = f"reference executor SKIPPED: {exc}"
    if static.unchecked:
        skipped = "; ".join([*static.unchecked, *([skipped] if skipped else [])])
    ok = static.ok and (report is None or report.ok) and not in_place
    code = (0 if ok else 1) if (skipped is None or args.allow_skip or not ok) else EXIT_SKIPPED
    if args.json:
        print_json({"ok": ok, "check": static.to_json(),
                    "reference": report.to_json() if report else None, "skipped": skipped,
                    "in_place_problems": in_place, "exit": code})
        return code
    if in_place is not None:
        console.print(escape("in place: right (no race, the input ends holding the output)"
                             if not in_place else f"in place: WRONG: {in_place[0]}"))
    for problem in static.problems[:10]:
        console.print(escape(f"problem: {problem}"))
    if static.ok:
        console.print("static check: no deadlock, " + ("race check not run" if static.unchecked else "no race")
                      + ", postcondition holds"
                      + (", ranks identical" if static.ranks_identical else "")
                      + (f" ({'; '.join(static.notes)})" if static.notes else ""))
    if skipped:
        err_console.print(escape(skipped + ("" if args.allow_skip else
                                            f" (exit {EXIT_SKIPPED}; --allow-skip accepts the checks that ran)")))
    if report is not None and report.ok:
        console.print(f"reference executor: {report.trials} trials OK on random data {report.how}, "
                      f"max abs error {report.max_abs_error:.3g}")
    elif report is not None:
        console.print(escape(f"MISMATCH in trial {report.trial} ({report.how}): "
                             f"{report.mismatch or report.rank_difference}"))
    return code
