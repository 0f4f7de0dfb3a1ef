import dataclasses
import json

import pytest

import hiercoll as hc
from hiercoll.errors import HiercollError, ScheduleError
from hiercoll.plan_file import load_plan, plan_from_dict, plan_to_json, save_plan
from hiercoll.schedule import ExpandedOps, Schedule, Transport, validate_structure
from hiercoll.schedule_io import parse_expanded
from tests.helpers import small_topology


def _plan(kind="all_reduce", algo="ring", nodes=2, gpus=2, nbytes=4 * 30, **params):
    topo = small_topology(nodes, gpus)
    spec = hc.CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="fp32", nbytes=nbytes)
    return topo, hc.plan(topo, spec, algo, params)


def test_json_round_trip_is_exact():
    topo, s = _plan(chunks=2)
    text = s.to_json()
    back = parse_expanded(json.loads(text))
    assert back == s and back.to_json() == text and back.digest() == s.digest()


def test_plan_file_expanded_and_recipe(tmp_path):
    topo, s = _plan("reduce_scatter", "direct", chunks=3)
    for form in ("expanded", "recipe"):
        path = tmp_path / f"{form}.json"
        save_plan(path, s, topo, form)
        plan = load_plan(path)
        assert plan.topology == topo and plan.schedule == s
    assert (tmp_path / "recipe.json").stat().st_size < (tmp_path / "expanded.json").stat().st_size


def test_transport_is_derived_from_topology():
    _, s = _plan("all_gather", "direct", nodes=2, gpus=2)
    by_dst = {(op.srcs[0].rank, op.dst.rank): op.transport for op in s.ops()}
    assert by_dst[(0, 0)] == Transport.LOCAL
    assert by_dst[(0, 1)] == Transport.INTRA
    assert by_dst[(0, 2)] == Transport.INTER


def test_lazy_rank_ops_match_expanded():
    _, s = _plan("all_reduce", "ring", nodes=4, gpus=2, chunks=2)
    e = s.expand()
    assert all(list(s.rank_ops(r)) == list(e.rank_ops(r)) for r in range(s.world_size))


def _mutate(s: Schedule, rank: int, index: int, **changes) -> Schedule:
    e = s.expand()
    ops = [list(e.rank_ops(r)) for r in range(e.world_size)]
    ops[rank][index] = dataclasses.replace(ops[rank][index], **changes)
    src = ExpandedOps(tuple(tuple(o) for o in ops), tuple(e.buffers(r) for r in range(e.world_size)))
    return Schedule(e.meta, src)


def test_structural_errors_name_the_op():
    _, s = _plan("all_reduce", "ring")
    op = s.rank_ops(1)[2]
    with pytest.raises(ScheduleError, match=r"op 1\.2: depends on 7\.0, which does not exist"):
        validate_structure(_mutate(s, 1, 2, deps=((7, 0),)))
    bad_dst = dataclasses.replace(op.dst, offset=10**6)
    with pytest.raises(ScheduleError, match=r"op 1\.2: region .* outside buffer"):
        validate_structure(_mutate(s, 1, 2, dst=bad_dst))
    later = len(s.rank_ops(0)) - 1
    with pytest.raises(ScheduleError, match=r"on a dependency cycle"):
        validate_structure(_mutate(s, 0, 0, deps=((0, later),)))
    with pytest.raises(ScheduleError, match=r"writes the input buffer"):
        validate_structure(_mutate(s, 1, 2, dst=dataclasses.replace(op.dst, buffer="input", offset=0)))


def test_bad_plan_files(tmp_path):
    topo, s = _plan()
    data = json.loads(plan_to_json(s, topo))
    data["ranks"][0]["ops"][0]["id"] = "0.5"
    with pytest.raises(ScheduleError, match=r"op 0\.5: at position 0 of rank 0, id should be 0\.0"):
        plan_from_dict(data)
    data = json.loads(plan_to_json(s, topo))
    data["ranks"][1]["ops"][0]["kind"] = "blend"
    with pytest.raises(ScheduleError, match=r"ranks\.1\.ops\.0\.kind"):
        plan_from_dict(data)
    data = json.loads(plan_to_json(s, topo))
    data["topology"]["gpus_per_node"] = 3
    with pytest.raises(HiercollError, match="fingerprint"):
        plan_from_dict(data)
    with pytest.raises(HiercollError, match="not a hiercoll plan"):
        plan_from_dict({"hello": 1})
