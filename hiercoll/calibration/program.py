"""Which program a measured row's kernel ran, as far as the simulator sees it: rows whose keys
are equal ran the same ops, so their times differ only by the run's own spread (regret's
"same program" ties, and the noise floor of `spread`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace

from hiercoll.calibration.predict import Case
from hiercoll.schedule import INPUT, LIBRARY_ALGORITHM, OUTPUT, Op, OpKind, Region


def program_key(case: Case) -> str:
    """Every rank's ops with their channels numbered in order of first use (plans that lower to
    the same ops on other channel numbers run the same rows: `direct` and `hier` all_to_all on
    one node), a reduce's sources in one order (the kernel loads them together and adds them in
    registers: `direct` and `hier` reduce-scatter on 2 GPUs differ only there, and measured
    10.5 / 9.4 us in one run, 9.4 / 9.3 in another), and the protocol. The library has no ops
    of ours: its label stands for it."""
    if case.measurement.algorithm == LIBRARY_ALGORITHM:
        return LIBRARY_ALGORITHM
    s = case.schedule
    parts = [repr(case.protocol)]
    names: dict[str, str] = {INPUT: INPUT, OUTPUT: OUTPUT}

    def named(g: Region) -> Region:
        """Scratch buffers by order of first use (`direct_recv` and `hier_scatter` hold the
        same bytes at the same place of the layout when the plans are otherwise equal: the
        2-GPU `direct`, `hier` and `hier_2d` reduce-scatters lower to the same rows)."""
        return replace(g, buffer=names.setdefault(g.buffer, f"scratch{len(names) - 2}"))
    for r in range(s.world_size):
        number: dict[int, int] = {}
        ops = tuple(replace(op, channel=number.setdefault(op.channel, len(number)),
                            dst=named(op.dst), srcs=_source_order(op, named))
                    for op in s.rank_ops(r))
        parts.append(repr(ops))
    parts += [repr(sorted((names[b], n) for b, n in s.buffers(r).items() if b in names))
              for r in range(s.world_size)]      # buffers no op touches (forwarded) time nothing
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _source_order(op: Op, named: Callable[[Region], Region]) -> tuple[Region, ...]:
    """A reduce's sources (buffers `named` canonically) in a canonical order (a sum's order
    changes no row's timing); any other op's as written."""
    srcs = tuple(map(named, op.srcs))
    if op.kind != OpKind.REDUCE:
        return srcs
    return tuple(sorted(srcs, key=lambda g: (g.rank, g.buffer, g.offset, g.count)))
