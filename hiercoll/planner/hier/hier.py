"""The `hier` algorithm: one registered name for the hierarchical families (node- and
rank-swizzled reduce-scatter / all-gather / all-reduce, RDMA-de-duplicated group_cast and
group_reduce, rail-aggregated all_to_all). Each family lives in its own module; this class only
dispatches and resolves labels (by formula for the regular sharded kinds)."""

from __future__ import annotations

from collections.abc import Sequence

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.planner.builder import RankBuilder
from hiercoll.planner.context import Algorithm, PlanContext, node_period
from hiercoll.planner.hier.all_gather import ag_index, build_all_gather
from hiercoll.planner.hier.all_to_all import a2a_index, build_all_to_all
from hiercoll.planner.hier.arrays import hier_op_arrays
from hiercoll.planner.hier.common import HierParams, Place, hier_peers, node_radices, rails_unsupported
from hiercoll.planner.hier.group import build_group_cast, build_group_reduce
from hiercoll.planner.hier.group_arrays import group_cast_arrays
from hiercoll.planner.hier.reduce_scatter import build_reduce_scatter, rs_index, rs_length
from hiercoll.planner.labels import GatherSendLabel, Label
from hiercoll.schedule_arrays import OpArrays
from hiercoll.topology import Topology


class Hier(Algorithm[HierParams]):
    name = "hier"
    kinds = frozenset({Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_REDUCE, Kind.ALL_TO_ALL,
                       Kind.GROUP_CAST, Kind.GROUP_REDUCE})
    Params = HierParams

    def unsupported(self, topo: Topology, spec: CollectiveSpec, params: HierParams) -> str | None:
        return super().unsupported(topo, spec, params) or rails_unsupported(topo, params.nics)

    level_node_orders = True

    def peers_per_rank(self, topology: Topology, spec: CollectiveSpec, params: HierParams) -> int:
        return hier_peers(topology)

    def symmetry_period(self, ctx: PlanContext[HierParams]) -> int | None:
        """A node shift; on several levels only a shift by one top-level group keeps every
        level's digits but the top one (the node order reads them relative to the rank's own)."""
        p = ctx.params
        period, radices = node_period(ctx, p.node_swizzle, p.rank_swizzle), node_radices(ctx)
        if period is None or len(radices) == 1:
            return period
        return period * (ctx.topology.num_nodes // radices[-1])

    def build_rank(self, ctx: PlanContext[HierParams], b: RankBuilder) -> None:
        pl, kind = Place.of(ctx, b.rank), ctx.spec.kind
        if kind == Kind.REDUCE_SCATTER:
            build_reduce_scatter(ctx, b, pl, at_shard_offset=False)
        elif kind == Kind.ALL_GATHER:
            build_all_gather(ctx, b, pl)
        elif kind == Kind.ALL_REDUCE:
            build_all_gather(ctx, b, pl, ready=build_reduce_scatter(ctx, b, pl, at_shard_offset=True))
        elif kind == Kind.ALL_TO_ALL:
            build_all_to_all(ctx, b, pl)
        elif kind == Kind.GROUP_CAST:
            build_group_cast(ctx, b, pl)
        else:
            build_group_reduce(ctx, b, pl)

    def op_arrays(self, ctx: PlanContext[HierParams], ranks: Sequence[int]) -> OpArrays | None:
        """The sharded kinds' and group_cast's ops written straight as arrays
        (`arrays.hier_op_arrays`, `group_arrays.group_cast_arrays`: what `build_rank` emits, op
        for op); None where that form does not cover the plan."""
        if ctx.spec.kind == Kind.GROUP_CAST:
            return group_cast_arrays(ctx, ranks)
        return hier_op_arrays(ctx, ranks)

    def index_of(self, ctx: PlanContext[HierParams], rank: int, label: Label) -> int:
        kind, pl = ctx.spec.kind, Place.of(ctx, rank)
        if kind == Kind.REDUCE_SCATTER:
            return rs_index(ctx, pl, label)
        if kind == Kind.ALL_GATHER:
            return ag_index(ctx, pl, label, base=0)
        if kind == Kind.ALL_REDUCE:
            if isinstance(label, GatherSendLabel):
                return ag_index(ctx, pl, label, base=rs_length(ctx))
            return rs_index(ctx, pl, label)
        if kind == Kind.ALL_TO_ALL:
            return a2a_index(ctx, pl, label)
        return super().index_of(ctx, rank, label)
