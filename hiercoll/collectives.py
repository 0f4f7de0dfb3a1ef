"""What each collective means: the spec, per-rank buffer layouts, group-cast splits, and the naive
numpy reference every schedule is checked against. Depends on nothing else in hiercoll but errors
and gcpause.

Sizes follow nccl-tests: `nbytes` (S) is the total buffer of the collective — all_reduce: each
rank's buffer; reduce_scatter: each rank's input (W shards); all_gather: each rank's output;
all_to_all: each rank's buffer; broadcast/reduce: the root's buffer. group_cast/group_reduce take
their sizes from the splits; their S is the largest per-rank output.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hiercoll.errors import HiercollError
from hiercoll.gcpause import without_cyclic_gc
from hiercoll.trusted_models import trusted_constructor


class Kind(StrEnum):
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_REDUCE = "all_reduce"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    GROUP_CAST = "group_cast"
    GROUP_REDUCE = "group_reduce"


class DType(StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP64 = "fp64"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.value]

    @property
    def eps(self) -> float:
        """Unit roundoff (half an ulp at 1.0)."""
        return {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24, "fp64": 2.0**-53}[self.value]


_ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}


class ReduceOp(StrEnum):
    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"


REDUCING = {Kind.REDUCE_SCATTER, Kind.ALL_REDUCE, Kind.REDUCE, Kind.GROUP_REDUCE}
ROOTED = {Kind.BROADCAST, Kind.REDUCE}
GROUPED = {Kind.GROUP_CAST, Kind.GROUP_REDUCE}
# every rank holds the same output elements: they must be the same bits on every rank
# (sim/reduction_order.py proves it of a plan; the executors' checks compare the bits)
SHARED_OUTPUT = frozenset({Kind.ALL_REDUCE, Kind.ALL_GATHER, Kind.BROADCAST})


class Split(BaseModel):
    """One contiguous piece of a rank's buffer and the ranks it goes to / comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    size: int = Field(ge=0, description="elements")
    peers: list[int] = Field(description="group_cast input: destinations; output: [source]. "
                             "group_reduce input: [destination]; output: sources")


class RankSplits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    input: list[Split] = Field(default_factory=list)
    output: list[Split] = Field(default_factory=list)


class GroupSplits(BaseModel):
    """MagiAttention-style group-cast/group-reduce arguments, one entry per rank.

    group_cast: an input split lists its destination ranks, an output split its one source.
    group_reduce is the transpose: an input split lists its one destination, an output split all
    the sources whose pieces it sums (accumulated into the output's existing values).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    ranks: list[RankSplits]

    @classmethod
    def from_counts(cls, counts: Any) -> GroupSplits:
        """All-to-all-v as group_cast arguments: `counts[s][d]` elements rank s sends rank d, its
        input laid out by destination and its output by source (MPI_Alltoallv's packed layout).

        Why not build the Splits by hand: a dense 1024-rank exchange is two million of them, and
        validating each (~6 us) costs more than simulating it; the matrix is checked once here."""
        try:
            m = np.asarray(counts)
        except (ValueError, TypeError) as e:
            raise ValueError(f"counts: not a matrix ({e}); give a W x W list of element counts") from None
        if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
            raise ValueError(f"counts: shape {m.shape}; give a square W x W matrix "
                             "(counts[s][d]: elements rank s sends rank d)")
        if m.dtype.kind not in "iu" and not (m.dtype.kind == "f" and np.isfinite(m).all()
                                             and np.all(m == np.round(m))):
            raise ValueError(f"counts: dtype {m.dtype}; give whole numbers of elements")
        bad = (m < 0) | (m > np.iinfo(np.int64).max)
        if bad.any():
            s, d = (int(v) for v in np.argwhere(bad)[0])
            raise ValueError(f"counts[{s}][{d}] = {m[s, d]}; element counts are >= 0 and < 2**63")
        dense = m.astype(np.int64)
        rows = dense.tolist()
        world = len(rows)
        split, rank_splits = _trusted_split, _trusted_rank_splits
        # one [p] list per rank, shared by the splits naming p (frozen models; nothing in
        # hiercoll mutates a split's peers: W^2 lists would cost more than the rest)
        peer = [[p] for p in range(world)]
        with without_cyclic_gc():
            out = cls.model_construct(ranks=[
                rank_splits(input=[split(size=rows[r][d], peers=peer[d]) for d in range(world)],
                            output=[split(size=rows[s][r], peers=peer[s]) for s in range(world)])
                for r in range(world)])
        _DENSE_COUNTS[id(out)] = dense
        weakref.finalize(out, _DENSE_COUNTS.pop, id(out), None)
        return out


_trusted_split: Callable[..., Split] = trusted_constructor(Split)
_trusted_rank_splits: Callable[..., RankSplits] = trusted_constructor(RankSplits)


def checked_split(size: int, peers: list[int]) -> Split:
    """A `Split` of values its builder computed and knows valid (size >= 0, ranks as ints),
    without pydantic's validation: a 1024-rank MoE dispatch builds hundreds of thousands."""
    return _trusted_split(size=size, peers=peers)


# GroupSplits made by `from_counts` -> their matrix, checked there: validation and pair streams
# read it instead of W^2 splits. Beside the model, not in it: a private attribute would make
# these splits unequal to the same splits loaded from a file.
_DENSE_COUNTS: dict[int, np.ndarray] = {}


def dense_counts(splits: GroupSplits, world: int | None = None) -> np.ndarray | None:
    """counts[s][d] of splits `GroupSplits.from_counts` made (of `world` ranks, where given),
    or None."""
    dense = _DENSE_COUNTS.get(id(splits))
    if dense is None or (world is not None and dense.shape != (world, world)):
        return None
    return dense


def transpose(splits: GroupSplits) -> GroupSplits:
    """group_cast arguments <-> group_reduce arguments: a group_reduce is a group_cast run
    backwards (MagiAttention pairs them for the forward and backward pass)."""
    return GroupSplits(ranks=[RankSplits(input=r.output, output=r.input) for r in splits.ranks])


@dataclass(frozen=True, slots=True)
class Segment:
    """`count` elements at `src_offset` of the source's input land at `dst_offset` of the
    destination's output (group_cast) or staging (group_reduce)."""

    src_offset: int
    dst_offset: int
    count: int


@dataclass(frozen=True, slots=True)
class PairStream:
    """Everything `src` sends to `dst`: aligned segments, and the offset of each of dst's output
    splits (by split index) inside the stream (needed by group_reduce to find a source's piece)."""

    src: int
    dst: int
    segments: tuple[Segment, ...]
    total: int


class CollectiveSpec(BaseModel):
    """One collective call: what, among how many ranks, on how much data."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Kind
    world_size: int = Field(ge=1)
    dtype: DType = DType.BF16
    nbytes: int = Field(default=0, ge=0, description="S as in nccl-tests (see module doc)")
    reduce_op: ReduceOp = ReduceOp.SUM
    root: int = 0
    splits: GroupSplits | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        w, isz = self.world_size, self.dtype.itemsize
        if self.kind in GROUPED:
            if self.splits is None:
                raise ValueError(f"splits: {self.kind} needs --splits FILE (per-rank input/output splits)")
            with without_cyclic_gc():
                _validate_splits(self.kind, self.world_size, self.splits)
            if self.kind == Kind.GROUP_REDUCE and self.reduce_op not in (ReduceOp.SUM, ReduceOp.AVG):
                raise ValueError(f"reduce_op: group_reduce supports sum and avg, not {self.reduce_op}")
            return self
        if self.splits is not None:
            raise ValueError(f"splits: only group_cast/group_reduce take splits, not {self.kind}")
        if self.nbytes % isz:
            raise ValueError(f"nbytes: {self.nbytes} is not a multiple of the {self.dtype} "
                             f"element size {isz}")
        if self.kind == Kind.ALL_TO_ALL and self.nbytes % (w * isz):
            raise ValueError(f"nbytes: all_to_all needs a multiple of world_size*{isz} = {w * isz} "
                             f"bytes (got {self.nbytes}); use group_cast for uneven all-to-all-v")
        if self.kind in ROOTED and not 0 <= self.root < w:
            raise ValueError(f"root: {self.root} is outside 0..{w - 1}")
        return self

    def resized(self, nbytes: int) -> CollectiveSpec:
        """This spec at another S, validated anew. Not `model_copy(update=...)`: that would carry
        over cached layouts (`count`, shards) computed for the old size."""
        return CollectiveSpec.model_validate(self.model_dump() | {"nbytes": nbytes})

    # ---- layout ------------------------------------------------------------------------------
    @cached_property
    def count(self) -> int:
        """Elements of S (for grouped kinds: of the largest output)."""
        if self.kind in GROUPED:
            return max((self.output_count(r) for r in range(self.world_size)), default=0)
        return self.nbytes // self.dtype.itemsize

    @property
    def total_bytes(self) -> int:
        """S in bytes for every kind: the one size every report quotes (`nbytes` is the input
        field, 0 for group kinds, whose size comes from their splits)."""
        return self.count * self.dtype.itemsize

    def shard(self, index: int) -> tuple[int, int]:
        """(offset, count) of shard `index` of `count`: balanced, first `count % W` one longer."""
        return self._shards[index]

    @cached_property
    def _shards(self) -> list[tuple[int, int]]:
        base, extra = divmod(self.count, self.world_size)
        return [(i * base + min(i, extra), base + (1 if i < extra else 0))
                for i in range(self.world_size)]

    def input_count(self, rank: int) -> int:
        k = self.kind
        if k == Kind.ALL_GATHER:
            return self.shard(rank)[1]
        if k == Kind.BROADCAST and rank != self.root:
            return 0
        if k in GROUPED:
            assert self.splits is not None
            return sum(s.size for s in self.splits.ranks[rank].input)
        return self.count

    def output_count(self, rank: int) -> int:
        k = self.kind
        if k == Kind.REDUCE_SCATTER:
            return self.shard(rank)[1]
        if k == Kind.REDUCE and rank != self.root:
            return 0
        if k in GROUPED:
            assert self.splits is not None
            return sum(s.size for s in self.splits.ranks[rank].output)
        return self.count

    @property
    def accumulates_output(self) -> bool:
        """group_reduce adds into the output's existing values; every other kind overwrites."""
        return self.kind == Kind.GROUP_REDUCE

    # ---- nccl-tests bandwidth ----------------------------------------------------------------
    @property
    def busbw_factor(self) -> float:
        n = self.world_size
        if self.kind == Kind.ALL_REDUCE:
            return 2 * (n - 1) / n
        if self.kind in (Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_TO_ALL):
            return (n - 1) / n
        return 1.0

    def bandwidths_gbps(self, time_us: float) -> tuple[float, float]:
        """(algbw, busbw) in GB/s (1e9 B/s) for a run of `time_us`."""
        if time_us <= 0:
            return 0.0, 0.0
        algbw = self.total_bytes / (time_us * 1e3)
        return algbw, algbw * self.busbw_factor

    # ---- group streams -----------------------------------------------------------------------
    @cached_property
    def pair_streams(self) -> dict[tuple[int, int], PairStream]:
        assert self.splits is not None
        with without_cyclic_gc():
            return _pair_streams(self.world_size, self.splits)


def _offsets(splits: list[Split]) -> list[int]:
    out, pos = [], 0
    for s in splits:
        out.append(pos)
        pos += s.size
    return out


def _validate_splits(kind: Kind, world: int, splits: GroupSplits) -> None:
    if dense_counts(splits, world) is not None:
        return      # from_counts checked the matrix; one peer per split, sent == got by layout
    if len(splits.ranks) != world:
        raise ValueError(f"splits.ranks: {len(splits.ranks)} entries for world size {world}; "
                         "give one {input, output} entry per rank")
    one_side = "output" if kind == Kind.GROUP_CAST else "input"
    for r, rs in enumerate(splits.ranks):
        for side in ("input", "output"):
            for i, sp in enumerate(getattr(rs, side)):
                peers = sp.peers
                if len(peers) == 1 and 0 <= peers[0] < world:
                    continue            # the common case, checked fast (W^2 splits all-to-all-v)
                where = f"splits.ranks[{r}].{side}[{i}].peers"
                if side == one_side and len(peers) != 1:
                    raise ValueError(f"{where}: a {kind} {side} split has exactly one peer "
                                     f"(got {peers})")
                bad = [p for p in peers if not 0 <= p < world]
                if bad:
                    raise ValueError(f"{where}: ranks {bad} outside 0..{world - 1}")
                if len(set(peers)) != len(peers):
                    raise ValueError(f"{where}: {peers} lists a rank twice")
    sent: dict[tuple[int, int], int] = {}
    got: dict[tuple[int, int], int] = {}
    for r, rs in enumerate(splits.ranks):
        for sp in rs.input:
            for p in sp.peers:
                sent[(r, p)] = sent.get((r, p), 0) + sp.size
        for sp in rs.output:
            for p in sp.peers:
                got[(p, r)] = got.get((p, r), 0) + sp.size
    for pair in sorted(set(sent) | set(got)):
        s, g = sent.get(pair, 0), got.get(pair, 0)
        if s != g:
            src, dst = pair
            raise ValueError(f"splits: rank {src} sends {s} elements to rank {dst} but rank {dst}'s "
                             f"output splits expect {g} from rank {src}; make the sizes match")


def _ranges_by_peer(splits: list[Split]) -> dict[int, list[tuple[int, int]]]:
    """Every peer's (offset, size) ranges of one rank's splits, in split order, in one pass:
    O(splits x peers) for a rank, not once per peer (a dense all-to-all-v has W of each)."""
    out: dict[int, list[tuple[int, int]]] = {}
    pos = 0
    for sp in splits:
        if sp.size > 0:
            for p in sp.peers:
                ranges = out.get(p)
                if ranges is None:
                    out[p] = [(pos, sp.size)]
                else:
                    ranges.append((pos, sp.size))
        pos += sp.size
    return out


def _zip_ranges(src: list[tuple[int, int]], dst: list[tuple[int, int]]) -> list[Segment]:
    """Align two equal-length streams of ranges into segments that lie in one range of each."""
    segs: list[Segment] = []
    i = j = 0
    si, so = (src[0] if src else (0, 0))
    di, do = (dst[0] if dst else (0, 0))
    while i < len(src) and j < len(dst):
        n = min(so, do)
        segs.append(Segment(si, di, n))
        si, so, di, do = si + n, so - n, di + n, do - n
        if so == 0:
            i += 1
            if i < len(src):
                si, so = src[i]
        if do == 0:
            j += 1
            if j < len(dst):
                di, do = dst[j]
    return segs


def _pair_streams(world: int, splits: GroupSplits) -> dict[tuple[int, int], PairStream]:
    """(src, dst) -> what src sends dst, for every pair that exchanges data. Each rank's splits
    are read once per side (O(W x splits)); pairs in (src, dst) order."""
    dense = dense_counts(splits, world)
    if dense is not None:
        return _dense_pair_streams(dense)
    received = [_ranges_by_peer(splits.ranks[d].output) for d in range(world)]
    out: dict[tuple[int, int], PairStream] = {}
    for s in range(world):
        sent = _ranges_by_peer(splits.ranks[s].input)
        for d in sorted(sent):
            segs = _zip_ranges(sent[d], received[d].get(s, []))
            out[(s, d)] = PairStream(s, d, tuple(segs), sum(x.count for x in segs))
    return out


def _dense_pair_streams(counts: np.ndarray) -> dict[tuple[int, int], PairStream]:
    """`_pair_streams` of from_counts' layout, from the matrix: s's input is laid out by
    destination and d's output by source, so each pair is one segment at the two prefix sums."""
    src_off = np.cumsum(counts, axis=1) - counts       # where s's piece for d starts in s's input
    dst_off = np.cumsum(counts, axis=0) - counts       # where s's piece lands in d's output
    s_idx, d_idx = np.nonzero(counts)                  # (src, dst) ascending, as the general path
    out: dict[tuple[int, int], PairStream] = {}
    for s, d, so, do, c in zip(s_idx.tolist(), d_idx.tolist(), src_off[s_idx, d_idx].tolist(),
                               dst_off[s_idx, d_idx].tolist(), counts[s_idx, d_idx].tolist()):
        out[(s, d)] = PairStream(s, d, (Segment(so, do, c),), c)
    return out


# ---- numerics ---------------------------------------------------------------------------------
def storage_dtype(dtype: DType) -> np.dtype:
    """numpy dtype that holds values of `dtype` (bf16 lives in float32, rounded to bf16)."""
    return np.dtype({"bf16": np.float32, "fp16": np.float16, "fp32": np.float32,
                     "fp64": np.float64}[dtype.value])


def round_to(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Round to the representable values of `dtype` (round to nearest even), in storage dtype."""
    if dtype != DType.BF16:
        return values.astype(storage_dtype(dtype))
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def random_inputs(spec: CollectiveSpec, rng: np.random.Generator) -> list[np.ndarray]:
    """Fresh values in [-1, 1) away from zero, rounded to the dtype: never zeros."""
    out = []
    for r in range(spec.world_size):
        n = spec.input_count(r)
        mag = rng.uniform(0.25, 1.0, n)
        sign = rng.choice([-1.0, 1.0], n)
        out.append(round_to(mag * sign, spec.dtype))
    return out


WIDE_EXPONENTS = (-10, 8)


def wide_inputs(spec: CollectiveSpec, rng: np.random.Generator) -> list[np.ndarray]:
    """Values of magnitudes 2^-10..2^9 with every mantissa bit drawn, rounded to the dtype:
    their sums round in fp32, so two summation orders give different bits somewhere (with
    `random_inputs` bf16 sums are exact in fp32 and any order gives the same bits). fp16 holds
    sums of up to 127 of them. For comparing ranks' bits (`harness/inputs.device_wide_inputs`
    draws the same on a device)."""
    out = []
    for r in range(spec.world_size):
        n = spec.input_count(r)
        mag = rng.uniform(1.0, 2.0, n) * np.exp2(rng.integers(WIDE_EXPONENTS[0], WIDE_EXPONENTS[1] + 1, n))
        out.append(round_to(mag * rng.choice([-1.0, 1.0], n), spec.dtype))
    return out


def initial_outputs(spec: CollectiveSpec, rng: np.random.Generator) -> list[np.ndarray]:
    """Outputs before the call: random values for group_reduce (it accumulates), NaN otherwise so
    that an element nobody wrote cannot pass."""
    outs = []
    for r in range(spec.world_size):
        n = spec.output_count(r)
        if spec.accumulates_output:
            outs.append(round_to(rng.uniform(-1.0, 1.0, n), spec.dtype))
        else:
            outs.append(np.full(n, np.nan, dtype=storage_dtype(spec.dtype)))
    return outs


@dataclass(frozen=True)
class Expected:
    """The naive result (float64) and, per element, how many values were combined and their
    absolute sum: what the tolerance of a rounded reduction depends on."""

    outputs: list[np.ndarray]
    abs_sums: list[np.ndarray]
    num_terms: int


def reduce_terms(op: ReduceOp, stack: Any, xp: Any = np) -> Any:
    """What one reduce op of a schedule computes over a stack of sources (axis 0): max, min, or
    the sum, avg included (a schedule carries avg's 1/n in the op's `scale`). The sum folds the
    sources left to right in the stack's dtype, as the kernels do (their order is part of the
    result once a sum rounds). `xp` is the array module (numpy; the device reference passes
    torch, whose amax/amin take the same arguments)."""
    if op == ReduceOp.MAX:
        return xp.amax(stack, axis=0)
    if op == ReduceOp.MIN:
        return xp.amin(stack, axis=0)
    if len(stack) == 0:
        return stack.sum(axis=0)
    total = stack[0]
    for term in stack[1:]:
        total = total + term
    return total


def accumulator(dtype: DType) -> np.dtype:
    """What the kernels accumulate a reduce in (kernels/program.py): fp64 for fp64, else fp32."""
    return np.dtype(np.float64 if dtype == DType.FP64 else np.float32)


def reduce_values(op: ReduceOp, dtype: DType, srcs: Sequence[np.ndarray], scale: float,
                  old: np.ndarray | None = None, exact: bool = False) -> np.ndarray:
    """One reduce op (or row) as the kernels compute it: the sources converted to the
    accumulator and folded in order, times `scale` (in the accumulator), plus the destination's
    `old` value when the op accumulates, rounded once to the dtype (storage dtype). `exact`: in
    float64, not rounded (the reference executor's exact pass). The reference executor and the
    emulator both call this, so their bits are the kernels' bits."""
    acc = np.dtype(np.float64) if exact else accumulator(dtype)
    value = reduce_terms(op, np.stack([np.asarray(s, dtype=acc) for s in srcs])) * acc.type(scale)
    if old is not None:
        value = value + np.asarray(old, dtype=acc)
    return value if exact else round_to(value, dtype)


def first_rank_difference(spec: CollectiveSpec, outputs: Sequence[np.ndarray]) -> tuple[int, int] | None:
    """(rank, element) where a rank's output first differs in its bits from rank 0's, for kinds
    whose ranks share outputs (`SHARED_OUTPUT`); None when all are identical or the kind has no
    shared outputs. NaN equals NaN here (bits, not values)."""
    if spec.kind not in SHARED_OUTPUT or len(outputs) < 2:
        return None
    ref = np.ascontiguousarray(outputs[0])
    for r, out in enumerate(outputs[1:], start=1):
        got = np.ascontiguousarray(out)
        if got.shape != ref.shape or got.dtype != ref.dtype:
            return (r, 0)
        if got.size == 0:
            continue
        diff = got.view(np.uint8).reshape(got.size, -1) != ref.view(np.uint8).reshape(ref.size, -1)
        bad = diff.any(axis=1)
        if bad.any():
            return (r, int(np.argmax(bad)))
    return None


def combine(op: ReduceOp, stack: Any, xp: Any = np) -> Any:
    """The collective's reduction of every rank's array (axis 0): avg divides the sum by n."""
    total = reduce_terms(op, stack, xp)
    return total / stack.shape[0] if op == ReduceOp.AVG else total


def valid_nbytes(kind: Kind, world_size: int, dtype: DType, nbytes: int) -> int:
    """The largest S <= nbytes the collective accepts (at least one unit): whole elements, and
    a multiple of W elements for all-to-all. Sweeps and the auto-picker round sizes with it."""
    unit = dtype.itemsize * (world_size if kind == Kind.ALL_TO_ALL else 1)
    return max(unit, nbytes // unit * unit)


def reference(spec: CollectiveSpec, inputs: list[np.ndarray],
              outputs_before: list[np.ndarray] | None = None) -> Expected:
    """Naive reference of every collective, all ranks in one process, in float64."""
    w = spec.world_size
    x = [np.asarray(a, dtype=np.float64) for a in inputs]
    k = spec.kind
    outs: list[np.ndarray]
    abs_sums: list[np.ndarray]
    if k in (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.REDUCE):
        stack = np.stack(x) if w else np.zeros((0, spec.count))
        full = combine(spec.reduce_op, stack)
        absum = np.abs(stack).sum(axis=0)
        if k == Kind.ALL_REDUCE:
            outs, abs_sums = [full.copy() for _ in range(w)], [absum] * w
        elif k == Kind.REDUCE:
            outs = [full if r == spec.root else np.zeros(0) for r in range(w)]
            abs_sums = [absum if r == spec.root else np.zeros(0) for r in range(w)]
        else:
            outs, abs_sums = [], []
            for r in range(w):
                off, n = spec.shard(r)
                outs.append(full[off:off + n])
                abs_sums.append(absum[off:off + n])
        return Expected(outs, abs_sums, w)
    if k == Kind.ALL_GATHER:
        full = np.concatenate(x) if x else np.zeros(0)
        return Expected([full.copy() for _ in range(w)], [np.abs(full)] * w, 1)
    if k == Kind.BROADCAST:
        return Expected([x[spec.root].copy() for _ in range(w)], [np.abs(x[spec.root])] * w, 1)
    if k == Kind.ALL_TO_ALL:
        blk = spec.count // w
        outs = [np.concatenate([x[s][d * blk:(d + 1) * blk] for s in range(w)]) for d in range(w)]
        return Expected(outs, [np.abs(o) for o in outs], 1)
    if k == Kind.GROUP_CAST:
        outs = [np.full(spec.output_count(r), np.nan) for r in range(w)]
        for (s, d), ps in spec.pair_streams.items():
            for seg in ps.segments:
                outs[d][seg.dst_offset:seg.dst_offset + seg.count] = \
                    x[s][seg.src_offset:seg.src_offset + seg.count]
        return Expected(outs, [np.abs(o) for o in outs], 1)
    return _reference_group_reduce(spec, x, outputs_before)


def _reference_group_reduce(spec: CollectiveSpec, x: list[np.ndarray],
                            outputs_before: list[np.ndarray] | None) -> Expected:
    assert spec.splits is not None
    w = spec.world_size
    if outputs_before is None:
        raise HiercollError("group_reduce accumulates into the output: pass its values before the call")
    base = [np.asarray(o, dtype=np.float64).copy() for o in outputs_before]
    acc = [np.zeros_like(b) for b in base]
    absum = [np.abs(b) for b in base]
    nsrc = [np.ones_like(b) for b in base]
    for r in range(w):
        for off, sp in zip(_offsets(spec.splits.ranks[r].output), spec.splits.ranks[r].output):
            nsrc[r][off:off + sp.size] = max(len(sp.peers), 1)
    for (s, d), ps in spec.pair_streams.items():
        for seg in ps.segments:
            piece = x[s][seg.src_offset:seg.src_offset + seg.count]
            sl = slice(seg.dst_offset, seg.dst_offset + seg.count)
            acc[d][sl] += piece
            absum[d][sl] += np.abs(piece)
    if spec.reduce_op == ReduceOp.AVG:
        acc = [a / n for a, n in zip(acc, nsrc)]
    outs = [b + a for b, a in zip(base, acc)]
    terms = 1 + max((len(sp.peers) for rs in spec.splits.ranks for sp in rs.output), default=0)
    return Expected(outs, absum, terms)


def tolerance(spec: CollectiveSpec, expected: Expected, rank: int, exact: bool = False) -> np.ndarray:
    """Per-element bound on |result - exact|: one rounding per partial result stored in the
    dtype (at most one per term plus the final one), each at most eps * sum of |terms|.

    This bound is loose by design (bf16 at 16 ranks: ~6.6% of sum|x|), so it cannot tell a
    rounding from a systematic error of a few percent. `exact=True` is the bound of a run kept in
    float64 without rounding to the dtype (the reference executor's exact pass): on dtype inputs
    (`random_inputs`: multiples of 2^-10 for bf16, 2^-26 for fp32) every sum is exact in
    float64 and only scale multiplies (avg's 1/n, itself a float) and sums of scaled partials
    round, each by at most float64's eps x sum|terms|; four times that per term leaves room for
    the scale's own representation error and still sees any error above ~1e-12 relative."""
    if exact:
        return 4 * DType.FP64.eps * (expected.num_terms + 2) * expected.abs_sums[rank] + 1e-300
    roundings = expected.num_terms + 1
    return spec.dtype.eps * roundings * expected.abs_sums[rank] + 1e-300
