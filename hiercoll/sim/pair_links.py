"""`copy_links` for many GPU pairs at once, over arrays.

A dense all-to-all-v of W GPUs has W^2 copies, each between its own pair: asking `copy_links`
pair by pair cost ~6 us each in Python (6.8 of 17 CPU s at 1024 GPUs). Where a copy's path is
its sender's half then its receiver's (`Network.halves_suffice`: one switch, NVSwitch inside
nodes), every pair's links come from per-GPU arrays. The result equals `copy_links` pair by pair,
links in the same order, and the network's links are created in the same order too: the pairs
that first ask for a GPU's HBM or one of its halves are asked through `copy_links` itself, in
order, before the rest are read off the arrays (so link ids, and every float sum over them, are
what the pair-by-pair tables had).

On a tiered fabric (`inter.tiers`) a pair's path adds an up and a down port of each tier below
the one where its ends meet, chosen by ECMP (a hash of the endpoints) or sprayed: the hash is
asked once per distinct key and tier, and the ports' first users are asked through `copy_links`
in order as above (a 4096-GPU `hier` all-reduce's 2.1 million pairs: its tables 48 -> 17 CPU s).
A caller whose rows mix copies with other ops passes `ask`, to make those ops' links between the
first users' in its own row order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from hiercoll.sim.engine import copy_links
from hiercoll.sim.links import LinkKey, Network
from hiercoll.topology import IntraKind
from hiercoll.topology.fabric import ALL_PORTS, ecmp_choice, layout, port_stabilizer, translation_span
from hiercoll.topology.tier_layout import TierLayout

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
# makes the links of the pairs at the indices it is given (ascending) as `copy_links` would
Ask = Callable[[I64], None]

# what a pair asks of its GPUs, one code per (GPU, role): the sender's and the receiver's HBM
# share a role (one link per GPU)
HBM, INTRA_OUT, INTRA_IN, INTER_OUT, INTER_IN = range(5)
ROLES = 5
WIDTH = 8      # most links of one copy: two HBMs, two NIC halves of two links, two fabric ports


def copy_links_batch(net: Network, a: I64, b: I64, ask: Ask | None = None) -> tuple[I64, I64, F64, F64] | None:
    """CSR (ptr, link ids, weights) and latencies of the copies a[i] -> b[i], each as
    `copy_links(net, a[i], b[i])` gives it; None where not covered (no NVSwitch inside nodes,
    or a sprayed fabric with degraded ports), before anything is asked. `ask`: called once with
    the pairs whose links must be made first, in order (default: `copy_links` each), for a
    caller that makes other links between them in its own order."""
    t = net.topology
    k = len(a)
    if t.intra.kind != IntraKind.NVSWITCH:
        return None
    if k == 0:
        return np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    lay = layout(t)
    if lay:
        return _tiered_batch(net, lay, a, b, ask)
    if not net.halves_suffice():
        return None
    # each GPU's node by the topology's own rule (one call per GPU, not per pair)
    node = np.array([t.node_of(g) for g in range(int(max(a.max(), b.max())) + 1)], np.int64)
    same = node[a] == node[b]
    self_copy = a == b
    _create_in_order(net, a, b, same, self_copy, ask)
    wf = net.wire_factor
    lid, w = _gpu_columns(net, a, b, same, self_copy, WIDTH)
    inter = ~same
    if inter.any():
        ai, bi = a[inter], b[inter]
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


def _create_in_order(net: Network, a: I64, b: I64, same: np.ndarray, self_copy: np.ndarray,
                     ask: Ask | None) -> None:
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
    _ask_first_users(net, a, b, req, net.topology.world_size * ROLES, ask)


def _ask_first_users(net: Network, a: I64, b: I64, req: I64, codes: int, ask: Ask | None) -> None:
    """Ask `copy_links` for each pair whose row of `req` holds the first request of one of the
    `codes` (-1: none) that no earlier batch on `net` asked, in pair order (a first request per
    code, not a sort of them all: a sort of 20 million requests took seconds)."""
    if ask is None:
        def ask(rows: I64) -> None:
            for i in rows.tolist():
                copy_links(net, int(a[i]), int(b[i]))
    known = _known_codes(net, codes)
    flat = req.ravel()
    live = np.flatnonzero(flat >= 0)
    live = live[~known[flat[live]]]
    first = np.full(codes, len(flat), np.int64)
    np.minimum.at(first, flat[live], live)
    ask(np.unique(first[first < len(flat)] // req.shape[1]))
    known[flat[live]] = True


def _known_codes(net: Network, codes: int) -> npt.NDArray[np.bool_]:
    """The network's record of the request codes whose links a batch has made, so a later
    batch asks only pairs that bring new ones (a 4096-GPU plan's tables ask 17 batches)."""
    known = net.batch_known
    if known is None or len(known) != codes:
        known = net.batch_known = np.zeros(codes, bool)
    return known


def _gpu_columns(net: Network, a: I64, b: I64, same: npt.NDArray[np.bool_],
                 self_copy: npt.NDArray[np.bool_], width: int) -> tuple[I64, F64]:
    """Link ids and weights (-1: none) of each copy's GPU-side links, `width` columns: the two
    HBMs (one, weighed twice, where both ends share it), the NVSwitch ports of a copy inside a
    node, the NIC halves of one that leaves it; the columns past 6 are the caller's. Each half
    is asked only of the GPUs that use it: asking another would make a new link."""
    k, wf = len(a), net.wire_factor
    lid = np.full((k, width), -1, np.int64)
    w = np.zeros((k, width), np.float64)
    hbm = _per_id(np.concatenate([a, b]), net.hbm)
    ha, hb = hbm[a], hbm[b]
    one = ha == hb                          # one HBM twice (a == b, shared or folded GPUs)
    lid[:, 0], w[:, 0] = ha, np.where(one, 2.0, 1.0)
    lid[:, 1], w[:, 1] = np.where(one, -1, hb), 1.0
    intra = same & ~self_copy
    if intra.any():
        ai, bi = a[intra], b[intra]
        lid[intra, 2] = _per_id(ai, lambda g: net.switch_port(g, True))[ai]
        lid[intra, 3] = _per_id(bi, lambda g: net.switch_port(g, False))[bi]
        w[intra, 2:4] = wf
    far = ~same
    if far.any():
        ai, bi = a[far], b[far]
        for j in (0, 1):
            lid[far, 2 + j] = _per_id(ai, lambda g, j=j: net.nic_side(g, True)[j][0])[ai]
            lid[far, 4 + j] = _per_id(bi, lambda g, j=j: net.nic_side(g, False)[j][0])[bi]
        w[far, 2:6] = wf
    return lid, w


def _per_id(ids: I64, link_of) -> I64:  # type: ignore[no-untyped-def]
    """An array over 0..max(ids) holding `link_of(i)` for each i in `ids` (-1 elsewhere): one
    Python call per distinct GPU or node, not per pair."""
    uniq = np.unique(ids)
    out = np.full(int(uniq[-1]) + 1 if len(uniq) else 0, -1, np.int64)
    out[uniq] = [link_of(int(g)) for g in uniq.tolist()]
    return out


# ---- tiered fabrics --------------------------------------------------------------------------
# A pair's links there: its HBMs, its two halves (NVSwitch ports, or GPU->NIC->tx and
# rx->NIC->GPU), then for each tier below the one its ends meet at, an up and a down port.

class _Ends:
    """Per pair: the nodes, local ranks and NICs of both ends, and where the path turns."""

    def __init__(self, net: Network, lay: list[TierLayout], a: I64, b: I64):
        t = net.topology
        top = int(max(a.max(), b.max())) + 1
        node = np.array([t.node_of(g) for g in range(top)], np.int64)
        local = np.array([t.local_rank_of(g) for g in range(top)], np.int64)
        nic = np.array([t.nic_of_local_rank(r) for r in range(int(local.max()) + 1)], np.int64)
        self.na, self.nb, self.la, self.lb = node[a], node[b], local[a], local[b]
        self.ra, self.rb = nic[self.la], nic[self.lb]
        self.self_copy = a == b
        self.same = self.na == self.nb
        fold_nodes = None if net.fold is None else max(net.fold // t.gpus_per_node, 1)
        self.fa, self.fb = (self.na, self.nb) if fold_nodes is None else \
            (self.na % fold_nodes, self.nb % fold_nodes)
        # turn_tier: the lowest tier whose group holds both ends (a rail leaf: and their rail)
        self.turn = np.full(len(a), len(lay) - 1, np.int64)
        for tl in reversed(lay):
            meet = self.na // tl.span == self.nb // tl.span
            if tl.index == 0 and tl.rails:
                meet &= self.ra == self.rb
            self.turn[meet] = tl.index
        self.turn[self.same] = 0


class _TierPorts:
    """One tier's up and down port of every pair that crosses it (`used`), as codes of
    (group, switch, port) whose link keys `key` gives; weight: per use, before the wire factor."""

    def __init__(self, tl: TierLayout, used: np.ndarray, groups: tuple[I64, I64],
                 switch: tuple[I64, I64], port: I64, weight: float):
        self.tl, self.used, self.weight = tl, used, weight
        # switch and port indices may be ALL_PORTS (-1): shifted by one into the codes, which
        # span the whole tier (the same code for the same port in every batch of a network)
        self.nsw, self.nport = tl.switches + 1, tl.uplinks + 1
        self.size = tl.groups * self.nsw * self.nport
        assert all(int(x.max(initial=0)) < n for x, n in (
            (groups[0], tl.groups), (groups[1], tl.groups), (switch[0], tl.switches),
            (switch[1], tl.switches), (port, tl.uplinks)))
        self.codes = tuple((g * self.nsw + s + 1) * self.nport + port + 1
                           for g, s in zip(groups, switch))

    def key(self, up: bool, code: int) -> LinkKey:
        g, rest = divmod(code, self.nsw * self.nport)
        s, k = divmod(rest, self.nport)
        return (f"{self.tl.name}_{'up' if up else 'down'}", g, s - 1, k - 1)


def _tier_ports(net: Network, lay: list[TierLayout], e: _Ends) -> list[_TierPorts]:
    """Every tier's ports below the outermost, as `fabric.route` picks them pair by pair."""
    t = net.topology
    assert t.inter is not None
    fold_nodes = None if net.fold is None else max(net.fold // t.gpus_per_node, 1)
    spray = t.inter.routing == "spray"
    far = ~e.same
    out: list[_TierPorts] = []
    prefix = np.zeros(len(e.na), np.int64)
    for tl in lay[:-1]:
        used = far & (e.turn > tl.index)
        copies = 1 if fold_nodes is None else port_stabilizer(t, tl, fold_nodes, net.levels)
        fa, fb = e.fa[used], e.fb[used]
        if tl.index == 0:
            sw = (e.ra[used], e.rb[used]) if tl.rails else (np.zeros_like(fa), np.zeros_like(fb))
        elif spray:
            sw = (np.full_like(fa, ALL_PORTS), np.full_like(fb, ALL_PORTS))
        else:
            sw = (prefix[used], prefix[used])
        if spray:
            port = np.full_like(fa, ALL_PORTS)
        else:
            k = np.zeros(len(e.na), np.int64)
            k[used] = _ecmp(net, lay, tl, e, used)
            port = k[used]
            prefix = k if tl.index == 0 else prefix * tl.uplinks + k
        ports = _TierPorts(tl, used, (fa // tl.span, fb // tl.span), sw, port, float(copies))
        out.append(ports)
    return out


def _ecmp(net: Network, lay: list[TierLayout], tl: TierLayout, e: _Ends, used: np.ndarray) -> I64:
    """The uplink `fabric.ecmp_choice` picks at tier `tl` for each pair in `used`: the hash
    asked once per distinct key (node in its span, local rank, node distance, local rank)."""
    t = net.topology
    assert t.inter is not None
    n, gpn = t.num_nodes, t.gpus_per_node
    span = translation_span(t, lay) or n
    na, nb, la, lb = e.na[used], e.nb[used], e.la[used], e.lb[used]
    code = (((na % span) * gpn + la) * n + (nb - na) % n) * gpn + lb
    uniq = np.unique(code)
    rest, lbs = np.divmod(uniq, gpn)
    rest, dist = np.divmod(rest, n)
    pos, las = np.divmod(rest, gpn)
    seed, tier, ways = t.inter.ecmp_seed, tl.index, tl.uplinks
    pick = np.array([ecmp_choice(seed, tier, key, ways)
                     for key in zip(pos.tolist(), las.tolist(), dist.tolist(), lbs.tolist())], np.int64)
    out: I64 = pick[np.searchsorted(uniq, code)]
    return out


def _tiered_batch(net: Network, lay: list[TierLayout], a: I64, b: I64,
                  ask: Ask | None) -> tuple[I64, I64, F64, F64] | None:
    """`copy_links_batch` on a tiered fabric, columns in `copy_links`'s order: HBMs, halves,
    then each tier's up and down port."""
    t = net.topology
    assert t.inter is not None
    if t.inter.routing == "spray" and t.degraded_links:
        return None         # each degraded port sprayed on its own (`route`): pair by pair
    k = len(a)
    e = _Ends(net, lay, a, b)
    tiers = _tier_ports(net, lay, e)
    _create_tiered_in_order(net, a, b, e, tiers, ask)
    wf = net.wire_factor
    lid, w = _gpu_columns(net, a, b, e.same, e.self_copy, 6 + 2 * len(tiers))
    for i, tp in enumerate(tiers):
        for d, code in enumerate(tp.codes):
            ids = np.full(tp.size, -1, np.int64)
            present = np.unique(code)
            ids[present] = [net.link_id(tp.key(d == 0, c)) for c in present.tolist()]
            lid[tp.used, 6 + 2 * i + d] = ids[code]
            w[tp.used, 6 + 2 * i + d] = tp.weight * wf
    keep = lid >= 0
    ptr = np.zeros(k + 1, np.int64)
    np.cumsum(keep.sum(axis=1), out=ptr[1:])
    # a copy's latency: on its GPU, in its node, or by the tier its path turns at (the
    # network's own rule asked once per kind present)
    kind = np.where(e.self_copy, 0, np.where(e.same, 1, 2 + e.turn))
    first = np.full(2 + len(lay), k, np.int64)
    np.minimum.at(first, kind, np.arange(k))
    per_kind = np.zeros(len(first))
    for c in np.flatnonzero(first < k).tolist():
        per_kind[c] = net.latency_us(int(a[first[c]]), int(b[first[c]]))
    return ptr, lid[keep], w[keep], per_kind[kind]


def _create_tiered_in_order(net: Network, a: I64, b: I64, e: _Ends, tiers: list[_TierPorts],
                            ask: Ask | None) -> None:
    """`_create_in_order` with the tier ports too: every pair that first asks for one of its
    links (HBM, half, or port) is asked through `copy_links`, in pair order."""
    k = len(a)
    fold, gpn = net.fold, net.topology.gpus_per_node
    ga, gb = (a, b) if fold is None else (a % fold, b % fold)
    # a NIC side's links are the folded GPU's only where a fold keeps local ranks
    na_, nb_ = (ga, gb) if fold is None or fold % gpn == 0 else (a, b)
    top = net.topology.world_size
    req = np.full((k, 4 + 2 * len(tiers)), -1, np.int64)
    req[:, 0] = ga * ROLES + HBM
    req[:, 1] = gb * ROLES + HBM
    intra = e.same & ~e.self_copy
    far = ~e.same
    req[intra, 2] = ga[intra] * ROLES + INTRA_OUT
    req[intra, 3] = gb[intra] * ROLES + INTRA_IN
    req[far, 2] = na_[far] * ROLES + INTER_OUT
    req[far, 3] = nb_[far] * ROLES + INTER_IN
    base = top * ROLES
    for i, tp in enumerate(tiers):
        for d, code in enumerate(tp.codes):
            req[tp.used, 4 + 2 * i + d] = base + code
            base += tp.size
    _ask_first_users(net, a, b, req, base, ask)
