"""What every command shares: output as a rich table or one JSON object, atomic file writes,
topology/spec arguments."""

from __future__ import annotations

import argparse
import json
import os
import sys
from enum import Enum
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hiercoll.errors import HiercollError

console = Console(stderr=False, highlight=False)
err_console = Console(stderr=True, highlight=False)
# Output that goes to a file, a pipe or a CI log is not wrapped at rich's 80-column default (a
# wrapped table or path cannot be grepped); tables are not stretched, only never folded.
PIPED_WIDTH = 1000
# ...but a table that grows to 1000 columns is unreadable in a log: piped tables wrap their cells
# at this width instead (a cell's text wraps inside its column; nothing is cut)
PIPED_TABLE_WIDTH = 160


def wide_when_piped() -> None:
    """Each console that does not print to a terminal gets PIPED_WIDTH columns (COLUMNS, when
    set, still wins: the user asked for that width)."""
    for c in (console, err_console):
        if not c.is_terminal and not os.environ.get("COLUMNS"):
            c.width = PIPED_WIDTH


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def add_topology_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    from hiercoll.topology.presets import DEFAULT_NODES, preset_names
    p.add_argument("--topology", "-t", required=required,
                   help=f"preset ({', '.join(preset_names())}) or YAML/JSON file")
    defaults = ", ".join(f"{name}: {n}" for name, n in sorted(DEFAULT_NODES.items()))
    p.add_argument("--nodes", "-n", type=int, default=None,
                   help=f"node count (presets: default 2; {defaults})")


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")


TEXT_COLUMNS = {"algorithm", "op", "link", "field", "value", "params", "runner-up", "choice", "kind",
                "collectives", "about",
                "size"}


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title, title_justify="left")
    for c in columns:
        table.add_column(c, justify="left" if c in TEXT_COLUMNS else "right")
    for row in rows:
        table.add_row(*[escape(str(x)) for x in row])
    console.print(table, width=None if console.is_terminal else min(console.width,
                                                                     PIPED_TABLE_WIDTH))


def parse_kv(items: list[str] | None, what: str = "--param") -> dict[str, Any]:
    """`key=value` pairs; values parsed as JSON when they can be (numbers, true/false)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise HiercollError(f"{what}: {item!r} should be key=value, e.g. chunks=4")
        key, value = item.split("=", 1)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
        except RecursionError:
            raise HiercollError(f"{what}: {key}: value nested too deeply") from None
    return out


# Optional modules and the extra that installs each: a core install (no extras) gets one line
# naming the pip command instead of a ModuleNotFoundError traceback.
EXTRAS = {"torch": "torch", "matplotlib": "plot", "triton": "cuda"}


def missing_extra_line(module: str, what: str | None = None) -> str | None:
    """`X needs torch, which is not installed: pip install 'hiercoll[torch]'`, or None when
    `module` is not an optional one."""
    root = module.split(".")[0]
    if root not in EXTRAS:
        return None
    return (f"{what + ' needs ' if what else ''}{root}{'' if what else ' is needed'}, which is not "
            f"installed: pip install 'hiercoll[{EXTRAS[root]}]'")


def require_extra(module: str, what: str) -> None:
    """Fail before any work when `what` (a flag or command) needs a module that is missing."""
    import importlib.util
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise HiercollError(missing_extra_line(module, what) or f"{what} needs {module}")


def format_params(params: dict[str, Any]) -> str:
    """`chunks=4 node_swizzle=true`: what `-p` would take back (JSON values, as parse_kv reads
    them), never a Python repr; unset (None) parameters are left out."""
    return " ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}"
                    for k, v in sorted(params.items()) if v is not None)


def enum_choices(enum: type[Enum]) -> list[str]:
    """argparse choices from an enum: the values are declared once, in the enum."""
    return [str(m.value) for m in enum]
