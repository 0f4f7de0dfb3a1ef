"""bench/sim_whatif.py's pieces on a small fabric: the Zipf router, and the whole bench end to
end (slow node and skewed MoE, every rank simulated) writing its JSON/MD/PNG."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))

from sim_whatif import zipf_router  # noqa: E402


def test_the_zipf_router_picks_distinct_experts_and_skews_with_s():
    uniform = zipf_router(4, 300, 3, 16, 0.0, seed=1)
    skewed = zipf_router(4, 300, 3, 16, 1.5, seed=1)
    for arr in (*uniform, *skewed):
        assert arr.shape == (300, 3) and arr.min() >= 0 and arr.max() < 16
        assert all(len(set(row)) == 3 for row in arr.tolist())       # top-k distinct
    top = lambda picks: np.bincount(np.concatenate(picks).ravel(), minlength=16).max()  # noqa: E731
    assert top(skewed) > 2 * top(uniform)


def test_the_bench_runs_end_to_end_on_a_small_fabric(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench/sim_whatif.py"), "--nodes", "8",
                           "--tokens", "16", "--bytes", str(1 << 24), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    payload = json.loads((tmp_path / "sim_whatif.json").read_text())
    assert {r["algorithm"] for r in payload["slow_node"]} == {"ring", "rhd", "hier", "hier_2d",
                                                              "hier_tiers"}
    assert all(r["slow_us"] > 0 and r["healthy_us"] > 0 for r in payload["slow_node"])
    assert {r["zipf_s"] for r in payload["moe"]} == {0.0, 1.2}
    assert (tmp_path / "sim_whatif.png").stat().st_size > 0
    assert "The pick per router" in (tmp_path / "sim_whatif.md").read_text()
