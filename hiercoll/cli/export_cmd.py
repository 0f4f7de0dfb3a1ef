"""`hiercoll export nccl-tuner|chakra`: hand hiercoll's decisions to other tools.

    hiercoll export nccl-tuner tuning.json -t dgx-h100 -n 2 -o nccl_tuner.conf
    hiercoll export chakra plan.json -o traces/         # traces/hiercoll.<rank>.et
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hiercoll.cli.common import add_json_flag, console, print_json
from hiercoll.errors import HiercollError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="NCCL tuner-plugin config from tuning.json; Chakra traces of a plan")
    esub = p.add_subparsers(dest="export_command", required=True, parser_class=type(p))
    t = esub.add_parser("nccl-tuner", help="CSV config for NCCL's example tuner plugin "
                        "(ring picks as ring/simple/channels; other picks as comments)")
    t.add_argument("tuning", help="tuning.json from `hiercoll autopick -o`")
    t.add_argument("-o", "--output", default=None, help="config file to write (default: print it)")
    t.add_argument("--topology", "-t", default=None,
                   help="the topology the tables were picked for (sets nNodes/nRanks; default: "
                   "the file's only topology, matching communicators of any size)")
    t.add_argument("--nodes", "-n", type=int, default=None, help="node count for a preset")
    t.add_argument("--dtype", default=None, help="which dtype's tables (NCCL cannot tell them apart)")
    add_json_flag(t)
    t.set_defaults(func=_nccl_tuner)
    c = esub.add_parser("chakra", help="one Chakra execution trace per rank (ASTRA-sim)")
    c.add_argument("plan", help="plan.json from `hiercoll plan -o`")
    c.add_argument("-o", "--out", dest="out_dir", required=True, help="directory for <prefix>.<rank>.et")
    c.add_argument("--prefix", default="hiercoll", help="file name prefix (ASTRA-sim's workload name)")
    add_json_flag(c)
    c.set_defaults(func=_chakra)


def _nccl_tuner(args: argparse.Namespace) -> int:
    from hiercoll.export.nccl_tuner import nccl_best_on, parse_tuner_config, render, select_tables
    from hiercoll.files import write_atomic
    from hiercoll.planner.search.autopick import read_tuning
    from hiercoll.topology import load_topology
    if not Path(args.tuning).is_file():
        raise HiercollError(f"{args.tuning}: no such file; make one with `hiercoll autopick ... -o tuning.json`")
    if args.nodes is not None and args.topology is None:
        raise HiercollError("--nodes: give --topology/-t too (the preset or file the tables were picked for)")
    topology = load_topology(args.topology, args.nodes) if args.topology else None
    tables = select_tables(read_tuning(args.tuning), topology.fingerprint() if topology else None,
                           args.dtype, args.tuning)
    nodes, ranks = (topology.num_nodes, topology.world_size) if topology else (-1, -1)
    text = render(tables, nodes, ranks, Path(args.tuning).name,
                  nccl_best_on(topology, tables[0].dtype) if topology else None)
    lines = parse_tuner_config(text)          # what the plugin would read back
    if args.output:
        write_atomic(args.output, text)
    if args.json:
        print_json({"output": args.output, "lines": len(lines),
                    "tables": [f"{t.collective.value} {t.dtype}" for t in tables]})
    elif args.output:
        console.print(f"wrote {args.output}: {len(lines)} override line(s) for "
                      f"{', '.join(t.collective.value for t in tables)}")
    else:
        console.print(text, end="", markup=False, highlight=False)
    return 0


def _chakra(args: argparse.Namespace) -> int:
    from hiercoll.export.chakra import write_traces
    from hiercoll.files import output_target
    from hiercoll.plan_file import load_plan
    out = Path(args.out_dir)
    if out.exists() and not out.is_dir():
        raise HiercollError(f"-o/--out: {out} is a file; give a directory for the per-rank traces")
    if not args.prefix or "/" in args.prefix:
        raise HiercollError(f"--prefix: {args.prefix!r} must be a plain file name prefix")
    plan = load_plan(args.plan)
    output_target(out / f"{args.prefix}.0.et")
    paths = write_traces(out, plan.schedule, plan.topology, args.prefix)
    if args.json:
        print_json({"directory": str(out), "files": [p.name for p in paths],
                    "ranks": plan.schedule.world_size, "ops": plan.schedule.num_ops})
    else:
        console.print(f"wrote {len(paths)} trace(s) to {out}/ ({args.prefix}.<rank>.et, one per rank); "
                      f"ASTRA-sim: --workload-configuration={out}/{args.prefix}")
    return 0
