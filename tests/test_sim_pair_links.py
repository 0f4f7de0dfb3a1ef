"""`copy_links_batch` (sim/pair_links.py) against `copy_links` pair by pair: the same links,
weights, latencies, and the network's links made in the same order (so link ids agree), on
one-switch fabrics with and without oversubscription, folded, under LL's wire factor, with
self-copies and repeated pairs; None where paths are not per-GPU halves."""

from __future__ import annotations

import numpy as np
import pytest

from hiercoll.sim.engine import copy_links
from hiercoll.sim.links import Network
from hiercoll.sim.pair_links import copy_links_batch
from hiercoll.topology import load_topology


def _oversubscribed(nodes: int):  # type: ignore[no-untyped-def]
    t = load_topology("dgx-h100", nodes)
    assert t.inter is not None
    return t.model_copy(update={"inter": t.inter.model_copy(update={"oversubscription": 3.0})})


@pytest.mark.parametrize("make", [lambda: load_topology("dgx-h100", 3), lambda: _oversubscribed(4),
                                  lambda: load_topology("h200x4", None)])
@pytest.mark.parametrize("fold", [None, 8])
@pytest.mark.parametrize("wire", [1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_batch_equals_copy_links_pair_by_pair(make, fold, wire, seed):
    topo = make()
    w = topo.world_size
    rng = np.random.default_rng(seed)
    k = 3 * w
    a = rng.integers(0, w, k).astype(np.int64)
    b = rng.integers(0, w, k).astype(np.int64)
    a[:3], b[:3] = [0, 1, 1], [0, 1, 1]          # self copies, and a pair asked twice
    one, many = (Network(topo, fold=fold, itemsize=2, wire_factor=wire) for _ in range(2))
    want = [copy_links(one, int(x), int(y)) for x, y in zip(a, b)]
    got = copy_links_batch(many, a, b)
    assert got is not None
    ptr, lid, wt, lat = got
    for i, (links, latency) in enumerate(want):
        row = tuple(zip(lid[ptr[i]:ptr[i + 1]].tolist(), wt[ptr[i]:ptr[i + 1]].tolist()))
        assert row == links and lat[i] == latency
    assert [x.name for x in many.links] == [x.name for x in one.links]
    assert many.links == one.links


def test_a_tiered_fabric_is_not_halves():
    net = Network(load_topology("h100-rail-3tier", 64))
    assert copy_links_batch(net, np.array([0]), np.array([9])) is None
