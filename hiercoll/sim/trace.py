"""What people look at: a Chrome/Perfetto trace and a PNG timeline of a simulation."""

from __future__ import annotations

import json
from typing import Any

from hiercoll.schedule import Schedule
from hiercoll.sim.result import SimResult

COLOURS = {("copy", "local"): "#9e9e9e", ("copy", "intra"): "#1f77b4", ("copy", "inter"): "#d62728",
           ("reduce", "local"): "#2ca02c", ("reduce", "intra"): "#17becf", ("reduce", "inter"): "#ff7f0e"}
MAX_LINK_TRACKS = 32


# Chrome's trace format: `ts`/`dur` are always microseconds; `displayTimeUnit` only picks how
# the viewer prints them and takes "ms" or "ns". "ms" (the format's default) keeps the printed
# numbers in the same decimal scale as the microsecond timestamps (0.678 ms, not 677698 ns).
DISPLAY_TIME_UNIT = "ms"
MAX_FLOWS = 100_000        # dependency arrows; past this a trace gets slow to open (said in it)


def chrome_trace(schedule: Schedule, result: SimResult) -> dict[str, Any]:
    """One process per rank with a named thread per channel, flow arrows for dependencies that
    cross ranks; one process "links" with a counter track (utilisation) per busy link when the
    simulation recorded rates. A simulation of representative ranks only says so on screen: a
    first process and a global marker carry the note."""
    events: list[dict[str, Any]] = []
    isz = schedule.spec.dtype.itemsize
    shown = set(result.ranks_simulated)
    note = None
    if len(shown) < schedule.world_size:
        note = (f"representative ranks only: {len(shown)} of {schedule.world_size} shown "
                f"({result.shortcut or 'the others run the same program shifted'})")
        events.append({"ph": "M", "name": "process_name", "pid": -1, "args": {"name": f"NOTE: {note}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": -1, "args": {"sort_index": -1}})
        events.append({"ph": "i", "s": "g", "pid": -1, "tid": 0, "ts": 0, "name": f"NOTE: {note}"})
    channel_of: dict[tuple[int, int], int] = {}
    for r in result.ranks_simulated:
        events.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
        for ch in sorted({op.channel for op in schedule.rank_ops(r)}):
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": ch,
                           "args": {"name": f"channel {ch}"}})
        for op in schedule.rank_ops(r):
            if op.ref not in result.op_end:
                continue
            channel_of[op.ref] = op.channel
            start, end = result.op_start[op.ref], result.op_end[op.ref]
            events.append({"ph": "X", "pid": r, "tid": op.channel, "ts": start, "dur": max(end - start, 1e-3),
                           "name": f"{op.kind.value} {op.transport.value}", "cat": op.transport.value,
                           "args": {"op": op.id, "bytes": op.dst.count * isz, "dst": str(op.dst),
                                    "srcs": [str(s) for s in op.srcs]}})
    flows = _dependency_flows(schedule, result, channel_of)
    events += flows[:2 * MAX_FLOWS]
    record, names = result.link_record, result.link_names
    if record is not None:
        pid = max(result.ranks_simulated, default=0) + 1
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "links"}})
        busiest = {l.name for l in result.busiest_links(MAX_LINK_TRACKS) if l.bytes > 0}
        for name, steps in zip(names, record):
            if name not in busiest:
                continue
            for t, util in steps:
                events.append({"ph": "C", "pid": pid, "name": name, "ts": t,
                               "args": {"utilization": round(util, 4)}})
    return {"traceEvents": events, "displayTimeUnit": DISPLAY_TIME_UNIT,
            "otherData": {"algorithm": schedule.meta.algorithm, "collective": schedule.spec.kind.value,
                          "time_us": result.time_us, "timestamps": "us", "shortcut": result.shortcut,
                          "note": note, "dependency_arrows": min(len(flows) // 2, MAX_FLOWS),
                          "dependency_arrows_left_out": max(len(flows) // 2 - MAX_FLOWS, 0)}}


def _dependency_flows(schedule: Schedule, result: SimResult,
                      channel_of: dict[tuple[int, int], int]) -> list[dict[str, Any]]:
    """A flow arrow (start at the dependency's slice, finish at the waiting op's) for each
    dependency on another rank's op, where both ops were simulated."""
    flows: list[dict[str, Any]] = []
    for r in result.ranks_simulated:
        for op in schedule.rank_ops(r):
            if op.ref not in channel_of:
                continue
            for dep in op.deps:
                if dep[0] == r or dep not in channel_of:
                    continue
                fid = len(flows) // 2 + 1
                flows.append({"ph": "s", "id": fid, "cat": "dep", "name": "dep", "pid": dep[0],
                              "tid": channel_of[dep], "ts": result.op_start[dep]})
                flows.append({"ph": "f", "bp": "e", "id": fid, "cat": "dep", "name": "dep",
                              "pid": r, "tid": op.channel, "ts": result.op_start[op.ref]})
    return flows


def trace_json(schedule: Schedule, result: SimResult) -> str:
    return json.dumps(chrome_trace(schedule, result))


def timeline_png(schedule: Schedule, result: SimResult, path: str, max_ranks: int = 32) -> None:
    """Ranks as rows (channels as sub-rows), ops as bars coloured by kind and transport."""
    import matplotlib

    from hiercoll.files import fit_title, save_figure
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = result.ranks_simulated[:max_ranks]
    channels = sorted({op.channel for r in ranks for op in schedule.rank_ops(r)}) or [0]
    rows = {(r, c): i for i, (r, c) in enumerate((r, c) for r in ranks for c in channels)}
    fig_h = min(2 + 0.28 * len(rows), 14)
    fig, ax = plt.subplots(figsize=(12, fig_h))
    for r in ranks:
        for op in schedule.rank_ops(r):
            if op.ref not in result.op_end:
                continue
            s, e = result.op_start[op.ref], result.op_end[op.ref]
            ax.broken_barh([(s, max(e - s, result.time_us * 1e-4))], (rows[(r, op.channel)] - 0.4, 0.8),
                           facecolors=COLOURS[(op.kind.value, op.transport.value)], edgecolor="white",
                           linewidth=0.4)
    ax.set_yticks(list(rows.values()))
    ax.set_yticklabels([f"r{r} ch{c}" for r, c in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (us)")
    spec = schedule.spec
    title = (f"{schedule.meta.algorithm} {spec.kind.value} {spec.total_bytes} B: "
             f"{result.time_us:.1f} us, busbw {result.busbw_gbps:.1f} GB/s, "
             f"{100 * result.bound_ratio:.0f}% of bound")
    if result.shortcut:
        title += f"\n(representative ranks only: {result.shortcut.split(';')[0]})"
    ax.set_title(fit_title(ax.figure, title, 10), fontsize=10)
    used = {(op.kind.value, op.transport.value) for r in ranks for op in schedule.rank_ops(r)}
    ax.legend(handles=[Patch(color=c, label=f"{k} {t}") for (k, t), c in COLOURS.items() if (k, t) in used],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)   # outside: never hides a bar
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
