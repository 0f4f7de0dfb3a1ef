"""Plan files: a schedule plus the topology it was planned for, saved expanded (every op) or as
its recipe (algorithm, parameters, spec, topology: tiny, re-planned on load)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from hiercoll.errors import HiercollError, ScheduleError, format_validation_error
from hiercoll.schedule import Schedule, SymmetryGroup, Transport
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
    """A plan from its JSON. Nothing in the file is trusted that the topology decides: the
    recorded topology fingerprint must be the embedded topology's (both forms), and every op's
    transport tier must be the one the topology gives its ranks (expanded form; the tier drives
    the lowering: an intra-node op marked 'inter' would go through NCCL)."""
    if not isinstance(data, dict) or "topology" not in data or "form" not in data:
        raise HiercollError(f"{source}: not a hiercoll plan (needs 'form', 'meta', 'topology'); "
                            "make one with `hiercoll plan ... -o plan.json`")
    data = dict(data)
    topology = topology_from_dict(data.pop("topology"), f"{source}: topology")
    if data["form"] == "recipe":
        schedule = _plan_recipe(data.get("meta"), topology, source)
    elif data["form"] == "expanded":
        schedule = parse_expanded(data, source)
    else:
        raise HiercollError(f"{source}: form: {data['form']!r} should be 'expanded' or 'recipe'")
    if schedule.meta.topology_fingerprint != topology.fingerprint():
        raise ScheduleError(f"{source}: meta.topology_fingerprint does not match the embedded "
                            "topology; re-plan instead of editing the topology")
    if data["form"] == "expanded":
        _check_transports(schedule, topology, source)
    return Plan(schedule, topology)


class _RecipeMeta(BaseModel):
    """A recipe's meta, typed before anything is looked up with it (an `algorithm` that is a
    list once reached the registry's dict as a TypeError). `spec` stays a mapping here: it is
    validated on its own below, so a missing `nbytes` is told apart from a defaulted one."""
    model_config = ConfigDict(extra="forbid")
    algorithm: StrictStr
    params: dict[StrictStr, Any] | None = None
    spec: dict[StrictStr, Any]
    topology_fingerprint: StrictStr
    schema_version: Literal[1] = 1
    symmetry_period: StrictInt | None = None
    symmetry_group: SymmetryGroup = "shift"


class _Recipe(BaseModel):
    meta: _RecipeMeta


def _plan_recipe(meta: Any, topology: Topology, source: str) -> Schedule:
    """Re-plan a recipe, after checking what the planner would otherwise silently fill in: the
    fingerprint it was planned for, and S (a missing `nbytes` would plan a 0-byte collective;
    group kinds take their sizes from the splits, so they need none)."""
    from hiercoll.collectives import GROUPED, CollectiveSpec
    from hiercoll.planner import plan  # recipe files need the planner to expand
    if not isinstance(meta, dict):
        raise HiercollError(f"{source}: meta: required mapping is missing (algorithm, params, "
                            "spec, topology_fingerprint)")
    try:
        recipe = _Recipe.model_validate({"meta": meta}).meta
    except ValidationError as err:
        raise HiercollError(format_validation_error(err, source)) from None
    if recipe.topology_fingerprint != topology.fingerprint():
        raise ScheduleError(f"{source}: meta.topology_fingerprint {recipe.topology_fingerprint!r} "
                            f"does not match the embedded topology ({topology.fingerprint()}); "
                            "re-plan instead of editing the topology")
    try:
        spec = CollectiveSpec.model_validate(recipe.spec)
    except ValidationError as err:
        raise HiercollError(format_validation_error(err, f"{source}: meta.spec")) from None
    if spec.kind not in GROUPED and "nbytes" not in recipe.spec:
        raise HiercollError(f"{source}: meta.spec.nbytes: required field is missing (a "
                            f"{spec.kind.value} recipe re-plans at this size; give S in bytes)")
    return plan(topology, spec, recipe.algorithm, recipe.params or {})


def _check_transports(schedule: Schedule, topology: Topology, source: str) -> None:
    """Every op's stored tier must be the one the topology derives (planner/builder.op_transport)."""
    from hiercoll.planner.builder import op_transport
    for r in range(schedule.world_size):
        for op in schedule.rank_ops(r):
            want = op_transport(topology, op.dst, op.srcs)
            if op.transport == want:
                continue
            d = op.dst.rank
            if want == Transport.LOCAL:
                why = f"all its regions are on rank {d}"
            elif want == Transport.INTER:
                s = next(x.rank for x in op.srcs if not topology.same_node(x.rank, d))
                why = f"ranks {d} and {s} are on different nodes in this topology"
            else:
                s = next(x.rank for x in op.srcs if x.rank != d)
                why = f"ranks {d} and {s} share a node in this topology"
            raise ScheduleError(f"{source}: op {op.id}: transport '{op.transport.value}' but {why}; "
                                "re-plan or fix the file")


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
