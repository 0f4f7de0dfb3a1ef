"""From a measurement to the plan that ran and the simulator's time for it.

A hiercoll bench row carries its plan's recipe (algorithm, params, spec), so the same schedule is
re-planned; a library row (NCCL, from nccl-tests or a bench) is predicted through the library
model (`planner/library_model.py`: NCCL's ring or its point-to-point all-to-all as a hiercoll
plan). Schedules depend only on the topology's shape, so they are built once and re-timed under
every candidate set of costs (`simulate(..., costs_from=...)`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hiercoll.calibration.measurements import Measurement
from hiercoll.collectives import CollectiveSpec, valid_nbytes
from hiercoll.errors import HiercollError
from hiercoll.ll_protocol import (
    DEFAULT_LL_THRESHOLD_BYTES,
    PROTOCOLS,
    CallProtocol,
    call_protocol,
    ll_limit_bytes,
    ll_unpack_peer_limit,
)
from hiercoll.planner import plan
from hiercoll.planner.library_model import (
    choose_fastest,
    library_candidates,
    library_variants,
    sm_only,
)
from hiercoll.schedule import LIBRARY_ALGORITHM, Schedule
from hiercoll.sim import simulate
from hiercoll.sim.forwarding import as_lowered, as_timed_ll, merged_rows
from hiercoll.sim.row_merge import Merged
from hiercoll.topology import Topology


@dataclass(frozen=True)
class Case:
    """A measurement and the schedule that reproduces it on the base topology."""

    measurement: Measurement
    schedule: Schedule
    # library rows: every plan NCCL's model chooses among (ring, tree); the prediction takes
    # the fastest under the costs being evaluated, so calibrate's fit and compare choose alike
    candidates: tuple[Schedule, ...] = ()
    protocol: CallProtocol | None = None     # cuda rows: the protocol their lowering ran
    planned: Schedule | None = None          # LL rows: the plan as LL runs it (`as_timed_ll`)
    rows: int = 0       # cuda rows: rows of the busiest rank's kernel (`row_merge`); 0 unknown

    @property
    def plan_label(self) -> str:
        """The plan as reports group it: algorithm and its non-default params; library rows say
        which model stands for them."""
        m = self.measurement
        if m.algorithm == LIBRARY_ALGORITHM:
            models = " or ".join(c.meta.algorithm for c in self.candidates) or self.schedule.meta.algorithm
            return f"nccl (model: {models})"
        extra = ",".join(f"{k}={v}" for k, v in sorted(m.params.items()) if k in ("chunks", "channels"))
        return f"{m.algorithm}({extra})" if extra else m.algorithm


def spec_of(m: Measurement) -> CollectiveSpec:
    """The collective a row timed (its size rounded to what the collective accepts: nccl-tests
    sizes are not always a multiple of W elements for all-to-all)."""
    nbytes = valid_nbytes(m.collective, m.world_size, m.dtype, m.nbytes)
    return CollectiveSpec(kind=m.collective, world_size=m.world_size, dtype=m.dtype,
                          nbytes=nbytes, reduce_op=m.reduce_op)


def build_case(m: Measurement, topology: Topology) -> Case:
    """The schedule of one measurement on `topology` (its shape must match the row's)."""
    spec = spec_of(m)
    if m.algorithm == LIBRARY_ALGORITHM:
        candidates = library_candidates(topology, spec)
        return Case(m, candidates[0], tuple(candidates))
    else:
        try:
            schedule = plan(topology, spec, m.algorithm, dict(m.params) or None)
        except HiercollError as exc:
            raise HiercollError(f"{m.source}: cannot re-plan this row ({exc})") from None
    protocol = protocol_of(schedule, topology, m.lowering)
    ll = protocol is not None and protocol.ll
    ran = timed(schedule, topology, m.lowering)
    if protocol is not None:
        protocol = protocol.with_barrier_rows(ran.barrier_rows)
    return Case(m, ran.schedule, protocol=protocol, planned=as_timed_ll(schedule) if ll else None,
                rows=ran.rows)


def _inter_peer(knobs: Mapping[str, object]) -> bool:
    """Whether a row's inter-node copies ran over peer mappings (the cuda backend's default)."""
    return knobs.get("inter_transport", "peer") == "peer"


def _ce_threshold(topology: Topology, knobs: Mapping[str, object]) -> int:
    threshold = knobs.get("ce_threshold_bytes")
    if not isinstance(threshold, int) or isinstance(threshold, bool):
        return topology.costs.ce_threshold_bytes
    return threshold


def protocol_of(schedule: Schedule, topology: Topology,
                knobs: Mapping[str, object]) -> CallProtocol | None:
    """The protocol a cuda bench row's lowering ran `schedule` with (the backend's own rule,
    `ll_protocol`: LL where its knobs allow and the plan qualifies), or None for a row without
    a protocol knob (another backend, or a bench from before the LL lowering)."""
    asked = knobs.get("protocol")
    if asked is None:
        return None
    if asked not in PROTOCOLS:
        raise HiercollError(f"lowering.protocol: {asked!r} is not one the cuda backend runs "
                            f"({', '.join(PROTOCOLS)}); fix the bench row")
    ll_bytes = knobs.get("ll_threshold_bytes")
    limit = ll_limit_bytes(str(asked), bool(knobs.get("fuse", True)),
                           bool(knobs.get("launch_per_op")),
                           ll_bytes if isinstance(ll_bytes, int) else DEFAULT_LL_THRESHOLD_BYTES,
                           _ce_threshold(topology, knobs))
    return call_protocol(schedule, limit, _inter_peer(knobs),
                         ll_unpack_peer_limit(str(asked), _unpack_peers(knobs)))


def _unpack_peers(knobs: Mapping[str, object]) -> int | None:
    """The row's limit on the peers an LL rank unpacks from: its `ll_unpack_peers`; for rows of
    84b9a30 / 2e0de52, which recorded `ll_unpack_threshold_bytes` instead, 0 where that was 0
    (no unpacking plan ran LL under auto) and none where it admitted every LL-sized op; None for
    rows from before either (auto ran every qualifying plan as LL)."""
    peers = knobs.get("ll_unpack_peers")
    if isinstance(peers, int):
        return peers
    old = knobs.get("ll_unpack_threshold_bytes")
    if isinstance(old, int):
        return 0 if old == 0 else None
    return None


def lowered(schedule: Schedule, topology: Topology, knobs: Mapping[str, object]) -> Schedule:
    """The schedule a cuda bench row ran: its copies forwarded and its channel heads split
    where the row's lowering did (`forward`, `split_channels`; not one launch per op), with the
    row's copy-engine threshold; as planned for every other row."""
    if knobs.get("launch_per_op") or "forward" not in knobs:
        return schedule
    # rows from before the channel split carry no `split_channels` knob: they ran unsplit; rows
    # of 84b9a30 / 2e0de52 (they carry `ll_unpack_threshold_bytes`) split every run of two ops
    return as_lowered(schedule, _ce_threshold(topology, knobs), inter_peer=_inter_peer(knobs),
                      forward=bool(knobs.get("forward")),
                      split=bool(knobs.get("split_channels", False))
                      and bool(knobs.get("single_stream") or knobs.get("fuse", True)),
                      split_min_peers=0 if "ll_unpack_threshold_bytes" in knobs else 2)


def timed(schedule: Schedule, topology: Topology, knobs: Mapping[str, object]) -> Merged:
    """What the simulator times for a cuda bench row: the schedule it ran (`lowered`), with
    the result copies its rows took as more destinations beside them (`merged_rows`), where
    the row's lowering forwarded; as planned for every other row (rows unknown: 0)."""
    if knobs.get("launch_per_op") or "forward" not in knobs:
        return Merged(schedule, 0)
    # rows of kernels before the merge (they carry no `max_ctas`: both came with cb2728e) ran
    # every copy as a row of its own
    # one kernel a call wherever `fuse` is on: the lowering makes an all-SM plan single-stream
    # itself (`lowering.effective_options`), whatever the row's `single_stream` knob says
    return merged_rows(lowered(schedule, topology, knobs), _ce_threshold(topology, knobs),
                       _inter_peer(knobs), merge="max_ctas" in knobs,
                       one_kernel=bool(knobs.get("fuse", True)))


def predict_us(case: Case, timed_on: Topology, base: Topology) -> float:
    """Simulated time of the case's schedule (planned on `base`) with the costs of `timed_on`
    (a variant of `base` with other bandwidths/latencies/costs), in the row's mode."""
    if case.measurement.algorithm == LIBRARY_ALGORITHM:     # NCCL: SM kernels, no copy engine
        timed_on = sm_only(timed_on)
        variants = library_variants(timed_on, case.candidates or (case.schedule,))
        if len(variants) == 1:
            return _simulated(variants[0][0], case, timed_on, base, variants[0][1])
        # NCCL's choice (plan and protocol), made with these costs
        _, best = choose_fastest(variants, lambda v: _simulated(v[0], case, timed_on, base, v[1]))
        return float(best or 0.0)
    return _time(case.schedule, case, timed_on, base)


def _time(schedule: Schedule, case: Case, timed_on: Topology, base: Topology) -> float:
    """A row's time under `timed_on`'s costs: by the protocol it ran where those costs price
    protocols (fitted with them: `Costs.prices_protocols`), else as before protocols were
    modelled (costs fitted without these terms rank plans as they were fitted to)."""
    protocol = case.protocol if timed_on.costs.prices_protocols() else None
    if protocol is not None and protocol.ll and case.planned is not None:
        schedule = case.planned
    return _simulated(schedule, case, timed_on, base, protocol)


def _simulated(schedule: Schedule, case: Case, timed_on: Topology, base: Topology,
               protocol: CallProtocol | None) -> float:
    return simulate(schedule, base, costs_from=_row_engines(timed_on, case.measurement),
                    call_mode=case.measurement.mode, protocol=protocol).time_us


def _row_engines(timed_on: Topology, m: Measurement) -> Topology:
    """`timed_on` with the copy-engine threshold the row ran with (its `ce_threshold_bytes`
    knob): which copies a copy engine moved is a fact of the run, not a cost to fit. Without
    it, a run on SMs alone (the backend's default) was priced at the topology's threshold:
    4 x H200 all_to_all 1 GiB, 4054 us simulated for 2500 measured."""
    threshold = m.lowering.get("ce_threshold_bytes")
    if (m.algorithm == LIBRARY_ALGORITHM or not isinstance(threshold, int)
            or isinstance(threshold, bool) or threshold == timed_on.costs.ce_threshold_bytes):
        return timed_on
    return timed_on.with_costs(ce_threshold_bytes=threshold)
