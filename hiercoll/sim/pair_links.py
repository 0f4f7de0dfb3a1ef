"""`copy_links` for many GPU pairs at once, over arrays.

A dense all-to-all-v of W GPUs has W^2 copies, each between its own pair: asking `copy_links`
pair by pair cost ~6 us each in Python (6.8 of 17 CPU s at 1024 GPUs). Where a copy's path is
its sender's half then its receiver's (`Network.halves_suffice`: one switch, NVSwitch inside
nodes), every pair's links come from per-GPU arrays. The result equals `copy_links` pair by pair,
links in the same order, and the network's links are created in the same order too: the pairs
that first ask for a GPU's HBM or one of its halves are asked through `copy_links` itself, in
order, before the rest are read off the arrays (so link ids, and every float sum over them, are
what the pair-by-pair tables had).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hiercoll.sim.engine import copy_links
from hiercoll.sim.links import Network

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

# what a pair asks of its GPUs, one code per (GPU, role): the sender's and the receiver's HBM
# share a role (one link per GPU)
HBM, INTRA_OUT, INTRA_IN, INTER_OUT, INTER_IN = range(5)
ROLES = 5
WIDTH = 8      # most links of one copy: two HBMs, two NIC halves of two links, two fabric ports


def copy_links_batch(net: Network, a: I64, b: I64) -> tuple[I64, I64, F64, F64] | None:
    """CSR (ptr, link ids, weights) and latencies of the copies a[i] -> b[i], each as
    `copy_links(net, a[i], b[i])` gives it; None where paths are not per-GPU halves."""
    if not net.halves_suffice():
        return None
    t = net.topology
    k = len(a)
    if k == 0:
        return np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    # each GPU's node by the topology's own rule (one call per GPU, not per pair)
    node = np.array([t.node_of(g) for g in range(int(max(a.max(), b.max())) + 1)], np.int64)
    same = node[a] == node[b]
    self_copy = a == b
    _create_in_order(net, a, b, same, self_copy)
    hbm = _per_id(np.concatenate([a, b]), net.hbm)
    wf = net.wire_factor
    lid = np.full((k, WIDTH), -1, np.int64)
    w = np.zeros((k, WIDTH), np.float64)
    ha, hb = hbm[a], hbm[b]
    one = ha == hb                          # one HBM twice (a == b, shared or folded GPUs)
    lid[:, 0], w[:, 0] = ha, np.where(one, 2.0, 1.0)
    lid[:, 1], w[:, 1] = np.where(one, -1, hb), 1.0
    # each half only of the GPUs (nodes) that use it: asking another would make a new link
    intra = same & ~self_copy
    if intra.any():
        ai, bi = a[intra], b[intra]
        lid[intra, 2] = _per_id(ai, lambda g: net.switch_port(g, True))[ai]
        lid[intra, 3] = _per_id(bi, lambda g: net.switch_port(g, False))[bi]
        w[intra, 2:4] = wf
    inter = ~same
    if inter.any():
        ai, bi = a[inter], b[inter]
        for j in (0, 1):
            lid[inter, 2 + j] = _per_id(ai, lambda g, j=j: net.nic_side(g, True)[j][0])[ai]
            lid[inter, 4 + j] = _per_id(bi, lambda g, j=j: net.nic_side(g, False)[j][0])[bi]
        w[inter, 2:6] = wf
        assert t.inter is not None
        if t.inter.oversubscription > 1.0:
            na, nb = node[ai], node[bi]
            lid[inter, 6] = _per_id(na, lambda n: net.fabric_port(n, True))[na]
            lid[inter, 7] = _per_id(nb, lambda n: net.fabric_port(n, False))[nb]
            w[inter, 6:8] = wf
    keep = lid >= 0
    ptr = np.zeros(k + 1, np.int64)
    np.cumsum(keep.sum(axis=1), out=ptr[1:])
    # without fabric tiers a copy's latency depends only on whether it stays on its GPU, its
    # node, or neither: the network's own rule asked once per kind present
    kind = np.where(self_copy, 0, np.where(same, 1, 2))
    first = {int(c): int(i) for c, i in zip(*np.unique(kind, return_index=True))}
    per_kind = np.zeros(3)
    for c, i in first.items():
        per_kind[c] = net.latency_us(int(a[i]), int(b[i]))
    latency = per_kind[kind]
    return ptr, lid[keep], w[keep], latency


def _create_in_order(net: Network, a: I64, b: I64, same: np.ndarray, self_copy: np.ndarray) -> None:
    """Ask `copy_links` for every pair that is the first to use one of its GPUs' links (its HBM,
    or one of its halves), in pair order: links come into being as pair-by-pair asking made
    them. A later pair only uses GPUs' links that an earlier pair made."""
    k = len(a)
    fold = net.fold
    ga, gb = (a, b) if fold is None else (a % fold, b % fold)
    req = np.full((k, 4), -1, np.int64)
    req[:, 0] = ga * ROLES + HBM
    req[:, 1] = gb * ROLES + HBM
    path = ~self_copy
    req[path, 2] = ga[path] * ROLES + np.where(same[path], INTRA_OUT, INTER_OUT)
    req[path, 3] = gb[path] * ROLES + np.where(same[path], INTRA_IN, INTER_IN)
    flat = req.ravel()
    live = np.flatnonzero(flat >= 0)
    _, first = np.unique(flat[live], return_index=True)
    for i in np.unique(live[first] // 4).tolist():
        copy_links(net, int(a[i]), int(b[i]))


def _per_id(ids: I64, link_of) -> I64:  # type: ignore[no-untyped-def]
    """An array over 0..max(ids) holding `link_of(i)` for each i in `ids` (-1 elsewhere): one
    Python call per distinct GPU or node, not per pair."""
    uniq = np.unique(ids)
    out = np.full(int(uniq[-1]) + 1 if len(uniq) else 0, -1, np.int64)
    out[uniq] = [link_of(int(g)) for g in uniq.tolist()]
    return out
