"""`hiercoll algorithms`: what `-a` and `-p` accept, without reading the source: each algorithm,
the collectives it plans, its parameters and their defaults (the same list an unknown `-p` names)."""

from __future__ import annotations

import argparse
import sys
from enum import Enum
from typing import Any

from hiercoll.cli.common import add_json_flag, console, print_json, print_table
from hiercoll.planner.registry import algorithms, param_defaults
from hiercoll.planner.search.library import LIBRARY, LIBRARY_KINDS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("algorithms", help="list algorithms, the collectives they plan, their parameters")
    add_json_flag(p)
    p.set_defaults(func=_run)


def _summary(obj: object) -> str:
    """The first sentence of the module's docstring (where each algorithm explains itself)."""
    doc = sys.modules[type(obj).__module__].__doc__ or ""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    end = para.find(". ")
    return para if end < 0 else para[:end + 1]


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def listing() -> list[dict[str, Any]]:
    rows = []
    for name, algo in sorted(algorithms().items()):
        fields = algo.Params.model_fields
        rows.append({"name": name, "collectives": sorted(k.value for k in algo.kinds),
                     "params": {k: {"default": _plain(v), "help": fields[k].description or ""}
                                for k, v in param_defaults(algo).items()},
                     "about": _summary(algo)})
    rows.append({"name": LIBRARY, "collectives": sorted(k.value for k in LIBRARY_KINDS), "params": {},
                 "about": "one collective-library call (NCCL; gloo on CPU), no ops to plan; "
                 "`hiercoll run` executes it, autopick weighs its measured times"})
    return rows


def _run(args: argparse.Namespace) -> int:
    rows = listing()
    if args.json:
        print_json({"algorithms": rows, "auto": "-a auto: the tuning file's or the searched "
                    "fastest of these (see `hiercoll autopick`)"})
        return 0
    print_table("algorithms (-a NAME -p KEY=VALUE)", ["algorithm", "collectives", "params", "about"],
                [[r["name"], ", ".join(r["collectives"]),
                  ", ".join(f"{k}={'(topology)' if v['default'] is None else v['default']}"
                            for k, v in r["params"].items()) or "-", r["about"]] for r in rows])
    console.print("-a auto: the tuning file's choice or the fastest simulated candidate (hiercoll autopick)")
    return 0
