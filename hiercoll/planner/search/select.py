"""Pick the schedule for a call: a named algorithm, or `auto` (tuning file, else a search)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hiercoll.collectives import CollectiveSpec
from hiercoll.planner.registry import plan
from hiercoll.planner.search.tuning_path import check_tuning_path
from hiercoll.schedule import Schedule
from hiercoll.topology import Topology


@dataclass(frozen=True)
class Chosen:
    schedule: Schedule
    how: str   # "named", "tuning file", "searched"
    executor: dict[str, Any] = field(default_factory=dict)   # tuned backend knobs (auto only)
    measured_us: float | None = None     # searched by measurement: the pick's time
    library_us: float | None = None      # ... and the library call's, same run


def plan_with(topology: Topology, spec: CollectiveSpec, algorithm: str,
              params: dict[str, Any] | None = None, tuning: str | None = None) -> Chosen:
    """`tuning`, when given, must be a file: a mistyped path is an error, not a silent search."""
    if tuning is not None:
        check_tuning_path(tuning)
    if algorithm != "auto":
        return Chosen(plan(topology, spec, algorithm, params), "named")
    from hiercoll.planner.search.autopick import choose  # needs the simulator
    pick = choose(topology, spec, tuning_path=tuning)
    return Chosen(plan(topology, spec, pick.algorithm, pick.params), pick.source, pick.executor,
                  pick.measured_us, pick.library_us)


def plan_auto(topology: Topology, spec: CollectiveSpec, algorithm: str = "auto",
              params: dict[str, Any] | None = None, tuning: str | None = None) -> Schedule:
    """`hc.plan`: a named algorithm, or "auto" (the tuning file's choice, else a simulated search)."""
    return plan_with(topology, spec, algorithm, params, tuning).schedule
