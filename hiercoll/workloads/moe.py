"""Mixture-of-experts dispatch and combine as group_cast / group_reduce (DeepEP's design).

A router gives each token of each rank up to k experts (`topk_idx[r]`, shape [T_r, k], -1 for a
dropped slot). Experts sit on ranks contiguously: expert e on rank e // (E / W). Dispatch sends
each token once to every rank that hosts one of its experts, however many of that rank's experts
it picked: a group_cast whose input split lists the destination ranks. `hier` then moves it over
RDMA once per destination node and forwards it over NVLink there, as DeepEP's internode dispatch
does; the flat `direct` plan sends it once per remote destination rank. Combine is the transpose:
a group_reduce that sums the expert outputs back into the source token's rows.

Layouts (`packing`):
- "node" (the default; DeepEP's internode send buffer): the dispatch input of rank r is its
  tokens packed per destination node: for each node n in order, every token that picks an expert
  on n, ordered by the set of n's ranks it goes to, then by token index (`send_order` lists the
  (node, token) of each row: the sender gathers x into it, as DeepEP's kernel fills its RDMA
  buffer). A token is in the input once per node it visits and not at all if it goes nowhere.
  Each (node, rank set) run is one split, so a rank's input has at most nodes x (2**G - 1)
  splits whatever the token count: planning and simulation scale with the node count, not with
  tokens x destinations (per-token splits made the README's 4096-token example millions of ops).
- "token": the input is the T_r token rows in order; runs of consecutive tokens with the same
  destination set are one split (usually one token each); a token nobody receives is a split
  with an empty `peers` list, so row t of the input is token t.
- dispatch output of rank d, either way: the tokens it receives, one output split per source
  rank, in the source's input order (`recv_tokens` lists (source rank, token index)).
- combine is `transpose(dispatch)`: its input is the dispatch output (expert results, one row per
  received token), its output the source's dispatch input layout, accumulated into its values.
  With "node" a token's rows (one per node it visited) are partial sums: `combine_rows` adds
  them into one row per token (DeepEP's combine also ends with that reduction).

Gate weights: the IR has no per-piece weight, and needs none. The destination rank applies the
gate weights of its experts to their outputs and sums them locally (a token it received once may
have picked several of its experts) before combine; combine is a plain sum over ranks, so the
source gets sum over ranks of sum over their experts of w_e * y_e = sum_e w_e * y_e, the MoE
output. Use reduce_op `sum` (`avg` would divide by the number of ranks, not by the weights); the
output's previous values are added too, which is where a residual or shared expert's output can
go.
"""

from __future__ import annotations

import json
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from hiercoll.collectives import (
    CollectiveSpec,
    DType,
    GroupSplits,
    Kind,
    RankSplits,
    Split,
    checked_split,
    transpose,
)
from hiercoll.errors import HiercollError
from hiercoll.files import write_atomic
from hiercoll.planner import plan
from hiercoll.sim import simulate
from hiercoll.topology import Topology

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Phase = Literal["dispatch", "combine"]


@dataclass(frozen=True, eq=False)
class MoeLayout:
    """Who sends which token where (DeepEP's `get_dispatch_layout`, for every source rank).

    Arrays are read-only. `tokens_per_rank[src, dst]` counts src's tokens that dst receives (a
    token routed to several experts of one rank counts once); `tokens_per_node[src, node]` the
    same per node; `tokens_per_expert[e]` the (token, expert) pairs over all sources;
    `is_token_in_rank[src]` is [T_src, W] bool.
    """

    num_experts: int
    world_size: int
    gpus_per_node: int
    topk_idx: tuple[IntArray, ...]
    tokens_per_rank: IntArray
    tokens_per_node: IntArray
    tokens_per_expert: IntArray
    is_token_in_rank: tuple[BoolArray, ...]
    # rank -> its "node" packing (`_node_blocks`), filled on first use: recv_tokens asks for
    # every source's blocks once per destination; the cache lives and dies with the layout
    _blocks: dict[int, list[tuple[int, IntArray, IntArray]]] = field(
        default_factory=dict, init=False, repr=False)

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.gpus_per_node

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.world_size

    def num_tokens(self, rank: int) -> int:
        return int(self.topk_idx[rank].shape[0])


# ---- layout ------------------------------------------------------------------------------------
def _check_sizes(num_experts: int, world_size: int, gpus_per_node: int) -> None:
    for name, v in (("num_experts", num_experts), ("world_size", world_size),
                    ("gpus_per_node", gpus_per_node)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise HiercollError(f"{name}: {v!r} must be a positive integer")
    if world_size % gpus_per_node:
        raise HiercollError(f"gpus_per_node: world_size {world_size} is not a multiple of "
                            f"gpus_per_node {gpus_per_node}")
    if num_experts % world_size:
        raise HiercollError(f"num_experts: {num_experts} experts do not split evenly over "
                            f"{world_size} ranks; use a multiple of the world size")


def _check_rank(rank: int, a: object, num_experts: int) -> IntArray:
    """One rank's topk_idx, validated: a 2-D integer array of expert ids or -1, no repeats."""
    where = f"topk_idx[{rank}]"
    if not isinstance(a, np.ndarray):
        raise HiercollError(f"{where}: a {type(a).__name__}, expected a numpy array [T, k]")
    if a.dtype.kind not in "iu":
        raise HiercollError(f"{where}: dtype {a.dtype}, expected an integer dtype (expert ids)")
    if a.ndim != 2:
        raise HiercollError(f"{where}: shape {a.shape}, expected 2-D [tokens, topk]")
    bad = (a < -1) | (a >= num_experts)
    if bad.any():
        t, j = (int(x) for x in np.argwhere(bad)[0])
        raise HiercollError(f"{where}[{t}, {j}]: expert {int(a[t, j])} outside 0..{num_experts - 1} "
                            "(-1 marks a dropped slot)")
    ids = np.sort(a.astype(np.int64), axis=1)
    rep = (ids[:, 1:] == ids[:, :-1]) & (ids[:, 1:] >= 0)
    if rep.any():
        t, j = (int(x) for x in np.argwhere(rep)[0])
        raise HiercollError(f"{where}[{t}]: lists expert {int(ids[t, j])} twice; a token picks "
                            "distinct experts")
    out = a.astype(np.int64, copy=True)
    out.setflags(write=False)
    return out


def _in_rank(idx: IntArray, experts_per_rank: int, world: int) -> BoolArray:
    """[T, W]: does the token pick an expert on that rank (-1 slots ignored)."""
    hit = np.zeros((idx.shape[0], world), dtype=np.bool_)
    rows, cols = np.nonzero(idx >= 0)
    hit[rows, idx[rows, cols] // experts_per_rank] = True
    hit.setflags(write=False)
    return hit


def _frozen(a: IntArray) -> IntArray:
    a.setflags(write=False)
    return a


def layout(topk_idx: Sequence[npt.NDArray[Any]], num_experts: int, world_size: int,
           gpus_per_node: int) -> MoeLayout:
    """Counts and masks of a router's assignment: what dispatch/combine splits are built from."""
    _check_sizes(num_experts, world_size, gpus_per_node)
    if len(topk_idx) != world_size:
        raise HiercollError(f"topk_idx: {len(topk_idx)} arrays for world size {world_size}; "
                            "give one [T, k] array per rank")
    idx = tuple(_check_rank(r, a, num_experts) for r, a in enumerate(topk_idx))
    per_rank = num_experts // world_size
    nodes = world_size // gpus_per_node
    in_rank = tuple(_in_rank(a, per_rank, world_size) for a in idx)
    tpr = np.stack([m.sum(axis=0, dtype=np.int64) for m in in_rank])
    tpn = np.stack([m.reshape(-1, nodes, gpus_per_node).any(axis=2).sum(axis=0, dtype=np.int64)
                    for m in in_rank])
    flat = np.concatenate([a.ravel() for a in idx])
    tpe = np.bincount(flat[flat >= 0], minlength=num_experts).astype(np.int64)
    return MoeLayout(num_experts=num_experts, world_size=world_size, gpus_per_node=gpus_per_node,
                     topk_idx=idx, tokens_per_rank=_frozen(tpr), tokens_per_node=_frozen(tpn),
                     tokens_per_expert=_frozen(tpe), is_token_in_rank=in_rank)


# ---- layouts of the dispatch input ---------------------------------------------------------------
Packing = Literal["node", "token"]
PACKINGS: tuple[str, ...] = ("node", "token")


def _check_packing(packing: str) -> None:
    if packing not in PACKINGS:
        raise HiercollError(f"packing: {packing!r}; choose one of {', '.join(PACKINGS)}")


def _runs(keys: IntArray) -> list[tuple[int, int]]:
    """(start, length) of each run of equal consecutive keys."""
    if not len(keys):
        return []
    cut = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [len(keys)]])
    return [(int(a), int(b - a)) for a, b in zip(starts, ends, strict=True)]


def _mask_keys(mask: BoolArray) -> IntArray:
    """One integer per row of a bool matrix (column j is bit j), for grouping equal rows."""
    if mask.shape[1] <= 62:
        return (mask.astype(np.int64) << np.arange(mask.shape[1], dtype=np.int64)).sum(axis=1)
    _, inverse = np.unique(mask, axis=0, return_inverse=True)     # wide rows: any stable id
    return inverse.reshape(-1).astype(np.int64)


def _keys_pack(layout: MoeLayout, rank: int) -> bool:
    """Whether a node's mask keys are its local-rank bits and (node, key) fits one int64."""
    g, nodes = layout.gpus_per_node, layout.num_nodes
    return g <= 62 and (nodes << g) < (1 << 62) and g * nodes == layout.is_token_in_rank[rank].shape[1]


def _node_blocks(layout: MoeLayout, rank: int) -> list[tuple[int, IntArray, IntArray]]:
    """Per destination node n: (n, the tokens in packed order, their local-rank mask key)."""
    cached = layout._blocks.get(rank)
    if cached is not None:
        return cached
    g = layout.gpus_per_node
    mask = layout.is_token_in_rank[rank]
    out = []
    if _keys_pack(layout, rank):
        out = _node_blocks_at_once(mask, layout.num_nodes, g)
    else:
        for n in range(layout.num_nodes):
            local = mask[:, n * g:(n + 1) * g]
            tokens = np.flatnonzero(local.any(axis=1))
            keys = _mask_keys(local[tokens])
            order = np.argsort(keys, kind="stable")
            out.append((n, tokens[order], keys[order]))
    layout._blocks[rank] = out
    return out


def _node_blocks_at_once(mask: BoolArray, nodes: int, g: int) -> list[tuple[int, IntArray, IntArray]]:
    """`_node_blocks` of one rank in one sort over every node (numpy calls per node were most
    of building a 1024-rank dispatch's splits): tokens by (node, key), ties in token order, as
    the per-node stable sorts give them."""
    keys = _mask_keys(mask.reshape(-1, g)).reshape(len(mask), nodes)      # [token, node]
    node_of, token = np.nonzero(keys.T)                           # by node, then token
    key = keys[token, node_of]
    order = np.argsort(node_of * (1 << g) + key, kind="stable")
    node_of, token, key = node_of[order], token[order].astype(np.int64), key[order]
    cut = np.searchsorted(node_of, np.arange(nodes + 1))
    return [(n, token[cut[n]:cut[n + 1]], key[cut[n]:cut[n + 1]]) for n in range(nodes)]


def send_order(layout: MoeLayout, rank: int, packing: Packing = "node") -> IntArray:
    """[R, 2] (node, token index) of each row of `rank`'s dispatch input: gather
    `x[order[:, 1]]` into it ("token": node -1, every token in order)."""
    _check_packing(packing)
    if packing == "token":
        t = np.arange(layout.num_tokens(rank), dtype=np.int64)
        return np.stack([np.full(len(t), -1, dtype=np.int64), t], axis=1)
    parts = [np.stack([np.full(len(tok), n, dtype=np.int64), tok], axis=1)
             for n, tok, _ in _node_blocks(layout, rank)]
    return np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)


def recv_tokens(layout: MoeLayout, dst: int, packing: Packing = "node") -> IntArray:
    """[R, 2] (source rank, token index) of each row `dst` receives, in dispatch output order:
    what an expert needs to know whose token it holds (DeepEP's recv_src_idx, with the rank)."""
    _check_packing(packing)
    rows = []
    for s in range(layout.world_size):
        if packing == "token":
            t = np.flatnonzero(layout.is_token_in_rank[s][:, dst])
        else:
            t = _in_block(layout, s, dst // layout.gpus_per_node, dst)
        rows.append(np.stack([np.full(len(t), s), t], axis=1))
    return np.concatenate(rows).astype(np.int64) if rows else np.zeros((0, 2), dtype=np.int64)


def _in_block(layout: MoeLayout, src: int, node: int, dst: int) -> IntArray:
    """The tokens of `src`'s node-`node` block that `dst` receives, in block order."""
    _, tokens, _ = _node_blocks(layout, src)[node]
    return tokens[layout.is_token_in_rank[src][tokens, dst]]


def combine_rows(layout: MoeLayout, rank: int, packed: npt.NDArray[Any], row_elems: int,
                 packing: Packing = "node") -> npt.NDArray[Any]:
    """A combine output in `rank`'s dispatch input layout -> one row per token ([T_r, row_elems],
    zeros for a token nobody received): the per-node partial sums added together."""
    order = send_order(layout, rank, packing)[:, 1]
    rows = np.asarray(packed).reshape(len(order), row_elems)
    out = np.zeros((layout.num_tokens(rank), row_elems), dtype=rows.dtype)
    np.add.at(out, order, rows)
    return out


# ---- splits ------------------------------------------------------------------------------------
def _check_row_elems(row_elems: int) -> None:
    if isinstance(row_elems, bool) or not isinstance(row_elems, int | np.integer) or row_elems < 1:
        raise HiercollError(f"row_elems: {row_elems!r} must be a positive integer (elements per token)")


def _token_splits(mask: BoolArray, row_elems: int) -> list[Split]:
    """"token" packing: one split per run of consecutive tokens with the same destination set."""
    keys = _mask_keys(mask)
    return [checked_split(int(n) * row_elems, [int(d) for d in np.flatnonzero(mask[a])])
            for a, n in _runs(keys)]


def _node_splits(layout: MoeLayout, rank: int, row_elems: int,
                 peers: dict[int, list[int]] | None = None) -> list[Split]:
    """"node" packing: one split per (node, local rank set) run of the packed input. `peers`:
    (node, key) -> its ranks, shared by the ranks of one dispatch (see `_node_splits_from_keys`)."""
    g = layout.gpus_per_node
    blocks = _node_blocks(layout, rank)
    if _keys_pack(layout, rank):
        return _node_splits_from_keys(blocks, g, row_elems, {} if peers is None else peers)
    out = []
    for n, tokens, keys in blocks:
        for a, count in _runs(keys):
            local = layout.is_token_in_rank[rank][tokens[a], n * g:(n + 1) * g]
            out.append(checked_split(int(count) * row_elems,
                                     [n * g + int(j) for j in np.flatnonzero(local)]))
    return out


def _node_splits_from_keys(blocks: list[tuple[int, IntArray, IntArray]], g: int,
                           row_elems: int, peers: dict[int, list[int]]) -> list[Split]:
    """`_node_splits` where a key is its tokens' local-rank bit mask (g <= 62): a run's
    destinations are its key's bits, so the runs of every node come from one pass over the
    rank's (node, key) sequence, not from numpy calls per run (most of building a 1024-rank
    dispatch's splits). A run's peers list is `peers`' one for its (node, key), shared by every
    split with that key (nothing mutates a split's peers; as `GroupSplits.from_counts`), not
    built again per split: a 1024-rank dispatch has ~430k splits and ~30k distinct keys."""
    seq = np.concatenate([n * (1 << g) + keys for n, _, keys in blocks]) if blocks else np.zeros(0, np.int64)
    out: list[Split] = []
    if not len(seq):
        return out
    starts = np.concatenate([[0], np.flatnonzero(seq[1:] != seq[:-1]) + 1])
    counts = np.diff(np.concatenate([starts, [len(seq)]]))
    low = (1 << g) - 1
    for v, count in zip(seq[starts].tolist(), counts.tolist(), strict=True):
        dsts = peers.get(v)
        if dsts is None:
            n, key = v >> g, v & low
            dsts = peers[v] = [n * g + j for j in range(g) if key >> j & 1]
        out.append(checked_split(count * row_elems, dsts))
    return out


def dispatch_splits(layout: MoeLayout, row_elems: int, packing: Packing = "node") -> GroupSplits:
    """group_cast arguments of dispatch: token rows to each rank hosting one of their experts;
    each destination receives one split per source, in the source's input order."""
    _check_row_elems(row_elems)
    _check_packing(packing)
    row_elems = int(row_elems)         # sizes are Python ints (checked_split does not coerce)
    w = layout.world_size
    ranks = []
    one = [[s] for s in range(w)]       # an output split's peers, shared (nothing mutates them)
    peers: dict[int, list[int]] = {}
    for r in range(w):
        inputs = (_token_splits(layout.is_token_in_rank[r], row_elems) if packing == "token"
                  else _node_splits(layout, r, row_elems, peers))
        outputs = [checked_split(t * row_elems, one[s])      # a column as Python ints at once
                   for s, t in enumerate(layout.tokens_per_rank[:, r].tolist()) if t]
        ranks.append(RankSplits(input=inputs, output=outputs))
    return GroupSplits(ranks=ranks)


def combine_splits(layout: MoeLayout, row_elems: int, packing: Packing = "node") -> GroupSplits:
    """group_reduce arguments of combine: dispatch run backwards, summing each token's returned
    rows (gate-weighted by the expert ranks beforehand, see the module doc)."""
    return transpose(dispatch_splits(layout, row_elems, packing))


def _dtype(dtype: DType | str) -> DType:
    try:
        return DType(dtype)
    except ValueError:
        raise HiercollError(f"dtype: {dtype!r}; choose one of "
                            f"{', '.join(d.value for d in DType)}") from None


def spec_for(layout: MoeLayout, row_elems: int, dtype: DType | str = DType.BF16,
             phase: Phase = "dispatch", packing: Packing = "node") -> CollectiveSpec:
    """The collective of one phase, ready for `plan` (group sizes come from the splits)."""
    if phase not in ("dispatch", "combine"):
        raise HiercollError(f"phase: {phase!r}; choose dispatch or combine")
    kind = Kind.GROUP_CAST if phase == "dispatch" else Kind.GROUP_REDUCE
    splits = (dispatch_splits(layout, row_elems, packing) if phase == "dispatch"
              else combine_splits(layout, row_elems, packing))
    return CollectiveSpec(kind=kind, world_size=layout.world_size, dtype=_dtype(dtype), nbytes=0,
                          splits=splits)


# ---- routers -----------------------------------------------------------------------------------
def random_router(tokens_per_rank: int | Sequence[int], topk: int, num_experts: int,
                  world_size: int, seed: int, drop_prob: float = 0.0) -> list[IntArray]:
    """Uniform top-k routing (distinct experts per token); each slot becomes -1 with
    `drop_prob` (capacity drops), so some tokens may go nowhere."""
    _check_sizes(num_experts, world_size, 1)
    counts = [tokens_per_rank] * world_size if isinstance(tokens_per_rank, int) else list(tokens_per_rank)
    if len(counts) != world_size or any(isinstance(t, bool) or t < 0 for t in counts):
        raise HiercollError(f"tokens_per_rank: {tokens_per_rank!r}: give one count >= 0, or one per "
                            f"rank ({world_size})")
    if not 0 <= topk <= num_experts:
        raise HiercollError(f"topk: {topk} must be in 0..num_experts ({num_experts})")
    if not 0.0 <= drop_prob <= 1.0:
        raise HiercollError(f"drop_prob: {drop_prob} must be in [0, 1]")
    rng = np.random.default_rng(seed)
    out = []
    for t in counts:
        idx = np.argsort(rng.random((t, num_experts)), axis=1)[:, :topk].astype(np.int64)
        idx[rng.random(idx.shape) < drop_prob] = -1
        out.append(idx)
    return out


def _from_json(path: Path) -> list[IntArray]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HiercollError(f"{path}: cannot read JSON ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("topk_idx"), list):
        raise HiercollError(f'{path}: expected {{"topk_idx": [[[expert, ...], ...], ...]}} '
                            "(per rank, per token, top-k expert ids)")
    ranks = data["topk_idx"]
    out = []
    for r, rows in enumerate(ranks):
        out.append(_json_rank(f"{path}: topk_idx[{r}]", rows))
    k = max((a.shape[1] for a in out), default=0)
    return [a if len(a) else np.zeros((0, k), dtype=np.int64) for a in out]


def _json_rank(where: str, rows: object) -> IntArray:
    """One rank's tokens: a list of equal-length lists of integers (bools and floats refused)."""
    if not isinstance(rows, list):
        raise HiercollError(f"{where}: {type(rows).__name__}, expected a list of tokens")
    if not all(isinstance(t, list) and all(type(e) is int for e in t) for t in rows):
        raise HiercollError(f"{where}: every token must be a list of integer expert ids")
    huge = next((e for t in rows for e in t if not -1 <= e < 2**62), None)
    if huge is not None:      # an int64 holds it no more (2**63: an OverflowError traceback)
        raise HiercollError(f"{where}: expert {huge} is no expert id (-1 marks a dropped slot)")
    lengths = sorted({len(t) for t in rows})
    if len(lengths) > 1:
        raise HiercollError(f"{where}: tokens have different top-k lengths {lengths}; pad with -1")
    return np.array(rows, dtype=np.int64).reshape(len(rows), lengths[0] if rows else 0)


MAX_ROUTER_ENTRIES = 1 << 28    # [W, T, k] ids read into memory: 2 GiB of int64


def _from_npy(path: Path) -> list[IntArray]:
    try:   # memory-mapped: a header that claims a huge shape allocates nothing
        a = np.load(path, allow_pickle=False, mmap_mode="r")
    except (OSError, ValueError, EOFError, SyntaxError, MemoryError, tokenize.TokenError) as err:
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise HiercollError(f"{path}: cannot read .npy ({first})") from None
    if a.ndim != 3 or a.dtype.kind not in "iu":
        raise HiercollError(f"{path}: array {a.dtype} {a.shape}, expected an integer array "
                            "[world, tokens, topk]")
    if a.size > MAX_ROUTER_ENTRIES:
        raise HiercollError(f"{path}: {a.shape} is {a.size} expert ids, over "
                            f"{MAX_ROUTER_ENTRIES}; route fewer tokens")
    return [np.array(a[r], dtype=np.int64) for r in range(a.shape[0])]


def load_router(path: str | Path) -> list[IntArray]:
    """topk_idx per rank from `.npy` ([W, T, k] integers) or `.json` ({"topk_idx": ...}, ranks
    may hold different token counts). Values are checked against the experts by `layout`."""
    p = Path(path)
    if not p.is_file():
        raise HiercollError(f"{p}: no such router file")
    if p.suffix == ".npy":
        return _from_npy(p)
    if p.suffix == ".json":
        return _from_json(p)
    raise HiercollError(f"{p}: unknown router format {p.suffix!r}; use .npy or .json")


def save_router(topk_idx: Sequence[npt.NDArray[Any]], path: str | Path) -> None:
    """Write what `load_router` reads: `.npy` needs equal token counts, `.json` does not."""
    p = Path(path)
    if p.suffix == ".npy":
        if len({a.shape for a in topk_idx}) > 1:
            raise HiercollError(f"{p}: ranks have different shapes; .npy needs [W, T, k], use .json")
        arr = np.stack([np.asarray(a, dtype=np.int64) for a in topk_idx])
        with open(p, "wb") as f:
            np.save(f, arr)
    elif p.suffix == ".json":
        write_atomic(p, json.dumps({"topk_idx": [np.asarray(a).tolist() for a in topk_idx]}))
    else:
        raise HiercollError(f"{p}: unknown router format {p.suffix!r}; use .npy or .json")


# ---- RDMA bytes --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RdmaRow:
    """Inter-node bytes and simulated time of one plan, next to the de-duplicated minimum."""

    phase: Phase
    algorithm: str
    inter_bytes: int
    min_inter_bytes: int
    time_us: float

    @property
    def excess_bytes(self) -> int:
        return self.inter_bytes - self.min_inter_bytes


def min_inter_bytes(layout: MoeLayout, row_elems: int, dtype: DType | str) -> int:
    """Unique (token, destination node other than the source's) pairs x row bytes: a token must
    cross into every remote node hosting one of its experts, at least once."""
    _check_row_elems(row_elems)
    g, n = layout.gpus_per_node, layout.num_nodes
    pairs = 0
    for s, m in enumerate(layout.is_token_in_rank):
        nodes = np.asarray(m.reshape(-1, n, g).any(axis=2), dtype=np.bool_)
        pairs += int(nodes.sum()) - int(nodes[:, s // g].sum())
    return pairs * row_elems * _dtype(dtype).itemsize


def rdma_bytes_report(layout: MoeLayout, topology: Topology, row_elems: int, dtype: DType | str,
                      algorithms: Sequence[str] = ("direct", "hier"),
                      phases: Sequence[Phase] = ("dispatch",),
                      packing: Packing = "node") -> list[RdmaRow]:
    """Plan and simulate each phase with each algorithm: how far each is from the minimum."""
    if (topology.world_size, topology.gpus_per_node) != (layout.world_size, layout.gpus_per_node):
        raise HiercollError(f"topology: {topology.name} has {topology.world_size} ranks, "
                            f"{topology.gpus_per_node} per node; the layout has {layout.world_size}, "
                            f"{layout.gpus_per_node}")
    floor = min_inter_bytes(layout, row_elems, dtype)
    rows = []
    for phase in phases:
        spec = spec_for(layout, row_elems, dtype, phase, packing)
        for algo in algorithms:
            res = simulate(plan(topology, spec, algo), topology)
            rows.append(RdmaRow(phase=phase, algorithm=algo, inter_bytes=int(round(res.bytes_inter)),
                                min_inter_bytes=floor, time_us=res.time_us))
    return rows
