"""Where a sweep's independent searches run: worker processes on this machine (the default), or a
Ray cluster (`--cluster ray[:ADDRESS]`, the optional `ray` extra) when the sweep outgrows one
machine (many topologies x collectives x sizes at thousands of GPUs).

Either way each job is the same deterministic function of its arguments and results come back
by job index, so a sweep gives the same rows wherever it ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hiercoll.errors import HiercollError

J = TypeVar("J")
R = TypeVar("R")

RAY_PREFIX = "ray"


@dataclass(frozen=True)
class Cluster:
    """A parsed `--cluster`: Ray at `address` ("auto": the cluster this machine belongs to, or
    HOST:PORT), or a Ray instance started here and stopped afterwards (address None)."""

    address: str | None = None

    @classmethod
    def parse(cls, text: str) -> Cluster:
        head, _, address = text.partition(":")
        if head != RAY_PREFIX or (_ and not address):
            raise HiercollError(f"--cluster: {text!r} is not 'ray' or 'ray:ADDRESS' (ADDRESS: "
                                "'auto' or HOST:PORT of a running Ray head); leave it out for "
                                "worker processes here")
        return cls(address or None)


def run_jobs(fn: Callable[[J], R], jobs: Sequence[J], workers: int,
             cluster: Cluster | None = None) -> Iterator[tuple[int, R]]:
    """(job index, result) as each job ends: `workers` processes here, or tasks on `cluster`."""
    if cluster is not None:
        yield from _on_ray(fn, jobs, cluster, workers)
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(fn, job): i for i, job in enumerate(jobs)}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()


def _on_ray(fn: Callable[[J], R], jobs: Sequence[J], cluster: Cluster,
            workers: int) -> Iterator[tuple[int, R]]:
    try:
        import ray
    except ImportError:
        raise HiercollError("--cluster ray: Ray is not installed; pip install 'hiercoll[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                  "configure_logging": False}
        if cluster.address is None:          # a local instance sized like the process pool
            kwargs["num_cpus"] = workers
        try:
            ray.init(address=cluster.address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
            raise HiercollError(f"--cluster ray:{cluster.address or ''}: cannot reach Ray ({first}); "
                                "check the address, or leave --cluster out") from None
    try:
        task = ray.remote(fn)
        pending = {task.remote(job): i for i, job in enumerate(jobs)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), ray.get(ref)
    finally:
        if started_here:
            ray.shutdown()
