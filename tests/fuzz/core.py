"""Case generation, mutation and the per-case oracle (see tests/fuzz/__init__.py)."""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import json
import os
import random
import re
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# (exception class, message pattern): tracebacks found in code being fixed elsewhere, counted and
# reported, not failed. Empty: the plan-file TypeErrors (2026-11-24) are fixed at the loader
# (plan_file._RecipeMeta), the `-a nccl -n 1000000` hang by the topology's rank limit.
KNOWN: list[tuple[str, str]] = []
# argv patterns of known hangs (counted as known, not failed). Empty, as KNOWN.
KNOWN_HANGS: list[str] = []

KINDS = ["reduce_scatter", "all_gather", "all_reduce", "all_to_all", "broadcast", "reduce",
         "group_cast", "group_reduce"]
ALGOS = ["ring", "direct", "two_shot", "hier", "hier_2d", "rhd", "rd", "bruck", "tree", "auto", "nccl",
         "bogus"]
SIZES = ["0", "1", "2", "7", "64", "1000", "4KiB", "64KiB", "1MiB", "-1", "1e3", "abc", "1.5KiB",
         "99999999999999999999999", "1 KiB", "", "4kib", "0x10", "nan", "1TiB", "3B"]
JUNK: list[Any] = [None, -1, 0, 1, 2, 3, 1e309, -1e9, 10**12, "x", "", [], {}, [1, 2], True,
                   0.5, "nan", {"a": 1},
                   # extreme but finite (issue 30: 5e-324 GB/s made autopick spin forever)
                   5e-324, 1e308, -0.0, 2**63, 2**62]


class CaseTimeout(Exception):
    pass


@dataclass
class Outcome:
    argv: list[str]
    rc: int | None
    stderr: str
    traceback: str | None = None
    exc: str | None = None
    hang: bool = False
    wrong_accepted: str | None = None
    known: bool = False
    seconds: float = 0.0


@dataclass
class Summary:
    cases: int = 0
    by_rc: dict[str, int] = field(default_factory=dict)
    tracebacks: list[Outcome] = field(default_factory=list)
    known: list[Outcome] = field(default_factory=list)
    hangs: list[Outcome] = field(default_factory=list)
    multiline: list[Outcome] = field(default_factory=list)
    bad_rc: list[Outcome] = field(default_factory=list)
    wrong_accepted: list[Outcome] = field(default_factory=list)
    accepted_verified: int = 0

    @property
    def clean(self) -> bool:
        return not (self.tracebacks or self.hangs or self.multiline or self.bad_rc
                    or self.wrong_accepted)

    def report(self) -> str:
        lines = [f"cases {self.cases}  exit codes {dict(sorted(self.by_rc.items()))}",
                 f"errors (rc 1/2) {self.by_rc.get('1', 0) + self.by_rc.get('2', 0)}  "
                 f"tracebacks {len(self.tracebacks)}  known (allowlisted) {len(self.known)}  "
                 f"hangs {len(self.hangs)}  multi-line errors {len(self.multiline)}  "
                 f"bad exit codes {len(self.bad_rc)}  wrong-accepted {len(self.wrong_accepted)}  "
                 f"accepted plans verified {self.accepted_verified}"]
        seen: set[str] = set()
        for title, items in (("traceback", self.tracebacks), ("known", self.known),
                             ("hang", self.hangs), ("multi-line", self.multiline),
                             ("bad rc", self.bad_rc), ("wrong-accepted", self.wrong_accepted)):
            for o in items:
                key = f"{title}:{o.exc or o.wrong_accepted or o.stderr[:80]}"
                if key in seen:
                    continue
                seen.add(key)
                lines.append(f"- {title}: {o.exc or o.wrong_accepted or o.stderr.strip()[:200]!r}"
                             f"\n    argv: {' '.join(o.argv)}")
        return "\n".join(lines)


def _known(exc_name: str, message: str) -> bool:
    return any(exc_name == k and re.search(pat, message) for k, pat in KNOWN)


@contextlib.contextmanager
def _time_limit(seconds: float):  # type: ignore[no-untyped-def]
    def fire(signum: int, frame: Any) -> None:
        raise CaseTimeout()
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


ENV_VALUES = {   # every HIERCOLL_* variable the CPU commands read, with values users mistype
    "HIERCOLL_MAX_OPS": ["inf", "1e400", "-1", "0", "1", "x", "", "1e3", "nan", "10**9", "2e9"],
    "HIERCOLL_NO_CACHE": ["1", "0", "", "yes"],
    "HIERCOLL_CACHE_DIR": ["", "/nonexistent/deep/dir", "/dev/null", "/proc/self", "."],
}


def split_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading NAME=value words (shell style) are the case's environment."""
    env: dict[str, str] = {}
    i = 0
    while i < len(argv) and re.fullmatch(r"HIERCOLL_[A-Z_]+=.*", argv[i]):
        name, value = argv[i].split("=", 1)
        env[name] = value
        i += 1
    return env, argv[i:]


@contextlib.contextmanager
def _environment(env: dict[str, str]):  # type: ignore[no-untyped-def]
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_cli(argv: list[str], case_timeout: float) -> Outcome:
    from hiercoll.cli.main import main
    err, out = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    o = Outcome(argv, None, "")
    env, argv = split_env(argv)
    try:
        with _time_limit(case_timeout), contextlib.redirect_stderr(err), \
                contextlib.redirect_stdout(out), _environment(env):
            try:
                o.rc = main(argv)
            except SystemExit as exc:       # argparse
                o.rc = exc.code if isinstance(exc.code, int) else 2
    except CaseTimeout:
        o.hang = True
    except Exception as exc:  # noqa: BLE001 - the point: nothing may escape
        o.exc = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        o.traceback = traceback.format_exc()
        last = traceback.extract_tb(exc.__traceback__)[-1]
        o.exc += f" (at {Path(last.filename).name}:{last.lineno})"
        o.known = _known(type(exc).__name__, str(exc))
    o.stderr = err.getvalue()
    o.seconds = time.perf_counter() - t0
    return o


# ---- seeds and mutation ---------------------------------------------------------------------------
def _topology_doc(rng: random.Random) -> dict[str, Any]:
    nodes, gpus = rng.choice([(1, 2), (1, 4), (2, 2), (1, 3), (2, 4), (3, 2)])
    d: dict[str, Any] = {"name": f"fz{nodes}x{gpus}", "num_nodes": nodes, "gpus_per_node": gpus,
                         "gpu": {"name": "T", "hbm_gbps": 3000.0, "num_sms": 100},
                         "intra": {"kind": rng.choice(["nvswitch", "nvswitch", "pcie"]),
                                   "gbps": 300.0, "latency_us": 1.0}}
    if d["intra"]["kind"] == "pcie":
        d["intra"]["bridge_gbps"] = 100.0
    if nodes > 1:
        d["inter"] = {"num_nics": gpus, "nic_gbps": 40.0, "latency_us": 3.0}
    return d


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list) and doc:
        for i in rng_indices(len(doc)):
            out += _paths(doc[i], (*prefix, i))
    return out


def rng_indices(n: int) -> list[int]:
    return sorted({0, n // 2, n - 1})


def _junk(rng: random.Random) -> Any:
    """A fresh copy of a junk value: a shared list or dict put in two places (or mutated later
    inside the document) would make the document refer to itself, or change JUNK itself."""
    return copy.deepcopy(rng.choice(JUNK))


def mutate_doc(doc: Any, rng: random.Random, times: int = 1) -> Any:
    doc = copy.deepcopy(doc)
    for _ in range(times):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            return _junk(rng)
        path = rng.choice(paths)
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        key = path[-1]
        r = rng.random()
        if r < 0.2 and isinstance(parent, dict):
            del parent[key]
        elif r < 0.3 and isinstance(parent, dict):
            parent[key + "_x" if isinstance(key, str) else key] = _junk(rng)
        elif r < 0.5 and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            v = parent[key]
            parent[key] = rng.choice([v + 1, v - 1, -v, v * 1000, 0, v // 2 if isinstance(v, int)
                                      else v / 2, 5e-324, 1e308])
        else:
            parent[key] = _junk(rng)
    return doc


def mutate_text(text: str, rng: random.Random) -> str:
    if not text:
        return text
    i, j = sorted(rng.randrange(len(text) + 1) for _ in range(2))
    r = rng.random()
    if r < 0.3:
        return text[:i] + text[j:]
    if r < 0.5:
        return text[:i]
    if r < 0.7:
        return text[:i] + text[i:j] * 2 + text[j:]
    return text[:i] + rng.choice(["\x00", "{", "]", "\"", ":", "-", "9" * 30, "\n  x: 1"]) + text[i:]


class Fuzzer:
    def __init__(self, seed: int, workdir: Path, case_timeout: float):
        self.rng = random.Random(seed)
        self.dir = workdir
        self.case_timeout = case_timeout
        self.n = 0

    def _file(self, text: str, ext: str) -> str:
        self.n += 1
        path = self.dir / f"f{self.n}.{ext}"
        path.write_text(text)
        return str(path)

    def _topology_arg(self) -> list[str]:
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            preset = rng.choice(["h200x4", "dgx-h100", "pcie-8gpu", "nope", "mi300x"])
            nodes = rng.choice([None, "1", "2", "0", "-1", "x", "1000000"])
            return ["-t", preset] + ([] if nodes is None else ["-n", nodes])
        doc = _topology_doc(rng)
        if r < 0.75:
            doc = mutate_doc(doc, rng, rng.choice([1, 1, 2]))
        ext = rng.choice(["yaml", "json"])
        text = yaml.safe_dump(doc) if ext == "yaml" else json.dumps(doc)
        if rng.random() < 0.1:
            text = mutate_text(text, rng)
        return ["-t", self._file(text, ext)]

    def _splits_arg(self, topo_argv: list[str]) -> list[str]:
        rng = self.rng
        if rng.random() < 0.5:
            return []
        world = 4
        doc: Any = [[{"dst": (s + 1) % world, "count": rng.randint(0, 5)}]
                    for s in range(world)]
        if rng.random() < 0.6:
            doc = mutate_doc(doc, rng)
        return ["--splits", self._file(json.dumps(doc), rng.choice(["json", "yaml"]))]

    def plan_case(self) -> list[str]:
        rng = self.rng
        out = str(self.dir / f"plan{self.n}_{rng.randrange(10**6)}.json")
        argv = ["plan", *self._topology_arg(), "-c", rng.choice(KINDS),
                "-b", rng.choice(SIZES if rng.random() < 0.4 else ["64", "1000", "4KiB", "4096"]),
                "-a", rng.choice(ALGOS), "-o", out]
        if rng.random() < 0.4:
            argv += ["-p", rng.choice(["chunks=2", "chunks=0", "chunks=x", "channels=2",
                                       "channels=99", "bogus=1", "chunks", "=", "chunks=3"])]
        if rng.random() < 0.2:
            argv += ["--dtype", rng.choice(["bf16", "fp16", "fp32", "fp64"])]
        if rng.random() < 0.2:
            argv += ["--reduce-op", rng.choice(["sum", "avg", "max", "min"])]
        if rng.random() < 0.2:
            argv += ["--root", rng.choice(["0", "1", "-1", "99", "x"])]
        if rng.random() < 0.15:
            argv += ["--form", "recipe"]
        if rng.random() < 0.1:
            argv += ["--tuning", self._file(mutate_text('{"entries": []}', rng), "json")]
        argv += self._splits_arg(argv)
        return argv

    def plan_file_case(self) -> list[str]:
        """verify / simulate on a mutated (valid-seeded) plan file."""
        from hiercoll import plan as hc_plan
        from hiercoll.collectives import CollectiveSpec
        from hiercoll.plan_file import save_plan
        from hiercoll.topology import Topology
        rng = self.rng
        topo = Topology.model_validate(_topology_doc(rng))
        kind = rng.choice(["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
        spec = CollectiveSpec(kind=kind, world_size=topo.world_size, dtype="fp32",
                              nbytes=4 * topo.world_size * rng.choice([1, 2, 5]))
        path = self.dir / f"seed{self.n}.json"
        self.n += 1
        algo = "direct" if kind == "all_to_all" else rng.choice(["ring", "direct"])
        save_plan(path, hc_plan(topo, spec, algo), topo,
                  rng.choice(["expanded", "recipe"]))
        doc = json.loads(path.read_text())
        text = (json.dumps(mutate_doc(doc, rng, rng.choice([1, 2]))) if rng.random() < 0.8
                else mutate_text(json.dumps(doc), rng))
        cmd = rng.choice([["verify", "--trials", "1"], ["simulate"]])
        return [*cmd, self._file(text, "json")]

    def autopick_case(self) -> list[str]:
        rng = self.rng
        return ["autopick", *self._topology_arg(), "-c", rng.choice(KINDS[:4]),
                "--sizes", rng.choice(["4KiB:64KiB", "64", "1:0", "x", "4KiB:1MiB:2", "0:0"])]

    def attention_case(self) -> list[str]:
        """A mask file, mutated (empty, huge ranges, junk types): issue 30 found max() of an
        empty mask and a MemoryError for a range up to 2**62."""
        rng = self.rng
        mask = [{"q": [0, 256], "k": [0, 256], "type": "causal"},
                {"q": [256, 512], "k": [0, 512], "type": rng.choice(["full", "bi_causal", "x"])}]
        doc: Any = [] if rng.random() < 0.1 else mutate_doc(mask, rng, rng.randint(0, 2))
        return ["workload", "attention", "--mask", self._file(json.dumps(doc), "json"), "-t",
                "h200x4", "--chunk-size", rng.choice(["64", "0", "-1", "x", "128"])]

    def library_case(self) -> list[str]:
        """autopick with a library table whose rows are mutated (issue 30: a time of -0.0 and a
        size of 0 divided by zero; a row without nbytes was a KeyError)."""
        rng = self.rng
        row = {"algorithm": "nccl", "collective": "all_reduce", "world_size": 4, "mode": "graph",
               "nbytes": 8192, "p50_us": 10.0}
        doc = {"rows": [mutate_doc(row, rng, rng.randint(0, 2)), row | {"nbytes": 1 << 20}]}
        return ["autopick", "-t", "h200x4", "-c", "all_reduce", "--sizes", "64KiB", "--no-cache",
                "-j", "1", "--library-table", self._file(json.dumps(doc), "json")]

    def env_case(self) -> list[str]:
        """A plan, simulate or autopick case under mistyped HIERCOLL_* variables (issue 30:
        HIERCOLL_MAX_OPS=inf or 1e400 was a traceback in any command that plans)."""
        rng = self.rng
        names = rng.sample(sorted(ENV_VALUES), rng.randint(1, len(ENV_VALUES)))
        env = [f"{n}={rng.choice(ENV_VALUES[n])}" for n in names]
        if rng.random() < 0.7:     # a valid command, so the variables are what is tested
            inner = ["plan", "-t", rng.choice(["h200x4", "dgx-h100"]), "-n", rng.choice(["1", "2"]),
                     "-c", rng.choice(KINDS[:4]), "-b", rng.choice(["4KiB", "1MiB"]),
                     "-a", rng.choice(["ring", "direct", "hier", "auto"]),
                     "-o", str(self.dir / f"envplan{self.n}_{rng.randrange(10**6)}.json")]
            if rng.random() < 0.3:
                inner = ["autopick", *inner[1:5], "-c", "all_reduce", "--sizes", "4KiB:64KiB", "-j", "1"]
        else:
            inner = rng.choice([self.plan_case, self.autopick_case])()
        return [*env, *inner]

    def _router_arg(self) -> list[str]:
        """A router file: a valid seed mutated (shapes, junk ids, huge values, bad JSON) or a
        .npy with a wrong dtype, rank or header (issue 30: a header claiming a huge shape and an
        expert id of 2**63 were tracebacks)."""
        rng = self.rng
        world = 8
        ranks = [[[rng.randrange(16) for _ in range(2)] for _ in range(rng.randint(0, 4))]
                 for _ in range(world)]
        for rk in ranks:     # distinct experts per token, as a router gives
            for tok in rk:
                if tok[0] == tok[1]:
                    tok[1] = (tok[0] + 1) % 16
        if rng.random() < 0.6:
            doc: Any = {"topk_idx": ranks}
            if rng.random() < 0.7:
                doc = mutate_doc(doc, rng, rng.randint(1, 2))
            text = json.dumps(doc)
            return ["--router", self._file(mutate_text(text, rng) if rng.random() < 0.1 else text,
                                           "json")]
        import numpy as np
        self.n += 1
        path = self.dir / f"router{self.n}.npy"
        shape = rng.choice([(world, 3, 2), (world, 0, 2), (2, 3, 2), (world, 3), (world, 3, 20)])
        dtype = rng.choice(["int64", "int32", "float64", "uint8"])
        arr = np.random.default_rng(rng.randrange(2**32)).integers(-2, 20, size=shape).astype(dtype)
        np.save(path, arr)
        if rng.random() < 0.2:       # a damaged header or body
            data = bytearray(path.read_bytes())
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            path.write_bytes(bytes(data))
        return ["--router", str(path)]

    def moe_case(self) -> list[str]:
        """`workload moe` with junk arguments, both packings, a router file or the random one."""
        rng = self.rng
        def pick(good: list[str], bad: list[str]) -> str:    # junk one time in ten
            return rng.choice(bad if rng.random() < 0.1 else good)
        argv = ["workload", "moe", "-t", rng.choice(["h200x4", "dgx-h100", "pcie-8gpu"]),
                "-n", pick(["1", "2"], ["0", "x"]),
                "--experts", pick(["16", "32", "64"], ["7", "0", "-8", "x"]),
                "--row-bytes", pick(["64", "1KiB"], ["0", "3", "x", "1TiB"])]
        if rng.random() < 0.4:
            argv += self._router_arg()
        else:
            argv += ["--tokens", pick(["1", "16", "64"], ["0", "-1", "x", "10**9"]),
                     "--topk", pick(["1", "2", "4"], ["0", "99", "-1"])]
            if rng.random() < 0.3:
                argv += ["--drop-prob", pick(["0.5", "1", "0"], ["1.5", "-0.1", "nan", "x"])]
        if rng.random() < 0.5:
            argv += ["--packing", pick(["node", "token"], ["rank"])]
        return argv

    # (share of cases, case): drawn by one uniform number against the running sum
    MIX = (("plan_case", 0.5), ("plan_file_case", 0.27), ("attention_case", 0.05),
           ("library_case", 0.04), ("autopick_case", 0.04), ("env_case", 0.05), ("moe_case", 0.05))

    def next_case(self) -> list[str]:
        r = self.rng.random()
        bounds = itertools.accumulate(share for _, share in self.MIX)
        name = next((n for (n, _), b in zip(self.MIX, bounds) if r < b), self.MIX[-1][0])
        return getattr(self, name)()


def check_accepted(argv: list[str], o: Outcome) -> None:
    """A plan the CLI accepted must execute correctly against the collective's semantics."""
    if argv[0] != "plan" or o.rc != 0:
        return
    out = argv[argv.index("-o") + 1]
    if not Path(out).exists():
        o.wrong_accepted = f"plan exited 0 but wrote no {out}"
        return
    import hiercoll as hc
    from hiercoll.errors import HiercollError, ReferenceTooLarge
    from hiercoll.plan_file import load_plan
    try:
        plan = load_plan(out)
        if plan.schedule.is_library_call:
            return
        if sum(len(plan.schedule.rank_ops(r)) for r in range(plan.schedule.world_size)) > 20000:
            return
        try:
            report = hc.verify(plan.schedule, trials=1)
        except ReferenceTooLarge:          # too large for the reference executor: check only
            report = hc.sim.check(plan.schedule)
    except HiercollError as exc:
        o.wrong_accepted = f"accepted plan does not load: {exc}"
        return
    if not report.ok:
        o.wrong_accepted = f"accepted plan fails verify: {str(report.to_json())[:300]}"


def judge(argv: list[str], case_timeout: float) -> Outcome:
    """One case: the CLI under the time limit, then the accepted plan's check under it too."""
    o = run_cli(argv, case_timeout)
    if not o.hang and o.exc is None:
        env, bare = split_env(argv)
        try:
            with _time_limit(case_timeout), _environment(env):
                check_accepted(bare, o)
        except CaseTimeout:
            o.hang = True
    return o


def failure(o: Outcome) -> tuple[str, str] | None:
    """What is wrong with a case's outcome: (the Summary list it goes to, what), or None."""
    if o.hang:
        return None if o.known else ("hangs", "hang")
    if o.exc is not None:
        return None if o.known else ("tracebacks", f"traceback: {o.exc}")
    if o.rc not in (0, 1, 2):
        return ("bad_rc", f"exit code {o.rc}")
    if o.rc == 2 and len([ln for ln in o.stderr.splitlines() if ln.strip()]) != 1:
        return ("multiline", f"not one line: {o.stderr!r}")
    return ("wrong_accepted", o.wrong_accepted) if o.wrong_accepted else None


def run_cases(cases: int, seed: int, case_timeout: float = 20.0,
              budget_s: float | None = None) -> Summary:
    summary = Summary()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hcfuzz") as tmp:
        fz = Fuzzer(seed, Path(tmp), case_timeout)
        for _ in range(cases):
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                break
            try:
                argv = fz.next_case()
            except Exception as exc:  # noqa: BLE001 - a seed the harness could not build
                raise RuntimeError(f"fuzzer seed failed: {exc}") from exc
            o = judge(argv, case_timeout)
            if o.hang and any(re.search(p, " ".join(argv)) for p in KNOWN_HANGS):
                o.known = True
            summary.cases += 1
            summary.by_rc[str(o.rc)] = summary.by_rc.get(str(o.rc), 0) + 1
            found = failure(o)
            if o.known:
                summary.known.append(o)
            elif found is not None and found[0] != "wrong_accepted":    # that one is below
                getattr(summary, found[0]).append(o)
            if o.wrong_accepted:
                summary.wrong_accepted.append(o)
            elif argv[0] == "plan" and o.rc == 0:
                summary.accepted_verified += 1
    return summary
