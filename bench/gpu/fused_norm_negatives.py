"""The fused kernel with one ordering switch off, on one GPU (every rank in one process): does the
stress catch it? On one GPU the ranks share one L2, so a missing release/acquire may well go
unseen here (the emulator's negatives are the test that must fail); this records what happened.

    CUDA_DEVICE_MAX_CONNECTIONS=32 python3 bench/gpu/fused_norm_negatives.py --world 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hiercoll.harness.fused_norm_stress import stress_one_gpu  # noqa: E402
from hiercoll.kernels.fused_norm_abi import Ordering  # noqa: E402
from hiercoll.torch.reference import unfused_add_rms_norm  # noqa: E402

CASES = {"all on": Ordering(), "no release": Ordering(release=False),
         "no acquire": Ordering(acquire=False),
         "no all-threads acquire": Ordering(acquire_all_threads=False)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--iters", type=int, default=300)
    args = ap.parse_args()
    for name, ordering in CASES.items():
        for rows, hidden, stage in ((1319, 2880, 2), (2048, 2880, 2), (64, 4096, 1)):
            r = stress_one_gpu(unfused_add_rms_norm, args.world, rows, hidden, args.iters, "eager", seed=1,
                               stage=stage, ordering=ordering, spin_limit=2_000_000,
                               max_seconds=5)
            print(json.dumps({"ordering": name} | r.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
