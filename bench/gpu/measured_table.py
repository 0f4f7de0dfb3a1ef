"""Ship what the GPU bench measured as the auto-picker's table for a preset
(hiercoll/data/measured_<preset>.json): NCCL through hiercoll's library call and every one of
hiercoll's plans, per collective and size, in one mode; where it covers a size the auto-picker
and the Communicator rank by these times instead of simulating (issue 25: pick the faster path).
Later files win where two measured the same plan at the same size (newer kernels).

    python bench/gpu/measured_table.py h200x4 -o hiercoll/data/measured_h200x4.json \
        bench/results/gpu/compare-w4/*-w4.json bench/results/gpu/compare-w4-small-3/*-w4.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hiercoll.files import write_atomic  # noqa: E402
from hiercoll.planner.search.library import LibraryTable, load_library_table  # noqa: E402
from hiercoll.topology import load_topology  # noqa: E402


def merged(paths: list[Path], preset: str) -> LibraryTable:
    tables = [load_library_table(p) for p in paths]
    modes = {t.mode for t in tables}
    worlds = {t.world_size for t in tables}
    if len(modes) != 1 or len(worlds) != 1:
        raise SystemExit(f"one mode and world size, please: {sorted(modes)} {sorted(worlds)}")
    times: dict = {}
    plans: dict = {}
    for t in tables:             # later files win
        for kind, pts in t.times_us.items():
            times.setdefault(kind, {}).update(dict(pts))
        for kind, by_label in t.plans_us.items():
            for label, pts in by_label.items():
                plans.setdefault(kind, {}).setdefault(label, {}).update(dict(pts))
    sources = []
    for p in paths:
        prov = json.loads(p.read_text()).get("provenance", {})
        sources.append(f"{p.parent.name}/{p.name} (git {prov.get('git_sha', '?')}, "
                       f"{prov.get('date_utc', '?')})")
    first = json.loads(paths[0].read_text()).get("provenance", {})
    topo = load_topology(preset, uncalibrated=True)
    return LibraryTable(
        source=(f"hiercoll bench --zero-copy --modes graph on {first.get('num_gpus', '?')} x "
                f"{first.get('device', '?')}, NCCL {first.get('nccl', '?')}, torch "
                f"{first.get('torch', '?')}, triton {first.get('triton', '?')}, NVLS off; graph "
                f"of 10 calls, p50 per call, slowest rank; files (later win): {'; '.join(sources)}"),
        mode=modes.pop(), world_size=worlds.pop(), topology=topo.name,
        shape_fingerprint=topo.shape_fingerprint(),
        times_us={k: sorted(v.items()) for k, v in times.items()},
        plans_us={k: {lbl: sorted(v.items()) for lbl, v in by.items()} for k, by in plans.items()})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("preset")
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    table = merged(args.files, args.preset)
    write_atomic(args.output, table.model_dump_json(indent=1) + "\n")
    print(f"{args.output}: {sum(len(v) for v in table.times_us.values())} library points, "
          f"{sum(len(p) for by in table.plans_us.values() for p in by.values())} plan points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
