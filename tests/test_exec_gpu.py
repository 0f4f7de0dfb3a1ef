"""The cuda backend on real GPUs (skipped without them): every applicable algorithm against the
numpy reference, eager and graph replay, through the stress command under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

NUM_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
from hiercoll.harness.launch import NO_MULTICAST  # noqa: E402

TOPOLOGIES = Path(__file__).resolve().parents[1] / "bench" / "gpu" / "topologies"


def _stress(tmp_path: Path, world: int, topology: str, collective: str) -> dict:
    out = tmp_path / f"{collective}.json"
    env = dict(os.environ, **NO_MULTICAST, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={world}", "-m", "hiercoll", "stress", "--backend", "cuda",
         "-c", collective, "-t", topology, "--sizes", "8KiB,1000008,16MiB", "--iters", "30",
         "--modes", "eager,graph", "--debug-timeout-ms", "5000", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.skipif(NUM_GPUS < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather",
                                        "all_to_all"])
def test_cuda_backend_matches_reference_on_two_gpus(tmp_path, collective):
    report = _stress(tmp_path, 2, str(TOPOLOGIES / "h200x2.yaml"), collective)
    assert report["cases"] and all(c["ok"] for c in report["cases"])


@pytest.mark.skipif(NUM_GPUS < 4, reason="needs 4 CUDA GPUs")
@pytest.mark.parametrize("topology", ["h200x4", str(TOPOLOGIES / "h200-2node-x2.yaml")])
def test_cuda_backend_matches_reference_on_four_gpus(tmp_path, topology):
    for collective in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        report = _stress(tmp_path, 4, topology, collective)
        assert all(c["ok"] for c in report["cases"]), [c for c in report["cases"] if not c["ok"]]
