"""Hypothesis strategies over the CLI's input surfaces, beside the mutation fuzzer (core.py):
hypothesis shrinks a failing case to a small one, the mutation fuzzer covers more per second.
Each strategy draws a mix of valid and broken inputs; the oracle is core.run_cli + core.judge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from tests.fuzz.core import ALGOS, KINDS, SIZES

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 10**6), st.sampled_from([10**30, -10**30]),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
JUNK = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                    max_leaves=6)


@st.composite
def topology_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A topology mapping: valid shapes (1-3 nodes, 1-4 GPUs), then up to two fields replaced
    by junk or dropped."""
    nodes, gpus = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["nvswitch", "pcie", "mesh"]))
    doc: dict[str, Any] = {"name": "hy", "num_nodes": nodes, "gpus_per_node": gpus,
                           "gpu": {"name": "T", "hbm_gbps": draw(st.floats(1, 1e4)), "num_sms": 100},
                           "intra": {"kind": kind, "gbps": draw(st.floats(1, 1e3)), "latency_us": 1.0}}
    if kind == "pcie":
        doc["intra"]["bridge_gbps"] = 100.0
    if nodes > 1:
        doc["inter"] = {"num_nics": draw(st.integers(1, gpus)), "nic_gbps": 40.0, "latency_us": 3.0}
    for _ in range(draw(st.integers(0, 2))):
        section = draw(st.sampled_from(sorted(doc)))
        target = doc if not isinstance(doc[section], dict) or draw(st.booleans()) else doc[section]
        if not target:       # an earlier draw emptied this section: nothing left to break
            continue
        key = draw(st.sampled_from(sorted(target)))
        if draw(st.booleans()):
            target[key] = draw(JUNK)
        else:
            del target[key]
    return doc


SIZE_TEXT = st.one_of(st.sampled_from(SIZES), st.integers(-5, 2**64).map(str),
                      st.builds(lambda n, u: f"{n}{u}", st.integers(0, 4096),
                                st.sampled_from(["", "B", "KiB", "MiB", "GiB", "TiB", "kib", "KB", " KiB"])),
                      st.text(max_size=6))
PARAMS = st.lists(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["chunks", "channels", "bogus", ""]),
                            st.one_of(st.integers(-2, 300).map(str), st.text(max_size=3))), max_size=2)


@st.composite
def plan_argvs(draw: st.DrawFn, workdir: Path) -> list[str]:
    """`plan` with a preset or a drawn topology file (YAML or JSON), kind, size, algorithm,
    parameters, and the other flags, each sometimes out of range."""
    if draw(st.booleans()):
        topo = ["-t", draw(st.sampled_from(["h200x4", "dgx-h100", "pcie-8gpu", "nope"])),
                "-n", draw(st.sampled_from(["1", "2", "0", "-3", "x", "1000000", "131073"]))]
    else:
        doc = draw(topology_docs())
        ext = draw(st.sampled_from(["yaml", "json"]))
        path = workdir / f"t{draw(st.integers(0, 10**9))}.{ext}"
        path.write_text(yaml.safe_dump(doc) if ext == "yaml" else json.dumps(doc))
        topo = ["-t", str(path)]
    argv = ["plan", *topo, "-c", draw(st.sampled_from(KINDS)), "-b", draw(SIZE_TEXT),
            "-a", draw(st.sampled_from(ALGOS)), "-o", str(workdir / "out.json")]
    for p in draw(PARAMS):
        argv += ["-p", p]
    for flag, values in (("--dtype", ["bf16", "fp32", "int3", ""]), ("--reduce-op", ["sum", "avg", "xor"]),
                         ("--root", ["0", "1", "-1", "99"]), ("--form", ["recipe", "expanded", "zip"])):
        if draw(st.booleans()):
            argv += [flag, draw(st.sampled_from(values))]
    return argv


@st.composite
def autopick_argvs(draw: st.DrawFn) -> list[str]:
    sizes = draw(st.one_of(st.builds(lambda a, b: f"{a}:{b}", SIZE_TEXT, SIZE_TEXT),
                           st.builds(lambda a, b, f: f"{a}:{b}:{f}", SIZE_TEXT, SIZE_TEXT,
                                     st.sampled_from(["2", "0", "-1", "1", "x", "1.5"])), SIZE_TEXT))
    return ["autopick", "-t", draw(st.sampled_from(["h200x4", "dgx-h100"])), "-n", "1",
            "-c", draw(st.sampled_from(KINDS[:4])), "--sizes", sizes]
