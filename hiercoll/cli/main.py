"""Entry point: dispatch to command modules; user errors become one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from hiercoll.errors import HiercollError

# Each module has `register(subparsers)`, which adds a parser with `func(args) -> int`.
COMMAND_MODULES = [
    "hiercoll.cli.topo_cmd",
    "hiercoll.cli.plan_cmd",
    "hiercoll.cli.verify_cmd",
    "hiercoll.cli.simulate_cmd",
    "hiercoll.cli.autopick_cmd",
    "hiercoll.cli.run_cmd",
    "hiercoll.cli.stress_cmd",
    "hiercoll.cli.bench_cmd",
    "hiercoll.cli.calibrate_cmd",
    "hiercoll.cli.compare_cmd",
    "hiercoll.cli.workload_cmd",
    "hiercoll.cli.transpose_cmd",
]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse's own convention)
        sys.stderr.write(f"error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hiercoll", description="Plan, simulate, verify and run hierarchical "
                     "collectives on GPU clusters.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HiercollError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
