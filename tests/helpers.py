"""Builders for tests: small custom topologies, random group-cast/group-reduce splits, the CLI
run as a user runs it (a subprocess) with its one-line error contract, and the cuda lowering's
emulation checked against numpy."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hiercoll.collectives import (
    CollectiveSpec,
    GroupSplits,
    RankSplits,
    Split,
    initial_outputs,
    random_inputs,
    reference,
    tolerance,
    transpose,
)
from hiercoll.topology import Topology

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m hiercoll ARGS` in the repository root, output captured, never raising."""
    return subprocess.run([sys.executable, "-m", "hiercoll", *args], capture_output=True,
                          text=True, timeout=600, check=False, cwd=ROOT, env=env)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The CLI's contract for bad input: exit 2, no traceback, one `error: ...` line."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def h200_topology(nodes: int, gpus: int) -> Topology:
    """The h200x4 preset's GPUs and links on `nodes` x `gpus` (one NIC per GPU): what the cuda
    lowering tests plan on."""
    from hiercoll.topology import preset
    data = preset("h200x4").model_dump(mode="json")
    data.update(name=f"test{nodes}x{gpus}", num_nodes=nodes, gpus_per_node=gpus)
    data["inter"] = dict(data["inter"], num_nics=gpus, nic_affinity=list(range(gpus)))
    return Topology.model_validate(data)


def bf16_spec(kind: str, world: int, count_per_rank: int = 37) -> CollectiveSpec:
    """`kind` over `world` ranks, `count_per_rank` bf16 elements a rank."""
    return CollectiveSpec(kind=kind, world_size=world, nbytes=2 * world * count_per_rank)


SHARDED_KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def lowering_cases(shapes: Sequence[tuple[int, int]]) -> list[tuple[int, int, str, str]]:
    """(nodes, gpus, kind, algorithm): every sharded collective and every algorithm that
    applies to it on each (nodes, gpus) h200 topology: what the lowering tests run."""
    from hiercoll.planner import applicable
    return [(nodes, gpus, kind, algo) for nodes, gpus in shapes for kind in SHARDED_KINDS
            for algo in applicable(h200_topology(nodes, gpus), bf16_spec(kind, nodes * gpus))]


def small_topology(nodes: int, gpus: int, nics: int | None = None, kind: str = "nvswitch") -> Topology:
    data = {
        "name": f"test{nodes}x{gpus}", "num_nodes": nodes, "gpus_per_node": gpus,
        "gpu": {"name": "T", "hbm_gbps": 3000.0, "num_sms": 100},
        "intra": {"kind": kind, "gbps": 300.0, "latency_us": 1.0},
    }
    if kind == "pcie":
        data["intra"]["bridge_gbps"] = 100.0
    if nodes > 1:
        data["inter"] = {"num_nics": nics or gpus, "nic_gbps": 40.0, "latency_us": 3.0}
    return Topology.model_validate(data)


def _pieces(total: int, rng: random.Random) -> list[int]:
    """Split `total` into 1-3 pieces (some may be zero)."""
    cuts = sorted(rng.randint(0, total) for _ in range(rng.randint(0, 2)))
    bounds = [0, *cuts, total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def _interleave(per_peer: dict[int, list[int]], rng: random.Random) -> list[tuple[int, int]]:
    """Merge each peer's ordered pieces into one random order that keeps each peer's order."""
    queues = {p: list(v) for p, v in per_peer.items() if v}
    out = []
    while queues:
        p = rng.choice(sorted(queues))
        out.append((p, queues[p].pop(0)))
        if not queues[p]:
            del queues[p]
    return out


def random_group_cast(world: int, seed: int, max_size: int = 6) -> GroupSplits:
    """Random input splits (each to a random set of ranks), output splits re-cut at random."""
    rng = random.Random(seed)
    inputs: list[list[Split]] = []
    sent: dict[tuple[int, int], int] = {}
    for s in range(world):
        splits = []
        for _ in range(rng.randint(0, 3)):
            dsts = rng.sample(range(world), rng.randint(1, world))
            size = rng.randint(0, max_size)
            splits.append(Split(size=size, peers=dsts))
            for d in dsts:
                sent[(s, d)] = sent.get((s, d), 0) + size
        inputs.append(splits)
    outputs = []
    for d in range(world):
        per_src = {s: _pieces(sent.get((s, d), 0), rng) for s in range(world) if (s, d) in sent}
        outputs.append([Split(size=n, peers=[s]) for s, n in _interleave(per_src, rng)])
    return GroupSplits(ranks=[RankSplits(input=i, output=o) for i, o in zip(inputs, outputs)])


def random_group_reduce(world: int, seed: int, max_size: int = 6) -> GroupSplits:
    """Random output splits (each summing a random set of sources): a transposed group_cast."""
    return transpose(random_group_cast(world, seed, max_size))


def check_emulation(schedule: Any, opts: Any, seed: int, calls: int = 3,
                    in_place: bool = False) -> None:
    """Every rank's lowered cuda program run by the CPU emulator (random interleavings) over
    `calls` calls with fresh random inputs, each output within the dtype's bound of numpy's.
    `in_place`: each rank's output is its input (one tensor)."""
    from hiercoll.executor.cuda import emulate as emu
    spec = schedule.spec
    rng = np.random.default_rng(seed)
    ins = [random_inputs(spec, rng) for _ in range(calls)]
    before = [initial_outputs(spec, rng) for _ in range(calls)]
    outs = emu.emulate(schedule, ins, before, opts, seed=seed, in_place=in_place)
    for c in range(calls):
        exp = reference(spec, ins[c], before[c])
        for r in range(spec.world_size):
            err = np.abs(outs[c][r] - exp.outputs[r])
            assert np.all(err <= tolerance(spec, exp, r)), f"call {c} rank {r}"


# Triton 3.6's interpreter calls int() on 1-element arrays, which numpy 2.4 refuses: every
# interpreted kernel script starts by taking the element instead.
_INTERPRETER_PREAMBLE = """import triton.runtime.interpreter as _interp
_orig_patch = _interp._patch_lang_tensor
def _patch(tensor, scope):
    _orig_patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
_interp._patch_lang_tensor = _patch
"""


def run_interpreted(script: str, timeout: float = 600) -> Any:
    """`script` run by Triton's CPU interpreter (TRITON_INTERPRET=1, a subprocess): the JSON its
    last output line prints. A failing script fails the test with its stderr."""
    import json
    import os
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _INTERPRETER_PREAMBLE + script],
                          capture_output=True, text=True, env=env, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compile_sm90_ptx(src: Any, num_warps: int) -> str:
    """PTX of a Triton ASTSource for sm_90. Skips only where this machine's Triton cannot
    compile for sm_90 at all (a trivial kernel fails too); a kernel that fails where the trivial
    one compiles is a failure of the test, not a skip (a catch-all skip hid a static_assert that
    caught the fused kernel's boolean poll mask)."""
    import pytest
    import triton
    from triton.backends.compiler import GPUTarget
    try:
        return str(triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": num_warps}).asm["ptx"])
    except Exception as exc:  # noqa: BLE001 - decided below: toolchain missing, or the kernel
        if _sm90_toolchain_works():
            raise
        pytest.skip(f"triton cannot compile for sm_90 here: {exc}")



_TOOLCHAIN: list[bool] = []


def _sm90_toolchain_works() -> bool:
    if not _TOOLCHAIN:
        import triton
        from sm90_probe import store_one
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        try:
            triton.compile(ASTSource(fn=store_one, signature={"p": "*i32"}, constexprs={}),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
            _TOOLCHAIN.append(True)
        except Exception:  # noqa: BLE001 - any failure here means no usable toolchain
            _TOOLCHAIN.append(False)
    return _TOOLCHAIN[0]


def truth_rows(tmp_path: Path, algorithms: Sequence[str], sizes: Sequence[int],
               launch_us: float = 9.0) -> tuple[Topology, list[Any]]:
    """Calibration rows made by simulating h200x4 all-reduces with known costs (the truth: a
    launch of `launch_us`), one per algorithm ('nccl': the library model) and size, read back as
    calibrate reads a bench file; with the uncalibrated topology a fit starts from."""
    import json

    import hiercoll as hc
    from hiercoll.calibration.measurements import load_measurements
    from hiercoll.calibration.predict import build_case
    from hiercoll.planner.library_model import library_model, sm_only

    topo = hc.load_topology("h200x4", uncalibrated=True)
    truth = topo.model_copy(update={"costs": topo.costs.model_copy(update={"launch_us": launch_us})})
    rows = []
    for algo in algorithms:
        for n in sizes:
            spec = hc.CollectiveSpec(kind="all_reduce", world_size=4, nbytes=n)
            if algo == "nccl":
                t = hc.simulate(library_model(truth, spec), truth, costs_from=sm_only(truth),
                                call_mode="graph").time_us
            else:
                t = hc.simulate(hc.plan(truth, spec, algo), truth, call_mode="graph").time_us
            rows.append({"collective": "all_reduce", "algorithm": algo, "world_size": 4,
                         "dtype": "bf16", "nbytes": n, "mode": "graph", "p50_us": t,
                         "params": {}, "topology": "h200x4"})
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"rows": rows}))
    return topo, [build_case(m, topo) for m in load_measurements([path])]
