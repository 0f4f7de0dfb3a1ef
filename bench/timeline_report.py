"""Overlay every committed one-GPU timeline (bench/gpu/one_gpu_timeline.sh) on the simulated
timeline of its plan with the calibrated one-GPU topology: Perfetto traces + a Markdown table of
the ops the model gets most wrong.

    python bench/timeline_report.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, command_line, stamp  # noqa: E402
from hiercoll.calibration.timeline import load_timeline, overlay  # noqa: E402
from hiercoll.files import write_atomic  # noqa: E402
from hiercoll.topology import load_topology  # noqa: E402

DIR = RESULTS / "calibration" / "timelines"
TOPOLOGY = ROOT / "hiercoll" / "data" / "one-gpu-h200x4.calibrated.yaml"


def main() -> int:
    meta = stamp(command_line())
    topo = load_topology(str(TOPOLOGY))
    lines = ["# Measured vs simulated per-op timelines (one H200, every rank in one process)", "",
             f"`{meta['command']}`, {meta['date']}, git {meta['git_sha']}; topology "
             f"`{TOPOLOGY.relative_to(ROOT)}` ({topo.calibration_label()})", "",
             "Each call was lowered one op per launch and timed with CUDA events around every "
             "launch (`hiercoll run PLAN --backend cuda --one-gpu --profile F`, eager). A "
             "launch's measured span includes the time its kernel spins waiting for its "
             "producers, so a consumer can look slower than its transfer; compare start times "
             "along a chain. Open the `.overlay.json` files in Perfetto: process 1 is measured, "
             "process 2 simulated, one thread per rank.", "",
             "| timeline | measured call us | simulated call us | worst ops (sim/meas) |",
             "|---|---|---|---|"]
    for path in sorted(DIR.glob("*.timeline.json")):
        trace, pairs, measured, simulated = overlay(load_timeline(path), topo)
        out = path.with_name(path.name.replace(".timeline.json", ".overlay.json"))
        write_atomic(out, trace)
        worst = ", ".join(f"{p.op} ({p.ratio:.2f})" for p in pairs[:4])
        lines.append(f"| {path.name} | {measured:.0f} | {simulated:.0f} | {worst} |")
    write_atomic(DIR / "README.md", "\n".join(lines) + "\n")
    print("\n".join(lines[-7:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
