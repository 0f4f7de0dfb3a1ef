"""Incremental max-min (issue 29's 4096-GPU `hier` on the ECMP three-tier fabric): an instant
whose changes provably move no other rate is not re-solved (`FluidNetwork._quiet`), and one
that may is re-solved over only the flows whose rates can move (`FluidNetwork._local`), in both
engines alike. Checked here: the rates after every instant are the max-min fair allocation of
every flow then running (a from-scratch filling), both engines give the same times to the bit
on cases that take every path, and on random small plans and presets; and off (the default),
neither path is taken."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import hiercoll as hc
from hiercoll.sim import fluid
from hiercoll.sim.fluid import FluidNetwork, max_min_rates
from tests.random_plans import PRESET_PLANS, preset_plan, small_plan, small_plans
from tests.test_sim_compiled import assert_same, both

pytest.importorskip("numba")


@pytest.fixture(autouse=True)
def local_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The paths are opt-in ($HIERCOLL_SIM_LOCAL=1): on for every test here."""
    monkeypatch.setenv(fluid.LOCAL_ENV, "1")


def two_pods(nodes: int = 8) -> hc.Topology:
    """h100-rail-3tier in small: 2 GPUs a node, leaves of 2 nodes, pods of 2 leaves, the 7:1
    aggregation tier between pods (nodes / 4 pods)."""
    base = hc.load_topology("h100-rail-3tier", nodes)
    data = base.model_dump(mode="json")
    data["gpus_per_node"] = 2
    data["inter"].update(num_nics=2, nic_affinity=[0, 1])
    data["inter"]["tiers"][0].update(group_size=2, uplinks=2, radix=4)
    data["inter"]["tiers"][1].update(group_size=2, uplinks=2)
    return type(base).model_validate(data)


def plan(topo: hc.Topology, kind: str, algo: str, nbytes: int) -> Any:
    spec = hc.CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="bf16", nbytes=nbytes)
    return hc.plan(topo, spec, algo)


class Paths:
    """Counts the Python engine's instants by path (quiet, local, whole component) and checks
    every instant's rates against a from-scratch max-min filling of every running flow."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, check: bool = True) -> None:
        self.seen: Counter[str] = Counter()
        self.worst = 0.0
        quiet, local, settle = FluidNetwork._quiet, FluidNetwork._local, FluidNetwork.settle
        paths = self

        def quiet_counted(net: FluidNetwork, started: list[fluid.Flow]) -> bool:
            ok = quiet(net, started)
            paths.seen["quiet" if ok else "not quiet"] += 1
            return ok

        def local_counted(net: FluidNetwork, started: list[fluid.Flow], seeds: dict[int, None]) -> bool:
            ok = local(net, started, seeds)
            paths.seen["local" if ok else "whole"] += 1
            return ok

        def settle_checked(net: FluidNetwork) -> None:
            settle(net)
            if check:
                paths.check(net)
        monkeypatch.setattr(FluidNetwork, "_quiet", quiet_counted)
        monkeypatch.setattr(FluidNetwork, "_local", local_counted)
        monkeypatch.setattr(FluidNetwork, "settle", settle_checked)

    def check(self, net: FluidNetwork) -> None:
        flows = list(dict.fromkeys(f for on in net.flows_on for f in on))
        if not flows:
            return
        links = [lid for lid, on in enumerate(net.flows_on) if on]
        want = max_min_rates(flows, links, net.cap)
        for f in flows:
            err = abs(f.rate - want[f]) / want[f]
            self.worst = max(self.worst, err)
            assert err < 1e-6, (f.links, f.rate, want[f])


def test_two_pods_take_every_path_and_match(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hierarchical all-reduce across two pods (flows queue on the oversubscribed tier):
    quiet instants, local re-solves and whole-component ones all occur; every instant's rates
    are max-min fair; the compiled core gives the same times to the bit."""
    topo = two_pods()
    paths = Paths(monkeypatch)
    py, fast = both(plan(topo, "all_reduce", "hier", 16 << 20), topo)
    assert_same(py, fast)
    assert fast.time_us == py.time_us and dict(fast.op_end) == dict(py.op_end)
    assert paths.seen["quiet"] > 0 and paths.seen["local"] > 0, paths.seen


def test_both_engines_take_the_same_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled core counts its instants by path (`compiled.LAST_COUNTS`): as many quiet,
    local and whole re-solves as the Python engine takes; on the two-pod fabric, where every
    link of the oversubscribed tier is near full, the local sets grow only along the rates that
    change, so no instant falls back to its whole component and a set is a few flows."""
    from hiercoll.sim import compiled
    topo = two_pods(16)
    paths = Paths(monkeypatch, check=False)
    py, fast = both(plan(topo, "all_reduce", "hier", 16 << 20), topo)
    assert fast.time_us == py.time_us and dict(fast.op_end) == dict(py.op_end)
    c = compiled.LAST_COUNTS
    assert (c["quiet"], c["local"], c["whole"]) == (paths.seen["quiet"], paths.seen["local"], paths.seen["whole"])
    assert c["local"] > 100 and c["whole"] == 0
    assert c["local_rounds"] < 1.1 * c["local"] and c["local_flows"] < 12 * c["local_rounds"]


def test_a_stale_wake_up_opens_no_instant(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the local re-solve a wake-up whose flow's rate changed since it was set is dropped
    when it reaches the top of the clock (`EventClock.void`): it never opens an instant that
    would pull a live event within INSTANT_RTOL back to its time. Every instant opens at a
    live event."""
    opened: list[bool] = []
    run = fluid.EventClock.run

    def watching(clock: fluid.EventClock, settle: Any, tick: Any = None) -> None:
        assert clock.void is not None
        void = clock.void

        def seen(fn: Any, arg: Any) -> bool:
            out = void(fn, arg)
            opened.append(out)
            return out
        clock.void = seen
        run(clock, settle, tick)
    monkeypatch.setattr(fluid.EventClock, "run", watching)
    topo = two_pods()
    hc.simulate(plan(topo, "all_reduce", "hier", 16 << 20), topo, mode="exact", engine="python")
    assert any(opened) and not all(opened)


@pytest.mark.parametrize("algo", ["ring", "direct", "rhd"])
def test_two_pods_other_algorithms(algo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    topo = two_pods()
    paths = Paths(monkeypatch)
    py, fast = both(plan(topo, "all_reduce", algo, 4 << 20), topo)
    assert_same(py, fast)
    assert fast.time_us == py.time_us and dict(fast.op_end) == dict(py.op_end)
    assert sum(paths.seen.values()) > 0


def test_a_local_solve_that_grows_past_its_rounds_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no round allowed, every loud instant re-solves its whole component (the compiled
    core reads LOCAL_ROUNDS when compiled, so only the Python engine is run here): still max-min."""
    monkeypatch.setattr(fluid, "LOCAL_ROUNDS", 0)
    topo = two_pods()
    paths = Paths(monkeypatch)
    hc.simulate(plan(topo, "all_reduce", "hier", 4 << 20), topo, mode="exact", engine="python")
    assert paths.seen["whole"] > 0 and paths.seen["local"] == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(**small_plans(1 << 16))
def test_random_small_plans_are_max_min_and_match(monkeypatch: pytest.MonkeyPatch, **draw: Any) -> None:
    topo, s = small_plan(draw)
    with monkeypatch.context() as m:
        Paths(m)
        assert_same(*both(s, topo, draw["mode"]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(**PRESET_PLANS)
def test_random_preset_plans_are_max_min_and_match(monkeypatch: pytest.MonkeyPatch, **draw: Any) -> None:
    """Presets bring crowded (shared copy-engine) links, whose capacity changes re-solve."""
    topo, s = preset_plan(draw)
    with monkeypatch.context() as m:
        Paths(m)
        assert_same(*both(s, topo, draw["mode"]))


def test_off_by_default_neither_path_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without $HIERCOLL_SIM_LOCAL both engines re-solve and settle whole components, as every
    committed result was made: the same times as with the paths on up to rounding, none taken."""
    topo = two_pods()
    s = plan(topo, "all_reduce", "hier", 1 << 22)
    on = hc.simulate(s, topo, mode="exact", engine="python").time_us  # type: ignore[arg-type]
    monkeypatch.delenv(fluid.LOCAL_ENV)
    paths = Paths(monkeypatch, check=False)
    py, fast = both(s, topo)
    assert_same(py, fast)
    assert paths.seen["quiet"] + paths.seen["not quiet"] + paths.seen["local"] + paths.seen["whole"] == 0
    assert py.time_us == pytest.approx(on, rel=1e-6)
