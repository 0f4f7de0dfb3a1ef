"""The scale-out fabric of a tiered topology: its switch layout and the paths flows take.

A node is one scale-up domain (8 GPUs of a DGX, 72 of an NVL72). Above the NICs, `inter.tiers`
lists switch layers from the leaf outwards, laid out as a folded Clos: a tier's *group* joins
`group_size` groups of the tier below (nodes, for the leaf); every switch of a group has
`uplinks` ports, port k to switch k of the tier above in its group; the outermost tier joins
everything. So a group of tier i has `prod(uplinks of tiers < i)` switches (tier 0: one per rail
when rail-optimised, else one), and a tier-i switch has one downlink per child switch that
reaches it. A flow goes up from its source's leaf to the lowest tier whose group holds both ends
(a rail-optimised leaf only joins NICs of one rail: different rails meet a tier higher) and back
down, taking at each tier one uplink (ECMP: a seeded hash of the endpoints) or all of them in
equal shares (spray). The port it goes up through and the port it comes down through (the
parent switch's downlink into the destination's group) are the links it loads.

The ECMP hash reads the endpoints relative to the outermost tier's child groups (position inside
its group, distance to the destination): shifting every rank by one such group maps paths onto
paths, which keeps the translation folding of `sim/symmetry.py` exact on tiered fabrics. It
cannot also survive a *level shift* (every node one position inside its group): a hash of
what such shifts keep would send every node's flow of one step up the same uplink, a collision
real per-flow hashing does not make. Spray needs no hash, so sprayed fabrics also fold by level
shifts (`level_shifts_keep_paths`).
"""

from __future__ import annotations

import hashlib
import itertools
from typing import TYPE_CHECKING, Literal

from hiercoll.topology.tier_layout import TierLayout, tier_layouts

if TYPE_CHECKING:
    from hiercoll.topology.model import Topology


def layout(t: Topology) -> list[TierLayout]:
    """Every tier's layout (empty without tiers)."""
    if t.inter is None or not t.inter.tiers:
        return []
    return tier_layouts(t.inter.tiers, t.num_nodes, t.inter.num_nics, t.inter.nic_gbps)


def translation_span(t: Topology, lay: list[TierLayout] | None = None) -> int | None:
    """Nodes by which a shift of every rank maps the fabric onto itself (links onto links,
    ECMP paths onto paths): the widest tier group below the outermost that is not the whole
    cluster (1 when there is none). None when such groups are not all full (then only a shift
    by the whole cluster does). A group holding the whole cluster (a rail leaf under a tier
    above it) maps onto itself under every shift: its ports are shared by every shifted copy of
    a flow, which the folded network counts (`port_stabilizer`) when routing sprays; an ECMP
    hash there reads the node itself (no smaller group to be relative to), so only the whole
    cluster repeats."""
    lay = layout(t) if lay is None else lay     # `lay`: the caller's layout(t), not rebuilt
    if t.inter is not None and t.inter.routing == "ecmp" and any(
            tl.index == 0 and tl.rails and tl.span >= t.num_nodes and tl.uplinks > 1 for tl in lay[:-1]):
        return t.num_nodes      # the ECMP key holds the node itself (below)
    spans = [tl.span for tl in lay[:-1] if tl.span < t.num_nodes]
    if any(t.num_nodes % s for s in spans):
        return None
    return max(spans, default=1)


def level_radices(t: Topology, lay: list[TierLayout] | None = None) -> tuple[int, ...] | None:
    """Radices m_1..m_k of the scale-out levels, leaf first: each tier whose groups hold more
    than one node and fewer than all adds a level of m_j groups of the level below, and the
    cluster is the last (their product is the node count). A node index is then a mixed-radix
    number whose digit j is its position in its level-j group. None when a tier's groups are not
    all full (no such numbering)."""
    lay = layout(t) if lay is None else lay
    n, below, radices = t.num_nodes, 1, []
    for tl in lay:
        if 1 < tl.span < n and tl.span > below:
            if n % tl.span or tl.span % below:
                return None
            radices.append(tl.span // below)
            below = tl.span
    radices.append(n // below)
    return tuple(radices)


def level_shifts_keep_paths(t: Topology, lay: list[TierLayout] | None = None) -> bool:
    """Whether moving every node one position inside its group at one level maps every flow's
    ports onto the moved flow's: spray (no hash), or ECMP with one uplink everywhere (no choice)."""
    lay = layout(t) if lay is None else lay
    return t.inter is not None and (t.inter.routing == "spray" or all(tl.uplinks <= 1 for tl in lay))


def port_stabilizer(t: Topology, tl: TierLayout, fold_nodes: int, levels: bool) -> int:
    """How many shifts of a folded simulation map one port of tier `tl` onto itself: the copies
    of the representative's flows that load it, so its weight in the folded network. Shifts by
    `fold_nodes` whole nodes: 1, unless the tier's group is the whole cluster (every shift keeps
    it). Level shifts (`levels`: positions inside groups, one node's ranks simulated): every
    node of the port's group reaches it."""
    span = min(tl.span, t.num_nodes)
    if levels:
        return span
    return t.num_nodes // fold_nodes if span >= t.num_nodes else 1


# (link key, GB/s per direction, weight) of each fabric port a flow uses
PortUse = tuple[tuple[str, int, int, int], float, float]


def ecmp_choice(seed: int, tier: int, key: tuple[int, ...], ways: int) -> int:
    """A deterministic hash of a flow's endpoints onto one of `ways` uplinks (stable across
    processes and Python versions, unlike hash())."""
    text = f"{seed}:{tier}:{key}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") % ways


def turn_tier(lay: list[TierLayout], src: tuple[int, int, int], dst: tuple[int, int, int]) -> int:
    """The lowest tier whose switch joins both (node, nic, local rank) ends: 0 = the same leaf."""
    (na, ra, _), (nb, rb, _) = src, dst
    return next((tl.index for tl in lay
                 if na // tl.span == nb // tl.span and (tl.index > 0 or not tl.rails or ra == rb)),
                len(lay) - 1)    # the outermost joins all (a copy with more nodes, unchecked)


def extra_latency_us(lay: list[TierLayout], turn: int) -> float:
    """Switch hops beyond the one leaf inter.latency_us counts: the other leaf, every tier
    below the turn twice, the turning tier once."""
    if turn == 0:
        return 0.0
    return lay[0].latency_us + 2 * sum(tl.latency_us for tl in lay[1:turn]) + lay[turn].latency_us


def route(t: Topology, lay: list[TierLayout], src: tuple[int, int, int], dst: tuple[int, int, int],
          fold_nodes: int | None = None, levels: bool = False) -> tuple[list[PortUse], float]:
    """Fabric ports from (node, nic, local rank) `src` to `dst`, with weights, and the latency
    the extra switch hops add. `fold_nodes`: the symmetry period in nodes (keys of folded ports;
    `levels`: folded by level shifts onto one node), each port's weight then multiplied by the
    shifted copies of the flow that share it (`port_stabilizer`)."""
    assert t.inter is not None
    (na, ra, la), (nb, rb, lb) = src, dst
    turn = turn_tier(lay, src, dst)
    if turn == 0:
        return [], 0.0
    extra = extra_latency_us(lay, turn)
    fa, fb = (na, nb) if fold_nodes is None else (na % fold_nodes, nb % fold_nodes)
    mode: Literal["ecmp", "spray"] = t.inter.routing
    if mode == "spray" and not t.degraded_links:
        return sprayed_bundles(t, lay[:turn], (fa, ra), (fb, rb), fold_nodes, levels), extra
    if mode == "spray":         # a degraded port: each port on its own, sprayed in equal shares
        choices = list(itertools.product(*(range(tl.uplinks) for tl in lay[:turn])))
    else:
        span = translation_span(t, lay) or t.num_nodes
        key = (na % span, la, (nb - na) % t.num_nodes, lb)
        choices = [tuple(ecmp_choice(t.inter.ecmp_seed, tl.index, key, tl.uplinks)
                         for tl in lay[:turn])]
    share = 1.0 / len(choices)
    uses: dict[tuple[str, int, int, int], list[float]] = {}
    for ks in choices:
        prefix = 0
        for tl, k in zip(lay[:turn], ks):
            s_up = (ra if tl.rails else 0) if tl.index == 0 else prefix
            s_down = (rb if tl.rails else 0) if tl.index == 0 else prefix
            copies = 1 if fold_nodes is None else port_stabilizer(t, tl, fold_nodes, levels)
            for key4 in ((f"{tl.name}_up", fa // tl.span, s_up, k),
                         (f"{tl.name}_down", fb // tl.span, s_down, k)):
                uses.setdefault(key4, [tl.port_gbps, 0.0])[1] += share * copies
            prefix = k if tl.index == 0 else prefix * tl.uplinks + k
    return [(key4, gw[0], gw[1]) for key4, gw in uses.items()], extra


ALL_PORTS = -1      # a port-key index standing for every port of a sprayed bundle ("*" in names)


def sprayed_bundles(t: Topology, tiers: list[TierLayout], src: tuple[int, int], dst: tuple[int, int],
                    fold_nodes: int | None, levels: bool) -> list[PortUse]:
    """Spray's ports as bundles: at each tier below the turn, every flow that reaches a group's
    uplinks (of its rail's leaf switch, at the leaf) splits evenly over all of them, so their
    max-min constraints are identical and one link of their summed capacity stands for them
    exactly (a flow's weight 1 on it), with one entry instead of one per uplink combination (a
    3-tier preset's cross-pod flow touched ~600 ports). Its bytes and busy time are the bundle's;
    its utilisation is each port's. `fold_nodes`, `levels`: as `route`."""
    (fa, ra), (fb, rb) = src, dst
    out: list[PortUse] = []
    ports = 1
    for tl in tiers:
        ports = tl.uplinks if tl.index == 0 else ports * tl.uplinks     # the group's uplinks used
        copies = 1 if fold_nodes is None else port_stabilizer(t, tl, fold_nodes, levels)
        s_up = (ra if tl.rails else 0) if tl.index == 0 else ALL_PORTS
        s_down = (rb if tl.rails else 0) if tl.index == 0 else ALL_PORTS
        out += [((f"{tl.name}_up", fa // tl.span, s_up, ALL_PORTS), tl.port_gbps * ports, float(copies)),
                ((f"{tl.name}_down", fb // tl.span, s_down, ALL_PORTS), tl.port_gbps * ports, float(copies))]
    return out
