"""The compiled simulator core against the Python engine, its oracle: the same op start and end
times (to a relative 1e-9; both walk flows and links in insertion order and group events into
the same instants, so on these cases they agree to the bit), the same bytes and busy time on every
link, on hand cases and on random small topologies, plans and sizes."""

from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings

import hiercoll as hc
from hiercoll.errors import HiercollError, VerificationError
from hiercoll.schedule import ExpandedOps, Schedule
from hiercoll.sim import compiled, fluid, simulate
from hiercoll.sim.result import SimResult
from tests.helpers import small_topology
from tests.random_plans import PRESET_PLANS, preset_plan, small_plan, small_plans

pytest.importorskip("numba")

REL = 1e-9


def both(schedule: Schedule, topo: hc.Topology, mode: str = "exact") -> tuple[SimResult, SimResult]:
    """(Python engine's result, compiled core's), the compiled one made to fail rather than fall
    back to the Python engine unnoticed."""
    py = simulate(schedule, topo, mode=mode, engine="python")  # type: ignore[arg-type]
    with mock.patch("hiercoll.sim.simulate.run_timing", side_effect=AssertionError("fell back")):
        fast = simulate(schedule, topo, mode=mode, engine="compiled")  # type: ignore[arg-type]
    return py, fast


def assert_same(py: SimResult, fast: SimResult) -> None:
    assert fast.time_us == pytest.approx(py.time_us, rel=REL, abs=1e-9)
    assert fast.op_start.keys() == py.op_start.keys() and fast.op_end.keys() == py.op_end.keys()
    for ref, t in py.op_end.items():
        assert fast.op_end[ref] == pytest.approx(t, rel=REL, abs=1e-9), ref
        assert fast.op_start[ref] == pytest.approx(py.op_start[ref], rel=REL, abs=1e-9), ref
    assert [l.name for l in fast.links] == [l.name for l in py.links]
    for a, b in zip(py.links, fast.links):
        assert b.bytes == pytest.approx(a.bytes, rel=1e-12, abs=1e-6), a.name
        assert b.busy_us == pytest.approx(a.busy_us, rel=REL, abs=1e-9), a.name
    assert (fast.bytes_intra, fast.bytes_inter, fast.num_ops) == pytest.approx(
        (py.bytes_intra, py.bytes_inter, py.num_ops), rel=1e-12)
    assert fast.shortcut == py.shortcut


def plan(topo: hc.Topology, kind: str, algo: str, nbytes: int, **params: int) -> Schedule:
    spec = hc.CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="bf16", nbytes=nbytes)
    return hc.plan(topo, spec, algo, params)


@pytest.mark.parametrize("preset,nodes,algo,nbytes,mode", [
    ("dgx-h100", 2, "ring", 64 << 20, "exact"),
    ("dgx-h100", 2, "direct", 1 << 20, "exact"),
    ("dgx-h100", 2, "hier", 256 << 20, "exact"),
    ("dgx-h100", 2, "hier", 256 << 20, "auto"),          # folded: deps onto representatives
    ("dgx-h100", 4, "rhd", 32 << 20, "exact"),
    ("h200x4", 1, "ring", 256 << 20, "exact"),           # calibrated: per-op SM caps, copy engines
    ("h200x4", 1, "direct", 256 << 20, "exact"),         # shared copy engines (crowded links)
    ("h200x4", 2, "hier", 64 << 20, "exact"),
    ("h100-rail-3tier", 2, "ring", 16 << 20, "exact"),   # fabric tiers, ECMP ports
    ("pcie-8gpu", 2, "ring", 8 << 20, "exact"),
    ("mi300x", 1, "direct", 8 << 20, "exact"),
])
def test_hand_cases_match_the_python_engine(preset: str, nodes: int, algo: str, nbytes: int, mode: str) -> None:
    topo = hc.load_topology(preset, nodes)
    py, fast = both(plan(topo, "all_reduce", algo, nbytes), topo, mode)
    assert_same(py, fast)


def test_zero_bytes_and_tiny_sizes_match() -> None:
    topo = hc.load_topology("dgx-h100", 2)
    for nbytes in (0, 2, 4096):
        assert_same(*both(plan(topo, "all_reduce", "ring", nbytes), topo))


def test_heap_filling_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hierarchical all-reduce across a three-tier fabric re-solves components of more than
    HEAP_ABOVE_LINKS links, which both engines fill by heap."""
    heap_fills = []
    real = fluid._fill_by_heap

    def counting(*args: object) -> object:
        heap_fills.append(1)
        return real(*args)  # type: ignore[arg-type]
    monkeypatch.setattr(fluid, "_fill_by_heap", counting)
    topo = hc.load_topology("h100-rail-3tier", 4)
    assert_same(*both(plan(topo, "all_reduce", "hier", 16 << 20), topo))
    assert heap_fills


@pytest.mark.parametrize("deps", [((1, 0),), ((0, 99),), ((7, 0),)])
def test_a_deadlock_is_reported_as_the_python_engine_reports_it(deps: tuple[tuple[int, int], ...]) -> None:
    """A cycle, an op past the end of its rank, a rank that does not exist: each waits forever."""
    topo = small_topology(1, 2)
    s = plan(topo, "all_reduce", "ring", 4096).expand()
    assert isinstance(s.source, ExpandedOps)
    ops = [list(r) for r in s.source.ops]
    ops[0][0] = dataclasses.replace(ops[0][0], deps=deps)
    ops[1][0] = dataclasses.replace(ops[1][0], deps=((0, 0),))
    stuck = Schedule(s.meta, ExpandedOps(tuple(map(tuple, ops)), s.source.buffers))
    messages = []
    for engine in ("python", "compiled"):
        with pytest.raises(VerificationError, match="deadlock") as err:
            simulate(stuck, topo, mode="exact", engine=engine)  # type: ignore[arg-type]
        messages.append(str(err.value))
    assert messages[0] == messages[1]


def test_a_growing_event_heap_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop returns to have its heap doubled and resumes where it stopped."""
    monkeypatch.setattr(compiled, "heap_start", lambda channels: 2 * channels + 3)
    topo = hc.load_topology("h200x4", 2)
    assert_same(*both(plan(topo, "all_reduce", "hier", 64 << 20), topo))


def test_progress_is_reported_and_ends_at_every_op() -> None:
    topo = hc.load_topology("dgx-h100", 2)
    s = plan(topo, "all_reduce", "ring", 64 << 20, channels=4)
    seen: list[tuple[int, int]] = []
    res = simulate(s, topo, mode="exact", engine="compiled", progress=lambda a, b: seen.append((a, b)))
    assert seen and seen[-1] == (res.num_ops, res.num_ops)
    assert [a for a, _ in seen] == sorted(a for a, _ in seen)


def test_engine_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """auto: compiled from AUTO_MIN_OPS ops with numba, else Python; record traces stay with
    the Python engine; a bad name is one clear error, from the argument or the environment."""
    assert compiled.use_compiled("auto", compiled.AUTO_MIN_OPS, record=False)
    assert not compiled.use_compiled("auto", compiled.AUTO_MIN_OPS - 1, record=False)
    assert not compiled.use_compiled("compiled", 10**9, record=True)
    assert not compiled.use_compiled("python", 10**9, record=False)
    monkeypatch.setenv(compiled.ENGINE_ENV, "compiled")
    assert compiled.use_compiled(None, 1, record=False)
    monkeypatch.setenv(compiled.ENGINE_ENV, "python")
    assert not compiled.use_compiled(None, 10**9, record=False)
    monkeypatch.setenv(compiled.ENGINE_ENV, "fast")
    with pytest.raises(HiercollError, match="HIERCOLL_SIM_ENGINE"):
        compiled.use_compiled(None, 1, record=False)
    with pytest.raises(HiercollError, match="engine 'fast'"):
        compiled.use_compiled("fast", 1, record=False)  # type: ignore[arg-type]
    monkeypatch.setattr(compiled, "numba_available", lambda: False)
    assert not compiled.use_compiled("auto", 10**9, record=False)
    with pytest.raises(HiercollError, match="needs numba"):
        compiled.use_compiled("compiled", 1, record=False)


def test_record_falls_back_to_the_python_engine() -> None:
    topo = hc.load_topology("dgx-h100", 1)
    res = simulate(plan(topo, "all_reduce", "ring", 1 << 20), topo, record=True, engine="compiled")
    assert res.link_record is not None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**small_plans(1 << 16))
def test_random_plans_match_the_python_engine(**draw: Any) -> None:
    topo, s = small_plan(draw)
    assert_same(*both(s, topo, draw["mode"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**PRESET_PLANS)
def test_random_plans_on_presets_match(**draw: Any) -> None:
    """Presets bring what small_topology lacks: calibrated per-op engine caps and shared copy
    engines (h200x4: copies from 8 MiB run on copy engines), fabric tiers, PCIe bridges."""
    topo, s = preset_plan(draw)
    assert_same(*both(s, topo, draw["mode"]))
