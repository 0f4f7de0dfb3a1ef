"""Rounding-sized changes in both engines: every max-min rate scaled by 1 +- 1e-13 (the Python
engine's `fluid.max_min_rates` wrapped as bench/sim_rounding.py wraps it, the compiled core's
`replay(rate_scale=)`).

Where flows do not queue behind each other through long chains of shared links, such a change
moves every time by about itself, in both engines, and the engines move alike; chains in
lockstep stay in lockstep (events within fluid.INSTANT_RTOL are one instant). On a contended
fabric it grows from step to step, which is the simulator's model, not its arithmetic (the fluid
model's instability: docs/simulator.md, "Known limits"); the last test pins that too, so the
documented limit and its bench stay true."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import hiercoll as hc
from hiercoll.collectives import Kind
from hiercoll.schedule import Schedule
from hiercoll.sim import fluid, simulate
from hiercoll.sim.result import SimResult
from tests.helpers import small_topology
from tests.random_plans import PRESET_PLANS, preset_plan, small_plan, small_plans
from tests.test_planner_flat import make_spec

pytest.importorskip("numba")

SCALE = 1e-13
REL = 1e-9


@contextmanager
def rates_scaled(scale: float) -> Iterator[None]:
    """Every rate either engine's max-min filling gives, x (1 + scale)."""
    import hiercoll.sim.compiled.core as core
    solve, replay = fluid.max_min_rates, core.replay

    def scaled(*args: Any) -> dict[Any, float]:
        return {f: r * (1 + scale) for f, r in solve(*args).items()}

    def replay_scaled(*args: Any) -> int:
        return int(replay(*args, 1.0 + scale))
    fluid.max_min_rates, core.replay = scaled, replay_scaled   # type: ignore[assignment]
    try:
        yield
    finally:
        fluid.max_min_rates, core.replay = solve, replay   # type: ignore[assignment]


def runs(schedule: Schedule, topo: hc.Topology, mode: str = "exact") -> dict[tuple[str, float], SimResult]:
    """(engine, scale) -> result, for both engines, unscaled and x (1 +- SCALE)."""
    out = {}
    for scale in (0.0, SCALE, -SCALE):
        with rates_scaled(scale):
            for engine in ("python", "compiled"):
                out[engine, scale] = simulate(schedule, topo, mode=mode, engine=engine)  # type: ignore[arg-type]
    return out


def spread(results: list[SimResult]) -> float:
    times = [r.time_us for r in results]
    return (max(times) - min(times)) / times[0] if times[0] else 0.0


def assert_close(a: SimResult, b: SimResult, rel: float = REL) -> None:
    assert b.time_us == pytest.approx(a.time_us, rel=rel, abs=1e-9)
    for ref, t in a.op_end.items():
        assert b.op_end[ref] == pytest.approx(t, rel=rel, abs=1e-9), ref
        assert b.op_start[ref] == pytest.approx(a.op_start[ref], rel=rel, abs=1e-9), ref


def plan(topo: hc.Topology, kind: str, algo: str, nbytes: int) -> Schedule:
    spec = hc.CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="bf16", nbytes=nbytes)
    return hc.plan(topo, spec, algo)


def test_the_scaling_reaches_both_engines() -> None:
    """A run of large copies moves by about the scaling in both engines (not by nothing: a hook
    that no longer reached the rates would make every test here pass vacuously)."""
    topo = hc.load_topology("dgx-h100", 1)
    res = runs(plan(topo, "all_reduce", "ring", 64 << 20), topo)
    for engine in ("python", "compiled"):
        base = res[engine, 0.0].time_us
        assert base == res["python", 0.0].time_us
        for scale in (SCALE, -SCALE):
            moved = (res[engine, scale].time_us - base) / base
            assert 0.5 < moved / -scale < 1.5, (engine, scale, moved)   # faster rates: sooner


def assert_moves_by_the_scaling_only(res: dict[tuple[str, float], SimResult]) -> None:
    """Each engine's times under rates x (1 +- SCALE) within 1e-9 of its own unscaled times,
    and the two engines equal under each scaling."""
    for engine in ("python", "compiled"):
        for scale in (SCALE, -SCALE):
            assert_close(res[engine, 0.0], res[engine, scale])
    for scale in (0.0, SCALE, -SCALE):
        assert_close(res["python", scale], res["compiled", scale])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**small_plans(1 << 20))
def test_small_random_plans_move_by_the_scaling_only(**draw: Any) -> None:
    """Random small topologies and plans: rates x (1 +- 1e-13) move no op's start or end by more
    than a relative 1e-9, in either engine, and both engines give the same times under the same
    scaling."""
    topo, s = small_plan(draw)
    assert_moves_by_the_scaling_only(runs(s, topo, draw["mode"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**PRESET_PLANS)
def test_random_plans_on_presets_move_by_the_scaling_only(**draw: Any) -> None:
    """Presets bring fabric tiers, calibrated per-op engine caps and shared copy engines."""
    topo, s = preset_plan(draw)
    assert_moves_by_the_scaling_only(runs(s, topo, draw["mode"]))


def test_chains_in_lockstep_stay_together() -> None:
    """49 GPUs behind PCIe: a hierarchical reduce-scatter's chains run in lockstep, their events
    rounding apart. A chain whose op starts a rounding earlier has its link alone that long and
    ends ~6 times as far ahead; taken as separate instants, 1e-13 on the rates became 6e-9 on an
    op's end. Events within INSTANT_RTOL are one instant now: the chains start together again."""
    topo = small_topology(7, 7, kind="pcie")
    spec = make_spec(Kind.REDUCE_SCATTER, topo.world_size, 213522, "bf16", 0)
    res = runs(hc.plan(topo, spec, "hier"), topo)
    for engine in ("python", "compiled"):
        for scale in (SCALE, -SCALE):
            assert_close(res[engine, 0.0], res[engine, scale], rel=1e-10)


def test_a_contended_fabric_amplifies_alike_in_both_engines() -> None:
    """48 GPUs, 8 a node, leaves of 4 nodes: a hierarchical all-reduce's steps queue behind each
    other on the spine, and a flow that reaches a shared link later makes up what it missed at
    a smaller share, so a rounding-sized change grows step by step (to ~1e-6 here, ~1 % at 512
    GPUs: bench/results/sim_rounding.md). Both engines take the same steps, so they move alike,
    to the bit (the same arithmetic in the same order; an amplifier this strong would show any
    difference). If this stops amplifying, docs/simulator.md's limit is out of date."""
    base = hc.load_topology("h100-rail-3tier", 6)
    data = base.model_dump(mode="json")
    data["gpus_per_node"] = 8
    data["inter"].update(num_nics=8, nic_affinity=list(range(8)))
    data["inter"]["tiers"][0].update(group_size=4, uplinks=4, radix=8)
    topo = type(base).model_validate(data)
    res = runs(plan(topo, "all_reduce", "hier", 64 << 20), topo)
    for scale in (0.0, SCALE, -SCALE):
        assert res["compiled", scale].time_us == res["python", scale].time_us
        assert dict(res["compiled", scale].op_end) == dict(res["python", scale].op_end)
    for engine in ("python", "compiled"):
        assert spread([res[engine, s] for s in (0.0, SCALE, -SCALE)]) > 1e3 * SCALE
