"""What people look at: a Chrome/Perfetto trace and a PNG timeline of a simulation."""

from __future__ import annotations

import json
from typing import Any

from hiercoll.schedule import Schedule
from hiercoll.sim.result import SimResult

COLOURS = {("copy", "local"): "#9e9e9e", ("copy", "intra"): "#1f77b4", ("copy", "inter"): "#d62728",
           ("reduce", "local"): "#2ca02c", ("reduce", "intra"): "#17becf", ("reduce", "inter"): "#ff7f0e"}
MAX_LINK_TRACKS = 32


def chrome_trace(schedule: Schedule, result: SimResult) -> dict[str, Any]:
    """One process per rank with a thread per channel; one process "links" with a counter track
    (utilisation) per busy link when the simulation recorded rates."""
    events: list[dict[str, Any]] = []
    isz = schedule.spec.dtype.itemsize
    for r in result.ranks_simulated:
        events.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        for op in schedule.rank_ops(r):
            if op.ref not in result.op_end:
                continue
            start, end = result.op_start[op.ref], result.op_end[op.ref]
            events.append({"ph": "X", "pid": r, "tid": op.channel, "ts": start, "dur": max(end - start, 1e-3),
                           "name": f"{op.kind.value} {op.transport.value}", "cat": op.transport.value,
                           "args": {"op": op.id, "bytes": op.dst.count * isz, "dst": str(op.dst),
                                    "srcs": [str(s) for s in op.srcs]}})
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
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"algorithm": schedule.meta.algorithm, "collective": schedule.spec.kind.value,
                          "time_us": result.time_us, "shortcut": result.shortcut}}


def trace_json(schedule: Schedule, result: SimResult) -> str:
    return json.dumps(chrome_trace(schedule, result))


def timeline_png(schedule: Schedule, result: SimResult, path: str, max_ranks: int = 32) -> None:
    """Ranks as rows (channels as sub-rows), ops as bars coloured by kind and transport."""
    import matplotlib

    from hiercoll.files import save_figure
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
    ax.set_title(title, fontsize=10)
    used = {(op.kind.value, op.transport.value) for r in ranks for op in schedule.rank_ops(r)}
    ax.legend(handles=[Patch(color=c, label=f"{k} {t}") for (k, t), c in COLOURS.items() if (k, t) in used],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)   # outside: never hides a bar
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
