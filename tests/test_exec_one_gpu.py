"""One-GPU runs (every rank in one process): the device reference agrees with the numpy one, the
slab allocation gives the peer deltas symmetric memory would, and, on a GPU, every algorithm
family runs right through the real kernels, eager and graph replay."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hiercoll.collectives import CollectiveSpec, Kind, random_inputs, reference, tolerance  # noqa: E402
from hiercoll.harness.device_reference import device_expected  # noqa: E402
from hiercoll.harness.inputs import compare_tensors  # noqa: E402

HAS_GPU = torch.cuda.is_available()


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all"])
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
@pytest.mark.parametrize(("world", "count"), [(2, 12), (3, 301), (4, 1000)])
def test_device_reference_matches_numpy_reference(kind, op, world, count):
    if kind == "all_to_all":
        count -= count % world
    spec = CollectiveSpec(kind=Kind(kind), world_size=world, dtype="fp32", reduce_op=op,
                          nbytes=count * 4)
    inputs = random_inputs(spec, np.random.default_rng(count + world))
    want = reference(spec, inputs)
    got = device_expected(spec, [torch.from_numpy(np.asarray(x)) for x in inputs])
    for r in range(world):
        np.testing.assert_allclose(got.outputs[r].numpy(), want.outputs[r], rtol=1e-12)
        np.testing.assert_allclose(got.bounds[r].numpy(), tolerance(spec, want, r), rtol=1e-12)


def test_device_reference_refuses_what_it_does_not_cover():
    spec = CollectiveSpec(kind=Kind.BROADCAST, world_size=2, dtype="fp32", nbytes=64)
    with pytest.raises(ValueError, match="broadcast is not covered"):
        device_expected(spec, [torch.zeros(16), torch.zeros(0)])


def test_compare_with_per_element_bound_names_the_first_bad_element():
    want = torch.tensor([1.0, 2.0, 3.0, 4.0])
    got = torch.tensor([1.0, 2.05, 3.2, 4.0])
    bound = torch.tensor([0.1, 0.1, 0.1, 0.1])
    check = compare_tensors(got, want, bound)
    assert not check.ok and check.first_bad_index == 2 and check.bound == pytest.approx(0.1)
    assert compare_tensors(got, want, bound * 3).ok


def test_slabs_give_the_deltas_symmetric_memory_would():
    from hiercoll.executor.cuda.one_gpu import slabs
    from hiercoll.executor.cuda.symm import deltas
    parts = slabs(3, 100, torch.bfloat16, torch.device("cpu"))
    stride = parts[0].stride
    assert stride >= 100 and (stride * 2) % 256 == 0
    assert deltas(parts[1], 1, 2) == [-stride, 0, stride]     # type: ignore[arg-type]
    parts[2].tensor[5] = 7.0
    assert float(parts[0].peer_view(2, 5, 1)[0]) == 7.0


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("topology", ["h200x4", "bench/gpu/topologies/h200-2node-x2.yaml"])
def test_every_algorithm_runs_right_on_one_gpu(tmp_path, topology):
    out = tmp_path / "r.json"
    from hiercoll.harness.launch import CUDA_CONNECTIONS, NO_MULTICAST
    env = dict(os.environ, **NO_MULTICAST, **CUDA_CONNECTIONS)
    for kind in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        proc = subprocess.run(
            [sys.executable, "-m", "hiercoll", "stress", "--one-gpu", "--backend", "cuda",
             "-c", kind, "-t", topology, "--sizes", "8KiB,1000008,16MiB", "--iters", "20",
             "--modes", "eager,graph", "--debug-timeout-ms", "5000", "--out", str(out)],
            capture_output=True, text=True, env=env, timeout=600, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        cases = json.loads(out.read_text())["cases"]
        assert cases and all(c["ok"] and c["iterations"] == 20 for c in cases)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("topology", ["h200x4", "bench/gpu/topologies/h200-2node-x2.yaml"])
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all"])
def test_plans_rebased_onto_the_callers_tensors_run_right(topology, kind):
    """Every plan rebased onto caller tensors (backend.rebased: no copy in or out): all_reduce in
    place (one tensor per rank, where lowering.runs_in_place allows), the others with input and
    output in two separate allocations. Called alternately with the plan's own copying call
    (they share the call counter and signals), eager and in a graph, fresh random inputs each
    call: the rebased result equals the copying call's bit for bit, and both are within the
    dtype's bound of the reference on every rank."""
    from hiercoll.executor.cuda.backend import rebased
    from hiercoll.executor.cuda.lowering import CudaOptions
    from hiercoll.executor.cuda.one_gpu import OneGpuCluster, slabs
    from hiercoll.planner import applicable, plan
    from hiercoll.topology import load_topology
    topo = load_topology(topology)
    w = topo.world_size
    in_place = kind == "all_reduce"
    ran = 0
    for nbytes in (1_000_000, 16 << 20):
        spec = CollectiveSpec(kind=Kind(kind), world_size=w, dtype="bf16", nbytes=nbytes)
        n_in, n_out = spec.input_count(0), spec.output_count(0)
        for algo in applicable(topo, spec):
            for opts in (CudaOptions(), CudaOptions(protocol="simple")):
                cluster = OneGpuCluster(plan(topo, spec, algo), opts)
                src = slabs(w, n_in, torch.bfloat16, cluster.device)
                dst = src if in_place else slabs(w, n_out, torch.bfloat16, cluster.device)
                twins = [rebased(p, src[r], dst[r]) for r, p in enumerate(cluster.prepared)]
                if (in_place and not cluster.prepared[0].in_place_ok) or twins[0] is None:
                    continue
                ran += 1
                ins, outs_r = [u.tensor[:n_in] for u in src], [u.tensor[:n_out] for u in dst]
                base, graphs = cluster.prepared, None
                for call in range(6):
                    xs = [torch.randn(n_in, device=cluster.device).to(torch.bfloat16)
                          for _ in range(w)]
                    want = device_expected(spec, xs)
                    outs = [torch.empty(n_out, device=cluster.device, dtype=torch.bfloat16)
                            for _ in range(w)]
                    cluster.run(xs, outs)                         # the copying call
                    cluster.prepared = twins                      # type: ignore[assignment]
                    if call == 3:         # its warm-up call runs in place too: inputs after
                        graphs = cluster.capture(ins, outs_r)
                    for u, x in zip(ins, xs, strict=True):
                        u.copy_(x)
                    if graphs is None:
                        cluster.run(ins, outs_r)
                    else:
                        graphs.replay()
                    cluster.prepared = base
                    torch.cuda.synchronize()
                    for r in range(w):
                        assert torch.equal(outs_r[r], outs[r]), (algo, opts, call, r)
                        check = compare_tensors(outs[r], want.outputs[r], want.bounds[r])
                        assert check.ok, (algo, opts, call, r, check)
    assert ran >= 3
