"""Entry point: dispatch to command modules; user errors become one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import copy
import importlib
import math
import os
import sys
from pathlib import PurePath
from types import TracebackType
from typing import Any, NoReturn

from hiercoll.cli.common import missing_extra_line, wide_when_piped
from hiercoll.errors import HiercollError, VerificationError

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
    "hiercoll.cli.export_cmd",
    "hiercoll.cli.algorithms_cmd",
]


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help names each flag's default, except where there is none to name (None, off) or
    the help already says it."""

    @staticmethod
    def _has_default(action: argparse.Action) -> bool:
        # a flag (--x / --no-x) says on or off by its name: "(default: True)" beside --no-fuse
        # reads as if passing it kept fusion on
        flag = isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction)
        return not (action.default is None or action.default is False or flag
                    or action.default is argparse.SUPPRESS or not action.option_strings)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if not self._has_default(action) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and self._has_default(action):   # argparse shows no help at all
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse's own convention)
        sys.stderr.write(f"error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hiercoll", description="Plan, simulate, verify and run hierarchical "
                     "collectives on GPU clusters.")
    from hiercoll import __version__
    parser.add_argument("--version", action="version", version=f"hiercoll {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


# Integer flags (by argparse dest, in every command) and the least value each takes.
INT_FLAG_MIN = {"seed": 0, "trials": 1, "iters": 1, "nodes": 1, "jobs": 1, "root": 0,
                "tokens": 1, "topk": 1, "experts": 1, "chunk_size": 1, "total_seqlen": 1}


def check_numbers(args: argparse.Namespace) -> None:
    """Numeric flags in range: integers at least their INT_FLAG_MIN, every float finite."""
    for dest, value in sorted(vars(args).items()):
        flag = "--" + dest.replace("_", "-")
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and dest in INT_FLAG_MIN and value < INT_FLAG_MIN[dest]:
            raise HiercollError(f"{flag}: {value} must be >= {INT_FLAG_MIN[dest]}")
        if isinstance(value, float) and not math.isfinite(value):
            raise HiercollError(f"{flag}: {value} must be a finite number")


# Flags (by argparse dest, in every command) that name one output file; checked before any work
# (`--out` is a directory for some commands, a file for others: each command checks its own).
OUTPUT_FILE_DESTS = ("output", "png", "trace", "md", "profile")


def check_outputs(args: argparse.Namespace) -> None:
    """Every output file flag names something writable as a file: not empty, not a directory,
    not a device or FIFO (files.output_target raises an OSError naming it)."""
    from hiercoll.files import output_target
    for dest in OUTPUT_FILE_DESTS:
        value = getattr(args, dest, None)
        if isinstance(value, str):
            output_target(value)


def _file_in_traceback(tb: TracebackType | None) -> str | None:
    """The file a failed read was reading: the innermost frame of `Path.read_text`/`read_bytes`/
    `open` (its `self`), else the innermost hiercoll frame with a `path`/`p` local."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        name, local = frame.f_code.co_name, frame.f_locals
        if name in ("read_text", "read_bytes", "open") and isinstance(local.get("self"), PurePath):
            return str(local["self"])
        if frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            for var in ("path", "p", "source"):
                if isinstance(local.get(var), (str, PurePath)):
                    return str(local[var])
    return None


def _parsing(tb: TracebackType | None) -> bool:
    """Whether the traceback went through a JSON or YAML parser (or pydantic's JSON reader)."""
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if module.split(".")[0] in ("json", "yaml") or tb.tb_frame.f_code.co_name.startswith(
                "model_validate_json"):
            return True
        tb = tb.tb_next
    return False


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def input_problem(exc: BaseException) -> str | None:
    """One line for a failure reading a user's file (unreadable, not UTF-8, nested too deeply),
    naming the file; None for anything else (a real bug keeps its traceback)."""
    if isinstance(exc, OSError) and exc.filename is not None:
        names = " -> ".join(os.fsdecode(f) for f in (exc.filename, exc.filename2) if f is not None)
        why = exc.strerror or type(exc).__name__
        return f"{names}: {why}" if names else why
    if isinstance(exc, UnicodeDecodeError):
        name = _file_in_traceback(exc.__traceback__)
        return None if name is None else f"{name}: not UTF-8 text; save it as UTF-8"
    if isinstance(exc, RecursionError) and _parsing(exc.__traceback__):
        name = _file_in_traceback(exc.__traceback__) or "input"
        return f"{name}: nested too deeply to read"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    wide_when_piped()
    try:
        check_numbers(args)
        check_outputs(args)
        return int(args.func(args) or 0)
    except HiercollError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except VerificationError as exc:     # a plan that deadlocks, races or computes a wrong result
        sys.stderr.write(f"error: {exc}\n")
        return 1
    except ModuleNotFoundError as exc:
        line = missing_extra_line(exc.name or "", f"hiercoll {args.command}")
        if line is None:
            raise
        sys.stderr.write(f"error: {line}\n")
        return 2
    except (OSError, UnicodeDecodeError, RecursionError) as exc:
        line = input_problem(exc)
        if line is None:
            raise
        sys.stderr.write(f"error: {line}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
