"""Make a shipped library table (hiercoll/data/nccl_<preset>.json) from a baseline measurement
file (`shared/measurements/h200x4-baseline.json`: per collective, rows [bytes, p50 us, ...]),
bound to the preset it was measured on.

    python bench/nccl_table.py ../shared/measurements/h200x4-baseline.json h200x4 \
        --source "$(head -2 ../shared/measurements/h200x4-baseline.md | tail -1)" \
        -o hiercoll/data/nccl_h200x4.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hiercoll.files import write_atomic  # noqa: E402
from hiercoll.planner.search.library import LibraryTable  # noqa: E402
from hiercoll.topology import load_topology  # noqa: E402


def table_from_baseline(baseline: dict, preset: str, source: str, mode: str) -> LibraryTable:  # type: ignore[type-arg]
    topo = load_topology(preset, uncalibrated=True)
    times = {kind: [(int(r[0]), round(float(r[1]), 1)) for r in rows]
             for kind, rows in baseline["nccl"].items()}
    return LibraryTable(source=source, mode=mode, world_size=int(baseline["world"]),
                        topology=topo.name, shape_fingerprint=topo.shape_fingerprint(),
                        times_us=times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("baseline")
    ap.add_argument("preset")
    ap.add_argument("--source", required=True, help="how it was measured (kept in the table)")
    ap.add_argument("--mode", default="eager", choices=["eager", "graph"])
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    table = table_from_baseline(json.loads(Path(args.baseline).read_text()), args.preset,
                                args.source, args.mode)
    write_atomic(args.output, table.model_dump_json(indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
