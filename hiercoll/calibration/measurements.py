"""Measured points, from the files people already have: one row model for every source.

Sources: `hiercoll bench` JSON (rows carry their plan's recipe), nccl-tests logs (parsed in
`nccl_tests.py`), and the NCCL baseline JSON in `shared/measurements` (NCCL on 4x H200). Every
error names the file (and line or row) and the fix, in one line.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hiercoll.calibration.measurement import Measurement
from hiercoll.collectives import Kind
from hiercoll.errors import HiercollError, format_validation_error
from hiercoll.schedule import LIBRARY_ALGORITHM

__all__ = ["Measurement", "load_measurements", "merge_repeats"]


def load_measurements(paths: Sequence[str | Path], *, allow_wrong: bool = False,
                      collective: Kind | None = None) -> list[Measurement]:
    """Every row of every file. JSON is a bench result or the baseline; anything else is read as
    an nccl-tests log (`collective` names it where the file name does not)."""
    from hiercoll.calibration.nccl_tests import parse_nccl_tests
    rows: list[Measurement] = []
    for p in paths:
        path = Path(p)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise HiercollError(f"{path}: cannot read ({exc.strerror}); check the path and its "
                                "permissions") from None
        except UnicodeDecodeError:
            raise HiercollError(f"{path}: not a text file; give an nccl-tests log or a hiercoll "
                                "bench JSON") from None
        if not text.strip():
            raise HiercollError(f"{path}: empty file; give an nccl-tests log or a hiercoll "
                                "bench JSON")
        if path.suffix.lower() == ".json" or text.lstrip()[:1] in ("{", "["):
            rows += _from_json(text, str(path))
        else:
            rows += parse_nccl_tests(text, str(path), allow_wrong=allow_wrong,
                                     collective=collective)
    return rows


# What tells one timed point from another; everything else (where it came from, its time and
# spread) is what repeats of the point differ in
_REPEAT_VARIES = {"source", "time_us", "p90_us", "p99_us", "iters"}


def merge_repeats(rows: Sequence[Measurement]) -> list[Measurement]:
    """One row per point: a point measured in several files or sweeps (repeated to average out a
    host whose speed wanders, or nccl-tests run twice) becomes its median, so the fit weighs
    each point once and its held-out error is not a comparison of repeats. First-seen order."""
    groups: dict[str, list[Measurement]] = {}
    for m in rows:
        key = json.dumps(m.model_dump(mode="json", exclude=_REPEAT_VARIES), sort_keys=True)
        groups.setdefault(key, []).append(m)
    out = []
    for same in groups.values():
        if len(same) == 1:
            out.append(same[0])
            continue
        out.append(same[0].model_copy(update={
            "source": f"{same[0].source} (median of {len(same)} repeats)",
            "time_us": statistics.median(m.time_us for m in same),
            "p90_us": _median_if_all([m.p90_us for m in same]),
            "p99_us": _median_if_all([m.p99_us for m in same]),
            "iters": sum(m.iters for m in same) if all(m.iters for m in same) else None}))
    return out


def _median_if_all(values: list[float | None]) -> float | None:
    """The median, where every repeat has the value (a percentile only some tools print)."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known and len(known) == len(values) else None


def _from_json(text: str, source: str) -> list[Measurement]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HiercollError(f"{source}: not valid JSON near line {exc.lineno}") from None
    if isinstance(data, dict) and isinstance(data.get("rows"), list):
        # a peer's row (torch's symmetric-memory kernels) has no hiercoll model; NCCL's peer
        # row is the library call
        return [bench_measurement(r, f"{source}#{i}") for i, r in enumerate(data["rows"])
                if not (isinstance(r, dict) and r.get("peer") and r.get("algorithm") != LIBRARY_ALGORITHM)]
    if isinstance(data, dict) and isinstance(data.get("nccl"), dict) and "world" in data:
        return _baseline(data, source)
    raise HiercollError(f"{source}: JSON without 'rows' (hiercoll bench) or 'nccl' + 'world' "
                        "(baseline); which file is this?")


def bench_measurement(r: Any, source: str) -> Measurement:
    """One `hiercoll bench` row as a measurement (one line naming the row's field if it is not
    one): its plan's recipe, its time and its mode, and the cuda lowering's knobs it ran with."""
    if not isinstance(r, dict):
        raise HiercollError(f"{source}: a row must be an object")
    library = r.get("algorithm") == LIBRARY_ALGORITHM or r.get("backend") == LIBRARY_ALGORITHM
    params = r.get("params") or {}
    if not isinstance(params, dict):
        raise HiercollError(f"{source}: params: expected an object of the plan's parameters, "
                            f"got {type(params).__name__}")
    params = {k: v for k, v in params.items() if v is not None}   # unset: the default
    fields = {"source": source, "tool": "hiercoll-bench",
              "collective": _kind(r.get("collective"), source),
              "algorithm": LIBRARY_ALGORITHM if library else r.get("algorithm"),
              "params": {} if library else params,
              "world_size": r.get("world_size"), "dtype": r.get("dtype"),
              "reduce_op": r.get("reduce_op", "sum"), "nbytes": r.get("nbytes"),
              "mode": r.get("mode", "eager"), "time_us": r.get("p50_us"), "statistic": "p50",
              "p90_us": r.get("p90_us"), "p99_us": r.get("p99_us"), "iters": r.get("iters"),
              "one_gpu": r.get("one_gpu") or False, "topology": r.get("topology"),
              "topology_fingerprint": r.get("topology_fingerprint") or None,
              "lowering": ({} if library or r.get("backend") != "cuda"
                           or not isinstance(r.get("options"), dict) else r["options"])}
    return _validated(fields, source, {"time_us": "p50_us"})


_BASELINE_KEYS = {"world_size": "world", "nbytes": "bytes (1st value)",
                  "time_us": "p50_us (2nd value)"}


def _baseline(data: dict[str, Any], source: str) -> list[Measurement]:
    """shared/measurements' baseline: {"world": W, "nccl": {kind: [[bytes, p50_us, ...], ...]}}
    (NCCL, eager, bf16, one node)."""
    rows = []
    for kind, points in data["nccl"].items():
        if not isinstance(points, list):
            raise HiercollError(f"{source}#nccl.{kind}: expected a list of [bytes, p50_us, ...]")
        for i, point in enumerate(points):
            where = f"{source}#nccl.{kind}.{i}"
            if not isinstance(point, list) or len(point) < 2:
                raise HiercollError(f"{where}: expected [bytes, p50_us, ...]")
            rows.append(_validated({"source": where, "tool": "baseline",
                                    "collective": _kind(kind, where),
                                    "algorithm": LIBRARY_ALGORITHM, "world_size": data["world"],
                                    "num_nodes": 1, "dtype": "bf16", "nbytes": point[0],
                                    "mode": "eager", "time_us": point[1], "statistic": "p50"},
                                   where, _BASELINE_KEYS))
    return rows


_ALIASES = {"alltoall": Kind.ALL_TO_ALL, "allreduce": Kind.ALL_REDUCE,
            "allgather": Kind.ALL_GATHER, "reducescatter": Kind.REDUCE_SCATTER}


def _kind(name: Any, source: str) -> Kind:
    if isinstance(name, str) and name in _ALIASES:
        return _ALIASES[name]
    try:
        return Kind(name)
    except ValueError:
        raise HiercollError(f"{source}: unknown collective {name!r}; one of "
                            f"{', '.join(k.value for k in Kind)}") from None


def _validated(fields: dict[str, Any], source: str,
               keys: dict[str, str] | None = None) -> Measurement:
    """Validated row; an error names the file's own key where it differs from the field's."""
    try:
        return Measurement.model_validate(fields)
    except ValidationError as err:
        msg = format_validation_error(err, source)
        for field_name, key in (keys or {}).items():
            msg = msg.replace(f"{source}: {field_name}:", f"{source}: {key}:", 1)
        raise HiercollError(msg) from None
