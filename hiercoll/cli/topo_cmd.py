"""`hiercoll topo show|schema|list|detect`: look at a topology before planning on it, or make one
from the machine you are on."""

from __future__ import annotations

import argparse
import json
import os
import socket
from datetime import UTC, datetime
from pathlib import Path

from hiercoll.cli.common import add_json_flag, console, print_json, print_table
from hiercoll.errors import HiercollError
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
    upg = tsub.add_parser("upgrade", help="rewrite a topology file in the current schema "
                          "version (old files load as they are; this makes the version explicit)")
    upg.add_argument("topology", help="YAML/JSON topology file")
    upg.add_argument("-o", "--output", required=True, help="file to write (YAML, or JSON for .json)")
    add_json_flag(upg)
    upg.set_defaults(func=_upgrade)
    lst = tsub.add_parser("list", help="built-in presets")
    add_json_flag(lst)
    lst.set_defaults(func=_list)
    _register_detect(tsub)


def _register_detect(tsub: argparse._SubParsersAction) -> None:
    d = tsub.add_parser("detect", help="topology file of this machine (NVML/nvidia-smi, sysfs NICs, "
                        "rocm-smi); one node seen, the node count from --nodes or WORLD_SIZE")
    d.add_argument("-o", "--output", default=None, help="topology YAML to write (default: print it)")
    d.add_argument("--nodes", "-n", type=int, default=None,
                   help="node count (default: WORLD_SIZE / LOCAL_WORLD_SIZE, else 1)")
    d.add_argument("--from", dest="from_dir", default=None,
                   help="read recorded tool outputs from this directory instead of running the tools")
    d.add_argument("--record", default=None, help="save the raw tool outputs into this directory")
    d.add_argument("--no-nvml", action="store_true", help="parse nvidia-smi even if pynvml is installed")
    d.add_argument("--name", default=None, help="the topology's name")
    for flag, typ, what in (("--hbm-gbps", float, "HBM GB/s (read+write)"), ("--num-sms", int, "SMs"),
                            ("--intra-latency-us", float, "one-hop latency inside the node"),
                            ("--inter-latency-us", float, "one-way latency between nodes"),
                            ("--nic-gbps", float, "per-NIC GB/s per direction"),
                            ("--num-nics", int, "NICs per node used by collectives"),
                            ("--oversubscription", float, "fabric oversubscription (1 = non-blocking)")):
        d.add_argument(flag, type=typ, default=None, help=f"{what} (no tool reports it)")
    add_json_flag(d)
    d.set_defaults(func=_detect)


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
    from hiercoll.topology.fabric import layout
    for tl in layout(t):
        up = (f", {tl.uplinks} uplinks x {tl.port_gbps:.4g} GB/s each" if tl.uplinks else
              ", outermost")
        rows.append([f"tier {tl.index}: {tl.name}",
                     f"{tl.groups} group(s) of {tl.span} node(s), {tl.switches} switch(es) per "
                     f"group{' (one per rail)' if tl.rails else ''}, {tl.down_ports} down{up}"])
    if t.inter is not None and t.inter.tiers:
        rows.append(["routing", t.inter.routing + (f", seed {t.inter.ecmp_seed}"
                                                   if t.inter.routing == "ecmp" else "")])
    for o in t.node_overrides:
        what = ", ".join(f"{k} {v:g}" for k, v in (("nic_gbps", o.nic_gbps), ("hbm_gbps", o.hbm_gbps),
                                                   ("intra_gbps", o.intra_gbps)) if v is not None)
        rows.append([f"node {o.node}" + (f" nic {o.nic}" if o.nic is not None else ""), what])
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


def _upgrade(args: argparse.Namespace) -> int:
    """The file's own fields, validated and converted (topology.versions), with its version."""
    import yaml

    from hiercoll.files import write_atomic
    from hiercoll.topology.load import read_structured_file, topology_from_dict
    source = Path(args.topology)
    if not source.is_file():
        raise HiercollError(f"topology: {args.topology!r} is not a file; give a YAML/JSON "
                            "topology file (presets need no upgrade)")
    t = topology_from_dict(read_structured_file(source), str(source))
    data = t.model_dump(mode="json", exclude_unset=True) | {"schema_version": t.schema_version}
    text = (json.dumps(data, indent=2) + "\n" if str(args.output).endswith(".json")
            else yaml.safe_dump(data, sort_keys=False))
    write_atomic(args.output, text)
    if args.json:
        print_json({"output": args.output, "schema_version": t.schema_version,
                    "fingerprint": t.fingerprint()})
    else:
        console.print(f"wrote {args.output} (schema_version {t.schema_version}, fingerprint "
                      f"{t.fingerprint()}, unchanged)")
    return 0


def _list(args: argparse.Namespace) -> int:
    if args.json:
        print_json({"presets": preset_names()})
    else:
        for name in preset_names():
            console.print(name)
    return 0


def _node_count(args: argparse.Namespace) -> tuple[int, str]:
    if args.nodes is not None:
        return args.nodes, "--nodes"
    world, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    if world is None or local is None:
        return 1, "default (no --nodes, no WORLD_SIZE/LOCAL_WORLD_SIZE)"
    try:
        w, lw = int(world), int(local)
    except ValueError:
        raise HiercollError(f"WORLD_SIZE/LOCAL_WORLD_SIZE: {world!r}/{local!r} are not integers; "
                            "give --nodes") from None
    if lw < 1 or w < lw or w % lw:
        raise HiercollError(f"WORLD_SIZE {w} is not a multiple of LOCAL_WORLD_SIZE {lw}; give --nodes")
    return w // lw, f"WORLD_SIZE {w} / LOCAL_WORLD_SIZE {lw}"


def _detect(args: argparse.Namespace) -> int:
    from hiercoll.files import write_atomic
    from hiercoll.topology.detect import Overrides, build, detect_live, facts_from_texts, read_recorded
    from hiercoll.topology.detect.build import to_yaml
    from hiercoll.topology.load import topology_from_dict
    for flag in ("num_sms", "num_nics"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise HiercollError(f"--{flag.replace('_', '-')}: must be >= 1")
    nodes, how = _node_count(args)
    if args.from_dir is not None:
        texts = read_recorded(Path(args.from_dir))
        facts = facts_from_texts(texts, args.from_dir)
        origin = f"recorded outputs in {args.from_dir}"
    else:
        facts, texts = detect_live(use_nvml=not args.no_nvml)
        origin = f"{socket.gethostname()}, {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}"
    if args.record is not None:
        for name, text in texts.items():
            write_atomic(Path(args.record) / name, text)
    o = Overrides(nodes=nodes, hbm_gbps=args.hbm_gbps, num_sms=args.num_sms,
                  intra_latency_us=args.intra_latency_us, inter_latency_us=args.inter_latency_us,
                  nic_gbps=args.nic_gbps, num_nics=args.num_nics, oversubscription=args.oversubscription,
                  name=args.name)
    detected = build(facts, o)
    topology = topology_from_dict(detected.topology, "detected topology")   # what we write loads back
    text = to_yaml(detected, [f"made by `hiercoll topo detect` from {origin}",
                              f"one node seen; num_nodes {nodes} from {how}",
                              f"fingerprint {topology.fingerprint()}"])
    if args.output:
        write_atomic(args.output, text)
    if args.json:
        print_json({"topology": detected.topology, "seen": detected.seen, "assumed": detected.assumed,
                    "fingerprint": topology.fingerprint(), "output": args.output})
    elif args.output:
        console.print(f"wrote {args.output} ({topology.num_nodes} x {topology.gpus_per_node} "
                      f"{topology.gpu.name}, {topology.intra.kind.value}); assumed: "
                      f"{len(detected.assumed)} values, listed in the file")
    else:
        console.print(text, end="", markup=False, highlight=False)
    return 0
