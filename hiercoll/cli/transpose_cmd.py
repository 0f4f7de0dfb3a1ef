"""`hiercoll transpose SPLITS -o OUT`: group-cast splits <-> group-reduce splits.

The backward of a group-cast (gradients of what was fetched flow back to the owner and are
summed there) is the group-reduce with every split's direction reversed; the same function turns
one into the other both ways.
"""

from __future__ import annotations

import argparse
import json

import yaml

from hiercoll.cli.args import load_splits
from hiercoll.cli.common import add_json_flag, console, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("transpose", help="group-cast splits <-> group-reduce splits (backward)")
    p.add_argument("splits", help="splits file (YAML/JSON, as --splits takes)")
    p.add_argument("--output", "-o", default=None, help="write the transposed splits here")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hiercoll.collectives import transpose
    from hiercoll.errors import HiercollError
    from hiercoll.files import write_atomic
    splits = load_splits(args.splits)
    if splits is None:
        raise HiercollError("transpose: give a splits file")
    data = transpose(splits).model_dump(mode="json")
    if args.output:
        text = (yaml.safe_dump(data, sort_keys=False) if not args.output.endswith(".json")
                else json.dumps(data, indent=1) + "\n")
        write_atomic(args.output, text)
    if args.json:
        print_json(data)
    elif args.output:
        console.print(f"wrote {args.output}: {len(data['ranks'])} ranks")
    else:
        console.print(yaml.safe_dump(data, sort_keys=False))
    return 0
