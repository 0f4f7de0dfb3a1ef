"""Recursive halving-doubling (`rhd`): reduce-scatter by recursive halving, all-gather by
recursive doubling, all-reduce as the two (Rabenseifner). log2(P) steps each instead of the
ring's W-1, moving the same (W-1)/W of the data per rank on power-of-two world sizes.

Reduce-scatter step s: virtual rank v pairs with v xor P/2^(s+1), keeps the half of its current
segment range that holds its own shard, sends the other half into the partner's receive slot and
reduces what it kept with what it received (the lower virtual rank's operand first). Every
element is summed once per level, by one rank, so all-reduce ranks hold the same bits. Each
step's result goes to a fresh buffer (two alternating scratch buffers, the last step to the
output): no op reads and writes one region. All-gather step t: v sends everything it holds
(2^t segments) to v xor 2^t, straight into its output. Distances halve in the reduce-scatter
(the first step is the farthest: half the data crosses the widest cut) and double in the
all-gather, so every step moves one contiguous range.

Non-power-of-two world sizes fold (fold.py): the odd rank of each of the first W-P pairs hands its
input to the even one first (all-gather: its shard) and gets its shard (all-reduce: the whole
result) back at the end, two extra steps. Chunks split each step's range (chunk c of a range is
the same piece on both partners), chunk c on channel c % channels; a step's chunk waits only for
the pieces of the step before that it reads.

Where every segment is one size and the chunk count a power of two, chunk c of a range is
counted from the sender's own position in it (segment g is the range's (g xor v)-th), not from
the range's start: xor-ing every rank by a power of two then maps each chunk onto the same
chunk, so multi-chunk rhd keeps the xor symmetry a one-chunk one has (one node simulated, and
one node's ops walked for the auto-picker's bound, instead of every rank's).
"""

from __future__ import annotations

from collections.abc import Callable

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.planner.builder import Dep, RankBuilder, avg_scale, chunk_bounds
from hiercoll.planner.context import Algorithm, BaseParams, PlanContext, xor_period
from hiercoll.planner.fold import Fold
from hiercoll.planner.labels import FoldLabel, LogStepLabel
from hiercoll.schedule import INPUT, Region

FOLD = "log_fold"          # the partner's input (reduce-scatter / all-reduce), on the even rank
FOLD_SUM = "log_fold_sum"  # my input + the partner's
RECV = "rhd_recv"          # per reduce-scatter step, the half the partner sent me
ACC = ("rhd_acc0", "rhd_acc1")
RESULT = "rhd_result"      # reduce-scatter, even rank of a pair: both shards, before they leave

# who wrote which elements of a buffer: (start, end, the op or the peer's op)
Written = list[tuple[int, int, Dep | int]]


def overlapping(written: Written, start: int, end: int) -> list[Dep | int]:
    """The writers of any element in [start, end)."""
    return [w for a, b, w in written if a < end and start < b]


def pieces(offset: int, count: int, chunks: int) -> list[tuple[int, int, int]]:
    """(chunk, offset, count) of a range split into `chunks` balanced pieces."""
    return [(c, offset + o, n) for c in range(chunks) for o, n in [chunk_bounds(count, chunks, c)]]


def step_pieces(spec: CollectiveSpec, fold: Fold, lo: int, hi: int, sender: int,
                chunks: int) -> list[tuple[int, int, int]]:
    """(chunk, offset, count) of virtual segments lo .. hi-1 as `sender` splits them. With even
    segments and a power-of-two chunk count, in the sender's relative order (see the module
    docstring): an aligned block of relative positions is an aligned block of segments, so each
    chunk stays one contiguous range; otherwise the range in balanced pieces."""
    if not rank_relative(spec, fold, chunks):
        return pieces(*fold.segment(spec, lo, hi), chunks)
    n, mine = hi - lo, sender & (hi - lo - 1)     # ranges are aligned powers of two
    if chunks <= n:
        per = n // chunks
        turn = mine & ~(per - 1)
        return [(c, *fold.segment(spec, lo + (c * per ^ turn), lo + (c * per ^ turn) + per))
                for c in range(chunks)]
    split = chunks // n
    out = []
    for x in range(n):
        off, cnt = fold.segment(spec, lo + (x ^ mine), lo + (x ^ mine) + 1)
        out += [(x * split + j, off + o, m) for j in range(split) for o, m in [chunk_bounds(cnt, split, j)]]
    return out


def rank_relative(spec: CollectiveSpec, fold: Fold, chunks: int) -> bool:
    """Whether chunks are counted from the sender's position: a power-of-two world (no fold)
    of equal shards (CollectiveSpec.shard makes the first count % W longer) and a power-of-two
    chunk count. Also what rhd's xor symmetry needs: rank r xor kP moves what r moves."""
    return fold.extra == 0 and spec.count % fold.p == 0 and chunks & (chunks - 1) == 0


def fold_in(ctx: PlanContext[BaseParams], b: RankBuilder, fold: Fold) -> tuple[str, Written]:
    """Reduce kinds: the extra rank of a pair copies its input to the even rank, which sums
    both (lower rank first). Returns the buffer the steps start from and who wrote it."""
    r, n = b.rank, ctx.spec.count
    partner = fold.partner(r)
    if partner is None:
        return INPUT, []
    if fold.virtual(r) is None:
        b.copy(ctx.input(r, 0, n), Region(partner, FOLD, 0, n), label=FoldLabel())
        return INPUT, []
    b.alloc(FOLD, n)
    b.alloc(FOLD_SUM, n)
    i = b.reduce([ctx.input(r, 0, n), Region(r, FOLD, 0, n)], Region(r, FOLD_SUM, 0, n),
                 deps=[Dep(partner, FoldLabel())])
    return FOLD_SUM, [(0, n, i)]


def recv_offset(spec: CollectiveSpec, fold: Fold, v: int, step: int) -> int:
    """Where step `step`'s half lands in virtual rank v's receive buffer: after the halves of
    the steps before (each step's slot is its own; no slot is reused within a call)."""
    lo, hi, off = 0, fold.p, 0
    for _ in range(step):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if v < mid else (mid, hi)
        off += fold.segment(spec, lo, hi)[1]
    return off


def reduce_scatter_steps(ctx: PlanContext[BaseParams], b: RankBuilder, fold: Fold, start: str,
                         written: Written, last_dst: Callable[[int, int], Region]) -> Written:
    """Recursive halving on virtual rank fold.virtual(b.rank) (at least one step); the last
    step writes `last_dst(offset in S, count)`. Returns the last step's reduces."""
    spec, r, k, chans = ctx.spec, b.rank, ctx.params.chunks, ctx.params.channels
    v = fold.virtual(r)
    assert v is not None
    scale = avg_scale(spec, spec.world_size)
    lo, hi, cur = 0, fold.p, start
    b.alloc(RECV, recv_offset(spec, fold, v, fold.steps))   # may exceed S: segments differ
    for s in range(fold.steps):
        mid = (lo + hi) // 2
        keep, send, q = ((lo, mid), (mid, hi), v + (mid - lo)) if v < mid else \
            ((mid, hi), (lo, mid), v - (mid - lo))
        qr = fold.rank_of(q)
        a, n = fold.segment(spec, *send)
        q_slot = recv_offset(spec, fold, q, s) - a
        for c, off, cn in step_pieces(spec, fold, *send, v, k):
            b.copy(Region(r, cur, off, cn), Region(qr, RECV, q_slot + off, cn), channel=c % chans,
                   deps=overlapping(written, off, off + cn), label=LogStepLabel("rs", s, c))
        ka, kn = fold.segment(spec, *keep)
        my_slot = recv_offset(spec, fold, v, s) - ka
        final = s == fold.steps - 1
        if not final:
            b.alloc(ACC[s % 2], spec.count)
        produced: Written = []
        for c, off, cn in step_pieces(spec, fold, *keep, q, k):
            mine, theirs = Region(r, cur, off, cn), Region(r, RECV, my_slot + off, cn)
            dst = last_dst(off, cn) if final else Region(r, ACC[s % 2], off, cn)
            i = b.reduce([mine, theirs] if v < q else [theirs, mine], dst, channel=c % chans,
                         scale=scale if final else 1.0,
                         deps=[Dep(qr, LogStepLabel("rs", s, c)), *overlapping(written, off, off + cn)])
            produced.append((off, off + cn, i))
        written, lo, hi, cur = produced, keep[0], keep[1], ACC[s % 2]
    return written


def all_gather_steps(ctx: PlanContext[BaseParams], b: RankBuilder, fold: Fold,
                     written: Written) -> Written:
    """Recursive doubling of the output's segments; `written`: who wrote my segment. Returns
    who wrote each part of the output by the end."""
    spec, r, k, chans = ctx.spec, b.rank, ctx.params.chunks, ctx.params.channels
    v = fold.virtual(r)
    assert v is not None
    written = list(written)
    for t in range(fold.steps):
        m = 1 << t
        base, q = (v // m) * m, v ^ m
        qr = fold.rank_of(q)
        for c, off, cn in step_pieces(spec, fold, base, base + m, v, k):
            b.copy(ctx.output(r, off, cn), ctx.output(qr, off, cn), channel=c % chans,
                   deps=overlapping(written, off, off + cn), label=LogStepLabel("ag", t, c))
        qbase = (q // m) * m
        written += [(off, off + cn, Dep(qr, LogStepLabel("ag", t, c)))
                    for c, off, cn in step_pieces(spec, fold, qbase, qbase + m, q, k)]
    return written


def unfold(ctx: PlanContext[BaseParams], b: RankBuilder, partner: int | None, written: Written) -> None:
    """The even rank of a pair hands the partner the whole output at the end."""
    if partner is None:
        return
    n = ctx.spec.output_count(b.rank)
    b.copy(ctx.output(b.rank, 0, n), ctx.output(partner, 0, n), deps=[w for _, _, w in written])


class HalvingDoubling(Algorithm[BaseParams]):
    name = "rhd"
    kinds = frozenset({Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_REDUCE})
    Params = BaseParams
    symmetry_group = "xor"

    def symmetry_period(self, ctx: PlanContext[BaseParams]) -> int | None:
        # chunks counted from the sender's position (step_pieces) map onto themselves under an
        # xor; a balanced split of the range (the other cases) does not
        if not rank_relative(ctx.spec, Fold(ctx.world), ctx.params.chunks):
            return None
        return xor_period(ctx)

    def build_rank(self, ctx: PlanContext[BaseParams], b: RankBuilder) -> None:
        spec, r = ctx.spec, b.rank
        fold = Fold(spec.world_size)
        partner, v = fold.partner(r), fold.virtual(r)
        if spec.kind == Kind.ALL_GATHER:
            off, n = spec.shard(r)
            if v is None:
                assert partner is not None
                b.copy(ctx.input(r, 0, n), ctx.output(partner, off, n), label=FoldLabel())
                return
            mine: Written = [(off, off + n, b.copy(ctx.input(r, 0, n), ctx.output(r, off, n)))]
            if partner is not None:
                po, pn = spec.shard(partner)
                mine.append((po, po + pn, Dep(partner, FoldLabel())))
            unfold(ctx, b, partner, all_gather_steps(ctx, b, fold, mine))
            return
        start, written = fold_in(ctx, b, fold)
        if v is None:
            return
        if fold.steps == 0:          # one rank
            n = spec.output_count(r)
            b.reduce([Region(r, start, 0, n)], ctx.output(r, 0, n), scale=avg_scale(spec, spec.world_size),
                     deps=[w for _, _, w in written])
            return
        if spec.kind == Kind.ALL_REDUCE:
            last = reduce_scatter_steps(ctx, b, fold, start, written, lambda c, m: ctx.output(r, c, m))
            unfold(ctx, b, partner, all_gather_steps(ctx, b, fold, last))
            return
        own_off = spec.shard(r)[0]
        if partner is None:    # reduce-scatter: my last segment is my shard, into the output
            reduce_scatter_steps(ctx, b, fold, start, written, lambda c, m: ctx.output(r, c - own_off, m))
            return
        b.alloc(RESULT, spec.count)   # the pair's two shards land here, then in both outputs
        last = reduce_scatter_steps(ctx, b, fold, start, written, lambda c, m: Region(r, RESULT, c, m))
        for x in fold.members(v):
            xo, xn = spec.shard(x)
            b.copy(Region(r, RESULT, xo, xn), ctx.output(x, 0, xn), deps=overlapping(last, xo, xo + xn))
