"""Exports: the NCCL tuner config read back and compared with tuning.json; Chakra traces decoded
and their dependency graph compared with the schedule's."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

import pytest

from hiercoll.cli.main import main
from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.errors import HiercollError
from hiercoll.export import chakra_proto
from hiercoll.export.chakra import SYNC_BYTES, build_traces, trace_files
from hiercoll.export.chakra_proto import decode_stream
from hiercoll.export.nccl_tuner import MAX_LINE, parse_tuner_config, render, select_tables
from hiercoll.plan_file import save_plan
from hiercoll.planner.registry import plan
from hiercoll.planner.search.autopick import TuningEntry, TuningFile, TuningTable, write_tuning
from hiercoll.planner.search.candidates import _flows
from hiercoll.schedule import OpKind, predecessor_map
from hiercoll.topology import load_topology
from tests.helpers import small_topology


# ---- NCCL tuner ----------------------------------------------------------------------------------
def _random_table(rng: random.Random, kind: Kind = Kind.ALL_REDUCE, dtype: str = "bf16",
                  fingerprint: str = "f" * 16) -> TuningTable:
    cuts = sorted(rng.sample(range(1, 1 << 30), rng.randint(1, 7)))
    bounds = [0, *cuts, 2**62]
    entries = []
    for lo, hi in zip(bounds, bounds[1:]):
        algo = rng.choice(["ring", "hier", "direct", "two_shot", "nccl"])
        params = {} if algo == "nccl" else {"chunks": rng.choice([1, 2, 4]), "channels": rng.choice([1, 2, 8, 16])}
        entries.append(TuningEntry(min_bytes=lo if lo == 0 else lo + 1, max_bytes=hi, algorithm=algo, params=params))
    return TuningTable(topology_fingerprint=fingerprint, topology="t", collective=kind, dtype=dtype, entries=entries)


@pytest.mark.parametrize("kind", [Kind.ALL_REDUCE, Kind.ALL_GATHER, Kind.REDUCE_SCATTER])
def test_tuner_config_reads_back_as_the_tuning_table(kind):
    rng = random.Random()
    table = _random_table(rng, kind)
    nodes, ranks = rng.choice([(-1, -1), (2, 16), (4, 32)])
    text = render([table], nodes, ranks, "tuning.json")
    lines = parse_tuner_config(text)
    rings = [e for e in table.entries if e.algorithm == "ring"]
    name = {Kind.ALL_REDUCE: "allreduce", Kind.ALL_GATHER: "allgather", Kind.REDUCE_SCATTER: "reducescatter"}[kind]
    assert [(x.collective, x.min_bytes, x.max_bytes, x.algorithm, x.protocol, x.channels, x.nodes, x.ranks)
            for x in lines] == [(name, e.min_bytes, e.max_bytes, "ring", "simple", e.params["channels"], nodes, ranks)
                                for e in rings]
    comments = [ln for ln in text.splitlines() if ln.startswith("# ") and ln[2:3].isdigit()]
    assert len(comments) == len(table.entries) - len(rings)
    for e, c in zip([e for e in table.entries if e.algorithm != "ring"], comments):
        assert c.startswith(f"# {e.min_bytes}-{e.max_bytes}: ")
        assert (e.algorithm in c) if e.algorithm != "nccl" else "NCCL's own choice" in c


def test_tuner_lines_fit_the_plugins_buffer_and_bad_lines_are_refused():
    table = _random_table(random.Random())
    table.entries[0] = TuningEntry(min_bytes=0, max_bytes=10, algorithm="hier", params={"x" * 40: "y" * 300})
    text = render([table], 2, 16, "t.json")
    assert max(len(ln) for ln in text.splitlines()) <= MAX_LINE
    for bad in ("allreduce,0,10,ring,simple,1,1", "allreduce,0,10,mesh,simple,1,1,8", "x" * 300):
        with pytest.raises(HiercollError):
            parse_tuner_config(bad)


def test_tuner_tables_must_be_one_topology_and_one_dtype():
    rng = random.Random()
    two_dtypes = TuningFile(tables=[_random_table(rng, dtype="bf16"), _random_table(rng, dtype="fp32")])
    with pytest.raises(HiercollError, match="--dtype"):
        select_tables(two_dtypes, None, None, "t.json")
    assert len(select_tables(two_dtypes, None, "fp32", "t.json")) == 1
    two_topos = TuningFile(tables=[_random_table(rng), _random_table(rng, Kind.ALL_GATHER, fingerprint="a" * 16)])
    with pytest.raises(HiercollError, match="-t/--nodes"):
        select_tables(two_topos, None, None, "t.json")
    assert len(select_tables(two_topos, "a" * 16, None, "t.json")) == 1


def test_cli_nccl_tuner(tmp_path, capsys):
    topo = load_topology("dgx-h100", 2)
    table = _random_table(random.Random(), fingerprint=topo.fingerprint())
    tuning = tmp_path / "tuning.json"
    write_tuning(tuning, table)
    out = tmp_path / "nccl_tuner.conf"
    assert main(["export", "nccl-tuner", str(tuning), "-t", "dgx-h100", "-n", "2", "-o", str(out), "--json"]) == 0
    lines = parse_tuner_config(out.read_text())
    assert json.loads(capsys.readouterr().out)["lines"] == len(lines)
    assert all((x.nodes, x.ranks) == (2, 16) for x in lines)
    assert main(["export", "nccl-tuner", str(tuning), "-t", "dgx-h100", "-n", "3"]) == 2
    assert "no tuning table for this topology" in capsys.readouterr().err
    assert main(["export", "nccl-tuner", str(tmp_path / "none.json")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


# ---- Chakra --------------------------------------------------------------------------------------
def _decode_all(files: dict[str, bytes], prefix: str = "hiercoll"):
    out = []
    for r in range(len(files)):
        meta, nodes = decode_stream(files[f"{prefix}.{r}.et"])
        assert meta.version == "0.0.4"
        out.append(nodes)
    return out


def _attr(node, name):
    for a in node.attr:
        if a.name == name:
            return getattr(a, a.WhichOneof("value"))
    return None


def _op_of(node) -> tuple[int, int]:
    r, i = _attr(node, "hiercoll_op").split(".")
    return int(r), int(i)


CASES = [(Kind.ALL_REDUCE, "ring", {"channels": 2}), (Kind.ALL_REDUCE, "hier", {"chunks": 2}),
         (Kind.ALL_REDUCE, "two_shot", {}), (Kind.REDUCE_SCATTER, "hier", {}),
         (Kind.ALL_GATHER, "ring", {}), (Kind.ALL_TO_ALL, "hier", {}), (Kind.ALL_TO_ALL, "direct", {}),
         (Kind.BROADCAST, "direct", {})]


@pytest.mark.parametrize("kind,algo,params", CASES)
def test_chakra_traces_have_the_schedules_dependency_graph(kind, algo, params):
    rng = random.Random()
    topo = small_topology(2, rng.choice([2, 4]))
    nbytes = rng.randint(1, 64) * 4096
    sched = plan(topo, CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="bf16", nbytes=nbytes), algo, params)
    traces = _decode_all(trace_files(sched, topo))
    assert len(traces) == topo.world_size
    # every send has exactly one receive: same (src, dst, tag), same size, on the right ranks
    sends, recvs = {}, {}
    for rank, nodes in enumerate(traces):
        ids = [n.id for n in nodes]
        assert ids == list(range(1, len(nodes) + 1))
        for n in nodes:
            assert all(d < n.id for d in n.data_deps)          # written in dependency order
            assert _attr(n, "is_cpu_op") is False
            key = (_attr(n, "comm_src"), _attr(n, "comm_dst"), _attr(n, "comm_tag"))
            if n.type == chakra_proto.NODE_TYPES["COMM_SEND_NODE"]:
                assert key[0] == rank and key not in sends
                sends[key] = (rank, n)
            elif n.type == chakra_proto.NODE_TYPES["COMM_RECV_NODE"]:
                assert key[1] == rank and key not in recvs
                recvs[key] = (rank, n)
    assert sends.keys() == recvs.keys()
    assert all(_attr(sends[k][1], "comm_size") == _attr(recvs[k][1], "comm_size") for k in sends)
    # op-level graph: local data deps + send->recv edges between nodes of different ops
    edges = set()
    for nodes in traces:
        by_id = {n.id: n for n in nodes}
        for n in nodes:
            for d in n.data_deps:
                a, b = _op_of(by_id[d]), _op_of(n)
                if a != b:
                    edges.add((a, b))
    for k, (_, s) in sends.items():
        a, b = _op_of(s), _op_of(recvs[k][1])
        if a != b:
            edges.add((a, b))
    preds = predecessor_map(sched)
    assert edges == {(p, o) for o, ps in preds.items() for p in ps}
    # every op is in the traces, and the data moved between ranks is what the ops move
    seen_ops = {_op_of(n) for nodes in traces for n in nodes}
    assert seen_ops == set(preds)
    isz = sched.spec.dtype.itemsize
    want = defaultdict(int)
    for op in sched.ops():
        flows = _flows(op, op.rank)
        sizes = ([op.dst.count] if op.kind == OpKind.COPY else [s.count for s in op.srcs] + [op.dst.count])
        for (a, b), count in zip(flows, sizes):
            if a != b:
                want[(a, b)] += count * isz
    got = defaultdict(int)
    for (a, b, tag), (_, s) in sends.items():
        if _attr(recvs[(a, b, tag)][1], "hiercoll_sync") is None:
            got[(a, b)] += _attr(s, "comm_size")
        else:
            assert _attr(s, "comm_size") == SYNC_BYTES
    assert dict(got) == dict(want)


def test_chakra_reduce_has_compute_nodes_and_durations():
    topo = small_topology(1, 4)
    sched = plan(topo, CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=4, dtype="fp32", nbytes=1 << 20), "two_shot", {})
    nodes = [n for ns in build_traces(sched, topo) for n in ns]
    comps = [n for n in nodes if n.type == chakra_proto.NODE_TYPES["COMP_NODE"]]
    assert comps and all(n.duration_micros >= 1 and _attr(n, "tensor_size") > 0 for n in comps)
    reduces = [n for n in comps if n.name.startswith("reduce")]
    assert reduces and all(_attr(n, "num_ops") > 0 for n in reduces)


def test_cli_chakra(tmp_path, capsys):
    topo = load_topology("dgx-h100", 2)
    sched = plan(topo, CollectiveSpec(kind=Kind.ALL_REDUCE, world_size=16, dtype="bf16", nbytes=1 << 20), "hier", {})
    p = tmp_path / "plan.json"
    save_plan(p, sched, topo)
    out = tmp_path / "traces"
    assert main(["export", "chakra", str(p), "-o", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["ranks"] == 16 and sorted(Path(out).iterdir())[0].name.endswith(".et")
    assert len(_decode_all({f.name: f.read_bytes() for f in out.iterdir()})) == 16
    assert main(["export", "chakra", str(p), "-o", str(p)]) == 2
    assert "is a file" in capsys.readouterr().err
    lib = tmp_path / "lib.json"
    assert main(["plan", "-t", "dgx-h100", "-n", "2", "-c", "all_reduce", "-b", "1MiB", "-a", "nccl", "-o", str(lib)]) == 0
    capsys.readouterr()
    assert main(["export", "chakra", str(lib), "-o", str(out)]) == 2
    assert "library call" in capsys.readouterr().err


def test_missing_protobuf_is_one_line(monkeypatch):
    import sys
    chakra_proto.messages.cache_clear()
    monkeypatch.setitem(sys.modules, "google.protobuf", None)
    try:
        with pytest.raises(HiercollError, match=r"hiercoll\[export\]"):
            chakra_proto.messages()
    finally:
        monkeypatch.undo()
        chakra_proto.messages.cache_clear()


def test_tuner_config_gives_nccl_its_best_where_hiercoll_would_run_its_own_plan():
    """The README's 16-node example wrote nothing (every pick was hiercoll's, so every range was
    a comment). With the topology known, each such range carries NCCL's best by the library
    model, after a comment saying so; ring picks keep their own line."""
    table = _random_table(random.Random())
    asked: list[tuple[Kind, int]] = []

    def best(kind: Kind, nbytes: int) -> tuple[str, int]:
        asked.append((kind, nbytes))
        return ("tree" if nbytes < 1 << 20 else "ring"), 8
    text = render([table], 2, 16, "tuning.json", best)
    lines = parse_tuner_config(text)
    assert [(x.min_bytes, x.max_bytes) for x in lines] == [(e.min_bytes, e.max_bytes) for e in table.entries]
    for e, x in zip(table.entries, lines):
        if e.algorithm == "ring":
            assert (x.algorithm, x.channels) == ("ring", e.params["channels"])
        else:
            assert x.algorithm in ("tree", "ring") and x.channels == 8 and x.protocol == "simple"
    assert len(asked) == sum(e.algorithm != "ring" for e in table.entries)
    assert all(e.min_bytes <= n <= max(e.max_bytes, 4 * e.min_bytes)
               for (_, n), e in zip(asked, [e for e in table.entries if e.algorithm != "ring"]))
    assert "calibrated library model" in text


def test_cli_nccl_tuner_writes_a_line_for_every_range_when_all_picks_are_hiercolls(tmp_path, capsys):
    topo = load_topology("dgx-h100", 2)
    entries = [TuningEntry(min_bytes=0, max_bytes=1 << 20, algorithm="rd", params={}),
               TuningEntry(min_bytes=(1 << 20) + 1, max_bytes=1 << 62, algorithm="hier", params={})]
    table = TuningTable(topology_fingerprint=topo.fingerprint(), topology="t",
                        collective=Kind.ALL_REDUCE, dtype="bf16", entries=entries)
    tuning = tmp_path / "tuning.json"
    write_tuning(tuning, table)
    out = tmp_path / "nccl_tuner.conf"
    assert main(["export", "nccl-tuner", str(tuning), "-t", "dgx-h100", "-n", "2", "-o", str(out)]) == 0
    lines = parse_tuner_config(out.read_text())
    assert len(lines) == 2 and {x.algorithm for x in lines} <= {"ring", "tree"}
    assert all(x.channels == 8 for x in lines)
