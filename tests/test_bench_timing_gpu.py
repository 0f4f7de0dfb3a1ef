"""The bench's timer on a real GPU (skipped without one): eager samples are batches of
`eager_calls` back-to-back calls, graph samples replays of `graph_calls`, each divided by its
calls; every call the timer makes is one the rows account for."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

SCRIPT = """
import torch, torch.distributed as dist
from hiercoll.executor.interface import Mode
from hiercoll.harness.bench import time_call
dist.init_process_group("nccl", rank=0, world_size=1)
torch.cuda.set_device(0)
x = torch.zeros(1, device="cuda")
n = [0]
def call():
    n[0] += 1
    x.add_(1.0)
t = time_call(call, torch.device("cuda", 0), Mode.EAGER, iters=7, warmup=2, eager_calls=5)
assert (t.iters, t.eager_calls, t.graph_calls) == (7, 5, 0), t
assert n[0] == 2 + 7 * 5, n
torch.cuda.synchronize()
assert x.item() == n[0]
n[0] = 0
g = time_call(call, torch.device("cuda", 0), Mode.GRAPH, iters=3, warmup=1, graph_calls=4)
assert (g.iters, g.eager_calls, g.graph_calls) == (3, 0, 4), g
assert g.p50_us > 0 and t.p50_us > 0
print("ok")
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_eager_samples_are_batches_and_graph_samples_replays():
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
