"""Read the plain-text output of nccl-tests (`all_reduce_perf`, `reduce_scatter_perf`,
`all_gather_perf`, `alltoall_perf`, `broadcast_perf`, `reduce_perf`) into measurement rows.

What a log holds: `#` header lines (`nThread 1 nGpus 1 ... iters: 20 ... graph: 0`, then one
`#  Rank  N Group G Pid P on HOST device D [bus] NAME` line per rank), the table header
(`size count type redop root time algbw busbw #wrong`, out-of-place then in-place), data rows,
and a footer (`# Out of bounds values`, `# Avg bus bandwidth`). Each data row gives two points:
out-of-place and in-place (some versions print only out-of-place for alltoall). Ranks = Rank
lines, nodes = distinct hosts. Several runs concatenated in one file are read in turn: each
table takes the header lines above it. Lines inside a table that do not start with a size
(NCCL INFO/WARN noise printed while connections are set up) are skipped; rows of size 0 (small
sizes rounded down by nccl-tests) carry no time worth fitting and are skipped too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import ValidationError

from hiercoll.calibration.measurement import Measurement
from hiercoll.collectives import Kind
from hiercoll.errors import HiercollError, format_validation_error

# Longest names first: "reduce_perf" is a suffix of "all_reduce_perf".
BINARIES = {"all_reduce_perf": Kind.ALL_REDUCE, "reduce_scatter_perf": Kind.REDUCE_SCATTER,
            "all_gather_perf": Kind.ALL_GATHER, "alltoall_perf": Kind.ALL_TO_ALL,
            "broadcast_perf": Kind.BROADCAST, "reduce_perf": Kind.REDUCE}
TYPES = {"float": "fp32", "half": "fp16", "bfloat16": "bf16", "double": "fp64"}
OPS = {"sum": "sum", "avg": "avg", "max": "max", "min": "min", "none": "sum"}
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device")
_TABLE = re.compile(r"^#\s*size\s+count\s+type\s+redop\s+root\s+time\s+algbw\s+busbw")
_RUN = re.compile(r"^#\s*nThread\b")
_GRAPH = re.compile(r"\bgraph:\s*(\d+)")
_ITERS = re.compile(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)")
_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")          # mpirun --tag-output
_BINARY = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(BINARIES) + r")(?![A-Za-z0-9_])")
_ROW = re.compile(r"^\d+\s+\d+\s")                             # size count ...
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?")


@dataclass
class _Run:
    """The header of one run: what applies to the table rows below it."""

    mode: str = "eager"
    iters: int | None = None
    hosts: dict[int, str] = field(default_factory=dict)
    binary: Kind | None = None          # the *_perf binary this run's lines name
    tabled: bool = False                # its table has started


def collective_of(text: str, source: str) -> Kind | None:
    """From the file name (`all_reduce_perf.log`), else the one binary the log names."""
    named = {BINARIES[m] for m in _BINARY.findall(text)}
    return _from_name(source) or (named.pop() if len(named) == 1 else None)


def parse_nccl_tests(text: str, source: str, *, allow_wrong: bool = False,
                     collective: Kind | None = None) -> list[Measurement]:
    """Two rows (out-of-place, in-place) per data line. The collective: `collective`, else the
    file name, else the binary named in the run's own lines (a command line or `# Collective
    test starting: ...`); a table whose collective none of these tells is a one-line error."""
    fixed = collective or _from_name(source)
    rows: list[Measurement] = []
    run, pending, in_table, saw_table = _Run(), None, False, False
    for lineno, raw in enumerate(text.splitlines(), start=1):
        where = f"{source}:{lineno}"
        line = _TAG.sub("", raw).strip()
        if in_table and _ROW.match(line):
            kind = fixed or run.binary
            if kind is None:
                raise HiercollError(f"{where}: cannot tell which collective this log timed; "
                                    "pass --collective, or name the file after the binary "
                                    "(all_reduce_perf.log, ...)")
            if not run.hosts:
                raise HiercollError(f"{where}: no '#  Rank N ... on HOST device' lines above "
                                    "this table: the log lost its header (ranks and nodes "
                                    "come from it)")
            rows += _data_row(line, where, kind, run, allow_wrong)
        elif _TABLE.match(line):
            in_table = saw_table = run.tabled = True
        elif _RUN.match(line):                             # a new run: its own header
            graph, iters = _GRAPH.search(line), _ITERS.search(line)
            binary = pending or (None if run.tabled else run.binary)
            run = _Run(mode="graph" if graph and int(graph.group(1)) > 0 else "eager",
                       iters=int(iters.group(1)) if iters else None, binary=binary)
            pending, in_table = None, False
        elif (rank := _RANK.match(line)) is not None:
            run.hosts[int(rank.group(1))] = rank.group(2)
        elif (named := _BINARY.search(line)) is not None and "concluded" not in line:
            # a command line or "# Collective test starting: ..." (not "... concluded: ...")
            in_table = False
            if run.tabled:
                pending = BINARIES[named.group(1)]         # ... of the next run
            else:
                run.binary = BINARIES[named.group(1)]
        # anything else: header detail, footer, NCCL INFO/WARN noise
    if not saw_table:
        raise HiercollError(f"{source}: no nccl-tests result table found (expected the "
                            "'#  size  count  type  redop  root  time  algbw  busbw  #wrong' "
                            "header of an *_perf run)")
    if not rows:
        raise HiercollError(f"{source}: the nccl-tests table has no data rows of size > 0; "
                            "was the run cut short?")
    return rows


def _from_name(source: str) -> Kind | None:
    m = _BINARY.search(re.split(r"[\\/]", source)[-1])
    return BINARIES[m.group(1)] if m else None


def _data_row(line: str, where: str, kind: Kind, run: _Run,
              allow_wrong: bool) -> list[Measurement]:
    cols = line.split()
    if len(cols) < 9 or not cols[0].isdigit():
        raise HiercollError(f"{where}: not an nccl-tests data row (size count type redop root "
                            f"time algbw busbw #wrong ...): {line[:60]!r}")
    size, _count, tname, redop, _root = cols[:5]
    if tname not in TYPES:
        raise HiercollError(f"{where}: type {tname!r} is not one hiercoll models; rerun "
                            "nccl-tests with -d float, half, bfloat16 or double")
    if redop not in OPS:
        raise HiercollError(f"{where}: reduction {redop!r} is not one hiercoll models; rerun "
                            "nccl-tests with -o sum, avg, max or min")
    if int(size) == 0:
        return []
    out = []
    for in_place, start in ((False, 5), (True, 9)):
        group = cols[start:start + 4]
        if in_place and not group:
            break                   # some versions print only out-of-place columns (alltoall)
        if len(group) < 4:
            raise HiercollError(f"{where}: the in-place columns are cut short (expected time "
                                "algbw busbw #wrong)")
        time_s, _algbw, _busbw, wrong_s = group
        if not _NUMBER.fullmatch(time_s):
            raise HiercollError(f"{where}: time {time_s!r} is not a number")
        if wrong_s != "N/A" and not wrong_s.isdigit():
            raise HiercollError(f"{where}: #wrong {wrong_s!r} is neither a count nor N/A")
        wrong = 0 if wrong_s == "N/A" else int(wrong_s)
        if wrong and not allow_wrong:
            raise HiercollError(f"{where}: {wrong} wrong elements "
                                f"({'in-place' if in_place else 'out-of-place'}): a wrong run's "
                                "time is no evidence; fix the run, or --allow-wrong to keep it "
                                "flagged")
        fields = {"source": where, "tool": "nccl-tests", "collective": kind, "algorithm": "nccl",
                  "world_size": len(run.hosts), "num_nodes": len(set(run.hosts.values())),
                  "dtype": TYPES[tname], "reduce_op": OPS[redop], "nbytes": int(size),
                  "mode": run.mode, "in_place": in_place, "time_us": float(time_s),
                  "statistic": "mean", "iters": run.iters, "wrong": wrong}
        try:
            out.append(Measurement.model_validate(fields))
        except ValidationError as err:
            raise HiercollError(format_validation_error(err, where)) from None
    return out
