"""What timing each eager call alone costs the measurement: the same host-bound calls timed with
CUDA events around every call (`--eager-calls 1`, the bench before 2026-11-29) and around
batches of 10 (`harness.bench.EAGER_CALLS`), in one process on one GPU (a world-1 NCCL group).

    torchrun --nproc-per-node 1 bench/gpu/eager_timing_probe.py --out DIR

Calls: a one-element add (the host's launch floor), NCCL's all_reduce of 8 KiB and 1 MiB (a
world of one: its host path without peers). Writes DIR/eager_timing.json and .md."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hiercoll.executor.interface import Mode  # noqa: E402
from hiercoll.harness.bench import time_call  # noqa: E402

REPEATS = 5      # alternating runs of each way, so a drift of the host shows as spread


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    one = torch.zeros(1, device=dev)
    small = torch.ones(4096, dtype=torch.bfloat16, device=dev)
    mid = torch.ones(1 << 19, dtype=torch.bfloat16, device=dev)
    calls = {"add_ (1 element)": lambda: one.add_(1.0),
             "nccl all_reduce 8 KiB": lambda: dist.all_reduce(small),
             "nccl all_reduce 1 MiB": lambda: dist.all_reduce(mid)}
    rows = []
    for name, call in calls.items():
        for rep in range(REPEATS):
            for batch in (1, 10):
                t = time_call(call, dev, Mode.EAGER, args.iters if batch == 1 else args.iters // 10,
                              eager_calls=batch)
                rows.append({"call": name, "eager_calls": batch, "repeat": rep,
                             "p50_us": t.p50_us, "p90_us": t.p90_us, "samples": t.iters})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    git = os.environ.get("HIERCOLL_GIT_SHA") or subprocess.run(   # env.sh: the device's commit
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        check=False).stdout.strip()
    meta = {"command": "torchrun --nproc-per-node 1 bench/gpu/eager_timing_probe.py --out DIR",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "git": git}
    (out / "eager_timing.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# Eager calls timed alone vs in batches of 10 ({meta['gpu']})", "",
             f"`{meta['command']}`, {meta['date']}, git {git}, torch {meta['torch']}", "",
             "| call | events around | p50 us per call, each repeat | median |", "|---|---|---|---|"]
    for name in calls:
        for batch in (1, 10):
            ps = [r["p50_us"] for r in rows if r["call"] == name and r["eager_calls"] == batch]
            lines.append(f"| {name} | {'each call' if batch == 1 else 'batches of 10'} | "
                         f"{' / '.join(f'{p:.2f}' for p in ps)} | {sorted(ps)[len(ps) // 2]:.2f} |")
    (out / "eager_timing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
