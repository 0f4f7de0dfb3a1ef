"""What a simulation returns, and the critical path through it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from hiercoll.schedule import OpRef


@dataclass(frozen=True, kw_only=True)
class LinkStat:
    name: str
    tier: str
    bytes: float          # on one link (a folded link stands for `copies` identical ones)
    busy_us: float
    utilization: float    # bytes / (capacity x total time)
    copies: int = 1


@dataclass(kw_only=True)
class SimResult:
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    lower_bound_us: float
    bound_cut: str
    bytes_intra: float
    bytes_inter: float
    links: list[LinkStat]
    op_start: Mapping[OpRef, float] = field(repr=False)    # a dict, or OpTimes (compiled core)
    op_end: Mapping[OpRef, float] = field(repr=False)
    critical_path: list[str] = field(repr=False)
    ranks_simulated: list[int] = field(repr=False)
    shortcut: str | None = None          # e.g. "translation symmetry, period 8 (...)"
    notes: list[str] = field(default_factory=list)   # e.g. why a symmetry was not folded
    num_ops: int = 0
    # with record=True: link names and, per link, (time, utilisation) steps (for traces)
    link_names: list[str] = field(default_factory=list, repr=False)
    link_record: list[list[tuple[float, float]]] | None = field(default=None, repr=False)

    @property
    def bound_ratio(self) -> float:
        """lower bound / time: 1.0 means the schedule reaches the bound."""
        return self.lower_bound_us / self.time_us if self.time_us > 0 else 1.0

    def busiest_links(self, n: int = 5) -> list[LinkStat]:
        return sorted(self.links, key=lambda l: (-l.utilization, l.name))[:n]

    def to_json(self) -> dict[str, Any]:
        return {"time_us": self.time_us, "algbw_gbps": self.algbw_gbps,
                "busbw_gbps": self.busbw_gbps, "lower_bound_us": self.lower_bound_us,
                "bound_ratio": self.bound_ratio, "bound_cut": self.bound_cut,
                "bytes_intra": self.bytes_intra, "bytes_inter": self.bytes_inter,
                "num_ops": self.num_ops, "ranks_simulated": len(self.ranks_simulated),
                "shortcut": self.shortcut, "notes": self.notes, "critical_path": self.critical_path[:64],
                "busiest_links": [vars(l) for l in self.busiest_links(8)]}


def critical_path(preds: dict[OpRef, tuple[OpRef, ...]], start: Mapping[OpRef, float],
                  end: Mapping[OpRef, float]) -> list[str]:
    """Walk back from the last op to finish through whichever predecessor released it.
    `preds` maps each simulated op to its predecessors (already folded onto representatives)."""
    if not end:
        return []
    cur = max(end, key=lambda ref: (end[ref], ref))
    path = [cur]
    while True:
        ready = [p for p in preds.get(cur, ()) if p in end and end[p] >= start[cur] - 1e-9]
        if not ready:
            break
        cur = max(ready, key=lambda ref: (end[ref], ref))
        path.append(cur)
    return [f"{r}.{i}" for r, i in reversed(path)]


class OpTimes(Mapping[OpRef, float]):
    """Per-op times as one array over the simulated ranks' ops, rank after rank: what the
    compiled core returns, read as the {(rank, index): us} dict the Python engine returns
    (same keys in the same order, same values) without a dict entry per op (two million
    tuples and floats cost a large run more than its replay)."""

    __slots__ = ("_ranks", "_lens", "_times", "_at")

    def __init__(self, ranks: Sequence[int], lens: Sequence[int], times: npt.NDArray[np.float64]):
        self._ranks, self._lens, self._times = list(ranks), list(lens), times
        offsets = np.zeros(len(self._lens), np.int64)
        np.cumsum(self._lens[:-1], out=offsets[1:])
        self._at = {r: (int(o), n) for r, o, n in zip(self._ranks, offsets.tolist(), self._lens)}

    def _row(self, ref: object) -> int | None:
        if not isinstance(ref, tuple) or len(ref) != 2:
            return None
        hit = self._at.get(ref[0])
        i = ref[1]
        if hit is None or not isinstance(i, int | np.integer) or not 0 <= i < hit[1]:
            return None
        return hit[0] + int(i)

    def __getitem__(self, ref: OpRef) -> float:
        row = self._row(ref)
        if row is None:
            raise KeyError(ref)
        return float(self._times[row])

    def __contains__(self, ref: object) -> bool:
        return self._row(ref) is not None

    def __iter__(self) -> Iterator[OpRef]:
        for r, n in zip(self._ranks, self._lens):
            for i in range(n):
                yield (r, i)

    def __len__(self) -> int:
        return len(self._times)

    def __repr__(self) -> str:
        return f"OpTimes({len(self)} ops on {len(self._ranks)} ranks)"
