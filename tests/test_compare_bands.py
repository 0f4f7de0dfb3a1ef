"""`hiercoll compare` reports the error per owner, mode and size band, in cross-validation's cells
(so a fresh run's out-of-sample error reads against the fit's folds)."""

from __future__ import annotations

import json

import pytest

from hiercoll.cli.main import main

KNOBS = {"forward": True, "fuse": True, "single_stream": True, "split_channels": True,
         "protocol": "simple", "max_ctas": 132, "ce_threshold_bytes": 1 << 40}


def _row(algorithm: str, nbytes: int, t: float, mode: str = "graph", **extra) -> dict:
    return {"algorithm": algorithm, "backend": "cuda", "peer": False, "mode": mode,
            "collective": "all_gather", "dtype": "bf16", "nbytes": nbytes, "world_size": 4,
            "p50_us": t, "params": {"channels": 1, "chunks": 1}, "options": KNOBS} | extra


def test_compare_splits_the_error_by_owner_mode_and_band(tmp_path, capsys):
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"rows": [
        _row("direct", 1 << 16, 10.0), _row("direct", 1 << 22, 20.0),
        _row("direct", 1 << 27, 400.0, mode="eager"),
        _row("nccl", 1 << 16, 12.0, backend="nccl", params={}, options={})]}))
    assert main(["compare", str(f), "-t", "h200x4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    got = {b["label"]: b for b in out["bands"]}
    assert set(got) == {"hiercoll plans, graph, < 1 MiB", "hiercoll plans, graph, 1-64 MiB",
                        "hiercoll plans, eager, >= 64 MiB", "NCCL library model, graph, < 1 MiB"}
    by_size = {(r["plan"].split("(")[0], r["mode"], r["nbytes"]): r["ratio"] for r in out["rows"]}
    assert got["hiercoll plans, graph, < 1 MiB"]["geomean_error"] == pytest.approx(
        max(by_size[("direct", "graph", 1 << 16)], 1 / by_size[("direct", "graph", 1 << 16)]) - 1,
        rel=1e-3)
