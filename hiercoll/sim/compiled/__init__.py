"""The compiled simulator core: the Python engine's replay (`sim/engine.py`, `sim/fluid.py`)
over flat tables, compiled with numba (the `sim` extra). The Python engine stays the reference:
tests run both and require the same times and link loads.

`run_compiled` replays tables `tables.build_tables` made (None where the case is one the tables
do not hold: then the caller runs the Python engine): never a different answer.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

import numpy as np
import numpy.typing as npt

from hiercoll.errors import HiercollError
from hiercoll.sim.engine import Progress
from hiercoll.sim.fluid import SLACK_MARGIN, LinkUsage
from hiercoll.sim.links import Network

if TYPE_CHECKING:
    from hiercoll.sim.compiled.tables import Tables

F64 = npt.NDArray[np.float64]

Engine = Literal["auto", "python", "compiled"]
ENGINES: tuple[Engine, ...] = ("auto", "python", "compiled")
ENGINE_ENV = "HIERCOLL_SIM_ENGINE"
# `auto` replays fewer ops than this in Python: below it, importing numba and loading the
# compiled loop from its cache (~0.5 s per process) costs more than the Python engine's ~20 us
# an op saves
AUTO_MIN_OPS = 20_000
PROGRESS_EVERY = 1024      # instants between progress reports, as the Python engine's clock


def heap_start(channels: int) -> int:
    """The first size of the heap of stale wake-ups' times (whole re-solves only: there, one
    still opens an instant); the loop asks for twice as much when it might overflow. The event
    heap holds a channel's one pending event (its next begin or its flow's wake-up) in place."""
    return 4 * channels + 64


@functools.cache
def numba_available() -> bool:
    """Whether numba (the `sim` extra) imports: a broken install (say, built for another
    numpy) leaves `auto` on the Python engine instead of failing the simulation."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


BLAS_PROBE = "scipy.linalg.cython_blas"


@functools.cache
def skip_blas_probe() -> None:
    """Load numba's array maths without its BLAS probe: the first compile or cache load of a
    process imports numba.np.arraymath, whose import asks whether scipy's BLAS is there by
    importing scipy.linalg (~0.2 s of a ~0.35 s fixed cost, more than a 100k-op replay). The
    replay calls no BLAS; with the probe answered "no", numba's np.dot and friends still import
    scipy when first typed, and only its np.cov-style inner products take a loop instead.
    Nothing is done where scipy.linalg or numba's array maths are loaded already."""
    import sys
    if BLAS_PROBE in sys.modules or "numba.np.arraymath" in sys.modules:
        return
    sys.modules[BLAS_PROBE] = None  # type: ignore[assignment]   # its import raises ImportError
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        del sys.modules[BLAS_PROBE]


def requested_engine(engine: Engine | None) -> Engine:
    """The engine asked for: the argument, else $HIERCOLL_SIM_ENGINE, else auto."""
    if engine is None:
        env = os.environ.get(ENGINE_ENV, "").strip().lower() or "auto"
        if env not in ENGINES:
            raise HiercollError(f"{ENGINE_ENV}={env!r}: expected one of {', '.join(ENGINES)}")
        return cast(Engine, env)
    if engine not in ENGINES:
        raise HiercollError(f"simulate: engine {engine!r}: expected one of {', '.join(ENGINES)}")
    return engine


def use_compiled(engine: Engine | None, num_ops: int, record: bool) -> bool:
    """Whether to replay with the compiled core. `record` (per-link utilisation traces) is the
    Python engine's alone; `compiled` without numba installed is an error, `auto` falls back."""
    engine = requested_engine(engine)
    if engine == "python" or record:
        return False
    if engine == "compiled":
        if not numba_available():
            raise HiercollError("simulate: engine 'compiled' needs numba "
                                "(pip install 'hiercoll[sim]'); engine 'auto' falls back to Python")
        return True
    return num_ops >= AUTO_MIN_OPS and numba_available()


# the last replay's counts (diagnostics: bench/sim_scale.py, the profile of issue 29)
LAST_COUNTS: dict[str, int] = {}


def counts(st: npt.NDArray[np.int64]) -> dict[str, int]:
    """A replay's instants and re-solves by path (quiet, local, whole), and the local ones'
    rounds, flows and links filled in all, and the whole ones' flows."""
    from hiercoll.sim.compiled import core as c
    return {"instants": int(st[c.INSTANTS]), "quiet": int(st[c.N_QUIET]), "local": int(st[c.N_LOCAL]),
            "whole": int(st[c.N_WHOLE]), "local_rounds": int(st[c.N_ROUNDS]),
            "local_flows": int(st[c.N_SETFLOWS]), "local_links": int(st[c.N_SETLINKS]),
            "whole_flows": int(st[c.N_WHOLEFLOWS]), "local_walked": int(st[c.N_WALKED]),
            "stale": int(st[c.N_STALE]), "empty_begins": int(st[c.N_EMPTYBEGIN]),
            "set_rate": int(st[c.N_SETRATE]), "events": int(st[c.N_EVENTS]),
            "local_heap_rounds": int(st[c.N_BIG]), "local_heap_flows": int(st[c.N_BIGFLOWS])}


@dataclass
class CompiledRun:
    """A replay kept as arrays: the tables (rows rank by rank) and each row's start and end."""

    tables: Tables
    op_start: F64
    op_end: F64
    usage: LinkUsage


def run_compiled(t: Tables, net: Network, progress: Progress | None = None) -> CompiledRun:
    """Replay built tables, keeping the times as arrays (`simulate`'s path: no per-op dict)."""
    op_start, op_end, usage = replay_tables(t, net, progress)
    return CompiledRun(t, op_start, op_end, usage)


def replay_tables(t: Tables, net: Network, progress: Progress | None = None) -> tuple[F64, F64, LinkUsage]:
    """The compiled loop over built tables: (start and end of every row, per-link usage);
    raises VerificationError naming an op that never ran, as the Python engine does."""
    skip_blas_probe()
    from hiercoll.sim.compiled.core import (
        DONE,
        ENDED,
        GROW,
        LOCAL_ON,
        N_STATE,
        NENDED,
        PAUSED,
        replay,
    )
    from hiercoll.sim.fluid import local_resolve

    n, n_ch, n_links = t.num_ops, len(t.ch_ptr) - 1, len(net.links)
    i64, f64 = np.int64, np.float64
    # per-link and per-channel state, an array a field (a row of fields as strided views of
    # one block was a fifth slower on the 4096-GPU `hier`)
    (weight, demand, used, ws, pcap, lold, ubytes, busy_us, busy_since,
     rem, left, at) = (np.zeros(n_links, f64) for _ in range(12))
    alone = np.array([l.bytes_per_us for l in net.links], f64)
    crowded = np.array([-1.0 if l.crowded_bytes_per_us is None else l.crowded_bytes_per_us
                        for l in net.links], f64)
    slack = np.array([c * (1.0 - SLACK_MARGIN) for c in alone.tolist()], f64)   # as fluid.py
    cap = alone.copy()                 # crowded links change theirs while shared
    head = np.full(n_links, -1, i64)
    (active, dirty, seen, incomp, lcount, lseen, seedmark, done, lhead,
     ltail) = (np.zeros(n_links, i64) for _ in range(10))
    fl_rate, fl_rem, fl_tref, fl_ceil, fl_new, ch_nbytes = (np.zeros(n_ch, f64) for _ in range(6))
    (ch_i, ch_d, ch_op, ch_shape, fl_stamp, fl_rated, fl_in, fl_bot,
     ch_nl) = (np.zeros(n_ch, i64) for _ in range(9))
    ch_wait_next = np.full(n_ch, -1, i64)
    ch_next, ch_nkey, ch_ndep, ch_ndend = (np.full(n_ch, -1, i64) for _ in range(4))   # the next op's (stash)
    op_start, op_end = np.zeros(n, f64), np.zeros(n, f64)
    op_wait = np.full(n, -1, np.int32)     # per op: the last channel parked on it, or ENDED
    dirty_list = np.zeros(n_links, i64)
    nodes = n_ch * t.max_links
    node_next, node_prev = np.full(nodes, -1, i64), np.full(nodes, -1, i64)
    # the event heap: a channel's pending event, kept in place (`pos`: its slot or -1); the
    # slots past the end hold +inf, as do the stale wake-ups' heap's
    hk, hp, pos = np.full(n_ch + 2, np.inf), np.zeros(n_ch + 2, i64), np.full(n_ch, -1, i64)
    gk = np.full(heap_start(n_ch), np.inf)
    rounds = np.zeros((2, n_ch + 1), i64)     # a round's events (channel * 2 + kind), scratch
    fk, fs = np.zeros(n_links + 1, f64), np.zeros(n_links + 1, i64)
    ready = np.zeros(n_ch + 1, i64)
    lstack, act, comp_links, full = (np.zeros(n_links + 1, i64) for _ in range(4))
    comp_flows = np.zeros(n_ch + 1, i64)
    extra = np.zeros(n_links, f64)     # scratch
    started = np.zeros(n_ch + 1, i64)          # flows started this instant
    seeds = np.zeros(n_links + 1, i64)         # links to re-solve from
    mixed = np.zeros(n_links + 1, i64)         # a local problem's shared links
    lnext = np.zeros(nodes, i64)               # a local problem's links' members, the set's order
    nd_lid, nd_w = np.zeros(nodes, i64), np.zeros(nodes, f64)   # each flow's links (ch_nl of them)
    st, tnow = np.zeros(N_STATE, i64), np.zeros(1, f64)
    st[LOCAL_ON] = int(local_resolve())
    stop = PROGRESS_EVERY if progress is not None else np.iinfo(i64).max
    while True:
        status = replay(t.op_key, t.key_shape, t.key_delay, t.op_nbytes, t.dep_ptr, t.dep_idx,
                        op_start, op_end, op_wait,
                        t.ch_ptr, t.ch_ops, ch_i, ch_d, ch_wait_next, ch_op, ch_shape,
                        fl_rate, fl_rem, fl_tref, fl_ceil, fl_stamp, fl_rated, fl_new,
                        t.sh_ptr, t.sh_lid, t.sh_w, t.max_links,
                        alone, crowded, cap, slack, weight, demand, ubytes, busy_us, busy_since, active, head,
                        node_next, node_prev, dirty, dirty_list, seen, incomp, done,
                        ws, rem, left, at, hk, hp, pos, gk, rounds, fk, fs,
                        ready, lstack, act, comp_flows, comp_links, full, used, extra, started,
                        seeds, seedmark, fl_in, lseen, lcount, pcap, lold, mixed, fl_bot, lhead, ltail, lnext,
                        nd_lid, nd_w, ch_nl, ch_next, ch_nkey, ch_nbytes, ch_ndep, ch_ndend,
                        st, tnow, t.ch_identity, stop)
        if status == DONE:
            break
        if status == GROW:
            gk = np.concatenate([gk, np.full_like(gk, np.inf)])
        elif status == PAUSED:
            assert progress is not None
            progress(int(st[NENDED]), n)
            stop += PROGRESS_EVERY
    if progress is not None:
        progress(int(st[NENDED]), n)
    LAST_COUNTS.clear()
    LAST_COUNTS.update(counts(st))
    if int(st[NENDED]) < n:
        from hiercoll.errors import VerificationError
        row = int(np.flatnonzero(op_wait != ENDED)[0])
        at_rank = int(np.searchsorted(np.cumsum(t.lens), row, side="right"))
        r, i = t.ranks[at_rank], row - int(sum(t.lens[:at_rank]))
        raise VerificationError(f"deadlock: op {r}.{i} and {n - int(st[NENDED]) - 1} others never ran "
                                "(a dependency waits on an op that waits on it)")
    usage = LinkUsage(ubytes.tolist(), busy_us.tolist(), active.tolist(), busy_since.tolist(), None)
    return op_start, op_end, usage
