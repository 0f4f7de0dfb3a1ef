"""`hier_tiers`: `hier`'s reduce-scatter / all-gather / all-reduce over every scale-out tier.

`hier` has two levels, the node and everything across nodes: a shard's node-partial goes
straight to its owner, so on a tiered fabric bytes bound for another leaf group cross the spine
once per sending node. `hier_tiers` adds a level per tier whose groups split the cluster
(hier/levels.py): a shard is reduced inside the node, then inside the leaf group (to the same
local rank on the node at the shard's leaf position), then across the leaf groups of a spine
group, ..., so each byte crosses each tier once and a tier above the leaf carries 1/m of the
tier below it (m = groups it joins). All-gather mirrors it; all-reduce is the two.

Where the topology has one level (no tiers, or no tier group smaller than the cluster) it plans
exactly `hier` (the same ops: `hier`'s own builders with their label formulas, all NICs), which
is why auto-pick does not search it there (`duplicate_of`). Tiers whose groups do not divide the
nodes (a partial last group) are refused in one line.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.planner.builder import RankBuilder
from hiercoll.planner.context import Algorithm, PlanContext, node_period
from hiercoll.planner.hier import all_gather as hier_ag
from hiercoll.planner.hier import reduce_scatter as hier_rs
from hiercoll.planner.hier.common import Place, SwizzleParams, hier_peers
from hiercoll.planner.hier.hier_2d import InterAlgo
from hiercoll.planner.hier.levels import Levels, levels_of, levels_unsupported
from hiercoll.planner.hier.tiers_build import build_all_gather, build_reduce_scatter
from hiercoll.planner.hier.tiers_index import tiers_index
from hiercoll.planner.labels import GatherSendLabel, Label
from hiercoll.topology import Topology


class HierTiersParams(SwizzleParams):
    """Knobs of `hier_tiers`: chunks, channels, the swizzles, the exchange inside each level;
    the levels come from the topology's `inter.tiers`."""

    inner: InterAlgo = Field(default=InterAlgo.DIRECT, description="inside every scale-out "
                             "level's group: direct (each rank sends to each of the m-1 others at "
                             "once, as hier does) or ring (m-1 steps to one neighbour)")
    inner_levels: tuple[InterAlgo, ...] | None = Field(
        default=None, description="one exchange per scale-out level, leaf first, e.g. "
        "[\"direct\", \"ring\"]; overrides inner")

    def ring_levels(self, count: int) -> tuple[bool, ...]:
        """Per level of `count`: whether it runs a ring."""
        return tuple(x == InterAlgo.RING for x in (self.inner_levels or (self.inner,) * count))


Ctx = PlanContext[HierTiersParams]


def _levels(ctx: Ctx) -> Levels:
    lv = ctx.memo.get("tier_levels")
    if lv is None:
        lv = levels_of(ctx.topology)
        lv = ctx.memo["tier_levels"] = replace(lv, ring=ctx.params.ring_levels(lv.count))
    assert isinstance(lv, Levels)
    return lv


def _is_hier(lv: Levels) -> bool:
    """One level exchanged directly: `hier`'s own plan."""
    return lv.count == 1 and not lv.is_ring(0)


class HierTiers(Algorithm[HierTiersParams]):
    name = "hier_tiers"
    kinds = frozenset({Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_REDUCE})
    Params = HierTiersParams

    def peers_per_rank(self, topology: Topology, spec: CollectiveSpec, params: HierTiersParams) -> int:
        return hier_peers(topology)

    def unsupported(self, topo: Topology, spec: CollectiveSpec, params: HierTiersParams) -> str | None:
        why = super().unsupported(topo, spec, params) or levels_unsupported(topo)
        if why is None and params.inner_levels is not None:
            radices = levels_of(topo).radices
            if len(params.inner_levels) != len(radices):
                why = (f"inner_levels: {len(params.inner_levels)} values for the "
                       f"{len(radices)} scale-out levels of this topology "
                       f"({' x '.join(map(str, radices))} nodes); give one per level, leaf first")
        return why

    def duplicate_of(self, topo: Topology) -> str | None:
        """`hier` where the topology has one scale-out level (this plans the same ops there)."""
        if levels_unsupported(topo) is None and levels_of(topo).count == 1:
            return "hier"
        return None

    def symmetry_period(self, ctx: Ctx) -> int | None:
        p, lv = ctx.params, _levels(ctx)
        period = node_period(ctx, p.node_swizzle, p.rank_swizzle)
        if period is None or lv.count == 1:
            return period
        # moving every node by one top-level group keeps all digits but the top one, which the
        # swizzled orders read relative to the rank's own; smaller shifts carry between digits
        return period * lv.strides[-1]

    def build_rank(self, ctx: Ctx, b: RankBuilder) -> None:
        pl, kind, lv = Place.of(ctx, b.rank), ctx.spec.kind, _levels(ctx)
        if _is_hier(lv):
            if kind == Kind.REDUCE_SCATTER:
                hier_rs.build_reduce_scatter(ctx, b, pl, at_shard_offset=False)
            elif kind == Kind.ALL_GATHER:
                hier_ag.build_all_gather(ctx, b, pl)
            else:
                hier_ag.build_all_gather(ctx, b, pl, ready=hier_rs.build_reduce_scatter(
                    ctx, b, pl, at_shard_offset=True))
        elif kind == Kind.REDUCE_SCATTER:
            build_reduce_scatter(ctx, b, pl, lv, at_shard_offset=False)
        elif kind == Kind.ALL_GATHER:
            build_all_gather(ctx, b, pl, lv)
        else:
            build_all_gather(ctx, b, pl, lv, ready=build_reduce_scatter(ctx, b, pl, lv,
                                                                        at_shard_offset=True))

    def index_of(self, ctx: Ctx, rank: int, label: Label) -> int:
        lv = _levels(ctx)
        if not _is_hier(lv):
            return tiers_index(ctx, lv, Place.of(ctx, rank), label)
        kind, pl = ctx.spec.kind, Place.of(ctx, rank)     # hier's formulas
        if kind == Kind.ALL_GATHER:
            return hier_ag.ag_index(ctx, pl, label, base=0)
        if kind == Kind.ALL_REDUCE and isinstance(label, GatherSendLabel):
            return hier_ag.ag_index(ctx, pl, label, base=hier_rs.rs_length(ctx))
        return hier_rs.rs_index(ctx, pl, label)
