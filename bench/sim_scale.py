"""Simulator scale: CPU seconds and peak memory of contention-aware simulations up to 4096 GPUs
(dgx-h100 nodes), folded (`auto`: one representative per node-shift orbit) and unfolded
(`exact`: every rank, what anything that breaks the symmetry costs: an uneven size, a group
operation, a heterogeneous cluster). Each case runs in its own process, so its peak RSS and CPU
time are its own; a case that passes --limit CPU seconds is killed and reported as such.

    python bench/sim_scale.py                 # every case
    python bench/sim_scale.py --only 4096     # the cases whose label contains "4096"
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from common import command_line, stamp, write_results

# (label, collective, topology, nodes, algorithm, params, mode, target CPU s or None); all_reduce
# of 1 GiB, group kinds below; cheapest first, the big ones last. "slow node": node 5's NICs at
# half speed (topology node_overrides), which breaks every symmetry.
TIER3 = "h100-rail-3tier"
LOCAL = " (local re-solve)"      # a case run with HIERCOLL_SIM_LOCAL=1
CASES: list[tuple[str, str, str, int, str, dict[str, Any], str, float | None]] = [
    # the per-op cost the missed 4096-GPU rows are extrapolated from (WHY_MISSED)
    ("256 ring exact (one switch)", "all_reduce", "dgx-h100", 32, "ring", {"channels": 1}, "exact", None),
    ("512 ring exact (one switch)", "all_reduce", "dgx-h100", 64, "ring", {"channels": 1}, "exact", None),
    ("1024 ring exact (one switch)", "all_reduce", "dgx-h100", 128, "ring", {"channels": 1}, "exact", None),
    ("4096 ring auto", "all_reduce", TIER3, 512, "ring", {"channels": 1}, "auto", 10),
    ("4096 hier auto", "all_reduce", TIER3, 512, "hier", {}, "auto", 10),
    ("4096 hier_tiers auto", "all_reduce", TIER3, 512, "hier_tiers", {}, "auto", 10),
    ("4096 hier auto spray", "all_reduce", TIER3 + "+spray", 512, "hier", {}, "auto", 10),
    ("4096 hier_tiers auto spray", "all_reduce", TIER3 + "+spray", 512, "hier_tiers", {}, "auto", 10),
    ("1024 group_cast hier exact", "group_cast", "dgx-h100", 128, "hier", {}, "exact", 60),
    ("1024 a2av direct exact", "all_to_all_v", "dgx-h100", 128, "direct", {}, "exact", 10),   # issue 29
    ("32768 ring auto", "all_reduce", TIER3, 4096, "ring", {"channels": 1}, "auto", 60),
    ("32768 hier auto", "all_reduce", TIER3, 4096, "hier", {}, "auto", 60),
    ("32768 hier_tiers auto", "all_reduce", TIER3, 4096, "hier_tiers", {}, "auto", 60),
    ("32768 hier_tiers auto spray", "all_reduce", TIER3 + "+spray", 4096, "hier_tiers", {}, "auto", 60),
    ("4096 hier exact", "all_reduce", TIER3, 512, "hier", {}, "exact", 60),
    ("4096 ring exact", "all_reduce", TIER3, 512, "ring", {"channels": 1}, "exact", 60),
    ("4096 ring auto slow node", "all_reduce", TIER3 + "+slow", 512, "ring", {"channels": 1}, "auto", 60),
    # log-depth: 24-36 ops a rank, so every rank can be simulated; the slow-node target names no
    # algorithm, the unfolded one names ring and hierarchical (rhd's row has none)
    ("4096 rhd exact", "all_reduce", TIER3, 512, "rhd", {}, "exact", None),
    ("4096 rhd auto slow node", "all_reduce", TIER3 + "+slow", 512, "rhd", {}, "auto", 120),
    # an MoE dispatch at 1024 expert-parallel ranks, router Zipf s = 1.2 (sim_whatif.py's: 256
    # tokens a rank, top-8, 14 KiB rows), unfolded (issue 29: <= 30 s)
    ("1024 moe zipf hier exact", "moe_zipf", TIER3, 128, "hier", {}, "exact", 30),
    ("1024 moe zipf direct exact", "moe_zipf", TIER3, 128, "direct", {}, "exact", 30),
    # the opt-in local re-solve (HIERCOLL_SIM_LOCAL=1, sim/fluid.py): quiet instants skipped,
    # only the flows whose rate can move re-solved and settled (other rounding)
    ("4096 hier exact" + LOCAL, "all_reduce", TIER3, 512, "hier", {}, "exact", 60),
    ("1024 moe zipf hier exact" + LOCAL, "moe_zipf", TIER3, 128, "hier", {}, "exact", 30),
]

# ASTRA-sim's analytical (contention-unaware) backend, every GPU simulated: issue 16's figures
ASTRA = {"1024 ring": "2.1 s (ring all-reduce, every GPU)",
         "4096 ring": "41 s, 0.8 GB (ring all-reduce, every GPU)"}


WHY_MISSED = (
    "Why the missed rows stay missed. (1) Folded on the default ECMP fabric: the hash of a "
    "flow's endpoints moves with them, so no node or leaf shift maps every path onto a path; "
    "only whole pods (2048 GPUs) are interchangeable, and `auto` simulates a pod's ranks. The "
    "fold is checked on op arrays (the ring's and, since 2026-11-28, `hier`'s: 4096 `hier` auto "
    "spray 6.2 -> 1.8 s); a pod of `hier` then replays as slowly as in (2). A flat ring survives "
    "only pod shifts on a three-tier Clos even with spray: its hop from leaf group g to g+1 is "
    "inside a pod for some g and across pods for others. (2) Unfolded at 4096 GPUs: the ring "
    "(33.5 million ops, written as arrays) replays at about half a microsecond an op in the "
    "compiled core (issue 29, `hiercoll/sim/compiled`, numba): 46.7 -> 20.5 CPU s, 2.27 -> 1.70 "
    "GB on 2026-11-28 (34.6 s in a re-run while other jobs loaded the machine 2-3; 17.4 s in "
    "the row above, with the in-place event heap, on a quieter machine), the same "
    "simulated times to the bit. `hier` (35.6 million ops) now writes arrays too (6 s), and its "
    "tables route the 2.1 million distinct GPU pairs of its copies in batches on the tiered "
    "fabric as well (48 -> 17 CPU s, the same tables to the bit), but its replay, steady at "
    "12-16 us an op at 1024-2048 GPUs, slows to ~3 ms an instant once "
    "the swizzled node order reaches the other pod (every rank's send crosses the 7:1 "
    "aggregation tier at once: one max-min component of every flow, re-solved at every event); "
    "killed at its cap (the default, whole-component re-solve). With the opt-in local re-solve "
    "(`HIERCOLL_SIM_LOCAL=1`, the `(local re-solve)` rows) it finishes since 2026-11-28: the "
    "local set grows only along the rates that change (a link the set shares with flows outside "
    "enters the problem with what they leave of it, and takes them in only where an outside "
    "flow's bottleneck may move), not through every near-full link (on the 7:1 tier, all of "
    "them); 26M of its 33M instants are quiet, 7.2M re-solve ~8 flows each, 3 their whole "
    "component; a stale wake-up opens no instant; a flow's links are copied to its channel when "
    "it starts (the 2.1M pair shapes' rows were a cache miss at every visit: 117 -> 101 s of "
    "replay). Its tables' shape and key columns are numpy chunks instead of Python lists "
    "(peak 5.3 -> 3.6 GB: the 4 GB target met, in both modes; the a2av row 1.9 -> 1.4 GB). "
    "147 CPU s (5 s op arrays, 16 s tables, 100-135 s replay as the machine's load varies): "
    "the 60 s target missed by 2.5x. Cycle counters on that replay: half in the events "
    "themselves (~1.7k cycles an event: a flow's start and end on its links, its op's rows and "
    "dependencies, DRAM misses on 35M-row tables) and half in the local re-solves (taking in "
    "the flows of pushed links, the 15 % of rounds filled by heap that hold half the flows, "
    "the mixed-link checks); 41M stale wake-ups were popped. Since the evening of 2026-11-28 "
    "the loop prefetches, an instant ahead, what the heap's next events will read (their ops' "
    "rows, keys, shape rows and next dependencies: `look` in the core; the same times to the "
    "bit): replay alone 121.6 / 131.4 -> 111.8 / 107.9 s in alternating runs, the whole row "
    "147.3 -> 138.8 CPU s on a quiet machine (load 1.0). Since the night of 2026-11-28 the "
    "event heap keeps a channel's one pending event in place (a flow whose rate changes has "
    "its wake-up moved: the 41M stale pops are gone and the heap is half as deep; with whole "
    "re-solves a stale wake-up still opens an instant, from a heap of times of its own), and a "
    "transfer stashes the next op's row, key, bytes and dependency range on its channel, so "
    "starting that op reads no table again; the tables take one pass over the 2.1M "
    "prototypes and number keys through a dense table (tables 15.4 -> 13.0 s): replay 77.4 / "
    "72.4 -> 58.1 / 54.7 s in alternating runs, the whole row 138.8 -> 77.8 CPU s, 3.63 -> "
    "3.30 GB, the same times and link loads to the bit (75.7 s in the row above, after a "
    "reduce's links were merged in inline loops: 519-source reduces): still 1.3x the 60 s "
    "target; what is "
    "left is ~20 % local re-solves, ~11 % prefetching, ~18 % starting and ending transfers, "
    "~8 % the heap. "
    "(3) The skewed MoE dispatch "
"at 1024 ranks (router drawn off the clock): each event "
    "re-solves the max-min component around the hot experts' ranks (every flow into them and, "
    "through their sources' NICs, most others), and the Python engine settles every flow of a "
    "re-solved component (bytes moved at its old rate), so the compiled core, to agree with it "
    "to the bit, does too: an event costs the whole component. `hier` 72.1 -> 46.6 (stop 40) -> "
    "30.9 s (2026-11-28, the faster core and batched pair links) -> 21.3 s (met; group_cast "
    "written as op arrays, `planner/hier/group_arrays.py`, no `Op` built and no label resolved: "
    "~10 s of op building became ~2; spec 4.3 s, replay ~14 s, the same simulated time to the "
    "bit); what is left is the replay: with the local re-solve (opt-in: it settles only the "
    "flows whose rates move, which changes rounding in both engines alike, 24074.6 -> "
    "24075.5 us) 10.9 s. `direct` (464k ops, ~370 flows a "
    "re-solve at 512 ranks) grows as W^2.2 (265.8 s at 1024 on stop 40). (4) Per op, all-in, "
    "on the one-switch rings: 512 and 1024 GPUs at 0.75 and 0.57 us (met); 256 GPUs at ~2 us: "
    "the ~0.18 s every process spends importing numba and loading the compiled loop from its "
    "cache is 1.4 us an op at 131k ops (the Python engine would be 20 us an op).")

BEFORE = ("Before (issue 16, same 2-core machine, CPU s): unfolded ring all-reduce 0.5 / 10-17 / "
          "46 / 248 s at 64 / 256 / 512 / 1024 GPUs (3.1 GB at 1024), not finished in 300 s at 4096 "
          "(5.9 GB and growing); an irregular 1024-GPU group_cast with `hier` not finished in 300 s; "
          "a dense all-to-all-v spent 0.7 / 5.5 / 41 s at 128 / 256 / 512 GPUs computing pair "
          "streams alone (O(W^3)). ASTRA-sim's analytical backend: 4096-GPU ring all-reduce, every "
          "GPU, 41 s / 0.8 GB.")


def irregular_group_cast(world: int, seed: int = 0) -> Any:
    """Each rank sends 1-3 pieces of 16Ki-256Ki elements, each to 1-8 random ranks (mostly on
    other nodes): no two ranks alike, so nothing folds."""
    from hiercoll.collectives import GroupSplits, RankSplits, Split
    rng = random.Random(seed)
    inputs: list[list[Split]] = []
    got: list[dict[int, int]] = [{} for _ in range(world)]
    for s in range(world):
        splits = []
        for _ in range(rng.randint(1, 3)):
            dsts = sorted(rng.sample(range(world), rng.randint(1, 8)))
            size = rng.randint(16 << 10, 256 << 10)
            splits.append(Split(size=size, peers=dsts))
            for d in dsts:
                got[d][s] = got[d].get(s, 0) + size
        inputs.append(splits)
    outputs = [[Split(size=n, peers=[s]) for s, n in sorted(g.items())] for g in got]
    return GroupSplits(ranks=[RankSplits(input=i, output=o) for i, o in zip(inputs, outputs)])


def dense_a2av_counts(world: int, seed: int = 0) -> list[list[int]]:
    """counts[s][d]: every rank sends every rank (itself included) its own 1-2047 elements."""
    rng = random.Random(seed)
    return [[rng.randint(1, 2047) for _ in range(world)] for _ in range(world)]


def dense_all_to_all_v(world: int, seed: int = 0) -> Any:
    """All-to-all-v as a group_cast (W input and W output splits per rank), from the counts
    matrix."""
    from hiercoll.collectives import GroupSplits
    return GroupSplits.from_counts(dense_a2av_counts(world, seed))


MOE = {"tokens": 256, "topk": 8, "row_bytes": 7168 * 2, "s": 1.2}     # sim_whatif.py's


def moe_zipf_router(topo: Any) -> Any:
    """sim_whatif.py's Zipf router, one expert a rank (numpy draws each token's experts apart:
    6.5 CPU s at 512 ranks, input generation, not hiercoll's work)."""
    from sim_whatif import zipf_router
    w = topo.world_size
    return zipf_router(w, MOE["tokens"], MOE["topk"], w, MOE["s"], seed=0)


def moe_zipf_dispatch(topo: Any, router: Any) -> Any:
    """The dispatch of `router` as a group_cast spec (hiercoll's MoE front end)."""
    from hiercoll.workloads import moe
    w = topo.world_size
    lay = moe.layout(router, w, w, topo.gpus_per_node)
    return moe.spec_for(lay, MOE["row_bytes"] // 2, "bf16", "dispatch")


def topology(name: str, nodes: int) -> Any:
    import hiercoll as hc
    from hiercoll.topology.model import NodeOverride
    if name.endswith("+spray"):      # per-packet spraying over every uplink instead of ECMP
        topo = hc.load_topology(name.removesuffix("+spray"), nodes)
        data = topo.model_dump(mode="json")
        data["inter"]["routing"] = "spray"
        return type(topo).model_validate(data)
    if name.endswith("+slow"):
        topo = hc.load_topology(name.removesuffix("+slow"), nodes)
        return topo.model_validate(topo.model_dump() | {
            "node_overrides": [NodeOverride(node=5, nic_gbps=topo.inter.nic_gbps / 2).model_dump()]})
    return hc.load_topology(name, nodes)


def one(label: str, kind: str, topo_name: str, nodes: int, algo: str, params: dict[str, Any],
        mode: str, target: float | None, nbytes: int) -> dict[str, Any]:
    import hiercoll as hc
    router = moe_zipf_router(topology(topo_name, nodes)) if kind == "moe_zipf" else None
    t0 = time.process_time()           # the router is the workload's input: drawn off the clock
    topo = topology(topo_name, nodes)
    w = topo.world_size
    if kind == "group_cast":
        spec = hc.CollectiveSpec(kind="group_cast", world_size=w, dtype="bf16",
                                 splits=irregular_group_cast(w))
    elif kind == "all_to_all_v":
        spec = hc.CollectiveSpec(kind="group_cast", world_size=w, dtype="bf16",
                                 splits=dense_all_to_all_v(w))
    elif kind == "moe_zipf":
        spec = moe_zipf_dispatch(topo, router)
    else:
        spec = hc.CollectiveSpec(kind=kind, world_size=w, dtype="bf16", nbytes=nbytes)
    t1 = time.process_time()
    sched = hc.plan(topo, spec, algo, params)
    t2 = time.process_time()
    res = hc.simulate(sched, topo, mode=mode)  # type: ignore[arg-type]
    t3 = time.process_time()
    return {"label": label, "gpus": w, "topology": topo_name, "collective": kind, "algorithm": algo,
            "params": params, "mode": mode, "target_s": target, "cpu_s": t3 - t0,
            "spec_cpu_s": t1 - t0, "plan_cpu_s": t2 - t1, "sim_cpu_s": t3 - t2,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "ops": res.num_ops, "ranks_simulated": len(res.ranks_simulated),
            "shortcut": res.shortcut, "sim_time_us": res.time_us, "busbw_gbps": res.busbw_gbps}


def _run_case(i: int, nbytes: int, limit: int) -> dict[str, Any]:
    label, kind, topo_name, nodes, algo, params, mode, target = CASES[i]
    row: dict[str, Any] = {"label": label, "gpus": nodes * 8, "topology": topo_name, "collective": kind,
                           "algorithm": algo, "params": params, "mode": mode, "target_s": target}
    def cap_cpu() -> None:      # a shared machine: every case stops at `limit` s and 12 GiB
        resource.setrlimit(resource.RLIMIT_CPU, (limit, limit + 5))
        resource.setrlimit(resource.RLIMIT_AS, (12 << 30, 12 << 30))
    env = dict(os.environ) | ({"HIERCOLL_SIM_LOCAL": "1"} if label.endswith(LOCAL) else {})
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, __file__, "--case", str(i), "--bytes", str(nbytes)],
                                stdout=out, stderr=err, text=True, preexec_fn=cap_cpu, env=env)
        _, status, usage = os.wait4(proc.pid, 0)     # this child's own peak RSS, even if killed
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        last = (stderr.strip().splitlines() or ["?"])[-1]
        row.update(error=f"> {limit} CPU s (killed)" if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL)
                   else f"killed by signal {-proc.returncode}" if proc.returncode < 0
                   else "out of memory at 12 GiB" if "MemoryError" in last else last[:200],
                   cpu_s=None, peak_rss_mib=usage.ru_maxrss / 1024,
                   cpu_s_used=usage.ru_utime + usage.ru_stime)
        return row
    return json.loads(stdout.strip().splitlines()[-1])


def error(r: dict[str, Any]) -> str:
    """A killed case: the CPU seconds it had used (its cap may have been lowered to its target +
    a margin while it ran, with prlimit, to fit the run in the time there was)."""
    if r["error"].startswith(">"):
        return f"> {r['cpu_s_used']:.0f} (killed at its CPU cap)"
    m = re.search(r"about ([0-9.e+]+) ops .*limit of ([0-9.e+]+)", r["error"])
    if m:
        return f"refused: ~{m[1]} ops > HIERCOLL_MAX_OPS {m[2]}"
    return str(r["error"])


def verdict(r: dict[str, Any]) -> str:
    t = r.get("target_s")
    if t is None:
        return ""
    if r.get("cpu_s") is None:
        return (f"<= {t:g} s: **missed** (> {r['cpu_s_used']:.0f} s)" if r["error"].startswith(">")
                else f"<= {t:g} s: **missed** (not simulated)")
    return f"<= {t:g} s: {'met' if r['cpu_s'] <= t else '**missed**'}"


def per_op_us(row: dict[str, Any]) -> str:
    """CPU us per simulated op, all-in (the case's CPU s over the ops it replayed): issue 29's
    <= 1 us target for the one-switch rings."""
    ops = row.get("ops")
    return f"{1e6 * row['cpu_s'] / ops:.2f}" if ops else ""


def render(payload: dict[str, Any]) -> str:
    """The markdown table of a run (`--render FILE.json` redoes it from the saved rows)."""
    rows = payload["rows"]
    meta = payload["meta"]
    md = ["# Simulator scale: CPU seconds and peak memory, folded and unfolded", "",
          f"Command: `{meta['command']}`  ",
          f"Date: {meta['date']}; machine: {meta['machine']} (shared with other jobs: CPU s is "
          f"process time); one process per case, each capped at a few CPU s past its target (60-125 s); "
          f"git {meta['git_sha']}", "",
          "all_reduce of 1 GiB bf16. `h100-rail-3tier`: dgx-h100 nodes under a rail-optimised "
          "leaf / spine / aggregation Clos (leaf per 32 nodes, pods of 8 leaf groups, aggregation "
          "7:1), so flows cross the spine; `dgx-h100`: one switch joins every node. `slow node`: "
          "node 5's NICs at half speed (`node_overrides`), which breaks every symmetry. `spray`: "
          "the preset with `inter.routing: spray` (every flow split evenly over every uplink, as "
          "per-packet spraying / adaptive routing does) instead of its default ECMP hash of the "
          "endpoints; only then do level shifts map paths onto paths (an ECMP hash moves "
          "with the endpoints), so only then can `hier` and `hier_tiers` fold onto one node. "
          "`group_cast` is an irregular one (each rank 1-3 pieces of 16Ki-256Ki elements to 1-8 "
          "random ranks); `a2av` a dense all-to-all-v as a group_cast (every pair its own 1-2047 "
          "elements). Mode `auto` folds ranks under a verified translation or level-shift "
          "symmetry (folded; level shifts move every node one position inside its group at one "
          "tier, which a flat ring or `hier`'s cluster-wide peer order do not survive and "
          "`hier_tiers`' per-level orders do); "
          "`exact` simulates every rank (unfolded). `CPU s` covers building the topology and "
          "spec, planning, the symmetry check and the simulation; `ranks sim.` is how many ranks "
          "the simulator ran (fewer than GPUs: folded); `peak RSS` is the case's own process; "
          "`load` is the machine's 1-minute load average when the case started. `rhd` (recursive "
          "halving-doubling) has 24-36 ops a rank, so every rank of 4096 is simulated; on a "
          "tiered fabric it does not fold (its xor symmetry reorders nodes across leaf groups), so "
          "`auto` runs it unfolded too. The slow-node target names no algorithm; it is met with "
          "`rhd` and missed with the ring.", "",
          "| case | GPUs | topology | algorithm | mode | CPU s | peak RSS MiB | ranks sim. | "
          "us / op | simulated time us | target (CPU s) | load | ASTRA-sim (analytical) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        astra = ASTRA.get(" ".join(r["label"].split()[:2]), "")
        folded = r["mode"] == "auto" and r.get("ranks_simulated", 0) < r["gpus"]
        mode = f"{r['mode']} ({'folded' if folded else 'unfolded'})" if r.get("ranks_simulated") \
            else f"{r['mode']} ({'folded' if r['mode'] == 'auto' else 'unfolded'})"
        algo = r["algorithm"] if r["collective"] == "all_reduce" else f"{r['algorithm']} ({r['collective']})"
        if r.get("error"):
            md.append(f"| {r['label']} | {r['gpus']} | {r['topology']} | {algo} | {mode} | "
                      f"{error(r)} | {r['peak_rss_mib']:.0f} | | | | {verdict(r)} | "
                      f"{r['load_avg_1m']:.1f} | {astra} |")
            continue
        md.append(f"| {r['label']} | {r['gpus']} | {r['topology']} | {algo} | {mode} | "
                  f"{r['cpu_s']:.1f} | {r['peak_rss_mib']:.0f} | {r['ranks_simulated']} | "
                  f"{per_op_us(r)} | {r['sim_time_us']:.1f} | {verdict(r)} | "
                  f"{r['load_avg_1m']:.1f} | {astra} |")
    md += ["", "Every case at the default op limit (HIERCOLL_MAX_OPS=2e8): it bounds the ranks a "
           "consumer builds, so a 32768-GPU plan of ~2e9 ops simulates folded (one node's ranks "
           "built) while walks over every rank are refused.", "",
           "A killed case shows the CPU seconds it had spent when its cap stopped it (no "
           "simulated time: it did not finish); wall time exceeds CPU time where the `load` "
           "column is above the 2 cores.", "", WHY_MISSED, "", BEFORE]
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bytes", type=int, default=1 << 30, help="all_reduce S")
    ap.add_argument("--limit", type=int, default=125, help="CPU seconds per case")
    ap.add_argument("--only", default=None, help="run the cases whose label contains this")
    ap.add_argument("--cases", default=None, help="comma-separated case indices (0-based) to run")
    ap.add_argument("--out", default="sim_scale", help="results name (bench/results/NAME.{md,json})")
    ap.add_argument("--merge", nargs="+", default=None,
                    help="merge these JSON results into --out (a later file's row of a case wins)")
    ap.add_argument("--render", default=None, help="rewrite the markdown from this JSON")
    ap.add_argument("--case", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            payload = json.load(f)
        write_results("sim_scale", payload, render(payload))
        return
    if args.merge:       # parallel partial runs (--cases/--out) joined, in CASES order
        parts = []
        for name in args.merge:
            with open(name) as f:
                parts.append(json.load(f))
        order = {c[0]: i for i, c in enumerate(CASES)}
        latest = {r["label"]: r for p in parts for r in p["rows"]}     # a later part's row wins
        rows = sorted(latest.values(), key=lambda r: order.get(r["label"], 99))
        payload = parts[0] | {"rows": rows}
        for key, sep in (("command", " & "), ("date", ", "), ("git_sha", ", ")):   # every run's
            payload["meta"][key] = sep.join(dict.fromkeys(
                x for p in parts for x in p["meta"][key].split(sep)))
        write_results(args.out, payload, render(payload))
        return
    if args.case is not None:
        print(json.dumps(one(*CASES[args.case], args.bytes)))
        return
    rows = []
    for i, case in enumerate(CASES):
        if args.only and args.only not in case[0]:
            continue
        if args.cases is not None and str(i) not in args.cases.split(","):
            continue
        load = os.getloadavg()[0]
        r = _run_case(i, args.bytes, args.limit)
        r["load_avg_1m"] = load
        rows.append(r)
        payload = {"rows": rows, "meta": stamp(command_line()), "bytes": args.bytes, "limit": args.limit}
        write_results(args.out, payload, render(payload))     # after every case: partial results
        cpu = "-" if r.get("cpu_s") is None else f"{r['cpu_s']:7.1f} s"
        print(f"{r['label']:30s} {cpu} {r['peak_rss_mib']:8.0f} MiB "
              f"{r.get('error') or format(r['sim_time_us'], '.1f') + ' us'}", flush=True)


if __name__ == "__main__":
    main()
