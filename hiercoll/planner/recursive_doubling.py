"""Recursive doubling all-reduce (`rd`): log2(P) steps, each exchanging the whole vector with
the partner v xor 2^t and summing; for small sizes, where latency is everything and moving
log2(P) x S per rank costs little.

Both partners of a step compute the same sum, so they must combine in the same order: the lower
virtual rank's operand first, on both sides. Then every rank builds the same expression tree
((x0+x1)+(x2+x3))+... and holds the same bits (sim/reduction_order.py checks it). Each step
writes a fresh buffer (two alternating scratch buffers, the last step the output), so no op
reads and writes one region; each step's incoming vector has its own receive slot.

Non-power-of-two world sizes fold as rhd does (fold.py): the odd rank of each of the first W-P
pairs hands its input to the even one, which sums both (lower rank first) before the steps and
copies the result back after them.
"""

from __future__ import annotations

from hiercoll.collectives import Kind
from hiercoll.planner.builder import Dep, RankBuilder, avg_scale
from hiercoll.planner.context import Algorithm, BaseParams, PlanContext, xor_period
from hiercoll.planner.fold import Fold
from hiercoll.planner.halving_doubling import fold_in, pieces
from hiercoll.planner.labels import LogStepLabel
from hiercoll.schedule import Region

RECV = "rd_recv"
ACC = ("rd_acc0", "rd_acc1")


class RecursiveDoubling(Algorithm[BaseParams]):
    name = "rd"
    kinds = frozenset({Kind.ALL_REDUCE})
    Params = BaseParams
    symmetry_group = "xor"

    def symmetry_period(self, ctx: PlanContext[BaseParams]) -> int | None:
        return xor_period(ctx)   # every step moves the whole vector: any size maps

    def build_rank(self, ctx: PlanContext[BaseParams], b: RankBuilder) -> None:
        spec, r, n = ctx.spec, b.rank, ctx.spec.count
        k, chans = ctx.params.chunks, ctx.params.channels
        fold = Fold(spec.world_size)
        v = fold.virtual(r)
        cur, written = fold_in(ctx, b, fold)
        if v is None:
            return
        scale = avg_scale(spec, spec.world_size)
        fold_deps: list[Dep | int] = [w for _, _, w in written]
        if fold.steps == 0:
            b.reduce([Region(r, cur, 0, n)], ctx.output(r, 0, n), scale=scale, deps=fold_deps)
            return
        b.alloc(RECV, fold.steps * n)
        # chunk c runs its own chain of steps on channel c % channels
        prev: dict[int, list[Dep | int]] = {c: list(fold_deps) for c in range(k)}
        for t in range(fold.steps):
            q = v ^ (1 << t)
            qr = fold.rank_of(q)
            final = t == fold.steps - 1
            if not final:
                b.alloc(ACC[t % 2], n)
            for c, off, cn in pieces(0, n, k):
                b.copy(Region(r, cur, off, cn), Region(qr, RECV, t * n + off, cn), channel=c % chans,
                       deps=prev[c], label=LogStepLabel("rd", t, c))
                mine, theirs = Region(r, cur, off, cn), Region(r, RECV, t * n + off, cn)
                dst = ctx.output(r, off, cn) if final else Region(r, ACC[t % 2], off, cn)
                prev[c] = [b.reduce([mine, theirs] if v < q else [theirs, mine], dst,
                                    scale=scale if final else 1.0, channel=c % chans,
                                    deps=[Dep(qr, LogStepLabel("rd", t, c)), *prev[c]])]
            cur = ACC[t % 2]
        partner = fold.partner(r)
        if partner is not None:
            b.copy(ctx.output(r, 0, n), ctx.output(partner, 0, n),
                   deps=[d for c in range(k) for d in prev[c]])
