"""`hiercoll workload ...` and `hiercoll transpose`: plans from model-level inputs, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

import hiercoll as hc
from hiercoll.plan_file import load_plan
from tests.helpers import run_cli as _hc

TWO_NODES = str(Path(__file__).parents[1] / "bench/gpu/topologies/h200-2node-x2.yaml")


def test_llama3_cp_writes_flat_and_hier_plans_that_verify(tmp_path: Path) -> None:
    proc = _hc("workload", "llama3-cp", "--cu-seqlens", "0,3,9,12,16", "-t", TWO_NODES,
               "--row-bytes", "64", "--dtype", "fp32", "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    methods = {(r["method"], r["algorithm"]) for r in body["rows"]}
    assert {("all_gather", "ring"), ("group_cast", "direct"), ("group_cast", "hier")} <= methods
    cast = {r["algorithm"]: r for r in body["rows"] if r["method"] == "group_cast"}
    gather = {r["algorithm"]: r for r in body["rows"] if r["method"] == "all_gather"}
    # needed-only moves less than gathering everything (16 tokens x 64 B to 3 other ranks)
    assert cast["hier"]["bytes_intra"] + cast["hier"]["bytes_inter"] < \
        gather["ring"]["bytes_intra"] + gather["ring"]["bytes_inter"]
    assert body["layouts"]["shards"][2]["local_k_slice"] == [3, 12]
    for r in body["rows"]:
        loaded = load_plan(r["plan_file"])
        assert hc.verify(loaded.schedule, trials=1).ok
    assert (tmp_path / "workload.png").stat().st_size > 1000
    assert json.loads((tmp_path / "workload.json").read_text())["costs"]


def test_moe_reports_the_rdma_minimum_and_hier_meets_it(tmp_path: Path) -> None:
    proc = _hc("workload", "moe", "--tokens", "16", "--topk", "2", "--experts", "8", "-t",
               TWO_NODES, "--row-bytes", "32", "--dtype", "fp32", "--json")
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    floor = body["layouts"]["min_inter_bytes"]
    rows = {(r["method"], r["algorithm"]): r for r in body["rows"]}
    assert rows[("group_cast", "hier")]["bytes_inter"] == floor
    assert rows[("group_cast", "direct")]["bytes_inter"] >= floor
    assert rows[("group_reduce", "hier")]["bytes_inter"] == floor


def test_transpose_round_trips_and_is_exported(tmp_path: Path) -> None:
    splits = {"ranks": [{"input": [{"size": 2, "peers": [1]}], "output": [{"size": 3, "peers": [1]}]},
                        {"input": [{"size": 3, "peers": [0]}], "output": [{"size": 2, "peers": [0]}]}]}
    src = tmp_path / "cast.yaml"
    src.write_text(yaml.safe_dump(splits))
    out = tmp_path / "reduce.yaml"
    assert _hc("transpose", str(src), "-o", str(out)).returncode == 0
    back = tmp_path / "back.json"
    assert _hc("transpose", str(out), "-o", str(back)).returncode == 0
    assert json.loads(back.read_text()) == hc.GroupSplits.model_validate(splits).model_dump(mode="json")
    reduced = yaml.safe_load(out.read_text())
    assert reduced == hc.transpose(hc.GroupSplits.model_validate(splits)).model_dump(mode="json")


def test_bad_workload_input_is_one_line() -> None:
    for argv in (["workload", "llama3-cp", "--cu-seqlens", "0,3,x", "-t", TWO_NODES],
                 ["workload", "llama3-cp", "--cu-seqlens", "0,3,9,12,17", "-t", TWO_NODES],
                 ["workload", "llama3-cp", "--cu-seqlens", "0,4,8", "-t", TWO_NODES,
                  "--row-bytes", "3"],
                 ["workload", "moe", "--experts", "7", "-t", TWO_NODES]):
        proc = _hc(*argv)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert proc.stderr.startswith("error:") and len(proc.stderr.strip().splitlines()) == 1


def test_attention_dispatch_from_a_mask_file_and_from_cu_seqlens(tmp_path: Path) -> None:
    mask = tmp_path / "mask.yaml"
    mask.write_text("- {q: [0, 8], k: [0, 8], type: causal}\n- {q: [8, 16], k: [0, 16], type: full}\n")
    proc = _hc("workload", "attention", "--mask", str(mask), "--chunk-size", "2", "-t", TWO_NODES,
               "--row-bytes", "64", "--dtype", "fp32", "--json", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    host, remote = body["layouts"]["host_ranges"], body["layouts"]["remote_ranges"]
    for r in range(4):      # zero redundancy: never fetch what is hosted
        hosted = {t for a, b in host[r] for t in range(a, b)}
        assert not hosted & {t for a, b in remote[r] for t in range(a, b)}
    for row in body["rows"]:
        assert hc.verify(load_plan(row["plan_file"]).schedule, trials=1).ok
    cu = _hc("workload", "attention", "--cu-seqlens", "0,3,9,12,16", "--chunk-size", "2", "-t",
             TWO_NODES, "--row-bytes", "64", "--dtype", "fp32", "--json")
    assert cu.returncode == 0 and json.loads(cu.stdout)["layouts"]["imbalance"] >= 1.0
    both = _hc("workload", "attention", "--chunk-size", "2", "-t", TWO_NODES)
    assert both.returncode == 2 and "--mask FILE or --cu-seqlens" in both.stderr
