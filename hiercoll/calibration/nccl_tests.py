"""Read the plain-text output of nccl-tests (`all_reduce_perf`, `reduce_scatter_perf`,
`all_gather_perf`, `alltoall_perf`, `broadcast_perf`, `reduce_perf`) into measurement rows.

What a log holds: `#` header lines (`nThread 1 nGpus 1 ... iters: 20 ... graph: 0`, then one
`#  Rank  N Group G Pid P on HOST device D [bus] NAME` line per rank), the table header
(`size count type redop root time algbw busbw #wrong`, out-of-place then in-place), data rows,
and a footer (`# Out of bounds values`, `# Avg bus bandwidth`). Each data row gives two points:
out-of-place and in-place. Ranks = Rank lines, nodes = distinct hosts. Several runs
concatenated in one file are read in turn (each table takes the header lines above it).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from hiercoll.calibration.measurements import Measurement
from hiercoll.collectives import Kind
from hiercoll.errors import HiercollError, format_validation_error

BINARIES = {"all_reduce_perf": Kind.ALL_REDUCE, "reduce_scatter_perf": Kind.REDUCE_SCATTER,
            "all_gather_perf": Kind.ALL_GATHER, "alltoall_perf": Kind.ALL_TO_ALL,
            "broadcast_perf": Kind.BROADCAST, "reduce_perf": Kind.REDUCE}
TYPES = {"float": "fp32", "half": "fp16", "bfloat16": "bf16", "double": "fp64"}
OPS = {"sum": "sum", "avg": "avg", "max": "max", "min": "min", "none": "sum"}
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device")
_TABLE = re.compile(r"^#\s*size\s+count\s+type\s+redop\s+root\s+time\s+algbw\s+busbw")
_NUMBER = r"[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?"


def collective_of(text: str, source: str) -> Kind | None:
    """From the file name (`all_reduce_perf.log`), else a binary named in the log itself."""
    for name, kind in BINARIES.items():
        if name in source.rsplit("/", 1)[-1]:
            return kind
    for name, kind in BINARIES.items():
        if re.search(rf"\b{name}\b", text):
            return kind
    return None


def parse_nccl_tests(text: str, source: str, *, allow_wrong: bool = False,
                     collective: Kind | None = None) -> list[Measurement]:
    kind = collective or collective_of(text, source)
    rows: list[Measurement] = []
    hosts: dict[int, str] = {}
    header: dict[str, Any] = {"mode": "eager", "iters": None}
    in_table = False
    saw_table = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        where = f"{source}:{lineno}"
        stripped = line.strip()
        if stripped.startswith("#"):
            if _TABLE.match(stripped):
                in_table, saw_table = True, True
                continue
            if re.match(r"^#\s*nThread\b", stripped):       # a new run: its own header
                hosts, in_table = {}, False
                header = {"mode": "graph" if re.search(r"graph:\s*1\b", stripped) else "eager",
                          "iters": _int(re.search(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)", stripped))}
            m = _RANK.match(stripped)
            if m:
                hosts[int(m.group(1))] = m.group(2)
            continue
        if not stripped or not in_table:
            continue
        if kind is None:
            raise HiercollError(f"{source}: cannot tell which collective this log timed; name "
                                "the file after the binary (all_reduce_perf.log, ...) or pass "
                                "--collective")
        if not hosts:
            raise HiercollError(f"{where}: no '#  Rank N ... on HOST device' lines above this "
                                "table: the log lost its header (ranks and nodes come from it)")
        rows += _data_row(stripped, where, kind, hosts, header, allow_wrong)
    if not saw_table:
        raise HiercollError(f"{source}: no nccl-tests result table found (expected the "
                            "'#  size  count  type  redop  root  time  algbw  busbw  #wrong' "
                            "header of an *_perf run)")
    if not rows:
        raise HiercollError(f"{source}: the nccl-tests table has no data rows")
    return rows


def _data_row(line: str, where: str, kind: Kind, hosts: dict[int, str], header: dict[str, Any],
              allow_wrong: bool) -> list[Measurement]:
    cols = line.split()
    if len(cols) < 9 or not re.fullmatch(r"\d+", cols[0]):
        raise HiercollError(f"{where}: not an nccl-tests data row (size count type redop root "
                            f"time algbw busbw #wrong ...): {line[:60]!r}")
    size, _count, tname, redop, _root = cols[:5]
    if tname not in TYPES:
        raise HiercollError(f"{where}: type {tname!r} is not one hiercoll models (float, half, "
                            "bfloat16, double); rerun nccl-tests with -d of one of them")
    if redop not in OPS:
        raise HiercollError(f"{where}: unknown reduction {redop!r}")
    out = []
    for in_place, start in ((False, 5), (True, 9)):
        group = cols[start:start + 4]
        if len(group) < 4:
            break           # some versions print only out-of-place columns (alltoall)
        time_s, _algbw, _busbw, wrong_s = group
        if not re.fullmatch(_NUMBER, time_s):
            raise HiercollError(f"{where}: time {time_s!r} is not a number")
        wrong = 0 if wrong_s == "N/A" else int(wrong_s) if wrong_s.isdigit() else -1
        if wrong < 0:
            raise HiercollError(f"{where}: #wrong {wrong_s!r} is neither a count nor N/A")
        if wrong and not allow_wrong:
            raise HiercollError(f"{where}: {wrong} wrong elements "
                                f"({'in-place' if in_place else 'out-of-place'}): a wrong run's "
                                "time is no evidence; fix the run, or --allow-wrong to keep it "
                                "flagged")
        fields = {"source": where, "tool": "nccl-tests", "collective": kind, "algorithm": "nccl",
                  "world_size": len(hosts), "num_nodes": len(set(hosts.values())),
                  "dtype": TYPES[tname], "reduce_op": OPS[redop], "nbytes": int(size),
                  "mode": header["mode"], "in_place": in_place, "time_us": float(time_s),
                  "statistic": "mean", "iters": header["iters"], "wrong": wrong}
        try:
            out.append(Measurement.model_validate(fields))
        except ValidationError as err:
            raise HiercollError(format_validation_error(err, where)) from None
    return out


def _int(m: re.Match[str] | None) -> int | None:
    return int(m.group(1)) if m else None
