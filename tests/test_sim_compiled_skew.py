"""A skewed MoE dispatch on the compiled core against the Python engine: the flows into a hot
expert's rank share its ingress, so one max-min problem holds most flows at once and is filled
by heap, where the compiled core leaves one-flow links (a flow's own NIC and PCIe hops) out of
the heap until the filling reaches them (issue 29's 1024-rank rows). The two engines must still
give the same op times, to the bit where the problems are filled the same way."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hiercoll as hc
from hiercoll.sim import fluid
from hiercoll.workloads import moe
from tests.test_sim_compiled import assert_same, both

pytest.importorskip("numba")


def zipf_dispatch(topo: hc.Topology, tokens: int, topk: int, s: float = 1.2) -> hc.CollectiveSpec:
    """bench/sim_whatif.py's router in small: top-k distinct experts a token, one expert a
    rank, expert e drawn with weight 1/(e+1)^s, the hot ones on random ranks (seeded)."""
    w = topo.world_size
    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, w + 1) ** s
    p = p[rng.permutation(w)]
    p /= p.sum()
    router = [np.stack([rng.choice(w, size=topk, replace=False, p=p) for _ in range(tokens)])
              for _ in range(w)]
    lay = moe.layout(router, w, w, topo.gpus_per_node)
    return moe.spec_for(lay, 7168, "bf16", "dispatch")


class HeapProblems:
    """Counts, over the Python engine's heap fillings, the problems with a one-flow link and
    those where such a link binds its flow (the compiled core brings those links in late)."""

    def __init__(self) -> None:
        self.with_one_flow_links = 0
        self.one_flow_link_binds = 0

    def wrap(self, fill: Any) -> Any:
        def counting(members: Any, weight_sum: dict[int, float], cap: list[float]) -> Any:
            start = dict(weight_sum)
            rates = fill(members, weight_sum, cap)
            alone = [lid for lid, fs in members.items() if len(fs) == 1]
            self.with_one_flow_links += bool(alone)
            self.one_flow_link_binds += any(
                rates[next(iter(members[lid]))] == cap[lid] / start[lid] for lid in alone)
            return rates
        return counting


@pytest.mark.parametrize("algo", ["direct", "hier"])
def test_skewed_dispatch_matches_the_python_engine(algo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    topo = hc.load_topology("h100-rail-3tier", 16)
    sched = hc.plan(topo, zipf_dispatch(topo, tokens=32, topk=8), algo)
    seen = HeapProblems()
    monkeypatch.setattr(fluid, "_fill_by_heap", seen.wrap(fluid._fill_by_heap))
    py, fast = both(sched, topo)
    assert_same(py, fast)
    assert fast.time_us == py.time_us and dict(fast.op_end) == dict(py.op_end)   # to the bit
    assert seen.with_one_flow_links > 0
    if algo == "direct":     # every flow into the hot ranks at once: thousands of problems
        assert seen.one_flow_link_binds > 100
