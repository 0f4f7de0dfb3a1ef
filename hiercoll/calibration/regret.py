"""Regret of the simulator's choice, priced by measurement: for every (collective, size) of a
bench run, the candidate the simulator ranks fastest among those the run measured, against the
fastest the run measured. regret = measured(pick) / measured(best); 1 is a perfect pick.

Why among the measured candidates: a pick the run did not time has no price, and the question
this answers is whether the simulator's ranking is the one to run (issue 28's promise). The NCCL
fallback competes with the time the simulator gives NCCL's own algorithm (the library model);
hiercoll's plans with the schedules the row's lowering ran (copies forwarded where it
forwarded them); both simulated in the bench's call mode. The shipped auto-pick may rank by a measured
table instead where one covers the size (`planner/search/library`): that is in-sample on the
run the table came from, and `shipped` says so per point.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from hiercoll.calibration.predict import lowered
from hiercoll.collectives import CollectiveSpec, DType, Kind
from hiercoll.errors import HiercollError
from hiercoll.planner.registry import plan
from hiercoll.planner.search.autopick import SimCache, library_model_us
from hiercoll.planner.search.candidates import Candidate
from hiercoll.planner.search.library import LIBRARY, LIBRARY_KINDS, shipped_table
from hiercoll.sim.simulate import CallMode
from hiercoll.topology import Topology


@dataclass(frozen=True)
class Measured:
    """One timed candidate of a bench run: hiercoll's plan (algorithm, params) or the library."""

    algorithm: str
    params: dict[str, Any]
    p50_us: float
    lowering: dict[str, Any] = field(default_factory=dict)   # the row's cuda knobs (options)

    @property
    def label(self) -> str:
        return LIBRARY if self.algorithm == LIBRARY else Candidate(self.algorithm,
                                                                   self.params).label()


@dataclass(frozen=True)
class RegretPoint:
    collective: str
    nbytes: int
    world: int
    mode: str
    pick: str                 # the simulator's fastest among the measured candidates
    best: str                 # the run's fastest
    pick_us: float            # measured
    best_us: float            # measured
    regret: float
    pick_sim_us: float
    best_sim_us: float
    candidates: int
    shipped: str | None       # the shipped auto-pick's label where a measured table ranks it

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Point = tuple[Kind, int, str, int]    # collective, bytes, dtype, world


def measured_points(rows: Iterable[dict[str, Any]], mode: str) -> dict[Point, list[Measured]]:
    """A bench JSON's rows grouped by point: hiercoll's plans on the cuda backend and the NCCL
    fallback (through hiercoll's library call), in `mode`; peers (nccl-tests' call, torch's
    kernels) are not candidates the auto-picker can run."""
    out: dict[Point, dict[str, Measured]] = {}
    for r in rows:
        if r.get("mode") != mode or r.get("peer"):
            continue
        algorithm = str(r.get("algorithm"))
        if r.get("backend") != ("nccl" if algorithm == LIBRARY else "cuda"):
            continue
        t = r.get("p50_us")
        if not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            continue
        point = (Kind(r["collective"]), int(r["nbytes"]), str(r["dtype"]), int(r["world_size"]))
        raw = r.get("params")
        params = ({k: v for k, v in raw.items() if v is not None}      # older files: nics: null
                  if isinstance(raw, dict) else {})
        options = r.get("options") if algorithm != LIBRARY else None
        m = Measured(algorithm, params, float(t), options if isinstance(options, dict) else {})
        out.setdefault(point, {})[m.label] = m       # measured twice: the last row wins
    return {p: list(by.values()) for p, by in out.items()}


def _simulated_us(topology: Topology, spec: CollectiveSpec, m: Measured, cache: SimCache,
                  mode: CallMode) -> float | None:
    """The simulator's time of one measured candidate in the bench's call mode (a graph replay
    pays the topology's graph per-call cost, an eager call the host's). NCCL's: the auto-pick's
    own library model time. A plan: the schedule the row's lowering ran, cached by candidate,
    knobs and mode."""
    from hiercoll.sim import simulate
    if m.algorithm == LIBRARY:
        return library_model_us(topology, spec, cache, mode) if spec.kind in LIBRARY_KINDS else None
    knobs = json.dumps(m.lowering, sort_keys=True)
    key = f"{SimCache.key(topology, spec, Candidate(m.algorithm, m.params))}:regret:{mode}:{knobs}"
    hit = cache.get(key)
    if hit is not None:
        return hit[0]
    try:
        sched = lowered(plan(topology, spec, m.algorithm, m.params), topology, m.lowering)
        t = simulate(sched, topology, mode="trusted", call_mode=mode).time_us
    except HiercollError:       # a plan this topology refuses: not a candidate here
        return None
    cache.put(key, [t, 0.0, 0.0])
    return t


def regret_points(topology: Topology, points: dict[Point, list[Measured]], mode: CallMode,
                  cache: SimCache | None = None) -> list[RegretPoint]:
    """One RegretPoint per point with at least two candidates the simulator can time."""
    cache = cache or SimCache(None)
    table = shipped_table(topology)
    out = []
    for (kind, nbytes, dtype, world), cands in sorted(points.items(), key=lambda kv: (
            kv[0][0].value, kv[0][1])):
        if world != topology.world_size:
            raise HiercollError(f"--validate: the bench ran {world} ranks but {topology.name} has "
                                f"{topology.world_size}; pass the topology it ran on (-t)")
        spec = CollectiveSpec(kind=kind, world_size=world, dtype=DType(dtype), nbytes=nbytes)
        sim = {m.label: _simulated_us(topology, spec, m, cache, mode) for m in cands}
        timed = [m for m in cands if sim[m.label] is not None]
        if len(timed) < 2:
            continue
        pick = min(timed, key=lambda m: (sim[m.label], m.label))
        best = min(timed, key=lambda m: (m.p50_us, m.label))
        shipped = None
        if table is not None and table.mode == mode:
            ranked = table.measured_plans_us(topology, spec)
            if ranked:
                lib = table.predict_us(kind, nbytes) if table.applies_to(topology, spec) else None
                ranked = ranked | ({LIBRARY: lib} if lib is not None else {})
                shipped = min(ranked, key=lambda k: (ranked[k], k))
        out.append(RegretPoint(kind.value, nbytes, world, mode, pick.label, best.label,
                               pick.p50_us, best.p50_us, pick.p50_us / best.p50_us,
                               float(sim[pick.label] or 0.0), float(sim[best.label] or 0.0),
                               len(timed), shipped))
    return out


def summary(points: list[RegretPoint]) -> dict[str, Any]:
    """Geomean and worst regret, and the points above 1.05 (the issue's line for explaining)."""
    if not points:
        return {"points": 0}
    logs = [math.log(p.regret) for p in points]
    worst = max(points, key=lambda p: p.regret)
    return {"points": len(points), "geomean": math.exp(sum(logs) / len(logs)),
            "worst": worst.regret, "worst_at": f"{worst.collective} {worst.nbytes} B",
            "above_1_05": sum(p.regret > 1.05 for p in points)}
