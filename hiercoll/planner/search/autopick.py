"""Auto-pick: for each size, simulate the candidate plans and keep the fastest.

Candidates are ordered by a cheap one-rank bound (candidates.rank_bound_us); each is simulated
unless that bound, or then the contention-free critical path, already cannot beat the best time
found (exact pruning when the bounds hold, which tests check). Sizes run in worker processes.
Results are cached on disk by (topology fingerprint, spec, candidate); `tuning.json` stores the
per-size-range choice so `plan --algorithm auto --tuning` needs no search.

The executor's copy-engine threshold is tuned too: the fastest few candidates are re-timed with
each of CE_THRESHOLDS that moves a copy between engines (the simulator times copy-engine and SM
copies with their own costs), and the row's `executor` says which won; `hiercoll run --tuning`
hands it to the cuda backend (CudaOptions.tuned).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from hiercoll.collectives import GROUPED, CollectiveSpec, Kind, valid_nbytes
from hiercoll.errors import HiercollError, format_validation_error
from hiercoll.files import write_atomic
from hiercoll.gcpause import without_cyclic_gc
from hiercoll.ll_protocol import CallProtocol, default_call_protocol
from hiercoll.planner.registry import max_ops, plan
from hiercoll.planner.search.candidates import (
    Candidate,
    baseline_algorithm,
    candidates_and_oversized,
    rank_bound_us,
    rank_key,
)
from hiercoll.planner.search.library import LIBRARY, LIBRARY_KINDS, LibraryTable, shipped_table
from hiercoll.planner.search.workers import Cluster, run_jobs
from hiercoll.progress import terminal_bar
from hiercoll.schedule import Schedule
from hiercoll.sim.row_merge import Merged
from hiercoll.sim.simulate import CallMode
from hiercoll.topology import Topology


@dataclass(frozen=True)
class Scored:
    candidate: Candidate
    time_us: float
    busbw_gbps: float
    lower_bound_us: float
    rows: int = 0           # rows its kernel walks where the lowering is modelled (`rank_key`)

    def rank(self) -> tuple[float, int, str]:
        return rank_key(self.time_us, self.rows, self.candidate.label())


@dataclass(kw_only=True)
class Row:
    """One size's decision (the `rows` entries of `autopick --json`)."""

    bytes: int
    algorithm: str
    params: dict[str, Any]
    time_us: float
    busbw_gbps: float
    lower_bound_us: float
    pct_of_bound: float
    runner_up: dict[str, Any] | None
    margin_pct: float | None
    flat_ring_time_us: float | None
    baseline_algorithm: str
    simulated: int
    pruned: int
    all_times: dict[str, float] = field(default_factory=dict)
    library_time_us: float | None = None     # measured (the table's source says how)
    # simulated NCCL (planner/library_model.py) where no measured table applies: a comparison
    # only, it does not compete (its plan is a ring the candidates already cover)
    library_model_us: float | None = None
    # the cuda backend's tuned knobs for the chosen plan ({"ce_threshold_bytes": N}; {} for NCCL)
    executor: dict[str, Any] = field(default_factory=dict)
    # the plans were ranked by the library table's measurements of them (`plans_us`), not
    # simulated: the machine's own numbers where they cover the size
    measured: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class SimCache:
    """Simulated times on disk, one JSON file keyed by a hash of (hiercoll version, simulator model
    version, topology, spec, candidate). What it reads is checked: a file or entry of the wrong
    shape counts as absent (a broken cache is only a slower run). `save` merges with what is on
    disk now and replaces the file atomically, so two writers never leave it corrupt (one may lose
    the other's new entries)."""

    # Bump when the simulator's timing changes (engine, bounds, cost terms): old entries then
    # miss instead of returning times the current model would not give.
    # 2: host launches by kind, copy-engine op starts; 3: direct's node-aware peer order (the key
    # names the candidate, not its ops: a planner change that re-times a candidate bumps it too);
    # 4: rail leaves spanning the cluster no longer folded (same fingerprint, other times);
    # 5: ECMP hashes per-level digit offsets (other paths on tiered fabrics); 6: where the
    # topology prices protocols, simple-protocol candidates timed forwarded (`backend_schedule`);
    # 7: ... and with independent channel heads split; unpacking plans priced simple under auto;
    # 8: the split only where a run pushes to 2+ peers, LL for ranks unpacking from one peer;
    # 9: relayed copies pass through their issuer, rows' result copies timed beside their rows,
    # LL calls with their independent pushes side by side and their own per-op cost;
    # 10: a copy-engine threshold the tuner tries timed as the backend runs it (as lowered);
    # 11: a simple call pays a row start per barrier half its fused kernel walks on its own
    MODEL_VERSION = 11
    ENTRY_LEN = 3        # [time_us, busbw_gbps, lower_bound_us]; also, under the candidate's key
    # plus BOUNDS_SUFFIX, a pruned candidate's [rank bound, critical-path bound or -1, 0], and
    # plus CE_SUFFIX, the tuned copy-engine threshold [threshold, 0, 0]; plus ROWS_SUFFIX, the
    # rows its kernel walks [rows, 0, 0] where the lowering is modelled; and under the
    # "library-model" candidate plus LIBRARY_MODEL_SUFFIX, NCCL's modelled time (an entry)

    def __init__(self, path: Path | None):
        self.path = path
        self.data: dict[str, list[float]] = self._read(path) if path is not None else {}
        self.new: dict[str, list[float]] = {}
        self.dirty = False

    @classmethod
    def _valid(cls, value: object) -> bool:
        return (isinstance(value, list) and len(value) == cls.ENTRY_LEN
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                        for x in value))

    @classmethod
    def _read(cls, path: Path) -> dict[str, list[float]]:
        try:
            raw = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, ValueError, RecursionError):   # ValueError: bad JSON or not UTF-8
            return {}
        if not isinstance(raw, dict):
            return {}
        return {k: [float(x) for x in v] for k, v in raw.items()
                if isinstance(k, str) and cls._valid(v)}

    @staticmethod
    def key(topology: Topology, spec: CollectiveSpec, cand: Candidate) -> str:
        import hiercoll  # at call time: hiercoll/__init__ imports the planner before its version
        text = json.dumps([hiercoll.__version__, SimCache.MODEL_VERSION, topology.fingerprint(),
                           spec.model_dump(mode="json"), cand.algorithm, cand.params],
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def get(self, key: str) -> list[float] | None:
        return self.data.get(key)

    def put(self, key: str, value: list[float]) -> None:
        self.data[key] = value
        self.new[key] = value
        self.dirty = True

    def save(self) -> None:
        """Merge this run's new entries into the file as it is now; a cache that cannot be
        written is skipped (it only makes the next run slower)."""
        if self.path is None or not self.dirty:
            return
        merged = self._read(self.path) | self.new
        try:
            write_atomic(self.path, json.dumps(merged, sort_keys=True))
        except OSError:
            return
        self.data |= merged
        self.dirty = False


BOUNDS_SUFFIX = "|bounds"
CE_SUFFIX = "|ce-threshold"
ROWS_SUFFIX = "|rows"
LIBRARY_MODEL_SUFFIX = "|library-model"


def default_cache_path() -> Path | None:
    if os.environ.get("HIERCOLL_NO_CACHE"):
        return None
    root = os.environ.get("HIERCOLL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hiercoll")
    return Path(root) / "sim-cache.json"


def simulate_candidate(topology: Topology, spec: CollectiveSpec, cand: Candidate,
                       cache: SimCache, schedule: Schedule | None = None,
                       call_mode: CallMode = "eager") -> Scored:
    """One candidate's simulated time in `call_mode` (cached by topology, spec, candidate and
    mode)."""
    base = SimCache.key(topology, spec, cand)
    key = base + _mode_suffix(call_mode)
    hit = cache.get(key)
    if hit is None:
        from hiercoll.sim import simulate
        sched = schedule or plan(topology, spec, cand.algorithm, cand.params)
        ran, protocol = backend_call(topology, sched)
        res = simulate(ran.schedule, topology, mode="trusted", call_mode=call_mode,
                       protocol=protocol)
        hit = [res.time_us, res.busbw_gbps, res.lower_bound_us]
        cache.put(key, hit)
        if ran.rows:
            cache.put(base + ROWS_SUFFIX, [float(ran.rows), 0.0, 0.0])
    return Scored(cand, hit[0], hit[1], hit[2], _rows(cache, base))


def backend_call(topology: Topology, schedule: Schedule) -> tuple[Merged, CallProtocol | None]:
    """What the simulator times for the cuda backend at its default knobs: the schedule its
    lowering runs (`backend_schedule`) and the protocol, with the barrier rows that kernel
    walks (None: the topology does not price protocols)."""
    protocol = backend_protocol(topology, schedule)
    ran = backend_schedule(topology, schedule, protocol)
    return ran, None if protocol is None else protocol.with_barrier_rows(ran.barrier_rows)


def backend_protocol(topology: Topology, schedule: Schedule) -> CallProtocol | None:
    """The protocol the cuda backend runs `schedule` with at its default knobs, where the
    topology prices protocols (costs fitted on our own executor: `sync_us`, `ll_unpack_us`);
    None elsewhere: nothing to apply there, and no walk over every op of a 4096-GPU plan.
    (Such a topology's fingerprint holds those costs, so cached times keep apart.)"""
    if not topology.costs.prices_protocols():
        return None
    return default_call_protocol(schedule, topology.costs.ce_threshold_bytes)


def backend_schedule(topology: Topology, schedule: Schedule,
                     protocol: CallProtocol | None) -> Merged:
    """What the cuda backend runs at its default knobs, where the topology prices protocols:
    the simple protocol's schedule as the lowering runs it (`sim.forwarding.as_timed`: copies
    forwarded, independent channel heads split, rows' result copies beside their rows) and the
    rows its busiest rank walks; an LL call as planned, its independent pushes side by side
    (`as_timed_ll`). `hiercoll autopick --validate` prices
    the bench rows it checks the same way (`calibration.predict.timed`), so the regret it
    reports is of this ranking; elsewhere (no protocol) the plan as written, as before (rows
    unknown: 0)."""
    if protocol is None:
        return Merged(schedule, 0)
    from hiercoll.sim.forwarding import as_timed, as_timed_ll
    if protocol.ll:
        return Merged(as_timed_ll(schedule), 0)
    return as_timed(schedule, topology.costs.ce_threshold_bytes, inter_peer=True)


def _mode_suffix(call_mode: CallMode) -> str:
    """Cache keys of graph-mode times (eager keys stay as they were: caches on disk keep working)."""
    return "" if call_mode == "eager" else ":graph"


def _critical_path_bound(topology: Topology, schedule: Schedule) -> float:
    """Stage 2 of pruning (stage 1, rank_bound_us, is already known by then)."""
    from hiercoll.sim.bounds import contention_free_us
    return contention_free_us(schedule, topology, verify_symmetry=False)


def _bound(topology: Topology, schedule: Schedule) -> float:
    """Both lower bounds together (what the tests check against simulations)."""
    return max(rank_bound_us(schedule, topology), _critical_path_bound(topology, schedule))


def _measured(topology: Topology, spec: CollectiveSpec, cands: list[Candidate],
              library: LibraryTable | None) -> list[Scored]:
    """The candidates the table measured at sizes around this one, scored by those times
    (bounds from their schedules, for the report); empty: simulate instead."""
    times = library.measured_plans_us(topology, spec) if library is not None else {}
    out = []
    for cand in cands:
        t = times.get(cand.label())
        if t is not None:
            built = plan(topology, spec, cand.algorithm, cand.params)
            out.append(Scored(cand, t, spec.bandwidths_gbps(t)[1], rank_bound_us(built, topology)))
    return out


def _simulated(topology: Topology, spec: CollectiveSpec, cands: list[Candidate], cache: SimCache,
               lib_us: float | None, base: str, prune: bool,
               call_mode: CallMode = "eager") -> tuple[list[Scored], int]:
    """Every candidate simulated, or pruned where a bound shows it cannot win (the bounds hold
    a call's device work only, so they bound either mode's time)."""
    scored: list[Scored] = []
    # (rank bound, index, candidate, cache key, schedule or None, critical-path bound or -1)
    pending: list[tuple[float, int, Candidate, str, Schedule | None, float]] = []
    for i, cand in enumerate(cands):
        key = SimCache.key(topology, spec, cand)
        if cache.get(key + _mode_suffix(call_mode)) is not None:   # simulated: no bound needed
            scored.append(simulate_candidate(topology, spec, cand, cache, call_mode=call_mode))
            continue
        known = cache.get(key + BOUNDS_SUFFIX)   # pruned before: its bounds, nothing built
        if known is not None:
            pending.append((known[0], i, cand, key, None, known[1]))
            continue
        built = plan(topology, spec, cand.algorithm, cand.params)
        pending.append((rank_bound_us(built, topology), i, cand, key, built, -1.0))
    pending.sort(key=lambda t: (t[0], t[1]))
    pruned = 0
    have_base = any(s.candidate.algorithm == base for s in scored)
    for bound, _, cand, key, sched, path_bound in pending:
        # the baseline (flat ring) is reported at its own best, so it competes among itself
        pool = [s.time_us for s in scored if cand.algorithm != base or s.candidate.algorithm == base]
        if lib_us is not None and cand.algorithm != base:
            pool.append(lib_us)
        best_us = min(pool, default=math.inf)
        must = cand.algorithm == base and not have_base
        # stage 1: one rank's bound (cheap); stage 2: the contention-free critical path. Strictly
        # above: a candidate whose bound equals the best time may tie it, and a tie is decided
        # by label below, so pruning it could change the pick (not only its time)
        if prune and not must:
            if bound <= best_us and path_bound < 0:
                sched = sched or plan(topology, spec, cand.algorithm, cand.params)
                path_bound = _critical_path_bound(topology, sched)
            if bound > best_us or path_bound > best_us:
                pruned += 1
                # both bounds are exact values of this candidate's schedule (-1: not computed),
                # so a later run prunes it the same way without building it
                entry = [bound, path_bound, 0.0]
                if cache.get(key + BOUNDS_SUFFIX) != entry:
                    cache.put(key + BOUNDS_SUFFIX, entry)
                continue
        scored.append(simulate_candidate(topology, spec, cand, cache, sched, call_mode))
        have_base = have_base or cand.algorithm == base
    return scored, pruned


@without_cyclic_gc()     # bounds and simulations of thousands of ranks: millions of acyclic objects
def pick_one(topology: Topology, spec: CollectiveSpec, cache: SimCache,
             only: list[str] | None = None, prune: bool = True,
             library: LibraryTable | None = None, library_model: bool = False,
             call_mode: CallMode = "eager") -> Row:
    """The fastest candidate for `spec`; `library`: measured library times that compete too
    (they prune simulations like any known time). `library_model`: also simulate NCCL's model
    for the report where no table applies (a column only: `plan -a auto` does not pay it)."""
    planned_only = [a for a in only if a != LIBRARY] if only else None
    cands, oversized = (([], 0) if planned_only == []
                        else candidates_and_oversized(topology, spec, planned_only))
    lib_us = _library_time_us(topology, spec, library, only)
    if not cands and lib_us is None:
        why = (f": {oversized} plan(s) would exceed the op limit (HIERCOLL_MAX_OPS="
               f"{max_ops():.0f}); use fewer ranks or raise HIERCOLL_MAX_OPS" if oversized else "")
        raise HiercollError(f"no algorithm can plan {spec.kind} on {topology.name}"
                            + (f" among {only}" if only else "") + why)
    base = baseline_algorithm(spec)
    measured = _measured(topology, spec, cands, library)
    if measured:
        scored, pruned = measured, len(cands) - len(measured)
    else:
        scored, pruned = _simulated(topology, spec, cands, cache, lib_us, base, prune, call_mode)
    simulated = 0 if measured else len(scored)
    thresholds = {} if measured else _tune_ce_threshold(topology, spec, scored, cache, call_mode)
    if lib_us is not None:    # no schedule of its own: it is held to the best plan's bound
        scored.append(Scored(Candidate(LIBRARY, {}), lib_us, spec.bandwidths_gbps(lib_us)[1],
                             min((s.lower_bound_us for s in scored), default=0.0)))
    scored.sort(key=Scored.rank)
    best, runner = scored[0], next((s for s in scored[1:]
                                    if s.candidate.algorithm != scored[0].candidate.algorithm), None)
    flat = min((s.time_us for s in scored if s.candidate.algorithm == base), default=None)
    return Row(bytes=spec.total_bytes, algorithm=best.candidate.algorithm,
               params=best.candidate.params, time_us=best.time_us, busbw_gbps=best.busbw_gbps,
               lower_bound_us=best.lower_bound_us,
               pct_of_bound=100.0 * best.lower_bound_us / best.time_us if best.time_us else 100.0,
               runner_up=None if runner is None else {
                   "algorithm": runner.candidate.algorithm, "params": runner.candidate.params,
                   "time_us": runner.time_us},
               margin_pct=None if runner is None else 100.0 * (runner.time_us / best.time_us - 1),
               flat_ring_time_us=flat, baseline_algorithm=base, simulated=simulated,
               pruned=pruned, all_times={s.candidate.label(): s.time_us for s in scored},
               library_time_us=lib_us,
               library_model_us=(library_model_us(topology, spec, cache, call_mode)
                                 if library_model and lib_us is None else None),
               measured=bool(measured),
               # a tuned threshold only: an untuned plan (measured, or engines priced alike)
               # runs with the backend's own default, which is how the measured rows ran
               executor=({} if best.candidate.algorithm == LIBRARY
                         or best.candidate.label() not in thresholds else
                         {"ce_threshold_bytes": thresholds[best.candidate.label()]}))


# Copy-engine thresholds the auto-picker tries (the cuda backend's --ce-threshold; its default is
# none since the SMs' copies run side by side), on the TUNE_TOP fastest candidates of each size.
CE_THRESHOLDS = (256 << 10, 2 << 20, 8 << 20, 64 << 20)
TUNE_TOP = 3


def _tune_ce_threshold(topology: Topology, spec: CollectiveSpec, scored: list[Scored],
                       cache: SimCache, call_mode: CallMode = "eager") -> dict[str, int]:
    """The fastest threshold per candidate label, for the TUNE_TOP fastest; their scores in
    `scored` become the tuned times. Thresholds that put the same copies on the copy engine are
    one choice (the topology's own wins it), and a tie keeps the topology's threshold."""
    from hiercoll.sim.engine import on_copy_engine
    own = topology.costs.ce_threshold_bytes
    if not topology.costs.engines_differ():
        return {}                     # the simulator times both engines alike
    chosen: dict[str, int] = {}
    # ties by label, as the final choice: which candidates get tuned must not depend on the
    # order they were simulated in (that changes with pruning and the cache)
    order = sorted(range(len(scored)),
                   key=lambda i: scored[i].rank())[:TUNE_TOP]
    for i in order:
        best = scored[i]
        cand = best.candidate
        ce_key = SimCache.key(topology, spec, cand) + CE_SUFFIX + _mode_suffix(call_mode)
        known = cache.get(ce_key)
        if known is not None:         # tuned before: its pick, and that pick's cached time
            pick = int(known[0])
            if pick != own:
                best = _retime(topology, spec, cand, cache, None, pick, call_mode)
            scored[i] = best
            chosen[cand.label()] = pick
            continue
        sched = plan(topology, spec, cand.algorithm, cand.params)
        ops = [op for r in range(spec.world_size) for op in sched.rank_ops(r)]
        groups: dict[frozenset[int], int] = {}
        for t in sorted({own, *CE_THRESHOLDS}, key=lambda t: (t != own, t)):
            on_ce = frozenset(k for k, op in enumerate(ops)
                              if on_copy_engine(op, spec.dtype.itemsize, t))
            groups.setdefault(on_ce, t)
        pick = own
        for t in groups.values():
            if t == own:
                continue
            timed = _retime(topology, spec, cand, cache, sched, t, call_mode)
            if timed.time_us < best.time_us:
                best, pick = timed, t
        scored[i] = best
        chosen[cand.label()] = pick
        cache.put(ce_key, [float(pick), 0.0, 0.0])
    return chosen


def _retime(topology: Topology, spec: CollectiveSpec, cand: Candidate, cache: SimCache,
            schedule: Schedule | None, threshold: int, call_mode: CallMode = "eager") -> Scored:
    """`schedule` timed with the copy-engine threshold `threshold` (cached under that topology;
    None: the candidate's, built only on a cache miss)."""
    variant = topology.with_costs(ce_threshold_bytes=threshold)
    key = SimCache.key(variant, spec, cand) + _mode_suffix(call_mode)
    hit = cache.get(key)
    if hit is None:
        from hiercoll.sim import simulate
        sched = schedule or plan(topology, spec, cand.algorithm, cand.params)
        # as the backend runs it at this threshold, like the untuned time it competes with
        ran, protocol = backend_call(variant, sched)
        res = simulate(ran.schedule, topology, mode="trusted", costs_from=variant,
                       call_mode=call_mode, protocol=protocol)
        hit = [res.time_us, res.busbw_gbps, res.lower_bound_us]
        cache.put(key, hit)
    return Scored(cand, hit[0], hit[1], hit[2], _rows(cache, SimCache.key(topology, spec, cand)))


def _rows(cache: SimCache, key: str) -> int:
    """The rows a simulated candidate's kernel walks (0 where not modelled), stored under its
    key (the same at every copy-engine threshold the tuner tries)."""
    rows = cache.get(key + ROWS_SUFFIX)
    return int(rows[0]) if rows else 0


def _library_time_us(topology: Topology, spec: CollectiveSpec, library: LibraryTable | None,
                     only: list[str] | None) -> float | None:
    if library is None or (only and LIBRARY not in only) or not library.applies_to(topology, spec):
        return None
    return library.predict_us(spec.kind, spec.total_bytes)


def library_model_us(topology: Topology, spec: CollectiveSpec, cache: SimCache,
                     call_mode: CallMode = "eager") -> float | None:
    """NCCL's time as the library model simulates it in `call_mode` (cached like any
    candidate)."""
    from hiercoll.planner.library_model import library_model_timed
    if spec.kind not in LIBRARY_KINDS:
        return None
    # cached under the model's own name (library_model() itself simulates ring and tree to
    # choose), so a warm run builds and simulates nothing; apart from our candidates' entries,
    # since NCCL moves every byte with SMs (timed without copy engines)
    key = (SimCache.key(topology, spec, Candidate("library-model", {})) + LIBRARY_MODEL_SUFFIX
           + _mode_suffix(call_mode))
    known = cache.get(key)
    if known is not None:
        return known[0]
    try:
        sched, time_us = library_model_timed(topology, spec, call_mode)
    except HiercollError:   # its ring refused as too large (HIERCOLL_MAX_OPS: 8 rings on 4096
        return None         # GPUs): the column is a comparison only, so the pick goes on without it
    cache.put(key, [time_us, 0.0, 0.0])     # an entry's shape; only the time is read
    return time_us


def spec_for_size(template: CollectiveSpec, nbytes: int) -> CollectiveSpec:
    return template.resized(valid_nbytes(template.kind, template.world_size, template.dtype, nbytes))


Job = tuple[Topology, CollectiveSpec, list[str] | None, dict[str, list[float]],
            LibraryTable | None, CallMode]


def _pick_in_worker(job: Job) -> tuple[Row, dict[str, list[float]]]:
    """One size in a worker process: its row, and the simulations it added to the cache."""
    topology, spec, only, known, library, call_mode = job
    cache = SimCache(None)
    cache.data = dict(known)
    row = pick_one(topology, spec, cache, only, library=library, library_model=True,
                   call_mode=call_mode)
    return row, {k: v for k, v in cache.data.items() if k not in known}


def sweep(topology: Topology, template: CollectiveSpec, sizes: list[int],
          only: list[str] | None = None, progress: bool = True, cache_path: Path | None = None,
          jobs: int | None = None, library: LibraryTable | None = None,
          cluster: Cluster | None = None, call_mode: CallMode = "eager") -> list[Row]:
    """One Row per size (a single row for group kinds, whose sizes come from the splits).
    Sizes are independent searches, so `jobs` worker processes take one size each (default:
    every core), or tasks on a Ray `cluster` (the same rows). `library`: measured library
    times that compete with the plans. `call_mode`: time every candidate as an eager call or
    as a CUDA-graph replay (what captured callers run)."""
    cache = SimCache(cache_path)
    specs = [template] if template.kind in GROUPED else [spec_for_size(template, s) for s in sizes]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(specs)))
    rows: list[Row | None] = [None] * len(specs)
    with terminal_bar(f"auto-picking {template.kind.value} (sizes done)", progress,
                      lines=True) as report:
        if jobs == 1 and cluster is None:
            for i, s in enumerate(specs):
                rows[i] = pick_one(topology, s, cache, only, library=library, library_model=True,
                                   call_mode=call_mode)
                report(i + 1, len(specs))
        else:
            work: list[Job] = [(topology, s, only, cache.data, library, call_mode) for s in specs]
            for done, (i, (row, added)) in enumerate(run_jobs(_pick_in_worker, work, jobs, cluster), 1):
                rows[i] = row
                for key, value in added.items():
                    cache.put(key, value)
                report(done, len(specs))
    cache.save()
    return [r for r in rows if r is not None]


# ---- tuning files --------------------------------------------------------------------------------
class TuningEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_bytes: int
    max_bytes: int
    algorithm: str
    params: dict[str, Any]
    executor: dict[str, Any] = {}     # the cuda backend's tuned knobs (CudaOptions.tuned)


class TuningTable(BaseModel):
    model_config = ConfigDict(extra="forbid")
    topology_fingerprint: str
    topology: str
    collective: Kind
    dtype: str
    entries: list[TuningEntry]


TUNING_SCHEMA_VERSION = 1


class TuningFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = TUNING_SCHEMA_VERSION
    tables: list[TuningTable] = []

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        """A file of another layout is refused by name, not half-read as this one."""
        if v != TUNING_SCHEMA_VERSION:
            raise ValueError(f"{v} is not a version this hiercoll reads ({TUNING_SCHEMA_VERSION}); "
                             "re-run `hiercoll autopick -o FILE` to write it anew")
        return v


def rows_to_table(topology: Topology, template: CollectiveSpec, rows: list[Row]) -> TuningTable:
    """Each row owns the sizes from the geometric midpoint with its neighbours."""
    entries = []
    for i, row in enumerate(rows):
        lo = 0 if i == 0 else int(math.sqrt(rows[i - 1].bytes * row.bytes)) + 1
        hi = 2**62 if i == len(rows) - 1 else int(math.sqrt(row.bytes * rows[i + 1].bytes))
        entries.append(TuningEntry(min_bytes=lo, max_bytes=hi, algorithm=row.algorithm,
                                   params=row.params, executor=row.executor))
    return TuningTable(topology_fingerprint=topology.fingerprint(), topology=topology.name,
                       collective=template.kind, dtype=template.dtype.value, entries=entries)


def read_tuning(path: str | Path) -> TuningFile:
    p = Path(path)
    if not p.exists():
        return TuningFile()
    try:
        return TuningFile.model_validate_json(p.read_text())
    except ValidationError as err:
        raise HiercollError(format_validation_error(err, str(p))) from None


def write_tuning(path: str | Path, table: TuningTable) -> None:
    """Merge `table` into the file (replacing the same topology+collective+dtype), atomically."""
    from hiercoll.files import write_atomic
    current = read_tuning(path)
    keep = [t for t in current.tables if (t.topology_fingerprint, t.collective, t.dtype)
            != (table.topology_fingerprint, table.collective, table.dtype)]
    write_atomic(path, TuningFile(tables=[*keep, table]).model_dump_json(indent=1) + "\n")


@dataclass(frozen=True)
class Pick:
    algorithm: str
    params: dict[str, Any]
    source: str
    executor: dict[str, Any] = field(default_factory=dict)
    # where the search ranked by a machine's measurements: the pick's and the library call's
    # measured times (a caller that adds its own costs to the plan compares with these)
    measured_us: float | None = None
    library_us: float | None = None


def tuned_executor(tuning_path: str | Path, topology: Topology,
                   spec: CollectiveSpec) -> dict[str, Any]:
    """The tuning file's executor knobs for this topology, collective, dtype and size ({} when
    it has no entry for them)."""
    from hiercoll.planner.search.tuning_path import check_tuning_path
    check_tuning_path(tuning_path)
    entry = _entry(read_tuning(tuning_path), topology, spec)
    return {} if entry is None else dict(entry.executor)


def _entry(tuning: TuningFile, topology: Topology, spec: CollectiveSpec) -> TuningEntry | None:
    for table in tuning.tables:
        if (table.topology_fingerprint == topology.fingerprint() and table.collective == spec.kind
                and table.dtype == spec.dtype.value):
            for e in table.entries:
                if e.min_bytes <= spec.total_bytes <= e.max_bytes:
                    return e
    return None


def choose(topology: Topology, spec: CollectiveSpec, tuning_path: str | None = None) -> Pick:
    """The tuning file's choice for this size when it has one, else a search for this size
    (with the library's measured times when a shipped table describes this topology)."""
    if tuning_path is not None:
        e = _entry(read_tuning(tuning_path), topology, spec)
        if e is not None:
            return Pick(e.algorithm, e.params, f"tuning file {tuning_path}", e.executor)
    cache = SimCache(default_cache_path())
    row = pick_one(topology, spec, cache, library=shipped_table(topology))
    cache.save()
    if row.measured:
        return Pick(row.algorithm, row.params, "searched (measured)", row.executor, row.time_us,
                    row.library_time_us)
    return Pick(row.algorithm, row.params, "searched (simulated)", row.executor)
