"""`hiercoll topo show|schema|list`: look at a topology before planning on it."""

from __future__ import annotations

import argparse
import json

from hiercoll.cli.common import add_json_flag, console, print_json, print_table
from hiercoll.topology import Topology, load_topology, preset_names


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("topo", help="show topologies, list presets, print the file schema")
    tsub = p.add_subparsers(dest="topo_command", required=True, parser_class=type(p))
    show = tsub.add_parser("show", help="summary of a preset or topology file")
    show.add_argument("topology", help="preset name or YAML/JSON file")
    show.add_argument("--nodes", "-n", type=int, default=None)
    add_json_flag(show)
    show.set_defaults(func=_show)
    schema = tsub.add_parser("schema", help="JSON schema of the topology file format")
    add_json_flag(schema)
    schema.set_defaults(func=_schema)
    lst = tsub.add_parser("list", help="built-in presets")
    add_json_flag(lst)
    lst.set_defaults(func=_list)


def summary_rows(t: Topology) -> list[list[str]]:
    rows = [["name", t.name], ["fingerprint", t.fingerprint()],
            ["nodes x gpus", f"{t.num_nodes} x {t.gpus_per_node} = {t.world_size} ranks"],
            ["gpu", f"{t.gpu.name}, HBM {t.gpu.hbm_gbps:g} GB/s, {t.gpu.num_sms} SMs"],
            ["intra-node", f"{t.intra.kind.value}, {t.intra.gbps:g} GB/s per "
             f"{'link' if t.intra.kind == 'mesh' else 'GPU'} per direction, {t.intra.latency_us:g} us"]]
    if t.inter is not None:
        rows.append(["inter-node", f"{t.inter.num_nics} NICs x {t.inter.nic_gbps:g} GB/s per direction, "
                     f"{t.inter.latency_us:g} us, rails at local ranks {t.nic_affinity()}, "
                     f"oversubscription {t.inter.oversubscription:g}"])
    rows.append(["costs", f"launch {t.costs.launch_us:g} us/op, reduce at "
                 f"{t.costs.reduce_efficiency:.0%} of HBM"])
    return rows


def _show(args: argparse.Namespace) -> int:
    t = load_topology(args.topology, args.nodes)
    if args.json:
        print_json(t.model_dump(mode="json") | {"fingerprint": t.fingerprint(),
                                                  "world_size": t.world_size})
    else:
        print_table(f"topology {t.name}", ["field", "value"], summary_rows(t))
    return 0


def _schema(args: argparse.Namespace) -> int:
    if args.json:               # one object on one line, like every other --json
        print_json(Topology.model_json_schema())
    else:
        console.print_json(json.dumps(Topology.model_json_schema()))
    return 0


def _list(args: argparse.Namespace) -> int:
    if args.json:
        print_json({"presets": preset_names()})
    else:
        for name in preset_names():
            console.print(name)
    return 0
