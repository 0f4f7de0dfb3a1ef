"""Random plans for the simulator engines' property tests (compiled core against the Python
engine, rounding): one set of hypothesis strategies and one way to turn a draw into a plan, so
the tests that compare engines draw from the same space.

Use: `@given(**small_plans(1 << 16))` with `small_plan(draw)`, or `@given(**PRESET_PLANS)` with
`preset_plan(draw)`, where `draw` is the test's keyword arguments."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

import hiercoll as hc
from hiercoll.collectives import Kind
from hiercoll.planner import algorithms, applicable
from hiercoll.schedule import Schedule
from hiercoll.topology import Topology
from tests.helpers import small_topology
from tests.test_planner_flat import make_spec

MODES = st.sampled_from(["exact", "auto"])


def small_plans(max_elems: int) -> dict[str, Any]:
    """Strategies of a small topology (up to 4 x 4 GPUs, three fabrics), any collective, a size
    up to `max_elems` elements, chunks and channels, a simulation mode."""
    return {"nodes": st.integers(1, 4), "gpus": st.integers(1, 4),
            "fabric": st.sampled_from(["nvswitch", "mesh", "pcie"]),
            "kind": st.sampled_from(list(Kind)), "elems": st.integers(0, max_elems),
            "chunks": st.integers(1, 3), "channels": st.integers(1, 2), "mode": MODES,
            "seed": st.integers(0, 10**6), "data": st.data()}


PRESET_PLANS: dict[str, Any] = {
    "preset": st.sampled_from(["dgx-h100", "h200x4", "h100-rail-3tier", "pcie-8gpu", "mi300x"]),
    "nodes": st.integers(1, 3),
    "kind": st.sampled_from([Kind.ALL_REDUCE, Kind.ALL_GATHER, Kind.REDUCE_SCATTER,
                             Kind.ALL_TO_ALL, Kind.GROUP_CAST]),
    "log_bytes": st.integers(10, 28), "mode": MODES, "seed": st.integers(0, 10**6),
    "data": st.data()}


def small_plan(draw: dict[str, Any]) -> tuple[Topology, Schedule]:
    """A `small_plans` draw as (topology, plan): an applicable algorithm, the chunks and
    channels it takes."""
    topo = small_topology(draw["nodes"], draw["gpus"], kind=draw["fabric"])
    spec = make_spec(draw["kind"], topo.world_size, draw["elems"], "bf16", draw["seed"])
    algo = draw["data"].draw(st.sampled_from(applicable(topo, spec)))
    fields = algorithms()[algo].Params.model_fields
    params = {k: draw[k] for k in ("chunks", "channels") if k in fields}
    return topo, hc.plan(topo, spec, algo, params)


def preset_plan(draw: dict[str, Any]) -> tuple[Topology, Schedule]:
    """A `PRESET_PLANS` draw as (topology, plan) with the algorithm's default parameters."""
    topo = hc.load_topology(draw["preset"], draw["nodes"])
    spec = make_spec(draw["kind"], topo.world_size, (1 << draw["log_bytes"]) // 2, "bf16",
                     draw["seed"])
    algo = draw["data"].draw(st.sampled_from(applicable(topo, spec)))
    return topo, hc.plan(topo, spec, algo, {})
