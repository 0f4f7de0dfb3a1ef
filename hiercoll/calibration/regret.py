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

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from hiercoll.calibration.measurement import Measurement
from hiercoll.calibration.measurements import bench_measurement
from hiercoll.calibration.predict import build_case, predict_us
from hiercoll.calibration.program import program_key
from hiercoll.calibration.spread import Sample, Spread, spreads_of
from hiercoll.collectives import CollectiveSpec, DType, Kind
from hiercoll.errors import HiercollError
from hiercoll.planner.search.candidates import Candidate, rank_key
from hiercoll.planner.search.library import LIBRARY, shipped_table
from hiercoll.sim.simulate import CallMode
from hiercoll.topology import Topology


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
    # the pick ran the same program as the best (a tie: their difference is the run's spread)
    same_program: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Point = tuple[Kind, int, DType, int]    # collective, bytes, dtype, world


def label(m: Measurement) -> str:
    """The candidate a row timed, as the auto-picker names it ('nccl' for the library)."""
    return LIBRARY if m.algorithm == LIBRARY else Candidate(m.algorithm, dict(m.params)).label()


def measured_points(rows: Iterable[dict[str, Any]], mode: str) -> dict[Point, list[Measurement]]:
    """A bench JSON's rows grouped by point: hiercoll's plans on the cuda backend and the NCCL
    fallback (through hiercoll's library call), in `mode`, read as calibrate reads them; peers
    (nccl-tests' call, torch's kernels) are not candidates the auto-picker can run."""
    out: dict[Point, dict[str, Measurement]] = {}
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or r.get("mode") != mode or r.get("peer"):
            continue
        if r.get("backend") != ("nccl" if r.get("algorithm") == LIBRARY else "cuda"):
            continue
        m = bench_measurement(r, f"rows[{i}]")
        point = (m.collective, m.nbytes, m.dtype, m.world_size)
        out.setdefault(point, {})[label(m)] = m      # measured twice: the last row wins
    return {p: list(by.values()) for p, by in out.items()}


@dataclass(frozen=True)
class Timed:
    us: float           # simulated
    rows: int           # rows the busiest rank's kernel walks (`rank_key`'s tie-break)
    program: str        # the timed ops up to channel numbering, and the protocol: equal ones ran alike


def simulated(topology: Topology, m: Measurement) -> Timed | None:
    """The simulator's time of one measured candidate, as calibrate predicts it (a plan as the
    row's lowering ran it, NCCL through the library model, in the row's call mode); None where
    this topology cannot plan it."""
    try:
        case = build_case(m, topology)
        return Timed(predict_us(case, topology, topology), case.rows, program_key(case))
    except HiercollError:
        return None


def regret_points(topology: Topology, points: dict[Point, list[Measurement]], mode: CallMode,
                  ) -> list[RegretPoint]:
    """One RegretPoint per point with at least two candidates the simulator can time."""
    return regret_run(topology, points, mode)[0]


def regret_run(topology: Topology, points: dict[Point, list[Measurement]], mode: CallMode,
               ) -> tuple[list[RegretPoint], list[Spread]]:
    """`regret_points`, and the run's own spread where candidates of a point ran one program
    (what a regret between two such is: `spread`)."""
    table = shipped_table(topology)
    out = []
    samples = []
    for (kind, nbytes, dtype, world), cands in sorted(points.items(), key=lambda kv: (
            kv[0][0].value, kv[0][1])):
        if world != topology.world_size:
            raise HiercollError(f"--validate: the bench ran {world} ranks but {topology.name} has "
                                f"{topology.world_size}; pass the topology it ran on (-t)")
        got = {label(m): simulated(topology, m) for m in cands}
        sim = {k: v for k, v in got.items() if v is not None}
        timed = [m for m in cands if label(m) in sim]
        samples += [Sample(mode, nbytes, (kind, nbytes, dtype, sim[label(m)].program), m.time_us)
                    for m in timed]
        if len(timed) < 2:
            continue
        pick = min(timed, key=lambda m: rank_key(sim[label(m)].us, sim[label(m)].rows, label(m)))
        best = min(timed, key=lambda m: (m.time_us, label(m)))
        shipped = None
        if table is not None and table.mode == mode:
            spec = CollectiveSpec(kind=kind, world_size=world, dtype=dtype, nbytes=nbytes)
            ranked = table.measured_plans_us(topology, spec)
            if ranked:
                lib = table.predict_us(kind, nbytes) if table.applies_to(topology, spec) else None
                ranked = ranked | ({LIBRARY: lib} if lib is not None else {})
                shipped = min(ranked, key=lambda k: (ranked[k], k))
        out.append(RegretPoint(kind.value, nbytes, world, mode, label(pick), label(best),
                               pick.time_us, best.time_us, pick.time_us / best.time_us,
                               sim[label(pick)].us, sim[label(best)].us,
                               len(timed), shipped,
                               sim[label(pick)].program == sim[label(best)].program))
    return out, spreads_of(samples)


def summary(points: list[RegretPoint]) -> dict[str, Any]:
    """Geomean and worst regret, and the points above 1.05 (the issue's line for explaining)."""
    if not points:
        return {"points": 0}
    logs = [math.log(p.regret) for p in points]
    worst = max(points, key=lambda p: p.regret)
    # where the pick is another program than the best: the model's own misses (the rest is one
    # program measured twice, the run's spread)
    other = [p for p in points if not p.same_program]
    worst_other = max(other, key=lambda p: p.regret) if other else None
    return {"points": len(points), "geomean": math.exp(sum(logs) / len(logs)),
            "worst": worst.regret, "worst_at": f"{worst.collective} {worst.nbytes} B",
            "above_1_05": sum(p.regret > 1.05 for p in points),
            "above_1_05_same_program": sum(p.regret > 1.05 and p.same_program for p in points),
            "worst_other_program": worst_other.regret if worst_other else 1.0,
            "worst_other_program_at": (f"{worst_other.collective} {worst_other.nbytes} B"
                                       if worst_other else "-")}
