"""NCCL's double binary tree all-reduce (`-a tree`), for the library model: what NCCL runs for
all-reduce on several nodes where its tuner prefers the tree to the ring (small and medium
sizes; `planner/library_model.py` takes whichever of the two the simulator times faster, as
NCCL's tuner does with its own model).

The shape (NCCL 2.x, `ncclGetDtree`, simplified): the buffer's two halves go down two binary
trees over the nodes; tree 0 is the heap order (node i's parent is (i-1)//2, root node 0), tree
1 the same over the nodes mirrored (root node N-1), so a node that is inside one tree is a leaf
or near it in the other. Inside a node the GPUs form a chain to the node's head, which talks to
the parent and child nodes: local rank 0 in tree 0, local rank G-1 in tree 1 (two rails).
Per chunk of a half: up, each rank reduces its input with the partial sums of the rank after it
on the chain and (a head) of its child nodes' heads; the root's head writes the result; down,
every rank copies the result from the rank before it (a head: from its parent node's head).
Up and down are one channel each per tree, so chunks pipeline through the tree. `channels` is
not used (each tree is one channel pair, as NCCL runs a tree per channel).

Not modelled: NCCL's LL/LL128 protocols (a calibration's per-op costs absorb them), its split of
a channel's data between the two trees by NIC, and tree-node placement on NVLS or CollNet.
"""

from __future__ import annotations

from typing import ClassVar

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.planner.builder import Dep, RankBuilder, avg_scale, chunk_bounds
from hiercoll.planner.context import Algorithm, BaseParams, PlanContext
from hiercoll.planner.labels import TreeLabel
from hiercoll.schedule import Region
from hiercoll.topology import Topology

SCRATCH = "tree_up"
TREES = 2


class TreeParams(BaseParams):
    pass


class Tree(Algorithm[TreeParams]):
    name = "tree"
    kinds = frozenset({Kind.ALL_REDUCE})
    Params = TreeParams
    # NCCL's algorithm, for the library model: plannable by name, not an auto-pick candidate
    searched: ClassVar[bool] = False

    def unsupported(self, topo: Topology, spec: CollectiveSpec, params: TreeParams) -> str | None:
        why = super().unsupported(topo, spec, params)
        if why is None and spec.world_size != topo.world_size:
            return "tree needs every GPU of the topology (its chains are whole nodes)"
        return why

    def build_rank(self, ctx: PlanContext[TreeParams], b: RankBuilder) -> None:
        r, g = b.rank, ctx.topology.gpus_per_node
        nodes = ctx.world // g
        node, local = divmod(r, g)
        k = ctx.params.chunks
        b.alloc(SCRATCH, ctx.spec.count)
        scale = avg_scale(ctx.spec, ctx.world)
        for t in range(TREES):
            pos = local if t == 0 else g - 1 - local             # place on the node's chain

            def chain(p: int, n: int = node, t: int = t) -> int:  # rank at chain place p
                return n * g + (p if t == 0 else g - 1 - p)
            tn = node if t == 0 else nodes - 1 - node            # place in tree t's heap

            def at(heap: int, t: int = t) -> int:                # a node's head rank
                n = heap if t == 0 else nodes - 1 - heap
                return n * g + (0 if t == 0 else g - 1)
            children = [at(c) for c in (2 * tn + 1, 2 * tn + 2) if c < nodes] if pos == 0 else []
            root = pos == 0 and tn == 0
            for c in range(k):
                off, n = chunk_bounds(ctx.spec.count, TREES * k, t * k + c)
                feeders = ([chain(pos + 1)] if pos + 1 < g else []) + children
                srcs = [ctx.input(r, off, n)] + [_up(q, off, n) for q in feeders]
                dst = ctx.output(r, off, n) if root else _up(r, off, n)
                b.reduce(srcs, dst, scale=scale if root else 1.0, channel=2 * t,
                         deps=[Dep(q, TreeLabel(t, c, "up")) for q in feeders],
                         label=TreeLabel(t, c, "down" if root else "up"))
                if root:
                    continue
                above = chain(pos - 1) if pos > 0 else at((tn - 1) // 2)
                b.copy(ctx.output(above, off, n), ctx.output(r, off, n), channel=2 * t + 1,
                       deps=[Dep(above, TreeLabel(t, c, "down"))], label=TreeLabel(t, c, "down"))


def _up(rank: int, off: int, n: int) -> Region:
    return Region(rank, SCRATCH, off, n)
