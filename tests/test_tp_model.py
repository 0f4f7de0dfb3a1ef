"""bench/tp_model.py on gloo (CPU): the tensor-parallel transformer gives the NCCL-path outputs
through the communicator's fused op and through patch() on the unedited model, every rank the
same, and patch() really routes the model's all-reduces (2 per layer); the GPU run is the
same script under torchrun with NCCL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("world", [2, 4])
def test_tp_model_on_gloo_matches_the_nccl_path_and_patch_routes(tmp_path, world):
    pytest.importorskip("torch")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={world}", str(ROOT / "bench" / "tp_model.py"), "--backend", "gloo",
         "--hidden", "64", "--ffn", "128", "--heads", "4", "--layers", "3", "--tokens", "8",
         "--steps", "3", "--reps", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=240, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads((tmp_path / f"tp_model_gloo_tp{world}.json").read_text())
    assert got["ok"] and got["ranks_identical"]
    assert got["patched_all_reduces_per_forward"] == [6]          # 2 per layer, 3 layers
    assert max(got["max_abs_diff_vs_nccl"].values()) <= got["bound"]
    assert set(got["us_per_forward"]["eager"]) == {"nccl", "fused", "empty", "patched"}
    assert "TP " + str(world) in (tmp_path / f"tp_model_gloo_tp{world}.md").read_text()
