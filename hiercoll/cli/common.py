"""What every command shares: output as a rich table or one JSON object, atomic file writes,
topology/spec arguments."""

from __future__ import annotations

import argparse
import json
import sys
from enum import Enum
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hiercoll.errors import HiercollError

console = Console(stderr=False, highlight=False)
err_console = Console(stderr=True, highlight=False)


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def add_topology_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--topology", "-t", required=required,
                   help="preset (h200x4, dgx-h100, dgx-h200, mi300x, pcie-8gpu) or YAML/JSON file")
    p.add_argument("--nodes", "-n", type=int, default=None, help="node count (presets: default 2, h200x4: 1)")


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")


TEXT_COLUMNS = {"algorithm", "op", "link", "field", "value", "params", "runner-up", "choice", "kind",
                "size"}


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title, title_justify="left")
    for c in columns:
        table.add_column(c, justify="left" if c in TEXT_COLUMNS else "right")
    for row in rows:
        table.add_row(*[escape(str(x)) for x in row])
    console.print(table)


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


def enum_choices(enum: type[Enum]) -> list[str]:
    """argparse choices from an enum: the values are declared once, in the enum."""
    return [str(m.value) for m in enum]
