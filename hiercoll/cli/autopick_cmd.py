"""`hiercoll autopick`: simulate every candidate per size, print the choice, write tuning.json."""

from __future__ import annotations

import argparse
import time

from hiercoll.cli.args import add_spec_args, make_spec, topology_from_args
from hiercoll.cli.common import add_json_flag, add_topology_args, console, print_json, print_table
from hiercoll.errors import HiercollError
from hiercoll.planner.search.autopick import default_cache_path, rows_to_table, sweep, write_tuning
from hiercoll.planner.search.workers import Cluster
from hiercoll.units import format_size, parse_size_range


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("autopick", help="choose the fastest simulated plan per size")
    add_topology_args(p)
    add_spec_args(p, sizes=True, collective_required=False)
    p.add_argument("--algorithms", default=None, help="comma list to restrict the search")
    p.add_argument("-o", "--output", default=None, help="tuning.json to write (merged)")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the sim cache")
    p.add_argument("--jobs", "-j", type=int, default=None, help="worker processes (default: all cores)")
    p.add_argument("--cluster", default=None, metavar="ray[:ADDRESS]",
                   help="run the sizes as tasks on Ray (the `ray` extra): 'ray' starts a local "
                   "instance of --jobs CPUs, 'ray:auto' or 'ray:HOST:PORT' joins a running "
                   "cluster; same results as the worker processes")
    p.add_argument("--library-table", default="auto",
                   help="measured NCCL times that compete with the plans: a `hiercoll bench "
                   "--algorithms nccl` JSON, a library table, 'auto' (the shipped table when this "
                   "topology is the machine it was measured on) or 'none'")
    p.add_argument("--validate", nargs="+", default=None, metavar="BENCH_JSON",
                   help="instead of a search: the regret of the simulator's choice on these "
                   "`hiercoll bench` results (per collective and size, the candidate it ranks "
                   "fastest among those measured, against the fastest measured)")
    p.add_argument("--mode", default=None, choices=["eager", "graph"],
                   help="how the calls run: the search times every candidate as an eager call "
                   "(default) or as a CUDA-graph replay (what captured callers run); "
                   "--validate prices picks with the bench's rows of this mode (default graph)")
    p.add_argument("--out", default=None, help="--validate: write regret.json/.md/.png here")
    add_json_flag(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    topology = topology_from_args(args)
    if args.validate:
        from hiercoll.cli.regret_report import validate
        return validate(args, topology)
    if args.collective is None:
        raise HiercollError("--collective: required (or --validate BENCH_JSON ...)")
    sizes = parse_size_range(args.sizes)
    template = make_spec(args, topology, nbytes=sizes[0])
    only = [a.strip() for a in args.algorithms.split(",")] if args.algorithms else None
    cluster = Cluster.parse(args.cluster) if args.cluster is not None else None
    t0 = time.perf_counter()
    library = _library(args.library_table, topology)
    rows = sweep(topology, template, sizes, only, progress=not args.json,
                 cache_path=None if args.no_cache else default_cache_path(), jobs=args.jobs,
                 library=library, cluster=cluster,
                 call_mode="graph" if args.mode == "graph" else "eager")
    elapsed = time.perf_counter() - t0
    if args.output:
        write_tuning(args.output, rows_to_table(topology, template, rows))
    if args.json:
        print_json({"topology": topology.name, "fingerprint": topology.fingerprint(),
                    "costs": topology.calibration_label(),
                    "collective": template.kind.value, "dtype": template.dtype.value,
                    "library_table": None if library is None else {
                        "source": library.source, "mode": library.mode},
                    "seconds": round(elapsed, 3), "rows": [r.to_json() for r in rows]})
        return 0
    table = []
    for r in rows:
        ru = r.runner_up
        ring = (f"{r.flat_ring_time_us:.1f} ({r.flat_ring_time_us / r.time_us:.2f}x)"
                if r.flat_ring_time_us else "-")
        table.append([format_size(r.bytes), f"{r.algorithm} {_short(r.params)}".strip(), f"{r.time_us:.1f}",
                      f"{r.busbw_gbps:.1f}", f"{r.pct_of_bound:.0f}%",
                      f"{ru['algorithm']} {_short(ru['params'])} +{r.margin_pct:.0f}%" if ru else "-", ring]
                     + ([f"{r.library_time_us:.1f}" if r.library_time_us else "-"] if library else
                        [f"{r.library_model_us:.1f}" if r.library_model_us else "-"]))
    base = rows[0].baseline_algorithm
    measured = sum(r.measured for r in rows)
    how = (f"{measured} size(s) ranked by measured plan times, " if measured else "")
    print_table(f"{template.kind.value} on {topology.name} ({topology.world_size} ranks, "
                f"{template.dtype.value}): {how}{sum(r.simulated for r in rows)} simulated, "
                f"{sum(r.pruned for r in rows if not r.measured)} pruned by bounds, {elapsed:.1f} s",
                ["size", "choice", "us", "busbw", "bound", "runner-up", f"{base} us (x)"]
                + ([f"nccl us ({library.mode}, measured)"] if library else ["nccl us (model)"]),
                table)
    console.print(f"simulated costs: {topology.calibration_label()}")
    if library is not None:
        what = "nccl and plan times" if measured else "nccl times"
        console.print(f"{what}: {library.source}")
    if args.output:
        console.print(f"wrote {args.output}")
    return 0


def _library(choice: str, topology):
    from hiercoll.planner.search.library import load_library_table, shipped_table
    if choice == "none":
        return None
    if choice == "auto":
        return shipped_table(topology)
    table = load_library_table(choice)
    table.refuse_unless_for(topology, "--library-table", choice)
    return table


def _short(params: dict) -> str:
    """chunks=2, channels=8 -> 'k2 c8'; other non-default knobs as key=value."""
    short = {"chunks": "k", "channels": "c"}
    parts = []
    for k, v in sorted(params.items()):
        if k in short:
            if v != 1:
                parts.append(f"{short[k]}{v}")
        elif not isinstance(v, bool) and v is not None:
            parts.append(f"{k}={v}")
    return " ".join(parts)
