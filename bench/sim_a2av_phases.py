"""Where the CPU time of a dense all-to-all-v simulation goes, phase by phase (issue 29's 10 s
target at 1024 GPUs): the counts, `GroupSplits.from_counts`, the spec, the plan, and inside
`simulate` the op arrays, the compiled tables, the replay, the lower bound and the rest. The
simulate phases are timed by wrapping the functions `simulate` calls.

    python bench/sim_a2av_phases.py --gpus 1024

Writes bench/results/sim_a2av_phases.{json,md} (atomically).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import command_line, provenance, stamp, timed, write_results  # noqa: E402
from sim_scale import dense_a2av_counts  # noqa: E402

WRAPPED = {"op arrays": "native_op_arrays", "tables": "tables_from_arrays",
           "replay": "run_compiled", "lower bound": "lower_bound"}


def measure(gpus: int) -> dict[str, Any]:
    t0 = time.process_time()
    import hiercoll as hc
    sim_mod = importlib.import_module("hiercoll.sim.simulate")   # the module, not the function
    from hiercoll.collectives import GroupSplits
    phases: dict[str, float] = {"import": time.process_time() - t0}
    marks = [time.process_time()]

    def lap(label: str) -> None:
        marks.append(time.process_time())
        phases[label] = marks[-1] - marks[-2]
    topo = hc.load_topology("dgx-h100", gpus // 8)
    counts = dense_a2av_counts(gpus)           # sim_scale's a2av row, phase by phase
    lap("counts")
    splits = GroupSplits.from_counts(counts)
    lap("from_counts")
    spec = hc.CollectiveSpec(kind="group_cast", world_size=gpus, dtype="bf16", splits=splits)
    lap("spec")
    schedule = hc.plan(topo, spec, "direct")
    lap("plan")
    inner: dict[str, float] = {}
    for label, name in WRAPPED.items():
        setattr(sim_mod, name, timed(inner, label, getattr(sim_mod, name)))
    res = hc.simulate(schedule, topo, mode="exact")
    lap("simulate")
    rest = phases["simulate"] - sum(inner.values())
    return {"gpus": gpus, "ops": res.num_ops, "time_us": res.time_us, "phases": phases,
            "simulate_phases": inner | {"rest": rest},
            "total_cpu_s": sum(phases.values())}


def render(payload: dict[str, Any]) -> str:
    r = payload["result"]
    lines = [f"# Dense all-to-all-v, {r['gpus']} GPUs: CPU seconds by phase", "",
             *provenance(payload["meta"]), "",
             f"`direct` group_cast of every pair's own 1-2047 elements on `dgx-h100`, unfolded; "
             f"{r['ops']} ops, simulated {r['time_us']:.1f} us; **{r['total_cpu_s']:.1f} CPU s** "
             "all-in (issue 29's target: 10 s).", "", "| phase | CPU s |", "|---|---|"]
    for k, v in r["phases"].items():
        lines.append(f"| {k} | {v:.2f} |")
        if k == "simulate":
            lines += [f"| &nbsp;&nbsp;{a} | {b:.2f} |" for a, b in r["simulate_phases"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gpus", type=int, default=1024)
    args = ap.parse_args()
    payload = {"meta": stamp(command_line()), "result": measure(args.gpus)}
    write_results("sim_a2av_phases", payload, render(payload))
    print(render(payload))


if __name__ == "__main__":
    main()
