"""`hiercoll autopick --validate BENCH_JSON ...`: the regret of the simulator's choice on measured
bench results (calibration/regret.py), as a table, and with --out as regret.json / .md / .png."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hiercoll.calibration.regret import RegretPoint, measured_points, regret_run, summary
from hiercoll.cli.common import console, print_json, print_table
from hiercoll.errors import HiercollError
from hiercoll.files import write_atomic
from hiercoll.sim.simulate import CallMode
from hiercoll.topology import Topology
from hiercoll.units import format_size


def _rows(path: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise HiercollError(f"--validate: cannot read {path}: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise HiercollError(f"--validate: {path} is not a `hiercoll bench --out` JSON (no rows)")
    return [r for r in data["rows"] if isinstance(r, dict)]


def validate(args: argparse.Namespace, topology: Topology) -> int:
    rows = [r for path in args.validate for r in _rows(path)]
    mode: CallMode = "eager" if args.mode == "eager" else "graph"
    points = measured_points(rows, mode)
    if not points:
        raise HiercollError(f"--validate: no {mode}-mode rows of hiercoll plans or the nccl "
                            "fallback in " + ", ".join(args.validate))
    result, spread = regret_run(topology, points, mode)
    summ = summary(result)
    payload = {"topology": topology.name, "costs": topology.calibration_label(),
               "mode": mode, "files": list(args.validate), "summary": summ,
               "spread": [s.text() for s in spread],
               "points": [p.to_json() for p in result]}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "regret.json", json.dumps(payload, indent=1) + "\n")
        write_atomic(out / "regret.md", markdown(payload, result))
        _plot(result, out / "regret.png")
    if args.json:
        print_json(payload)
        return 0
    print_table(f"regret of the simulator's pick on {topology.name} ({mode}): "
                + _headline(summ),
                ["collective", "size", "pick (simulated us)", "measured best", "regret",
                 "shipped pick"],
                [[p.collective, format_size(p.nbytes), f"{p.pick} ({p.pick_sim_us:.1f})",
                  f"{p.best} {p.best_us:.1f}", f"{p.regret:.3f}", p.shipped or "-"]
                 for p in result])
    console.print(f"simulated costs: {topology.calibration_label()}")
    if spread:
        console.print(_spread_line([s.text() for s in spread]), markup=False, highlight=False)
    if args.out:
        console.print(f"wrote {args.out}/regret.json, regret.md, regret.png")
    return 0


def _headline(summ: dict[str, Any]) -> str:
    if not summ.get("points"):
        return "no point with two candidates the simulator can time"
    return (f"{summ['points']} points, geomean {summ['geomean']:.3f}, worst {summ['worst']:.3f} "
            f"({summ['worst_at']}), {summ['above_1_05']} above 1.05 "
            f"({summ.get('above_1_05_same_program', 0)} of them the best's own program); "
            f"where the pick is another program, worst {summ.get('worst_other_program', 1.0):.3f}"
            f" ({summ.get('worst_other_program_at', '-')})")


def _spread_line(spread: list[str]) -> str:
    return ("the run's spread where candidates of a point ran one program (a regret between "
            "such is noise): " + "; ".join(spread))


def markdown(payload: dict[str, Any], points: list[RegretPoint]) -> str:
    lines = [f"# Regret of the simulator's choice on {payload['topology']} ({payload['mode']})", "",
             f"- measured: {', '.join(payload['files'])}", f"- simulated costs: {payload['costs']}",
             f"- {_headline(payload['summary'])}",
             *([f"- {_spread_line(payload['spread'])}"] if payload.get("spread") else []),
             "- regret = measured time of the candidate the simulator ranks fastest (among those "
             "the run measured) / the fastest measured; `shipped pick`: what the shipped "
             "auto-pick ranks first where its measured table covers the size (in-sample when that "
             "table came from these files); `same program`: the pick lowered to the best's own "
             "ops (a tie: the difference is the run's spread between two runs of one program)", "",
             "| collective | bytes | simulator's pick | its sim us | its measured us | measured "
             "best | best us | regret | same program | candidates | shipped pick |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p.collective} | {p.nbytes} | {p.pick} | {p.pick_sim_us:.1f} | "
                     f"{p.pick_us:.1f} | {p.best} | {p.best_us:.1f} | {p.regret:.3f} | "
                     f"{'yes' if p.same_program else 'no'} | {p.candidates} | {p.shipped or '-'} |")
    return "\n".join(lines) + "\n"


def _plot(points: list[RegretPoint], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return       # matplotlib is optional: the JSON and Markdown are the record
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for coll in sorted({p.collective for p in points}):
        mine = sorted((p.nbytes, p.regret) for p in points if p.collective == coll)
        ax.plot([n for n, _ in mine], [r for _, r in mine], marker="o", label=coll)
    ax.axhline(1.10, color="red", lw=1, ls="--", label="worst target 1.10")
    ax.axhline(1.03, color="orange", lw=1, ls=":", label="geomean target 1.03")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes")
    ax.set_ylabel("measured(pick) / measured(best)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
