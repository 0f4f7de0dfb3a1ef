"""Plan files: a schedule plus the topology it was planned for, saved expanded (every op) or as
its recipe (algorithm, parameters, spec, topology: tiny, re-planned on load)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hiercoll.errors import HiercollError, ScheduleError
from hiercoll.schedule import Schedule
from hiercoll.schedule_io import parse_expanded
from hiercoll.topology import Topology
from hiercoll.topology.load import topology_from_dict

Form = Literal["expanded", "recipe"]


@dataclass(frozen=True)
class Plan:
    schedule: Schedule
    topology: Topology


def plan_to_json(schedule: Schedule, topology: Topology, form: Form = "expanded") -> str:
    if schedule.meta.topology_fingerprint != topology.fingerprint():
        raise HiercollError("plan: the schedule was planned for another topology "
                            f"({schedule.meta.topology_fingerprint} != {topology.fingerprint()})")
    topo = topology.model_dump(mode="json")
    if form == "recipe":
        body: dict[str, Any] = {"form": "recipe", "meta": schedule.meta.to_json()}
    else:
        body = schedule.to_json_dict()
    body["topology"] = topo
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def save_plan(path: str | Path, schedule: Schedule, topology: Topology, form: Form = "expanded") -> None:
    from hiercoll.files import write_atomic
    write_atomic(path, plan_to_json(schedule, topology, form) + "\n")


def plan_from_dict(data: Any, source: str = "plan") -> Plan:
    if not isinstance(data, dict) or "topology" not in data or "form" not in data:
        raise HiercollError(f"{source}: not a hiercoll plan (needs 'form', 'meta', 'topology'); "
                            "make one with `hiercoll plan ... -o plan.json`")
    data = dict(data)
    topology = topology_from_dict(data.pop("topology"), f"{source}: topology")
    if data["form"] == "recipe":
        from hiercoll.collectives import CollectiveSpec
        from hiercoll.planner import plan  # recipe files need the planner to expand
        meta = data.get("meta") or {}
        try:
            spec = CollectiveSpec.model_validate(meta["spec"])
            schedule = plan(topology, spec, meta["algorithm"], meta.get("params") or {})
        except KeyError as exc:
            raise HiercollError(f"{source}: meta.{exc.args[0]}: required field is missing") from None
    elif data["form"] == "expanded":
        schedule = parse_expanded(data, source)
    else:
        raise HiercollError(f"{source}: form: {data['form']!r} should be 'expanded' or 'recipe'")
    if schedule.meta.topology_fingerprint != topology.fingerprint():
        raise ScheduleError(f"{source}: meta.topology_fingerprint does not match the embedded "
                            "topology; re-plan instead of editing the topology")
    return Plan(schedule, topology)


def load_plan(path: str | Path) -> Plan:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise HiercollError(f"{p}: cannot read ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HiercollError(f"{p}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    return plan_from_dict(data, str(p))
