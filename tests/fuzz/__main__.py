"""`python -m tests.fuzz --cases N [--seed S]`: the long profile; prints the figures."""

from __future__ import annotations

import argparse
import sys

from tests.fuzz.core import run_cases


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz")
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--case-timeout", type=float, default=20.0)
    args = ap.parse_args()
    summary = run_cases(args.cases, args.seed, case_timeout=args.case_timeout)
    print(summary.report())
    return 0 if summary.clean else 1


if __name__ == "__main__":
    sys.exit(main())
