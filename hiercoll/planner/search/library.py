"""The collective library (NCCL) as a pseudo-algorithm: a plan with no ops that executors run as
one library call, and measured library times the auto-picker compares its simulations with, so
it falls back to the library where the library wins.

Why measured, not modelled: NCCL picks its own algorithm, protocol and channel count per size and
changes them between versions; a table from `hiercoll bench --algorithms nccl` on the machine is
the number a user trusts. The comparison mixes a measurement with a simulation, and the table
says how it was measured (eager mode includes host launch cost, graph mode does not), so every
auto-pick row that involves the library names the table it came from.
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hiercoll.collectives import CollectiveSpec, Kind
from hiercoll.errors import HiercollError, format_validation_error
from hiercoll.schedule import LIBRARY_ALGORITHM, ExpandedOps, Schedule, ScheduleMeta
from hiercoll.topology import Topology

LIBRARY = LIBRARY_ALGORITHM
LIBRARY_KINDS = (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_GATHER, Kind.ALL_TO_ALL,
                 Kind.BROADCAST, Kind.REDUCE)
SHIPPED = ("measured_h200x4.json", "measured_h200x2.json", "nccl_h200x4.json")   # first that applies


def library_schedule(topology: Topology, spec: CollectiveSpec) -> Schedule:
    """The plan of one library call: buffers, no ops (the executor calls the library)."""
    if spec.kind not in LIBRARY_KINDS:
        raise HiercollError(f"--algorithm {LIBRARY}: {spec.kind.value} has no single library "
                            f"call; choose a planned algorithm")
    if spec.world_size != topology.world_size:
        raise HiercollError(f"world size: the spec has {spec.world_size} ranks, topology "
                            f"{topology.name} has {topology.world_size}")
    meta = ScheduleMeta(LIBRARY, {}, spec, topology.fingerprint())
    bufs = tuple({"input": spec.input_count(r), "output": spec.output_count(r)}
                 for r in range(spec.world_size))
    return Schedule(meta, ExpandedOps(tuple(() for _ in bufs), bufs))


class LibraryTable(BaseModel):
    """p50 times of the library per collective and total bytes (nccl-tests' size), on one
    machine: bound to its shape (`shape_fingerprint`: any calibration of that machine applies),
    or to one topology file (`topology_fingerprint`); neither: any topology with this world
    size."""

    model_config = ConfigDict(extra="forbid")
    library: str = LIBRARY
    source: str = Field(description="how it was measured: command, machine, versions, date")
    mode: str = Field(pattern="^(eager|graph)$")
    world_size: int = Field(ge=1)
    topology: str
    topology_fingerprint: str | None = None
    shape_fingerprint: str | None = None
    times_us: dict[Kind, list[tuple[Annotated[int, Field(gt=0)],
                                    Annotated[float, Field(gt=0, allow_inf_nan=False)]]]] = Field(
        description="per collective: (bytes > 0, p50 us > 0, finite) points")
    plans_us: dict[Kind, dict[str, list[tuple[Annotated[int, Field(gt=0)],
                                              Annotated[float, Field(gt=0, allow_inf_nan=False)]]]]] = Field(
        default_factory=dict, description="hiercoll's own plans measured in the same run and "
        "mode, per collective and candidate label (e.g. 'direct(channels=1,chunks=1)'): where "
        "they cover a size, the auto-picker ranks by these instead of simulating")

    def applies_to(self, topology: Topology, spec: CollectiveSpec) -> bool:
        return (spec.world_size == self.world_size and bool(self.times_us.get(spec.kind))
                and self.measured_on(topology))

    def measured_on(self, topology: Topology) -> bool:
        if self.shape_fingerprint is not None:
            return self.shape_fingerprint == topology.shape_fingerprint()
        return self.topology_fingerprint in (None, topology.fingerprint())

    def refuse_unless_for(self, topology: Topology, flag: str = "--library-table",
                          path: str | None = None) -> None:
        """A table the user named must describe this topology: one line saying why not
        (HiercollError), rather than a table that is reported in use and silently never applies."""
        fix = "; measure this machine (hiercoll bench --algorithms nccl) or pass --library-table none"
        named = f" ({path})" if path else ""
        if self.world_size != topology.world_size:
            raise HiercollError(f"{flag}: measured on {self.world_size} ranks{named}, topology "
                                f"{topology.name} has {topology.world_size}{fix}")
        if not self.measured_on(topology):
            which = (f"machine shape {self.shape_fingerprint}, this topology's is "
                     f"{topology.shape_fingerprint()}" if self.shape_fingerprint is not None else
                     f"topology fingerprint {self.topology_fingerprint}, this topology's is "
                     f"{topology.fingerprint()}")
            raise HiercollError(f"{flag}: measured on {self.topology}{named} ({which}), not on "
                                f"{topology.name}{fix}")

    def predict_us(self, kind: Kind, nbytes: int) -> float:
        """Log-log interpolation between measured sizes; below the smallest, its time (the
        latency floor); above the largest, time grows with bytes at the last bandwidth."""
        pts = sorted(self.times_us[kind])
        if nbytes <= pts[0][0]:
            return pts[0][1]
        if nbytes >= pts[-1][0]:
            return pts[-1][1] * nbytes / pts[-1][0]
        return _log_log(pts, nbytes)

    def measured_plans_us(self, topology: Topology, spec: CollectiveSpec) -> dict[str, float]:
        """Candidate label -> measured time of that plan at this size, for the plans measured
        at sizes on both sides of it (interpolated, never extrapolated: a plan's time beyond its
        measured range is the simulator's to say); empty where the table does not apply."""
        if spec.world_size != self.world_size or not self.measured_on(topology):
            return {}
        n = spec.total_bytes
        return {label: _log_log(sorted(pts), n)
                for label, pts in self.plans_us.get(spec.kind, {}).items()
                if pts and min(pts)[0] <= n <= max(pts)[0]}


def _log_log(pts: list[tuple[int, float]], nbytes: int) -> float:
    """Time at `nbytes` on the log-log line between the measured points around it."""
    exact = next((t for b, t in pts if b == nbytes), None)
    if exact is not None:          # a measured size: its own time, not a rounding of it
        return exact
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if b0 < nbytes < b1:
            f = math.log(nbytes / b0) / math.log(b1 / b0)
            return math.exp(math.log(t0) + f * math.log(t1 / t0))
    raise AssertionError("nbytes outside the measured points")


def shipped_table(topology: Topology) -> LibraryTable | None:
    """The table measured on the machine a preset describes, if this topology is that preset."""
    return next((t for t in _shipped_tables()
                 if (t.shape_fingerprint or t.topology_fingerprint) and t.measured_on(topology)),
                None)


@functools.cache
def _shipped_tables() -> tuple[LibraryTable, ...]:
    """Read once per process (every `plan -a auto` search asks)."""
    return tuple(LibraryTable.model_validate_json(
        resources.files("hiercoll.data").joinpath(name).read_text()) for name in SHIPPED)


def load_library_table(path: str | Path) -> LibraryTable:
    """A LibraryTable JSON, or the JSON `hiercoll bench --out` writes (its nccl rows)."""
    p = Path(path)
    try:
        data: Any = json.loads(p.read_text())
    except (OSError, ValueError) as err:
        raise HiercollError(f"--library-table: cannot read {p}: {err}") from None
    if isinstance(data, dict) and "rows" in data and "times_us" not in data:
        return _from_bench(data, p)
    try:
        return LibraryTable.model_validate(data)
    except ValidationError as err:
        raise HiercollError(format_validation_error(err, str(p))) from None


def _bench_kind(r: dict[str, Any], path: Path, i: int) -> Kind:
    try:
        return Kind(str(r.get("collective")))
    except ValueError:
        raise HiercollError(f"--library-table: {path}: rows[{i}].collective: "
                            f"{r.get('collective')!r} is not a collective") from None


def _bench_point(r: dict[str, Any], path: Path, i: int) -> tuple[int, float]:
    """(bytes, p50 us) of a bench row, or one line naming the row's field and what it needs."""
    n, t = r.get("nbytes"), r.get("p50_us")
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise HiercollError(f"--library-table: {path}: rows[{i}].nbytes: {n!r} should be a "
                            "positive number of bytes")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
        raise HiercollError(f"--library-table: {path}: rows[{i}].p50_us: {t!r} should be a "
                            "positive, finite time in microseconds")
    return n, float(t)


def _from_bench(data: dict[str, Any], path: Path) -> LibraryTable:
    if not all(isinstance(r, dict) for r in data["rows"]):
        raise HiercollError(f"--library-table: {path}: rows must be objects (a hiercoll bench "
                            "JSON's rows)")
    rows = [r for r in data["rows"] if r.get("algorithm") == LIBRARY]
    if not rows:
        raise HiercollError(f"--library-table: {path} has no '{LIBRARY}' rows; run hiercoll bench "
                            f"with --algorithms {LIBRARY}")
    rows = [r for r in rows if r.get("backend", LIBRARY) == LIBRARY]   # gloo's calls are not NCCL's
    if not rows:
        raise HiercollError(f"--library-table: {path}: its library rows ran through gloo, not "
                            f"{LIBRARY}; bench with --backend cuda on the GPUs")
    mode = "graph" if any(r.get("mode") == "graph" for r in rows) else "eager"
    times: dict[Kind, list[tuple[int, float]]] = {}
    for i, r in enumerate(data["rows"]):
        if r in rows and r.get("mode") == mode:
            times.setdefault(_bench_kind(r, path, i), []).append(_bench_point(r, path, i))
    prov = data.get("provenance", {})
    prov = prov if isinstance(prov, dict) else {}
    world = rows[0].get("world_size")
    first = data["rows"].index(rows[0])
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise HiercollError(f"--library-table: {path}: rows[{first}].world_size: {world!r} "
                            "should be the number of ranks (>= 1)")
    return LibraryTable(source=f"{path}: {prov.get('command', 'hiercoll bench')} on "
                               f"{prov.get('device', '?')}, NCCL {prov.get('nccl', '?')}, "
                               f"{prov.get('date_utc', 'undated')}",
                        mode=mode, world_size=world,
                        topology=str(rows[0].get("topology", "?")), topology_fingerprint=None,
                        times_us={k: sorted(v) for k, v in times.items()},
                        plans_us=plan_times(data["rows"], mode, world, path))


def plan_times(rows: list[dict[str, Any]], mode: str, world: int,
               path: Path) -> dict[Kind, dict[str, list[tuple[int, float]]]]:
    """hiercoll's own plans among bench rows (cuda backend, not a peer's row, this mode and
    world), by collective and candidate label; at a size measured twice, the last row wins."""
    from hiercoll.planner.search.candidates import Candidate
    out: dict[Kind, dict[str, dict[int, float]]] = {}
    for i, r in enumerate(rows):
        if (r.get("algorithm") in (None, LIBRARY) or r.get("peer") or r.get("backend") != "cuda"
                or r.get("mode") != mode or r.get("world_size") != world):
            continue
        params = r.get("params")
        label = Candidate(str(r["algorithm"]), params if isinstance(params, dict) else {}).label()
        n, t = _bench_point(r, path, i)
        out.setdefault(_bench_kind(r, path, i), {}).setdefault(label, {})[n] = t
    return {k: {label: sorted(pts.items()) for label, pts in v.items()} for k, v in out.items()}
