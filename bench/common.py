"""Shared by the bench scripts: machine/version stamp, atomic result writing, percentiles."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def stamp(command: str) -> dict[str, Any]:
    from hiercoll.harness.results import git_sha  # hiercoll's own checkout, wherever we run
    sha = git_sha() or ""
    return {"command": command, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": f"{os.environ.get('HIERCOLL_MACHINE', 'cpu-dev')} {platform.machine()}, {os.cpu_count()} cores, "
                       f"{platform.python_implementation()} {platform.python_version()}",
            "git_sha": sha}


def timed(acc: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn, adding its CPU seconds to acc[name] on every call."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[name] = acc.get(name, 0.0) + time.process_time() - t
    return wrapper


def write_results(name: str, payload: dict[str, Any], markdown: str) -> None:
    from hiercoll.files import write_atomic
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_atomic(RESULTS / f"{name}.json", json.dumps(payload, indent=1, sort_keys=True) + "\n")
    write_atomic(RESULTS / f"{name}.md", markdown)


def provenance(meta: dict[str, Any]) -> list[str]:
    """The markdown lines that say how a result was made: its command, date, machine and git."""
    return [f"Command: `{meta['command']}`  ",
            f"Date: {meta['date']}; machine: {meta['machine']}; git {meta['git_sha'] or '?'}"]


def command_line() -> str:
    return "python " + " ".join([os.path.relpath(sys.argv[0]), *sys.argv[1:]])


def percentiles(xs: list[float], ps: tuple[int, ...] = (50, 90, 99)) -> dict[str, float]:
    """{"p50": ..., ...} of the samples (nearest rank, rounded to 0.01)."""
    s = sorted(xs)
    return {f"p{p}": round(s[min(len(s) - 1, int(len(s) * p / 100))], 2) for p in ps}


def rank_average(samples: list[float], device: Any) -> dict[str, float]:
    """Percentiles of this rank's samples averaged over the process group sample by sample (a
    collective: every rank calls it with as many samples; torch's own all-reduce, so call it
    with nothing patched)."""
    import torch
    import torch.distributed as dist
    t = torch.tensor(samples, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return percentiles((t / dist.get_world_size()).tolist())
