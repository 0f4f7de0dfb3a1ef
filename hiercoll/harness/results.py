"""Benchmark result files: JSON rows with provenance, a Markdown table and a busbw plot."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def provenance() -> dict[str, Any]:
    """Command, versions, machine, git sha and date of this run."""
    import torch
    info: dict[str, Any] = {
        "command": " ".join(["hiercoll"] + sys.argv[1:]),
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(), "torch": torch.__version__, "host": platform.node(),
    }
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["num_gpus"] = torch.cuda.device_count()
        try:
            info["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - provenance is best effort, recorded as absent
            info["nccl"] = None
        try:
            import triton
            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
    info["git_sha"] = git_sha()
    return info


GIT_SHA_ENV = "HIERCOLL_GIT_SHA"


def git_sha() -> str | None:
    """The commit of hiercoll's own checkout (not of whatever directory the bench ran in; an
    installed, non-git copy: None), with `-dirty` when it has uncommitted changes. A copy whose
    `.git` is stale (the lent GPU machines get the working tree with the session's first commit)
    is named by its caller: `$HIERCOLL_GIT_SHA` wins when set."""
    named = os.environ.get(GIT_SHA_ENV, "").strip()
    if named:
        return named
    here = Path(__file__).resolve().parent
    try:
        top = subprocess.run(["git", "-C", str(here), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, check=False).stdout.strip()
        if not top or not (Path(top) / "hiercoll" / "harness" / "results.py").is_file():
            return None       # a git repository around an installed copy is not ours
        sha = subprocess.run(["git", "-C", top, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=False).stdout.strip()
        dirty = subprocess.run(["git", "-C", top, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return None
    return (sha + ("-dirty" if dirty else "")) or None


def row_label(row: dict[str, Any]) -> str:
    """The algorithm, or for the library pseudo-algorithm the library that ran it: a library
    call through gloo is labelled gloo, not nccl."""
    algo, backend = row["algorithm"], row.get("backend")
    if row.get("peer"):
        return f"peer:{algo}"
    if algo == "nccl" and backend and backend != algo:
        return f"{backend} (library call)"
    return str(algo)


def write_results(out_dir: str | Path, rows: list[dict[str, Any]], world_size: int) -> Path:
    from hiercoll.files import write_atomic
    out = Path(out_dir)
    kinds = sorted({r["collective"] for r in rows})
    stem = f"{'-'.join(kinds)}-w{world_size}"
    body = {"provenance": provenance(), "rows": rows}
    write_atomic(out / f"{stem}.json", json.dumps(body, indent=1, sort_keys=True) + "\n")
    write_atomic(out / f"{stem}.md", markdown(body))
    try:
        plot(rows, out / f"{stem}.png")
    except ImportError:
        pass   # matplotlib is optional; the JSON and MD are the record
    return out / f"{stem}.json"


def markdown(body: dict[str, Any]) -> str:
    prov = body["provenance"]
    lines = [f"# {', '.join(sorted({r['collective'] for r in body['rows']}))}", "",
             f"`{prov['command']}`  ", f"{prov['date_utc']}, {prov.get('device', 'cpu')} x"
             f"{prov.get('num_gpus', '-')}, torch {prov['torch']}, NCCL {prov.get('nccl')}, "
             f"triton {prov.get('triton')}, git {prov.get('git_sha')}", "",
             "| algorithm | mode | bytes | p50 us | p90 us | p99 us | algbw GB/s | busbw GB/s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in body["rows"]:   # the JSON keeps full precision; the table rounds
        lines.append(f"| {row_label(r)} | {r['mode']} | {r['nbytes']} | {r['p50_us']:.2f} | "
                     f"{r['p90_us']:.2f} | {r['p99_us']:.2f} | {r['algbw_gbps']:.2f} | "
                     f"{r['busbw_gbps']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    from hiercoll.files import fit_title, save_figure
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in rows:
        series.setdefault((row_label(r), r["mode"]), []).append((r["nbytes"], r["busbw_gbps"]))
    for (algo, mode), pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                ls="-" if mode == "graph" else "--", label=f"{algo} ({mode})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes (S, nccl-tests)")
    ax.set_ylabel("busbw GB/s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(fit_title(fig, ", ".join(sorted({r["collective"] for r in rows}))
                           + f" on {rows[0]['world_size']} ranks", 12), fontsize=12)
    fig.tight_layout()
    save_figure(fig, path, dpi=90)
    plt.close(fig)
