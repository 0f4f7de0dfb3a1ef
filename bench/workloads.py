"""Workload front ends on realistic sizes: bytes per tier and simulated time, flat vs hier vs
all-gather (`hiercoll workload ...`).

- long-context CP: 128k tokens of varlen documents (seeded lengths, 1-32k tokens), cp 16 on
  dgx-h100 x 2 nodes, K+V rows of 8 KV heads x 128 dims in bf16 (4 KiB per token): llama3's
  all-gather vs the needed-KV group-cast (causal), and the MagiAttention-style dispatch.
- MoE layer: 4096 tokens per rank, top-8 of 256 experts, dgx-h100 x 4 nodes (32 ranks), hidden
  7168 in bf16 (14 KiB per token): dispatch (group-cast) and combine (group-reduce), direct vs
  hier, against an all-gather of every token and the RDMA minimum.

    python bench/workloads.py [--moe-tokens 4096] [--only moe_layer,...]

Each part's result is merged into bench/results/workloads/workloads.json, so one part can be
re-run alone.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, command_line, stamp  # noqa: E402
from hiercoll.cli.main import main as hiercoll  # noqa: E402
from hiercoll.files import write_atomic  # noqa: E402

OUT = RESULTS / "workloads"
NOTE = ("Bytes are exact (from the schedules); times are simulated on uncalibrated dgx-h100 "
        "costs (2 us per op). The group-casts and group-reduces move one op per contiguous run "
        "of rows: the CP cases' runs are KV ranges; the MoE dispatch packs each source's tokens "
        "per destination node, grouped by their ranks there (DeepEP's send buffer, `--packing "
        "node`, the default), so a rank's input has at most nodes x (2^gpus - 1) runs whatever "
        "the token count (token order made about one op per token and destination: 1M ops a "
        "plan at 4096 tokens, killed for memory after 27 min). An all-gather moves the same "
        "node's data in a few large ops. Read the bytes as the result and the times as what "
        "the simulator predicts for these op counts.")


def varlen_cu_seqlens(total: int, seed: int, lo: int = 1024, hi: int = 32768) -> list[int]:
    """Document lengths drawn log-uniformly in [lo, hi], the last one cut to fill `total`."""
    rng = np.random.default_rng(seed)
    cu = [0]
    while cu[-1] < total:
        n = int(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        cu.append(min(total, cu[-1] + n))
    return cu


def run(name: str, argv: list[str]) -> dict:
    buf = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        rc = hiercoll([*argv, "--json", "--png", str(OUT / f"{name}.png")])
    if rc:
        raise SystemExit(f"{name}: hiercoll exited {rc}")
    body = json.loads(buf.getvalue())
    body["seconds"] = round(time.perf_counter() - t0, 1)
    body["argv"] = "hiercoll " + " ".join(argv)
    print(f"{name}: {body['seconds']} s", flush=True)
    return body


def table(body: dict) -> list[str]:
    floor = body.get("min_inter_bytes")
    lines = [f"### {body['title']}", "", f"`{body['argv']}` ({body['seconds']} s; costs: "
             f"{body['costs']})", ""]
    if floor is not None:
        lines += [f"RDMA minimum (unique token, remote node pairs): {floor / 2**20:.1f} MiB", ""]
    lines += ["| method | algorithm | intra MiB | inter MiB | simulated us |",
              "|---|---|---|---|---|"]
    for r in body["rows"]:
        lines.append(f"| {r['method']} | {r['algorithm']} | {r['bytes_intra'] / 2**20:.1f} | "
                     f"{r['bytes_inter'] / 2**20:.1f} | {r['time_us']:.1f} |")
    return lines + [""]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--moe-tokens", type=int, default=4096)
    ap.add_argument("--only", default=None, help="comma list of parts to (re)run")
    args = ap.parse_args()
    meta = stamp(command_line())
    OUT.mkdir(parents=True, exist_ok=True)
    cu = ",".join(map(str, varlen_cu_seqlens(128 * 1024, seed=1)))
    parts = {
        "llama3_cp_128k": ["workload", "llama3-cp", "--cu-seqlens", cu, "-t", "dgx-h100", "-n",
                           "2", "--row-bytes", "4KiB"],
        "attention_128k": ["workload", "attention", "--cu-seqlens", cu, "--chunk-size", "1024",
                           "-t", "dgx-h100", "-n", "2", "--row-bytes", "4KiB"],
        "moe_layer": ["workload", "moe", "--tokens", str(args.moe_tokens), "--topk", "8",
                      "--experts", "256", "-t", "dgx-h100", "-n", "4", "--row-bytes", "14KiB",
                      "--seed", "0"],
    }
    chosen = args.only.split(",") if args.only else list(parts)
    old = OUT / "workloads.json"
    results = json.loads(old.read_text())["results"] if old.exists() else {}
    fresh = {name: run(name, parts[name]) for name in chosen}
    for body in fresh.values():
        layouts = body.pop("layouts", {})   # per-rank tables: in the CLI's --json, not here
        if "min_inter_bytes" in layouts:
            body["min_inter_bytes"] = layouts["min_inter_bytes"]
        body["meta"] = meta
    results |= fresh
    write_atomic(OUT / "workloads.json", json.dumps({"meta": meta, "results": results}, indent=1,
                                                    sort_keys=True) + "\n")
    md = ["# Workloads on realistic sizes", "", NOTE, ""]
    for name in parts:
        if name in results:
            m = results[name]["meta"]
            md += table(results[name]) + [f"(`{m['command']}`, {m['date']}, {m['machine']}, "
                                          f"git {m['git_sha']})", ""]
    write_atomic(OUT / "workloads.md", "\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
