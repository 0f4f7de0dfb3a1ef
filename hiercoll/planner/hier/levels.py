"""The scale-out levels of a tiered topology, as `hier_tiers` uses them.

Level 0 is the node (scale-up domain). Above it, each tier of `inter.tiers` whose groups hold more
than one node and fewer than all of them adds a level: a leaf group of m_1 nodes, a spine group of
m_2 leaf groups, ..., and the whole cluster of m_k groups of the level below. A node index is then
a mixed-radix number: digit j (j = 1..k, leaf first, least significant) is the node's position
inside its level-j group, so nodes that differ only in digit j share every group below level j+1
... and meet at level j's tier. Without tiers (or when no tier group is smaller than the cluster)
there is one level, radices (N,): `hier`'s two-level picture.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hiercoll.topology import Topology
from hiercoll.topology.fabric import layout, level_radices


@dataclass(frozen=True)
class Levels:
    """Radices m_1..m_k of the scale-out levels (leaf first); their product is the node count."""

    radices: tuple[int, ...]
    ring: tuple[bool, ...] = ()    # per level: a ring among the m_j peers (else direct); a plan's choice
    strides: tuple[int, ...] = field(init=False)   # nodes per level-j step: 1, m_1, m_1*m_2, ...
    count: int = field(init=False)                 # levels
    num_nodes: int = field(init=False)

    def __post_init__(self) -> None:
        strides, s = [], 1
        for m in self.radices:
            strides.append(s)
            s *= m
        object.__setattr__(self, "strides", tuple(strides))
        object.__setattr__(self, "count", len(self.radices))
        object.__setattr__(self, "num_nodes", s)

    def is_ring(self, j: int) -> bool:
        return j < len(self.ring) and self.ring[j]

    def digit(self, node: int, j: int) -> int:
        """Digit j (0-based: 0 = the leaf level) of `node`: its position in its level-j group."""
        return (node // self.strides[j]) % self.radices[j]

    def with_digit(self, node: int, j: int, value: int) -> int:
        """`node` moved to position `value` of its level-j group (the other digits kept)."""
        return node + (value - self.digit(node, j)) * self.strides[j]

    def first_difference(self, a: int, b: int) -> int:
        """The lowest level whose digit differs between nodes a and b (count when a == b): where
        reduce-scatter sends b's shard away from a, and where all-gather brings it to a."""
        for j, m in enumerate(self.radices):      # hot: digits peeled off both at once
            a, da = divmod(a, m)
            b, db = divmod(b, m)
            if da != db:
                return j
        return self.count

    def above(self, node: int, j: int) -> int:
        """Index of `node`'s digits j+1..k-1 (digit j+1 least significant): the slot
        of a shard kept at level j among the N / (m_1 ... m_(j+1)) shards kept there."""
        return node // (self.strides[j] * self.radices[j])

    def kept(self, j: int) -> int:
        """Shards (per local rank) a rank still holds after level j's reduce-scatter step."""
        return self.num_nodes // (self.strides[j] * self.radices[j])


def spans(topo: Topology) -> list[tuple[str, int]]:
    """(tier name, nodes per group) of the tiers whose groups split the cluster, leaf first;
    a tier whose groups span as many nodes as the one below adds nothing and is left out."""
    out: list[tuple[str, int]] = []
    for tl in layout(topo):
        if 1 < tl.span < topo.num_nodes and (not out or tl.span > out[-1][1]):
            out.append((tl.name, tl.span))
    return out


def levels_unsupported(topo: Topology) -> str | None:
    """Why the tiers do not split the nodes into full groups, or None."""
    n = topo.num_nodes
    for name, span in spans(topo):
        if n % span:
            return (f"{n} nodes do not fill the {name} tier's groups of {span} nodes (the last "
                    f"holds {n % span}); use a multiple of {span} nodes, or -a hier")
    return None


def levels_of(topo: Topology) -> Levels:
    """The levels of `topo` (check `levels_unsupported` first)."""
    radices = level_radices(topo)
    assert radices is not None, levels_unsupported(topo)
    return Levels(radices)
