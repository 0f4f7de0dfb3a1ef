"""The prediction next to the measurement: per row, per plan, and as a log-log plot.

One row per (collective, plan, size, mode): measured time, predicted time, their ratio; per
(collective, plan, mode) the geomean and worst error. `hiercoll compare` prints it, and
`hiercoll calibrate` writes the same report for its fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hiercoll.calibration.fit import RowError, geomean_error, worst_error
from hiercoll.units import format_size


@dataclass(frozen=True)
class PlanError:
    collective: str
    plan: str
    mode: str
    rows: int
    geomean_error: float
    worst_error: float
    mean_ratio: float      # geometric mean of pred/meas: < 1 means the model is too fast


def by_plan(rows: Sequence[RowError]) -> list[PlanError]:
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        m = r.case.measurement
        groups.setdefault((m.collective.value, r.case.plan_label, m.mode), []).append(r.ratio)
    out = []
    for (coll, plan, mode), ratios in sorted(groups.items()):
        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        out.append(PlanError(coll, plan, mode, len(ratios), geomean_error(ratios),
                             worst_error(ratios), gm))
    return out


def row_json(r: RowError) -> dict[str, Any]:
    m = r.case.measurement
    return {"source": m.source, "collective": m.collective.value, "plan": r.case.plan_label,
            "mode": m.mode, "nbytes": m.nbytes, "measured_us": round(m.time_us, 3),
            "predicted_us": round(r.predicted_us, 3), "ratio": round(r.ratio, 4),
            "held_out": r.held_out}


def summary(rows: Sequence[RowError], min_bytes: int = 1 << 20) -> dict[str, Any]:
    """Errors overall, held out, and split at `min_bytes` (small sizes are reported apart:
    they are where fixed costs, and so the model's weakest part, dominate)."""
    def stats(sel: list[RowError]) -> dict[str, Any]:
        ratios = [r.ratio for r in sel]
        return {"rows": len(sel), "geomean_error": geomean_error(ratios),
                "worst_error": worst_error(ratios)}

    held = [r for r in rows if r.held_out]
    per_mode = {f"held_out_{mode}": stats([r for r in held if r.case.measurement.mode == mode])
                for mode in sorted({r.case.measurement.mode for r in rows})}
    return per_mode | {"all": stats(list(rows)), "fit": stats([r for r in rows if not r.held_out]),
            "held_out": stats(held),
            "held_out_large": stats([r for r in held if r.case.measurement.nbytes >= min_bytes]),
            "held_out_small": stats([r for r in held if r.case.measurement.nbytes < min_bytes]),
            "large": stats([r for r in rows if r.case.measurement.nbytes >= min_bytes]),
            "small": stats([r for r in rows if r.case.measurement.nbytes < min_bytes]),
            "min_bytes_large": min_bytes}


def band_errors(rows: Sequence[RowError]) -> list[tuple[str, int, float]]:
    """(label, rows, geomean error) per owner, mode and size band, in cross-validation's cells
    (`crossval.cells`): what a run the fit never saw holds out, read against the folds."""
    from hiercoll.calibration.crossval import cells
    out = []
    for label, member in cells(("graph", "eager")):
        sel = [r.ratio for r in rows if member(r.case)]
        if sel:
            out.append((label, len(sel), geomean_error(sel)))
    return out


def headline(s: dict[str, Any]) -> str:
    """One line of a `summary`: held-out error (split by size and mode), fit, worst row."""
    modes = "".join(f"; {k.removeprefix('held_out_')} mode {s[k]['geomean_error']:.1%}"
                    for k in ("held_out_graph", "held_out_eager") if k in s)
    return (f"held-out geomean error {s['held_out']['geomean_error']:.1%} "
            f"({s['held_out']['rows']} rows; >= 1 MiB {s['held_out_large']['geomean_error']:.1%}, "
            f"< 1 MiB {s['held_out_small']['geomean_error']:.1%}{modes}); "
            f"fit {s['fit']['geomean_error']:.1%}; worst row {s['all']['worst_error']:.1%}")


def markdown(title: str, lines: Sequence[str], rows: Sequence[RowError]) -> str:
    """A report a person reads: per-plan errors first, then every row."""
    out = [f"# {title}", "", *lines, "",
           "| collective | plan | mode | rows | geomean error | worst error | pred/meas (geomean) |",
           "|---|---|---|---|---|---|---|"]
    for p in by_plan(rows):
        out.append(f"| {p.collective} | {p.plan} | {p.mode} | {p.rows} | {p.geomean_error:.1%} | "
                   f"{p.worst_error:.1%} | {p.mean_ratio:.3f} |")
    out += ["", "| collective | plan | mode | bytes | measured us | predicted us | pred/meas | "
            "held out |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=_order):
        m = r.case.measurement
        out.append(f"| {m.collective.value} | {r.case.plan_label} | {m.mode} | "
                   f"{format_size(m.nbytes)} | {m.time_us:.1f} | {r.predicted_us:.1f} | "
                   f"{r.ratio:.3f} | {'yes' if r.held_out else ''} |")
    return "\n".join(out) + "\n"


def _order(r: RowError) -> tuple[str, str, str, int]:
    m = r.case.measurement
    return (m.collective.value, r.case.plan_label, m.mode, m.nbytes)


def plot(rows: Sequence[RowError], path: Path, title: str) -> None:
    """Measured (points) vs predicted (lines), log-log, one colour per plan and a panel per
    collective; held-out points hollow."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hiercoll.files import fit_title, save_figure
    kinds = sorted({r.case.measurement.collective.value for r in rows})
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.6 * len(kinds), 4.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        series: dict[tuple[str, str], list[RowError]] = {}
        for r in rows:
            if r.case.measurement.collective.value == kind:
                series.setdefault((r.case.plan_label, r.case.measurement.mode), []).append(r)
        for i, ((plan, mode), pts) in enumerate(sorted(series.items())):
            pts.sort(key=lambda r: r.case.measurement.nbytes)
            color = f"C{i % 10}"
            xs = [r.case.measurement.nbytes for r in pts]
            ax.plot(xs, [r.predicted_us for r in pts], color=color, lw=1.2,
                    ls="-" if mode == "graph" else "--", label=f"{plan} {mode}")
            for r in pts:
                ax.plot(r.case.measurement.nbytes, r.measured_us, "o", ms=3.5, color=color,
                        mfc="none" if r.held_out else color)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes (S, nccl-tests)")
        ax.set_ylabel("time per call (us)")
        ax.set_title(kind, fontsize=9)
        ax.grid(True, alpha=0.3, which="both")
        ax.legend(fontsize=6)
    fig.suptitle(fit_title(fig, title + "  (points: measured, hollow = held out; lines: predicted)",
                           9), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=90)
    plt.close(fig)
