"""Refuse measurements that were not taken on a machine of the topology's shape, in one line.

A calibrated file keeps its base's shape (ranks, nodes, fabric kinds, NIC placement) and changes
only numbers, so shapes, not full fingerprints, decide: rows from `hiercoll bench -t h200x4`
calibrate `h200x4` and any calibrated copy of it. One-GPU rows (every rank on one GPU) only fit a
`shared_gpu` topology and the other way round.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from hiercoll.calibration.measurements import Measurement
from hiercoll.errors import HiercollError
from hiercoll.topology import Topology, load_topology


class _Unloadable(str):
    """A row's topology name that does not load from here (a file path relative to another
    directory, a preset this version lacks): the reason."""


def row_shape(m: Measurement) -> str | _Unloadable | None:
    """The shape fingerprint of the machine a row names, if it names one we can load (a preset,
    checked against the row's own fingerprint); `_Unloadable` (why) if the name does not load;
    else None."""
    if not m.topology or m.topology_fingerprint is None:
        return None
    return _shape_of(m.topology, m.world_size, m.topology_fingerprint, m.one_gpu)


@functools.cache
def _shape_of(name: str, world_size: int, fingerprint: str,
              one_gpu: bool) -> str | _Unloadable | None:
    """Loaded once per distinct machine (a bench file's rows all name the same one). A preset
    that ships calibrated is tried with its defaults too: rows measured before its calibration
    carry the default-cost fingerprint."""
    for uncalibrated in (False, True):
        try:
            topo = load_topology(name, uncalibrated=uncalibrated)
            if topo.world_size != world_size and world_size % topo.gpus_per_node == 0:
                topo = load_topology(name, world_size // topo.gpus_per_node, uncalibrated)
        except HiercollError as exc:
            return _Unloadable(str(exc))
        if topo.fingerprint() == fingerprint:
            return topo.model_copy(update={"shared_gpu": one_gpu}).shape_fingerprint()
    return None


def check_rows(rows: Sequence[Measurement], topology: Topology) -> None:
    if not rows:
        raise HiercollError("measurements: no rows to use (empty files?)")
    shape = topology.shape_fingerprint()
    for m in rows:
        if m.world_size != topology.world_size:
            raise HiercollError(f"{m.source}: measured on {m.world_size} ranks, the topology has "
                                f"{topology.world_size}; give the topology of that machine "
                                "(--topology)")
        if m.num_nodes is not None and m.num_nodes != topology.num_nodes:
            raise HiercollError(f"{m.source}: measured on {m.num_nodes} node(s), the topology "
                                f"has {topology.num_nodes}; use --nodes or another topology")
        if m.one_gpu != topology.shared_gpu:
            what = ("every rank on one GPU (--one-gpu)" if m.one_gpu else "one GPU per rank")
            raise HiercollError(f"{m.source}: measured with {what}; calibrate a topology with "
                                f"shared_gpu: {str(m.one_gpu).lower()} (e.g. "
                                f"{'one-gpu-h200x4' if m.one_gpu else 'h200x4'})")
        theirs = row_shape(m)
        if isinstance(theirs, _Unloadable):
            if m.topology_fingerprint not in (topology.fingerprint(), topology.base_fingerprint()):
                raise HiercollError(f"{m.source}: measured on topology {m.topology!r}, which "
                                    f"does not load from here ({theirs.split(': ', 1)[-1]}); "
                                    "run from the directory the row's path is relative to, "
                                    "or give that topology as --topology")
        elif theirs is not None and theirs != shape:
            raise HiercollError(f"{m.source}: measured on topology {m.topology_fingerprint} "
                                f"({m.topology or '?'}), whose shape differs from "
                                "--topology's; calibrate a topology of that machine")
