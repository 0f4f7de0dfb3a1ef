"""Every measured candidate of a bench run beside the simulator's time for it, per point: what a
regret above 1 comes from (a tie the model cannot break, a plan it times as another, a term it
lacks). Candidates as `hiercoll autopick --validate` reads them (our plans as lowered, NCCL
through the library model), fastest measured first, `measured/simulated` us.

    python bench/gpu/sim_vs_measured.py -t h200x4 bench/results/gpu/w4/final-h200/compare/*-w4.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hiercoll.calibration.regret import label, measured_points, simulated  # noqa: E402
from hiercoll.topology import load_topology  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("bench", nargs="+", help="hiercoll bench JSON files of one machine")
    ap.add_argument("-t", "--topology", required=True, help="the costs to simulate with")
    ap.add_argument("--mode", default="graph", choices=("graph", "eager"))
    args = ap.parse_args()
    topo = load_topology(args.topology)
    rows = [r for f in args.bench for r in json.loads(Path(f).read_text())["rows"]]
    points = measured_points(rows, args.mode)
    for (kind, nbytes, _, _), cands in sorted(points.items(), key=lambda kv: (kv[0][0].value, kv[0][1])):
        cells = []
        for m in sorted(cands, key=lambda m: m.time_us):
            sim = simulated(topo, m)
            cells.append(f"{label(m).split('(')[0]} {m.time_us:.1f}/{'-' if sim is None else f'{sim.us:.1f}'}")
        print(f"{kind.value} {nbytes}: " + " | ".join(cells))


if __name__ == "__main__":
    main()
