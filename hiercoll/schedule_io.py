"""Parsing expanded schedules from JSON (pydantic at the boundary, dataclasses inside)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hiercoll.collectives import CollectiveSpec
from hiercoll.errors import ScheduleError, format_validation_error
from hiercoll.schedule import (
    SCHEMA_VERSION,
    ExpandedOps,
    Op,
    OpKind,
    Region,
    Schedule,
    ScheduleMeta,
    SymmetryGroup,
    Transport,
    validate_structure,
)


class _MetaModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    algorithm: str
    params: dict[str, Any]
    spec: CollectiveSpec
    topology_fingerprint: str
    schema_version: Literal[1] = Field(description=f"this hiercoll reads version {SCHEMA_VERSION}")
    symmetry_period: int | None = Field(default=None, ge=1)
    symmetry_group: SymmetryGroup = "shift"


class _OpModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    ch: int = Field(ge=0)
    kind: OpKind
    dst: tuple[int, str, int, int]
    srcs: list[tuple[int, str, int, int]]
    deps: list[tuple[int, int]]
    transport: Transport
    acc: bool = False
    scale: float = Field(default=1.0, allow_inf_nan=False,
                         description="a finite factor (avg: 1/W); Infinity/NaN have no meaning")


class _RankModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    buffers: dict[str, Annotated[int, Field(ge=0, description="elements; 0 for an unused one")]]
    ops: list[_OpModel]


class _ExpandedModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    form: Literal["expanded"]
    meta: _MetaModel
    ranks: list[_RankModel]


def _region(t: tuple[int, str, int, int]) -> Region:
    return Region(t[0], t[1], t[2], t[3])


def _op(rank: int, index: int, m: _OpModel) -> Op:
    want = f"{rank}.{index}"
    if m.id != want:
        raise ScheduleError(f"op {m.id}: at position {index} of rank {rank}, id should be {want}")
    return Op(rank=rank, index=index, channel=m.ch, kind=m.kind, dst=_region(m.dst),
              srcs=tuple(_region(s) for s in m.srcs), deps=tuple((d[0], d[1]) for d in m.deps),
              transport=m.transport, accumulate=m.acc, scale=m.scale)


def parse_expanded(data: dict[str, Any], source: str = "plan") -> Schedule:
    try:
        model = _ExpandedModel.model_validate(data)
    except ValidationError as err:
        raise ScheduleError(format_validation_error(err, source)) from None
    saved = model.meta
    meta = ScheduleMeta(algorithm=saved.algorithm, params=saved.params, spec=saved.spec,
                        topology_fingerprint=saved.topology_fingerprint,
                        schema_version=saved.schema_version, symmetry_period=saved.symmetry_period,
                        symmetry_group=saved.symmetry_group)
    if len(model.ranks) != meta.spec.world_size:
        raise ScheduleError(f"{source}: ranks: {len(model.ranks)} entries for world size "
                            f"{meta.spec.world_size}")
    ops = tuple(tuple(_op(r, i, m) for i, m in enumerate(rm.ops)) for r, rm in enumerate(model.ranks))
    sched = Schedule(meta, ExpandedOps(ops, tuple(dict(rm.buffers) for rm in model.ranks)))
    validate_structure(sched)
    return sched
