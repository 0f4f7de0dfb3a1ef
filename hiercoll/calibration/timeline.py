"""The measured timeline of one call beside the simulated timeline of the same plan: which op
does the model get wrong?

In: a `hiercoll run --profile` document (the plan's recipe and, per rank, every launch's start
and end from CUDA events, one op per launch). Out: one Perfetto/Chrome trace with two processes,
"measured" and "simulated", a thread per (rank, channel) in each, ops matched by id (each event
carries both times), and the ops ranked by how far the model is off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hiercoll.collectives import CollectiveSpec
from hiercoll.errors import HiercollError, format_validation_error
from hiercoll.planner import plan
from hiercoll.schedule import Schedule
from hiercoll.sim import simulate
from hiercoll.topology import Topology


class MeasuredLaunch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    rank: int = Field(ge=0)
    channel: int
    launch: str
    ops: list[str]
    start_us: float
    end_us: float


class TimelineDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: str = Field(pattern="^hiercoll-timeline$")
    plan: dict[str, Any]
    topology: str
    setting: str
    device: str
    mode: str
    launches: list[MeasuredLaunch]


@dataclass(frozen=True)
class OpPair:
    op: str
    rank: int
    channel: int
    measured_us: float      # the op's launch span
    simulated_us: float

    @property
    def ratio(self) -> float:
        return self.simulated_us / self.measured_us if self.measured_us > 0 else float("inf")


def load_timeline(path: str | Path) -> TimelineDoc:
    try:
        return TimelineDoc.model_validate_json(Path(path).read_text())
    except OSError as exc:
        raise HiercollError(f"{path}: cannot read ({exc.strerror})") from None
    except ValidationError as err:
        raise HiercollError(format_validation_error(err, str(path)) + " (write it with "
                            "`hiercoll run --profile`)") from None


def replan(doc: TimelineDoc, topology: Topology) -> Schedule:
    """The profiled plan, re-planned from its recipe on `topology` (same shape)."""
    meta = doc.plan
    spec = CollectiveSpec.model_validate(meta["spec"])
    if spec.world_size != topology.world_size:
        raise HiercollError(f"--timeline: a {spec.world_size}-rank plan; the topology has "
                            f"{topology.world_size} ranks")
    return plan(topology, spec, meta["algorithm"], meta.get("params") or None)


def overlay(doc: TimelineDoc, topology: Topology) -> tuple[str, list[OpPair], float, float]:
    """(trace JSON, matched ops worst first, measured call span, simulated call time)."""
    schedule = replan(doc, topology)
    result = simulate(schedule, topology, mode="exact", call_mode="eager")
    ops = {op.id: op for r in range(schedule.world_size) for op in schedule.rank_ops(r)}
    events: list[dict[str, Any]] = []
    for pid, name in ((1, f"measured ({doc.setting}, {doc.device})"),
                      (2, f"simulated ({topology.calibration_label()})")):
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}})
    pairs: list[OpPair] = []
    origin = min((launch.start_us for launch in doc.launches), default=0.0)
    for launch in doc.launches:
        tid = launch.rank * 100 + max(launch.channel, 0)
        sim = [ops[o] for o in launch.ops if o in ops]
        sim_us = sum(result.op_end[o.ref] - result.op_start[o.ref] for o in sim)
        args = {"ops": launch.ops, "measured_us": round(launch.end_us - launch.start_us, 3),
                "simulated_us": round(sim_us, 3) if sim else None}
        events.append({"ph": "X", "pid": 1, "tid": tid, "name": launch.launch,
                       "ts": launch.start_us - origin, "dur": launch.end_us - launch.start_us,
                       "args": args})
        if len(sim) == 1:
            pairs.append(OpPair(sim[0].id, launch.rank, launch.channel,
                                launch.end_us - launch.start_us, sim_us))
    for o in ops.values():
        start, end = result.op_start[o.ref], result.op_end[o.ref]
        events.append({"ph": "X", "pid": 2, "tid": o.rank * 100 + o.channel, "name": o.id,
                       "ts": start, "dur": end - start,
                       "args": {"kind": o.kind.value, "elements": o.dst.count}})
    for pid in (1, 2):
        for rank in range(schedule.world_size):
            events.append({"ph": "M", "pid": pid, "tid": rank * 100, "name": "thread_name",
                           "args": {"name": f"rank {rank}"}})
    measured_span = max((x.end_us for x in doc.launches), default=0.0) - origin
    pairs.sort(key=lambda p: -abs(p.simulated_us - p.measured_us))
    from hiercoll.sim.trace import DISPLAY_TIME_UNIT
    trace = json.dumps({"traceEvents": events, "displayTimeUnit": DISPLAY_TIME_UNIT})
    return trace, pairs, measured_span, result.time_us
