"""The non-power-of-two fold of the log-depth families (rhd, rd): W = P + E with P the largest
power of two not above W. Ranks 2i and 2i+1 (i < E) form a pair: 2i+1 hands its data to 2i
before the steps and gets its result back after them, so P "virtual" ranks run the power-of-two
algorithm. Pairs are neighbours, so every virtual rank stands for a contiguous run of ranks and
therefore of shards (reduce-scatter and all-gather move contiguous segments).

Virtual rank v is rank 2v (v < E) or v + E (v >= E)."""

from __future__ import annotations

from dataclasses import dataclass

from hiercoll.collectives import CollectiveSpec


@dataclass(frozen=True)
class Fold:
    world: int

    @property
    def p(self) -> int:
        """Ranks taking part in the steps (a power of two)."""
        return 1 << (self.world.bit_length() - 1)

    @property
    def extra(self) -> int:
        return self.world - self.p

    @property
    def steps(self) -> int:
        """log2(P): exchange steps between virtual ranks."""
        return self.p.bit_length() - 1

    def virtual(self, rank: int) -> int | None:
        """The virtual rank `rank` runs, or None for a rank folded into its partner."""
        if rank < 2 * self.extra:
            return rank // 2 if rank % 2 == 0 else None
        return rank - self.extra

    def rank_of(self, v: int) -> int:
        return 2 * v if v < self.extra else v + self.extra

    def partner(self, rank: int) -> int | None:
        """The other rank of `rank`'s pair (None when it has none)."""
        return rank ^ 1 if rank < 2 * self.extra else None

    def members(self, v: int) -> tuple[int, ...]:
        """The ranks virtual rank `v` stands for, in rank order."""
        return (2 * v, 2 * v + 1) if v < self.extra else (v + self.extra,)

    def segment(self, spec: CollectiveSpec, lo: int, hi: int) -> tuple[int, int]:
        """(offset, count) of the shards of virtual ranks lo .. hi-1 (contiguous in rank order)."""
        first = self.members(lo)[0]
        last = self.members(hi - 1)[-1]
        start = spec.shard(first)[0]
        end_off, end_n = spec.shard(last)
        return start, end_off + end_n - start
