"""A Communicator call whose plan is the library's runs it on the caller's tensors: right
results for every collective (AVG too), nothing staged in the pool, async handles complete
(gloo under torchrun; on cuda it is the same path with NCCL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import json, sys
import torch
import torch.distributed as dist
from hiercoll.torch import Communicator

dist.init_process_group("gloo")
rank, w = dist.get_rank(), dist.get_world_size()
comm = Communicator(backend="nccl")           # every call is the library's
g = torch.Generator().manual_seed(1234)
xs = [torch.randn(5 * w + 3, generator=g) for _ in range(w)]     # odd size: no bucket padding
ok = {}
t = xs[rank].clone()
comm.all_reduce(t)
ok["all_reduce"] = torch.allclose(t, sum(xs), atol=1e-5)
t = xs[rank].clone()
comm.all_reduce(t, op=dist.ReduceOp.AVG)
ok["avg"] = torch.allclose(t, sum(xs) / w, atol=1e-5)
full = [torch.randn(4 * w, generator=g) for _ in range(w)]
out = torch.empty(4)
work = comm.reduce_scatter_tensor(out, full[rank], async_op=True)
work.wait()
ok["reduce_scatter"] = torch.allclose(out, sum(full)[4 * rank:4 * rank + 4], atol=1e-5)
gathered = torch.empty(4 * w)
comm.all_gather_into_tensor(gathered, full[rank][:4].contiguous())
ok["all_gather"] = torch.allclose(gathered, torch.cat([f[:4] for f in full]))
a2a = torch.empty(4 * w)
comm.all_to_all_single(a2a, full[rank])
ok["all_to_all"] = torch.allclose(a2a, torch.cat([f[4 * rank:4 * rank + 4] for f in full]))
stats = comm.stats()
res = {"ok": ok, "pool_bytes": stats["pool_bytes"], "plans": len(stats["plans"])}
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(res, f)
comm.close()
dist.destroy_process_group()
'''


@pytest.mark.parametrize("world", [2, 3])
def test_library_calls_run_on_the_callers_tensors(tmp_path, world):
    pytest.importorskip("torch")
    script = tmp_path / "direct.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={world}", str(script), str(out)],
                          capture_output=True, text=True, env=env, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["ok"] == dict.fromkeys(got["ok"], True) and len(got["ok"]) == 5
    assert got["pool_bytes"] == 0           # nothing was staged
    assert got["plans"] == 5                # sum and avg all-reduce, and the other three
