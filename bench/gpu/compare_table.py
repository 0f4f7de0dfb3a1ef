"""The comparison table of issue 25 from `bench/gpu/compare.sh`'s JSON: per collective, size and
mode, hiercoll's best plan against the peers timed in the same run (NCCL as nccl-tests calls it,
NCCL through hiercoll's library fallback, torch's symmetric-memory kernels).

    python bench/gpu/compare_table.py bench/results/gpu/compare-w4 --commit 283bed0

Writes DIR/summary.md. ratio = best peer time / hiercoll's best time (> 1: hiercoll faster);
busbw per nccl-tests.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def _label(r: dict[str, Any]) -> str:
    return f"peer:{r['algorithm']}" if r.get("peer") else str(r["algorithm"])


def _size(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"


def summarise(rows: list[dict[str, Any]]) -> list[str]:
    by: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[(r["collective"], r["mode"], r["nbytes"])].append(r)
    lines = ["| collective | mode | size | hiercoll best | us | busbw | NCCL (nccl-tests call) | "
             "NCCL via hiercoll fallback | torch symm-mem best | best peer / hiercoll |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (kind, mode, n), group in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] != "graph", kv[0][2])):
        ours = [r for r in group if not r.get("peer") and r["algorithm"] != "nccl"]
        if not ours:
            continue
        best = min(ours, key=lambda r: r["p50_us"])
        nccl = next((r for r in group if r.get("peer") and r["algorithm"] == "nccl"), None)
        lib = next((r for r in group if not r.get("peer") and r["algorithm"] == "nccl"), None)
        torch_rows = [r for r in group if r.get("peer") and r["algorithm"].startswith("torch")]
        tbest = min(torch_rows, key=lambda r: r["p50_us"]) if torch_rows else None
        peers = [r for r in (nccl, lib, tbest) if r is not None]
        ratio = min(r["p50_us"] for r in peers) / best["p50_us"] if peers else float("nan")

        def cell(r: dict[str, Any] | None) -> str:
            return "-" if r is None else f"{r['p50_us']:.1f} us ({r['busbw_gbps']:.0f} GB/s)"
        tname = f"{tbest['algorithm'].removeprefix('torch-')}: {cell(tbest)}" if tbest else "-"
        lines.append(f"| {kind} | {mode} | {_size(n)} | {best['algorithm']} | {best['p50_us']:.1f} | "
                     f"{best['busbw_gbps']:.0f} | {cell(nccl)} | {cell(lib)} | {tname} | "
                     f"{ratio:.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--commit", default=None, help="hiercoll commit the run used")
    args = ap.parse_args()
    files = sorted(args.dir.glob("*-w*.json"))
    rows: list[dict[str, Any]] = []
    prov: dict[str, Any] = {}
    for f in files:
        body = json.loads(f.read_text())
        rows += body["rows"]
        prov = body["provenance"]
    head = [f"# Comparison table: {args.dir.name}", "",
            f"Run: `bash bench/gpu/compare.sh` (per collective: `{prov.get('command', '?')}`), "
            f"{prov.get('date_utc')}, {prov.get('num_gpus')} x {prov.get('device')}, torch "
            f"{prov.get('torch')}, NCCL {prov.get('nccl')}, triton {prov.get('triton')}, hiercoll "
            f"commit {args.commit or prov.get('git_sha')}. Graph: a CUDA graph of "
            f"{max((r.get('graph_calls') or 0) for r in rows)} back-to-back calls, p50 per call, "
            "slowest rank; eager: events around back-to-back calls. Zero-copy (plans on their "
            "symmetric buffers; NCCL in place for all-reduce). Table: "
            f"`python bench/gpu/compare_table.py {args.dir} --commit {args.commit}`.", ""]
    out = args.dir / "summary.md"
    out.write_text("\n".join(head + summarise(rows)) + "\n")
    print(out)


if __name__ == "__main__":
    main()
