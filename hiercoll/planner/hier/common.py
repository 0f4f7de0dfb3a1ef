"""What every hierarchical family shares: its parameters, the rank's place in the hierarchy, the
rail (NIC) gateways, and slot arithmetic for scratch buffers.

Vocabulary: N nodes, L GPUs per node (`local_rank` 0..L-1), W = N*L. A *rail* is the set of ranks
with one local rank on every node. A *gateway* is the GPU next to a NIC that this plan uses: with
one NIC per GPU every rank is its own gateway; with fewer NICs (`nics` below L) a local rank's
inter-node traffic is staged over NVLink to its gateway, crosses RDMA between the gateways of
that rail on both nodes, and is forwarded (or read) over NVLink on the far side. Inter-node ops
therefore always run gateway-to-gateway, which is what makes the NIC each byte uses explicit.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

from pydantic import Field

from hiercoll.collectives import CollectiveSpec
from hiercoll.planner.builder import ceil_div, chunk_bounds
from hiercoll.planner.context import BaseParams, PlanContext
from hiercoll.schedule import Region
from hiercoll.topology import Topology


class SwizzleParams(BaseParams):
    """Visiting orders, shared by `hier` and `hier_2d` (chunks/channels come from BaseParams)."""

    node_swizzle: bool = Field(default=True, description="node a targets a+1, a+2, ... and its own "
                               "node last, so each step pairs every node with a different peer")
    rank_swizzle: bool = Field(default=True, description="local rank l starts with local peer l+1")


class HierParams(SwizzleParams):
    """Knobs of the `hier` algorithm."""

    nics: int | None = Field(default=None, ge=1, description="NICs used per node (rails); default "
                             "all of the topology's, at most one per GPU")


SwizzleT = TypeVar("SwizzleT", bound=SwizzleParams)   # hier's or hier_2d's params


def rails(topo: Topology, nics: int | None) -> list[int]:
    """Local ranks of the gateway GPUs: the nearest GPU of each NIC used, NICs spread evenly."""
    if topo.num_nodes == 1 or topo.inter is None:
        return list(range(topo.gpus_per_node))
    total = topo.inter.num_nics
    use = min(nics or total, total, topo.gpus_per_node)
    aff = topo.nic_affinity()
    return sorted({aff[(i * total) // use] for i in range(use)})


def rails_unsupported(topo: Topology, nics: int | None) -> str | None:
    """Why `nics` cannot be honoured on `topo`, or None."""
    if nics is None or topo.num_nodes == 1 or topo.inter is None:
        return None
    if nics > topo.inter.num_nics:
        return (f"nics={nics} but the topology has {topo.inter.num_nics} NICs per node; "
                f"use nics<={topo.inter.num_nics}")
    if nics > topo.gpus_per_node:
        return f"nics={nics} exceeds the {topo.gpus_per_node} GPUs per node; use nics<={topo.gpus_per_node}"
    return None


@dataclass(frozen=True)
class Place:
    """A rank's coordinates and the hierarchy around it. Cheap to build per rank: the gateway
    map is only computed when a family asks for it (label formulas never do)."""

    topo: Topology
    rank: int
    nics: int | None = None
    node_swizzle: bool = True
    rank_swizzle: bool = True
    # scale-out level radices the swizzled node order walks (leaf first); () = one level of N
    radices: tuple[int, ...] = ()
    # set once at construction (hot: label formulas build a Place per resolved dependency)
    num_nodes: int = field(init=False)
    gpus: int = field(init=False)
    node: int = field(init=False)
    local_rank: int = field(init=False)

    def __post_init__(self) -> None:
        gpus = self.topo.gpus_per_node
        object.__setattr__(self, "num_nodes", self.topo.num_nodes)
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "node", self.rank // gpus)
        object.__setattr__(self, "local_rank", self.rank % gpus)
        if len(self.radices) < 2:
            object.__setattr__(self, "radices", (self.topo.num_nodes,))

    @staticmethod
    def of(ctx: PlanContext[SwizzleT], rank: int) -> Place:
        """`rank`'s Place in this plan (one per rank and plan: label formulas ask per dependency)."""
        places: dict[int, Place] = ctx.memo.setdefault("places", {})
        pl = places.get(rank)
        if pl is None:
            p = ctx.params
            pl = places[rank] = Place(ctx.topology, rank, p.nics if isinstance(p, HierParams) else None,
                                      p.node_swizzle, p.rank_swizzle, node_radices(ctx))
        return pl

    def at(self, node: int, local_rank: int) -> int:
        return node * self.gpus + local_rank

    # ---- gateways ----------------------------------------------------------------------------
    @cached_property
    def gateways(self) -> tuple[int, ...]:
        """Local ranks of the gateway GPUs."""
        return tuple(rails(self.topo, self.nics))

    @cached_property
    def _gateway_map(self) -> tuple[int, ...]:
        gws = self.gateways
        return tuple(max((g for g in gws if g <= x), default=gws[0]) for x in range(self.gpus))

    def gateway_of(self, local_rank: int) -> int:
        """The gateway local rank serving `local_rank`: the nearest gateway at or below it."""
        return self._gateway_map[local_rank]

    @cached_property
    def _clients(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {g: [] for g in self.gateways}
        for x, g in enumerate(self._gateway_map):
            out[g].append(x)
        return out

    def clients(self, gateway: int) -> list[int]:
        """Local ranks whose inter-node traffic goes through `gateway` (in local-rank order)."""
        return self._clients[gateway]

    def client_index(self, local_rank: int) -> int:
        return self._clients[self.gateway_of(local_rank)].index(local_rank)

    @property
    def is_gateway(self) -> bool:
        return self.local_rank in self._clients

    @property
    def staged(self) -> bool:
        """Whether this rank's inter-node traffic is staged through another GPU."""
        return self.num_nodes > 1 and self.gateway_of(self.local_rank) != self.local_rank

    # ---- visiting orders ---------------------------------------------------------------------
    def target_nodes(self, include_own: bool = True) -> list[int]:
        """Node visiting order: swizzled a+1, a+2, ..., a (own node last); plain 0..N-1. With
        levels, "a+k" adds k's mixed-radix digits to a's level by level (each mod its radix),
        so every step is still a permutation and a leaf group's nodes visit their own group
        first, like one-level a+1, a+2, ..."""
        return list(_target_order(self.num_nodes, self.node, self.node_swizzle, self.radices,
                                  include_own))

    def source_nodes(self) -> list[int]:
        """Remote nodes in the order their data arrives when every node sends in
        `target_nodes` order: a-1, a-2, ... swizzled (everyone targets a+1 first)."""
        return list(_source_order(self.num_nodes, self.node, self.node_swizzle, self.radices))

    def target_position(self, target: int, include_own: bool = True) -> int:
        """Index of `target` in `target_nodes(include_own)`, by formula."""
        n, a = self.num_nodes, self.node
        if self.node_swizzle:
            if len(self.radices) == 1:
                return (target - a - 1) % n
            return (level_add(self.radices, target, a, -1) - 1) % n
        return target if include_own or target < a else target - 1

    def local_peers(self, include_self: bool = False) -> list[int]:
        """Local ranks in rank-swizzled order (l+1, l+2, ...) or plain order."""
        l, g = self.local_rank, self.gpus
        order = [(l + k) % g for k in range(1, g)] if self.rank_swizzle else [x for x in range(g) if x != l]
        return ([l] + order) if include_self else order

    def peer_position(self, local_peer: int, include_self: bool = False) -> int:
        l, g = self.local_rank, self.gpus
        if self.rank_swizzle:
            k = (local_peer - l) % g
            return k if include_self else k - 1
        if local_peer == l:
            return 0
        pos = local_peer if local_peer < l else local_peer - 1
        return pos + 1 if include_self else pos


# a plan asks every rank's node orders once per split it builds (a 1024-rank MoE dispatch: 360k
# times at 512 ranks, 23M level_add calls, a fifth of its planning): one per (node, orders)
@functools.lru_cache(maxsize=4096)
def _target_order(n: int, a: int, swizzle: bool, radices: tuple[int, ...],
                  include_own: bool) -> tuple[int, ...]:
    if not swizzle:
        order = list(range(n))
    elif len(radices) == 1:
        order = [(a + k) % n for k in range(1, n + 1)]
    else:
        order = [level_add(radices, a, k % n, 1) for k in range(1, n + 1)]
    return tuple(t for t in order if include_own or t != a)


@functools.lru_cache(maxsize=4096)
def _source_order(n: int, a: int, swizzle: bool, radices: tuple[int, ...]) -> tuple[int, ...]:
    if not swizzle:
        return tuple(b for b in range(n) if b != a)
    if len(radices) == 1:
        return tuple((a - k) % n for k in range(1, n))
    return tuple(level_add(radices, a, k, -1) for k in range(1, n))


def hier_peers(topology: Topology) -> int:
    """peers_per_rank of the hierarchical family: per node, an NVLink scatter to each local peer
    plus the send (W = 512: hier's all-reduce builds ~1086 ops a rank against 2 x 9 x 64
    estimated, not the 142 that counting its N + L peers once gave)."""
    return topology.num_nodes * (topology.gpus_per_node + 1)


def node_radices(ctx: PlanContext[SwizzleT]) -> tuple[int, ...]:
    """The level radices a plan's swizzled node order walks: the topology's scale-out levels
    for an algorithm with `level_node_orders` on full tier groups, else one level of N."""
    hit = ctx.memo.get("node_radices")
    if hit is None:
        from hiercoll.topology.fabric import level_radices
        radices = level_radices(ctx.topology) if ctx.algorithm.level_node_orders else None
        hit = ctx.memo["node_radices"] = radices or (ctx.topology.num_nodes,)
    assert isinstance(hit, tuple)
    return hit


def level_add(radices: tuple[int, ...], a: int, k: int, sign: int) -> int:
    """Node a with k's mixed-radix digits added (sign 1) or subtracted (-1), each mod its
    level's radix: a level-relative step that never carries into the level above."""
    out, stride = 0, 1
    for m in radices:
        out += ((a // stride) % m + sign * ((k // stride) % m)) % m * stride
        stride *= m
    return out


def other_slot(mine: int, other: int, count: int) -> int:
    """Slot 0..count-2 of `other` (!= mine) among `count` items, relative to `mine`."""
    return (other - mine) % count - 1


@dataclass(frozen=True)
class Shards:
    """Shard arithmetic of the sharded kinds: shard (node, local rank), chunk c of it. Holds the
    numbers it needs (building a rank calls `piece` thousands of times)."""

    count: int
    world: int
    gpus: int
    chunks: int
    width: int = field(init=False)   # the largest shard: width of every per-shard scratch slot

    def __post_init__(self) -> None:
        object.__setattr__(self, "width", ceil_div(self.count, self.world))

    @staticmethod
    def of(spec: CollectiveSpec, gpus: int, chunks: int) -> Shards:
        return Shards(spec.count, spec.world_size, gpus, chunks)

    def piece(self, node: int, local_rank: int, c: int) -> tuple[int, int, int]:
        """(shard offset in S, chunk offset inside the shard, chunk count); shards as
        `CollectiveSpec.shard`: balanced, the first count % W one longer."""
        index = node * self.gpus + local_rank
        base, extra = divmod(self.count, self.world)
        off, n = index * base + min(index, extra), base + (1 if index < extra else 0)
        coff, cn = chunk_bounds(n, self.chunks, c)
        return off, coff, cn

    def slot(self, rank: int, buffer: str, slot: int, coff: int, cn: int) -> Region:
        return Region(rank, buffer, slot * self.width + coff, cn)


KeyT = TypeVar("KeyT", bound=Hashable)


def slot_table(entries: Iterable[tuple[KeyT, int]]) -> tuple[dict[KeyT, int], int]:
    """Pack (key, size) entries back to back: {key: offset}, total size."""
    offsets: dict[KeyT, int] = {}
    pos = 0
    for key, size in entries:
        offsets[key] = pos
        pos += size
    return offsets, pos
