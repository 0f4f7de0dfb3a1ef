"""Turning CLI arguments into a topology and a collective spec, with one-line errors."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError

from hiercoll.cli.common import enum_choices
from hiercoll.collectives import CollectiveSpec, DType, GroupSplits, Kind, ReduceOp
from hiercoll.errors import HiercollError, format_validation_error
from hiercoll.topology import Topology, load_topology
from hiercoll.topology.load import read_structured_file
from hiercoll.units import parse_size


def add_spec_args(p: argparse.ArgumentParser, sizes: bool = False,
                  collective_required: bool = True) -> None:
    p.add_argument("--collective", "-c", required=collective_required, choices=enum_choices(Kind),
                   metavar="KIND",
                   help=f"the collective: {', '.join(enum_choices(Kind))}")
    if sizes:
        p.add_argument("--sizes", default="4KiB:1GiB", help="LOW:HIGH[:FACTOR] or a,b,c (bytes)")
    else:
        p.add_argument("--bytes", "-b", default=None,
                       help="S as in nccl-tests, e.g. 64MiB (required unless --splits gives sizes)")
    p.add_argument("--dtype", default="bf16", choices=enum_choices(DType), help="element type")
    p.add_argument("--reduce-op", default="sum", choices=enum_choices(ReduceOp),
                   help="reduction of reducing collectives")
    p.add_argument("--root", type=int, default=0, help="broadcast/reduce root")
    p.add_argument("--splits", default=None, help="group_cast/group_reduce splits (YAML/JSON); "
                   "an all-to-all-v as {counts: W x W matrix} (counts[s][d]: elements s sends d)")


def load_splits(path: str | None) -> GroupSplits | None:
    if path is None:
        return None
    data = read_structured_file(Path(path))
    if isinstance(data, dict) and set(data) == {"counts"}:
        try:
            return GroupSplits.from_counts(data["counts"])
        except ValueError as err:
            raise HiercollError(f"{path}: {err}") from None
    try:
        return GroupSplits.model_validate(data)
    except ValidationError as err:
        raise HiercollError(format_validation_error(err, path)) from None


def make_spec(args: argparse.Namespace, topology: Topology, nbytes: int | None = None) -> CollectiveSpec:
    splits = load_splits(args.splits)
    kind = Kind(args.collective)
    if kind in (Kind.GROUP_CAST, Kind.GROUP_REDUCE) and splits is None:
        raise HiercollError(f"--splits: {kind.value} needs a splits file (see README, 'group collectives')")
    if nbytes is None and args.bytes is None and splits is None:
        raise HiercollError("--bytes: how big is the collective? give -b SIZE (S as in "
                            "nccl-tests, e.g. -b 64MiB; -b 0 for an empty one)")
    size = nbytes if nbytes is not None else parse_size(args.bytes or "0", "--bytes")
    try:
        return CollectiveSpec(kind=kind, world_size=topology.world_size, dtype=args.dtype,
                              nbytes=size if splits is None else 0, reduce_op=args.reduce_op,
                              root=args.root, splits=splits)
    except ValidationError as err:
        raise HiercollError(format_validation_error(err, "collective")) from None


def topology_from_args(args: argparse.Namespace) -> Topology:
    return load_topology(args.topology, args.nodes)
