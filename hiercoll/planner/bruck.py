"""Bruck all-to-all (`bruck`): ceil(log2 W) steps instead of W-1 sends; for small blocks, where
each message's latency outweighs moving blocks more than once.

Classic Bruck rotates the input so that slot i holds the block for rank r+i, then at step k
sends every slot whose index has bit k set to rank r+2^k (which keeps the same slot index), and
finally rotates back. Here the rotations are addressing, not copies: slot i of rank r starts as
input block (r+i) mod W, a block's index never changes on its way, and its last hop (step k =
the highest set bit of i) writes straight into the destination's output at the origin's place.
Blocks between hops wait in a receive slot per step (offset i x block), so nothing is written
twice and no slot is reused within a call. Block i moves popcount(i) times: about (log2 W)/2
times the data of a direct all-to-all, in log2 W dependent steps. Works for any W.
"""

from __future__ import annotations

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.planner.builder import Dep, RankBuilder, chunk_bounds
from hiercoll.planner.context import Algorithm, BaseParams, PlanContext, node_period
from hiercoll.planner.labels import BruckLabel, Label
from hiercoll.schedule import Region
from hiercoll.topology import Topology

RECV = "bruck_recv"


def bruck_steps(world: int) -> int:
    """ceil(log2 W): the steps that move every block index 1..W-1."""
    return (world - 1).bit_length()


def _with_bit(n: int, bit: int) -> int:
    """How many of 0 .. n-1 have `bit` set."""
    period = 1 << (bit + 1)
    return (n // period) * (1 << bit) + max(0, n % period - (1 << bit))


class Bruck(Algorithm[BaseParams]):
    name = "bruck"
    kinds = frozenset({Kind.ALL_TO_ALL})
    Params = BaseParams

    def peers_per_rank(self, topology: Topology, spec: CollectiveSpec, params: BaseParams) -> int:
        """Block i hops popcount(i) times: ~W/2 x log2 W copies per rank."""
        w = spec.world_size
        return w * (w - 1).bit_length() // 4 + 2

    def symmetry_period(self, ctx: PlanContext[BaseParams]) -> int | None:
        return node_period(ctx)   # every peer is rank-relative (r + 2^k)

    def index_of(self, ctx: PlanContext[BaseParams], rank: int, label: Label) -> int:
        """Every rank's layout is the same: k own-block copies, then per step the blocks with
        that bit set, k chunks each (by formula: a 4096-rank plan never builds a peer's list)."""
        if not isinstance(label, BruckLabel):
            raise KeyError(label)
        w, k = ctx.world, ctx.params.chunks
        before = sum(_with_bit(w, b) for b in range(label.step)) + _with_bit(label.block, label.step)
        return k + before * k + label.chunk

    def build_rank(self, ctx: PlanContext[BaseParams], b: RankBuilder) -> None:
        w, r, k, chans = ctx.world, b.rank, ctx.params.chunks, ctx.params.channels
        blk = ctx.spec.count // w
        steps = bruck_steps(w)
        for c in range(k):
            lo, n = chunk_bounds(blk, k, c)
            b.copy(ctx.input(r, r * blk + lo, n), ctx.output(r, r * blk + lo, n), channel=c % chans)
        if steps > 1:
            b.alloc(RECV, (steps - 1) * w * blk)
        for s in range(steps):
            to = (r + (1 << s)) % w
            for i in range(1 << s, w):
                if not i >> s & 1:
                    continue
                low = i & ((1 << s) - 1)          # the hops block i has made so far
                j = low.bit_length() - 1           # the step that brought it here (-1: none)
                for c in range(k):
                    lo, n = chunk_bounds(blk, k, c)
                    deps: list[Dep | int] = []
                    if low == 0:
                        src = ctx.input(r, ((r + i) % w) * blk + lo, n)
                    else:
                        src = Region(r, RECV, (j * w + i) * blk + lo, n)
                        deps.append(Dep((r - (1 << j)) % w, BruckLabel(j, i, c)))
                    if i >> (s + 1):                   # more hops to go
                        dst = Region(to, RECV, (s * w + i) * blk + lo, n)
                    else:                              # last hop: the origin's place in the output
                        dst = ctx.output(to, ((r - low) % w) * blk + lo, n)
                    b.copy(src, dst, channel=c % chans, deps=deps, label=BruckLabel(s, i, c))
