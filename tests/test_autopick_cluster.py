"""`autopick --cluster ray[:ADDRESS]` (issue 16 §3): the sweep's sizes as Ray tasks give the same
rows as the local worker processes and the serial loop; a bad --cluster or a missing Ray is one
line. The Ray case starts a local instance (about 10 s), as CI runs it."""

from __future__ import annotations

import sys

import pytest

from hiercoll.cli.main import main
from hiercoll.collectives import CollectiveSpec
from hiercoll.errors import HiercollError
from hiercoll.planner.search.autopick import sweep
from hiercoll.planner.search.workers import Cluster, run_jobs
from tests.helpers import small_topology


@pytest.mark.parametrize(("text", "address"), [("ray", None), ("ray:auto", "auto"),
                                               ("ray:10.0.0.1:6379", "10.0.0.1:6379")])
def test_cluster_flag_parses(text: str, address: str | None) -> None:
    assert Cluster.parse(text) == Cluster(address)


@pytest.mark.parametrize("text", ["spark", "ray:", "rayx", ""])
def test_a_bad_cluster_is_one_line(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(HiercollError, match="--cluster"):
        Cluster.parse(text)
    assert main(["autopick", "-t", "dgx-h100", "-n", "1", "-c", "all_reduce", "--sizes", "4KiB",
                 "--no-cache", "--cluster", text]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --cluster")


def test_without_ray_installed_the_cluster_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)          # import ray -> ImportError
    with pytest.raises(HiercollError, match=r"pip install 'hiercoll\[ray\]'"):
        list(run_jobs(abs, [-1], 1, Cluster()))


def test_ray_gives_the_rows_the_worker_processes_and_the_serial_loop_give() -> None:
    pytest.importorskip("ray")
    topo = small_topology(2, 2)
    template = CollectiveSpec(kind="all_reduce", world_size=4, dtype="bf16", nbytes=0)
    sizes = [4 << 10, 1 << 20, 64 << 20]

    def rows(**kw: object) -> list[dict]:
        return [r.to_json() for r in sweep(topo, template, sizes, progress=False, **kw)]

    serial = rows(jobs=1)
    assert rows(jobs=2) == serial
    assert rows(jobs=2, cluster=Cluster()) == serial
    assert [r["bytes"] for r in serial] == sizes
