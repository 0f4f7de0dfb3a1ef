"""The network as links: every resource a transfer occupies, with its bandwidth and tier.

Inside a node: each GPU's NVSwitch port (egress, ingress), or one link per ordered GPU pair
(mesh), or PCIe up/down plus the host bridge. Between nodes: the GPU's PCIe path to its NIC, the
NIC's tx/rx, and (when oversubscribed) the node's uplink/downlink into the fabric; with
`inter.tiers`, the switch ports of every tier a flow crosses instead (topology/fabric.py: leaf
uplinks, spine downlinks, ..., chosen by ECMP or sprayed). Every GPU's HBM is a link too: copies
and reductions read and write it, so they share it. `node_overrides` set the capacities of the
links of the nodes they name (NICs, HBM, scale-up ports); `degraded_links` scale single links.

With a translation symmetry of period P (rank r and r+P run the same program), links are folded
onto their orbit representative: a flow's weight on a folded link is how many links of that
orbit its path uses, times how many shifted copies of the flow share one such link (a switch
port of a group the shifts keep in place: `fabric.port_stabilizer`), which makes max-min rates
on the folded network equal the full ones. `levels`: folded by level shifts (every node onto
node 0, `sim/symmetry.py`), not by whole-group translations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from hiercoll.topology import IntraKind, Topology
from hiercoll.topology.fabric import ALL_PORTS, extra_latency_us, layout, port_stabilizer, route, turn_tier
from hiercoll.topology.tier_layout import TierLayout

LinkKey = tuple[str, *tuple[int, ...]]   # kind, then GPU/node/NIC numbers: ("nic_tx", 1, 3)
# A link's capacity where only its crowded capacity limits (never the tightest alone)
UNLIMITED_GBPS = 1e9


class Tier(StrEnum):
    INTRA = "intra"
    INTER = "inter"
    MEMORY = "memory"


@dataclass(frozen=True, slots=True)
class LinkInfo:
    name: str
    tier: Tier
    bytes_per_us: float     # capacity, one direction
    counts_traffic: bool    # the link where a tier's bytes are counted once per transfer
    crowded_bytes_per_us: float | None = None   # capacity while two or more flows use it
    shared_by: int = 1      # folded: shifts that map this link onto itself (its copies: P / this)


@dataclass
class Network:
    """Link table for one topology; `fold` is the symmetry period (None: exact, every link)."""

    topology: Topology
    fold: int | None = None
    itemsize: int = 1        # bytes per element of the schedule (which copies go to copy engines)
    levels: bool = False     # folded by level shifts (fold = one node), not translations
    wire_factor: float = 1.0   # bytes on the wire per byte moved (2 under LL: a flag per word)
    links: list[LinkInfo] = field(default_factory=list)
    _ids: dict[LinkKey, int] = field(default_factory=dict)
    _paths: dict[tuple[int, int], tuple[tuple[int, float], ...]] = field(default_factory=dict)
    _tiers: list[TierLayout] = field(default_factory=list)
    # per GPU: its HBM link, and the NIC-side halves of an inter-node path (a dense all-to-all
    # asks W^2 paths of W GPUs' few links: look each GPU's up once)
    _hbm: dict[int, int] = field(default_factory=dict)
    _tx: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    _rx: dict[int, list[tuple[int, float]]] = field(default_factory=dict)

    _degraded: dict[str, float] = field(default_factory=dict)
    # pair_links' record, per request code, of the requests whose links a batch has made (a
    # later batch asks only pairs that bring new links); None until a batch runs
    batch_known: npt.NDArray[np.bool_] | None = None

    def __post_init__(self) -> None:
        self._tiers = layout(self.topology)
        self._degraded = {d.link: d.factor for d in self.topology.degraded_links}

    # ---- folding -----------------------------------------------------------------------------
    def _gpu(self, g: int) -> int:
        return g if self.fold is None else g % self.fold

    def _node(self, n: int) -> int:
        if self.fold is None:
            return n
        return n % max(self.fold // self.topology.gpus_per_node, 1)

    def _link(self, key: LinkKey, tier: Tier, gbps: float, counts: bool = False,
              crowded_gbps: float | None = None, shared_by: int = 1) -> int:
        lid = self._ids.get(key)
        if lid is None:
            lid = len(self.links)
            self._ids[key] = lid
            name = key[0] + "[" + ",".join("*" if k == ALL_PORTS else str(k) for k in key[1:]) + "]"
            factor = self._degraded.get(name, 1.0) * 1e3      # GB/s -> bytes/us, then degraded
            self.links.append(LinkInfo(name, tier, gbps * factor, counts,
                                       None if crowded_gbps is None else crowded_gbps * factor,
                                       shared_by))
        return lid

    def link_id(self, key: LinkKey) -> int:
        """The id of a link already made, by its key (`sim/pair_links.py` reads the ids of ports
        that its pairs' first `copy_links` made)."""
        return self._ids[key]

    # ---- paths -------------------------------------------------------------------------------
    def hbm(self, g: int) -> int:
        """GPU g's HBM; with `shared_gpu` every rank's is the one GPU's (never folded)."""
        lid = self._hbm.get(g)
        if lid is None:
            t = self.topology
            key = ("hbm", 0) if t.shared_gpu else ("hbm", self._gpu(g))
            lid = self._hbm[g] = self._link(key, Tier.MEMORY,
                                            t.hbm_gbps_of(t.node_of(g)) * t.costs.reduce_efficiency)
        return lid

    def engine(self, rank: int, channel: int, engine: str, gbps: float) -> int:
        """What one op of (rank, channel) can move on `engine` (sm or ce) at most: a channel runs
        its ops one at a time, so one link per channel and engine caps each op."""
        return self._link((f"{engine}_op", self._gpu(rank), channel), Tier.MEMORY, gbps)

    def copy_engines(self, rank: int, gbps: float) -> int:
        """A GPU's copy engines together: unlimited for one copy (its per-copy cap and the links
        bound it), `gbps` in all while two or more of its copies run at once (concurrent
        copy-engine copies share the engines' bandwidth worse than one uses it alone: H200, one
        peer 380 GB/s, three peers at once 199 GB/s in all). One GPU's under `shared_gpu`."""
        key = ("ce_all", 0) if self.topology.shared_gpu else ("ce_all", self._gpu(rank))
        return self._link(key, Tier.MEMORY, UNLIMITED_GBPS, crowded_gbps=gbps)

    def net_path(self, a: int, b: int) -> tuple[tuple[int, float], ...]:
        """Network links (no HBM) from GPU a to GPU b, with weights (1 per link use)."""
        key = (a, b)
        hit = self._paths.get(key)
        if hit is None:
            hit = self._paths[key] = self.path(a, b)
        return hit

    def path(self, a: int, b: int) -> tuple[tuple[int, float], ...]:
        """`net_path` without its cache: for callers that cache per pair themselves (a dense
        all-to-all-v's million copies: a second million-entry dict cost a third of its tables)."""
        path = self._intra(a, b) if self.topology.same_node(a, b) else self._inter(a, b)
        merged: dict[int, float] = {}
        for lid, w in path:
            merged[lid] = merged.get(lid, 0.0) + w * self.wire_factor
        return tuple(merged.items())

    def _intra(self, a: int, b: int) -> list[tuple[int, float]]:
        t, f = self.topology, self.topology.intra
        gbps = t.intra_gbps_of(t.node_of(a)) * t.costs.intra_efficiency
        if a == b:
            return []
        if f.kind == IntraKind.NVSWITCH:
            return [(self.switch_port(a, True), 1.0), (self.switch_port(b, False), 1.0)]
        if f.kind == IntraKind.MESH:
            return [(self._link(("xgmi", self._gpu(a), self._gpu(b)), Tier.INTRA,
                                gbps * f.links_per_pair, True), 1.0)]
        path = [(self._link(("pcie_up", self._gpu(a)), Tier.INTRA, gbps, True), 1.0),
                (self._link(("pcie_down", self._gpu(b)), Tier.INTRA, gbps), 1.0)]
        if f.bridge_gbps is not None:
            path.append((self._link(("bridge", self._node(t.node_of(a))), Tier.INTRA,
                                    f.bridge_gbps), 1.0))
        return path

    def switch_port(self, g: int, out: bool) -> int:
        """GPU g's NVSwitch port, egress (`out`, where intra-node bytes are counted) or ingress."""
        t = self.topology
        gbps = t.intra_gbps_of(t.node_of(g)) * t.costs.intra_efficiency
        if out:
            return self._link(("nvl_out", self._gpu(g)), Tier.INTRA, gbps, True)
        return self._link(("nvl_in", self._gpu(g)), Tier.INTRA, gbps)

    def fabric_port(self, node: int, up: bool) -> int:
        """A node's uplink into (or downlink from) an oversubscribed one-switch fabric."""
        inter = self.topology.inter
        assert inter is not None
        gbps = (inter.num_nics * inter.nic_gbps * self.topology.costs.nic_efficiency
                / inter.oversubscription)
        return self._link(("fabric_up" if up else "fabric_down", self._node(node)), Tier.INTER,
                          gbps)

    def halves_suffice(self) -> bool:
        """Is every copy's network path its sender's half then its receiver's (`switch_port`
        inside a node; `nic_side` and `fabric_port` between nodes), with no link of the pair
        itself? Only behind an NVSwitch and without fabric tiers (a route per pair)."""
        return not self._tiers and self.topology.intra.kind == IntraKind.NVSWITCH

    def _inter(self, a: int, b: int) -> list[tuple[int, float]]:
        t = self.topology
        inter = t.inter
        assert inter is not None
        path = self.nic_side(a, True) + self.nic_side(b, False)
        if self._tiers:
            na, nb = t.node_of(a), t.node_of(b)
            la, lb = t.local_rank_of(a), t.local_rank_of(b)
            nic_a, nic_b = t.nic_of_local_rank(la), t.nic_of_local_rank(lb)
            eff = t.costs.nic_efficiency
            fold_nodes = None if self.fold is None else max(self.fold // t.gpus_per_node, 1)
            ports, _ = route(t, self._tiers, (na, nic_a, la), (nb, nic_b, lb), fold_nodes, self.levels)
            path += [(self._link(key, Tier.INTER, gbps * eff, shared_by=self._port_sharing(key[0])), w)
                     for key, gbps, w in ports]
        elif inter.oversubscription > 1.0:
            path += [(self.fabric_port(t.node_of(a), True), 1.0),
                     (self.fabric_port(t.node_of(b), False), 1.0)]
        return path

    def nic_side(self, g: int, send: bool) -> list[tuple[int, float]]:
        """GPU g's PCIe path to its NIC and the NIC's tx (send) or rx, memoized per GPU."""
        memo = self._tx if send else self._rx
        hit = memo.get(g)
        if hit is None:
            t = self.topology
            inter = t.inter
            assert inter is not None
            n, nic = t.node_of(g), t.nic_of_local_rank(t.local_rank_of(g))
            g2n = inter.gpu_path_gbps()
            nic_gbps = t.nic_gbps_of(n, nic) * t.costs.nic_efficiency
            if send:
                hit = [(self._link(("gpu_to_nic", self._gpu(g)), Tier.INTER, g2n), 1.0),
                       (self._link(("nic_tx", self._node(n), nic), Tier.INTER, nic_gbps, True), 1.0)]
            else:
                hit = [(self._link(("nic_rx", self._node(n), nic), Tier.INTER, nic_gbps), 1.0),
                       (self._link(("nic_to_gpu", self._gpu(g)), Tier.INTER, g2n), 1.0)]
            memo[g] = hit
        return hit

    def _port_sharing(self, kind: str) -> int:
        """shared_by of a fabric port of kind "<tier>_up" / "<tier>_down" (folded networks)."""
        if self.fold is None:
            return 1
        fold_nodes = max(self.fold // self.topology.gpus_per_node, 1)
        tl = next(tl for tl in self._tiers if kind.rsplit("_", 1)[0] == tl.name)
        return port_stabilizer(self.topology, tl, fold_nodes, self.levels)

    def latency_us(self, a: int, b: int) -> float:
        t = self.topology
        if a == b:
            return 0.0
        if t.same_node(a, b):
            return t.intra.latency_us
        assert t.inter is not None
        if not self._tiers:
            return t.inter.latency_us
        la, lb = t.local_rank_of(a), t.local_rank_of(b)
        turn = turn_tier(self._tiers, (t.node_of(a), t.nic_of_local_rank(la), la),
                         (t.node_of(b), t.nic_of_local_rank(lb), lb))
        return t.inter.latency_us + extra_latency_us(self._tiers, turn)
