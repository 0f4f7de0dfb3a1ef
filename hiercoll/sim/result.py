"""What a simulation returns, and the critical path through it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    op_start: dict[OpRef, float] = field(repr=False)
    op_end: dict[OpRef, float] = field(repr=False)
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


def critical_path(preds: dict[OpRef, tuple[OpRef, ...]], start: dict[OpRef, float],
                  end: dict[OpRef, float]) -> list[str]:
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
