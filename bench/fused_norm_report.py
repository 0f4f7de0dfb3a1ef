"""The across-GPU fused all-reduce + add + RMSNorm results in one table and one plot: per shape,
each measured path (fused 1-/2-stage, the unfused NCCL / torch symm-mem / hiercoll paths, torch's
one-shot all-reduce alone) and what the shipped path choice (`sim/fused_norm_cost.costs_for`)
runs there, priced by the same run's measurement (in-sample: the fit was made from these rows).

    python bench/fused_norm_report.py RUN_DIR [RUN_DIR ...] --out bench/results/gpu/fused_norm_multi

A RUN_DIR holds `fused_norm_w<W>.json` (bench/fused_norm.py --group), or only its
`bench_w<W>.log` when the run was cut short (the rows it printed, one JSON line each).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hiercoll.executor.cuda.fused_norm import stage_choice  # noqa: E402
from hiercoll.files import write_atomic  # noqa: E402

UNFUSED = ("unfused_nccl", "unfused_torch-one-shot", "unfused_torch-two-shot", "unfused_hiercoll")


def load_rows(run: Path) -> tuple[list[dict[str, Any]], str]:
    """The rows of one run and where they came from."""
    for js in sorted(run.glob("**/fused_norm_w*.json")):
        data = json.loads(js.read_text())
        return data["rows"], f"{js} (commit {data['meta'].get('git_sha')}, {data['meta']['date']})"
    for log in sorted(run.glob("**/bench_w*.log")):
        rows = [json.loads(line) for line in log.read_text().splitlines()
                if line.startswith('{"rows"')]
        return rows, f"{log} (cut short: the {len(rows)} rows it printed)"
    raise SystemExit(f"{run}: no fused_norm_w*.json or bench_w*.log")


def picked(row: dict[str, Any]) -> tuple[int, float]:
    """The shipped choice for this shape and its measured p50 (stage 0: NCCL + add + norm)."""
    stage = stage_choice(row["rows"], row["hidden"], row["world"], 2)
    key = {0: "stage0" if "stage0" in row else "unfused_nccl", 1: "stage1", 2: "stage2",
           3: "stage3"}[stage]
    return stage, row[key]["p50"]


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| M | hidden | shipped choice | its p50 | 1-stage | 2-stage | LL | NCCL + add + norm | "
           "torch 1-shot + | torch 2-shot + | hiercoll AR + | torch 1-shot AR alone | "
           "choice / NCCL unfused | choice / best unfused | M <= 16: choice <= 1-shot alone + 1 "
           "us |", "|" + "---|" * 15]
    for r in rows:
        stage, t = picked(r)
        best = min(r[k]["p50"] for k in UNFUSED if k in r)
        cells = [r.get(k, {}).get("p50", "-") for k in UNFUSED]
        alone = r.get("torch-one-shot_alone", {}).get("p50")
        small = ("-" if r["rows"] > 16 or alone is None
                 else "met" if t <= alone + 1 else "missed")
        out.append(f"| {r['rows']} | {r['hidden']} | "
                   f"{('unfused', '1-stage', '2-stage', 'LL')[stage]} | "
                   f"{t} | {r['stage1']['p50']} | {r['stage2']['p50']} | "
                   f"{r.get('stage3', {}).get('p50', '-')} | "
                   + " | ".join(str(c) for c in cells)
                   + f" | {alone if alone is not None else '-'} | "
                   f"{t / r['unfused_nccl']['p50']:.2f} | {t / best:.2f} | {small} |")
    return out


def plot(runs: list[tuple[list[dict[str, Any]], str]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    hidden = sorted({r["hidden"] for rows, _ in runs for r in rows})
    fig, axes = plt.subplots(len(runs), len(hidden), figsize=(6 * len(hidden), 4 * len(runs)),
                             squeeze=False)
    for i, (rows, _) in enumerate(runs):
        for j, h in enumerate(hidden):
            ax = axes[i][j]
            sel = [r for r in rows if r["hidden"] == h]
            if not sel:
                ax.set_visible(False)
                continue
            ms = [r["rows"] for r in sel]
            for key, label in (("stage1", "fused 1-stage"), ("stage2", "fused 2-stage"),
                               ("stage3", "fused LL"),
                               ("unfused_nccl", "NCCL + add + norm"),
                               ("unfused_torch-two-shot", "torch 2-shot + add + norm"),
                               ("torch-one-shot_alone", "torch 1-shot AR alone")):
                have = [r for r in sel if key in r]
                if have:
                    ax.plot([r["rows"] for r in have], [r[key]["p50"] for r in have], marker=".",
                            label=label)
            ax.plot(ms, [picked(r)[1] for r in sel], "k--", lw=2, label="shipped choice")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{sel[0]['world']} GPUs, hidden {h}")
            ax.set_xlabel("rows M")
            ax.set_ylabel("p50 us per call (graph)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs = [load_rows(r) for r in args.runs]
    lines = ["# Fused all-reduce + residual add + RMSNorm across GPUs: the shipped choice, measured",
             "", "Generated by `python bench/fused_norm_report.py "
             + " ".join(str(r) for r in args.runs) + f" --out {args.out}`. Per-call p50 us, "
             "graph replays of 10 calls, rank-averaged; `+` = + torch add + `rms_norm`. The "
             "shipped choice is priced by the same run's measurement of that path (the fit was "
             "made from these rows: in-sample).", ""]
    for rows, source in runs:
        lines += [f"## {rows[0]['world']} GPUs", "", f"Source: {source}", ""] + table(rows) + [""]
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "summary.md", "\n".join(lines))
    plot(runs, args.out / "summary.png")
    print(args.out / "summary.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
