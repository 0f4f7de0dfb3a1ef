"""Issue 15, sections 3 and 4: every bad input is one line `error: ...` and exit 2, never a
traceback; `-o PATH` writes *to* PATH (through symlinks, never replacing a directory, device or
FIFO); the simulation cache is versioned, validated and survives two writers."""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest

import hiercoll as hc
from hiercoll.cli.main import input_problem
from hiercoll.collectives import CollectiveSpec
from hiercoll.errors import HiercollError
from hiercoll.files import output_target, write_atomic
from hiercoll.planner.search.autopick import SimCache
from hiercoll.planner.search.candidates import Candidate
from hiercoll.topology.load import load_topology
from hiercoll.units import MAX_SIZE, parse_size, parse_size_range
from tests.helpers import run_cli as _hc

LONG = "a" * 300     # longer than NAME_MAX (255): ENAMETOOLONG


def _one_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, stderr exactly one line `error: ...` containing every needle."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _topology_dict() -> dict:
    return load_topology("dgx-h100", nodes=2, uncalibrated=True).model_dump(mode="json")


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "p.json"
    proc = _hc("plan", "-t", "h200x4", "-c", "all_reduce", "-b", "1MiB", "-a", "ring", "-o", str(path))
    assert proc.returncode == 0, proc.stderr
    return path


# ---- 1. one line, never a traceback --------------------------------------------------------

def test_non_utf8_files_are_one_line(tmp_path: Path, plan_file: Path) -> None:
    bad_yaml, bad_json = tmp_path / "bad.yaml", tmp_path / "bad.json"
    bad_yaml.write_bytes(b"num_nodes: 2\nname: \xff\xfe\n")
    bad_json.write_bytes(b'{"x": "\xff"}')
    out = str(tmp_path / "o.json")
    _one_line(_hc("topo", "show", str(bad_yaml)), str(bad_yaml), "UTF-8")
    _one_line(_hc("topo", "show", str(bad_json)), str(bad_json), "UTF-8")
    _one_line(_hc("simulate", str(bad_json)), str(bad_json), "UTF-8")                  # plan
    _one_line(_hc("verify", str(bad_json)), str(bad_json), "UTF-8")
    _one_line(_hc("plan", "-t", "h200x4", "-c", "group_cast", "--splits", str(bad_yaml),  # splits
                  "-o", out), str(bad_yaml), "UTF-8")
    _one_line(_hc("plan", "-t", "h200x4", "-c", "all_reduce", "-b", "1MiB", "-a", "auto",  # tuning
                  "--tuning", str(bad_json), "-o", out), str(bad_json), "UTF-8")
    assert not Path(out).exists()


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_deeply_nested_files_are_one_line(tmp_path: Path, suffix: str) -> None:
    deep = tmp_path / f"deep{suffix}"
    deep.write_text("[" * 5000 + "]" * 5000)
    _one_line(_hc("topo", "show", str(deep)), str(deep), "nested too deeply")
    _one_line(_hc("plan", "-t", "h200x4", "-c", "group_cast", "--splits", str(deep),
                  "-o", str(tmp_path / "o.json")), str(deep), "nested too deeply")
    if suffix == ".json":
        _one_line(_hc("simulate", str(deep)), str(deep), "nested too deeply")
        # a topology nested deep inside an otherwise fine mapping
        nested = tmp_path / "nested.json"
        nested.write_text('{"num_nodes": 1, "gpu": ' + "[" * 3000 + "]" * 3000 + "}")
        _one_line(_hc("topo", "show", str(nested)), str(nested))


def test_paths_longer_than_name_max_are_one_line(tmp_path: Path, plan_file: Path) -> None:
    long = str(tmp_path / LONG)
    _one_line(_hc("topo", "show", long), "File name too long")
    _one_line(_hc("simulate", long), "File name too long")
    _one_line(_hc("plan", "-t", "h200x4", "-c", "all_reduce", "-b", "1MiB", "-a", "ring",
                  "-o", long), long, "File name too long")
    _one_line(_hc("simulate", str(plan_file), "--trace", long), "File name too long")
    # a name that fits, but would not with the temp file's prefix and suffix around it
    fits = tmp_path / ("b" * 250)
    write_atomic(fits, "x")
    assert fits.read_text() == "x"


def test_sizes_are_parsed_exactly_with_integers(tmp_path: Path) -> None:
    assert parse_size("9007199254740993") == 2**53 + 1
    assert parse_size("1.5KiB") == 1536 and parse_size("0.5KB") == 500 and parse_size(" 12 kib ") == 12288
    assert parse_size(str(MAX_SIZE)) == MAX_SIZE
    for bad in ["1.3", "1e3", "0x10", "-5", "١٢", str(MAX_SIZE + 1), "9" * 400, "99999999TiB", "nan",
                "inf", ""]:
        with pytest.raises(HiercollError):
            parse_size(bad)
    with pytest.raises(HiercollError):
        parse_size(True)  # type: ignore[arg-type]
    # 2**53 + 1 bytes: refused for bf16 quoting the exact count, not silently rounded to 2**53
    _one_line(_hc("plan", "-t", "h200x4", "-c", "all_reduce", "-b", "9007199254740993", "-a", "ring",
                  "-o", str(tmp_path / "x.json")), "9007199254740993")
    # 2**56 + 8 is not a float; as an integer it plans exactly
    exact = 2**56 + 8
    assert float(exact) != exact
    out = tmp_path / "big.json"
    proc = _hc("plan", "-t", "h200x4", "-c", "all_reduce", "-b", str(exact), "-a", "ring",
               "--form", "recipe", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["meta"]["spec"]["nbytes"] == exact
    _one_line(_hc("plan", "-t", "h200x4", "-c", "all_reduce", "-b", "99999999999TiB", "-a", "ring",
                  "-o", str(out)), "too large")


@pytest.mark.parametrize("sizes", [",", " , ,", "4KiB:1MiB:0", "4KiB:1MiB:1", "4KiB:1MiB:-2",
                                   "4KiB:1MiB:2.5", "4KiB:1MiB:x", "4KiB:1MiB:", "1MiB:4KiB"])
def test_bad_size_lists_and_factors(sizes: str) -> None:
    with pytest.raises(HiercollError):
        parse_size_range(sizes)


def test_bad_size_lists_on_the_cli() -> None:
    _one_line(_hc("autopick", "-t", "h200x4", "-c", "all_reduce", "--sizes", ","), "--sizes")
    _one_line(_hc("autopick", "-t", "h200x4", "-c", "all_reduce", "--sizes", "4KiB:1MiB:-2"),
              "FACTOR")
    assert parse_size_range("1KiB:16KiB:4") == [1024, 4096, 16384]


def test_verify_seed_and_trials_refused(plan_file: Path) -> None:
    _one_line(_hc("verify", str(plan_file), "--seed", "-1"), "--seed")
    _one_line(_hc("verify", str(plan_file), "--trials", "0"), "--trials")
    _one_line(_hc("verify", str(plan_file), "--trials", "-1"), "--trials")
    _one_line(_hc("topo", "show", "dgx-h100", "--nodes", "0"), "--nodes")
    _one_line(_hc("run", str(plan_file), "--timeout", "nan"), "--timeout", "finite")
    assert _hc("verify", str(plan_file), "--seed", "0", "--trials", "1").returncode == 0


@pytest.mark.parametrize("where,value", [
    (("inter", "latency_us"), math.inf), (("intra", "latency_us"), math.inf),
    (("intra", "gbps"), math.nan), (("gpu", "hbm_gbps"), math.inf), (("costs", "launch_us"), math.inf),
    (("num_nodes",), True), (("num_nodes",), "2"), (("gpus_per_node",), 8.0),
    (("inter", "num_nics"), "8"), (("gpu", "num_sms"), True), (("inter", "nic_gbps"), "50"),
    (("shared_gpu",), "yes"), (("schema_version",), True), (("inter", "nic_affinity"), [0, 1, 2, 3, 4, 5, 6, True]),
])
def test_topology_values_strict_and_finite(tmp_path: Path, where: tuple[str, ...], value: object) -> None:
    data = _topology_dict()
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))        # json writes inf/nan as Infinity/NaN, which it reads
    _one_line(_hc("topo", "show", str(path)), str(path), ".".join(where))


def test_topology_yaml_inf_and_int_floats(tmp_path: Path) -> None:
    text = ("num_nodes: 1\ngpus_per_node: 4\ngpu: {name: X, hbm_gbps: 3000, num_sms: 100}\n"
            "intra: {kind: nvswitch, gbps: 300, latency_us: LAT}\n")
    ok = tmp_path / "ok.yaml"
    ok.write_text(text.replace("LAT", "1"))       # floats may be written as ints
    assert hc.load_topology(str(ok)).intra.latency_us == 1.0
    inf = tmp_path / "inf.yaml"
    inf.write_text(text.replace("LAT", ".inf"))
    _one_line(_hc("topo", "show", str(inf)), "intra.latency_us", "finite")


def test_duplicate_keys_refused(tmp_path: Path) -> None:
    yml = tmp_path / "dup.yaml"
    yml.write_text("num_nodes: 1\ngpus_per_node: 4\ngpus_per_node: 8\n")
    _one_line(_hc("topo", "show", str(yml)), str(yml), "gpus_per_node", "twice", "line 3")
    nested = tmp_path / "dup2.yaml"
    nested.write_text("num_nodes: 1\nintra:\n  gbps: 1\n  gbps: 2\n")
    _one_line(_hc("topo", "show", str(nested)), "gbps", "twice")
    js = tmp_path / "dup.json"
    js.write_text('{"num_nodes": 1, "num_nodes": 2}')
    _one_line(_hc("topo", "show", str(js)), "num_nodes", "twice")
    # a merge key's values may be overridden: that is not a duplicate
    merged = tmp_path / "merge.yaml"
    merged.write_text("base: &g {name: X, hbm_gbps: 3000, num_sms: 100}\nnum_nodes: 1\n"
                      "gpus_per_node: 4\ngpu:\n  <<: *g\n  num_sms: 132\n"
                      "intra: {kind: nvswitch, gbps: 300, latency_us: 1}\n")
    _one_line(_hc("topo", "show", str(merged)), "base", "unknown field")   # got past the loader


def test_deep_param_value_is_one_line(tmp_path: Path) -> None:
    _one_line(_hc("plan", "-t", "h200x4", "-c", "all_reduce", "-b", "1MiB", "-a", "ring",
                  "-p", "chunks=" + "[" * 5000, "-o", str(tmp_path / "p.json")), "--param", "chunks")


def test_real_bugs_keep_their_traceback() -> None:
    assert input_problem(ValueError("x")) is None
    assert input_problem(OSError("no file involved")) is None
    try:
        def recurse(n: int) -> int:
            return recurse(n + 1) + 1
        recurse(0)
    except RecursionError as exc:
        assert input_problem(exc) is None
    try:
        b"\xff".decode()
    except UnicodeDecodeError as exc:
        assert input_problem(exc) is None
    assert input_problem(FileNotFoundError(2, "No such file or directory", "x.json")) == \
        "x.json: No such file or directory"


# ---- 2. files: -o PATH writes to PATH -------------------------------------------------------

def _plan_to(path: str) -> subprocess.CompletedProcess[str]:
    return _hc("plan", "-t", "h200x4", "-c", "all_reduce", "-b", "1MiB", "-a", "ring", "-o", path)


def test_output_paths_that_are_not_files(tmp_path: Path, plan_file: Path) -> None:
    d = tmp_path / "somedir"
    d.mkdir()
    fifo = tmp_path / "fifo"         # stands in for /dev/full: exists, is not a regular file
    os.mkfifo(fifo)
    for bad in (f"{d}/", str(d), str(fifo), "", f"{tmp_path}/nodir/"):
        _one_line(_plan_to(bad))
    _one_line(_hc("simulate", str(plan_file), "--png", str(d)), str(d), "directory")
    _one_line(_hc("simulate", str(plan_file), "--trace", str(d)), str(d), "directory")
    _one_line(_hc("simulate", str(plan_file), "--trace", str(fifo)), str(fifo), "regular file")
    # every command's output-file flags are checked before any work
    _one_line(_hc("autopick", "-t", "h200x4", "-c", "all_reduce", "--sizes", "4KiB:1GiB", "-o", f"{d}/"),
              "directory")
    _one_line(_hc("compare", str(plan_file), "-t", "h200x4", "--md", str(d)), "directory")
    _one_line(_hc("run", str(plan_file), "--profile", str(fifo)), "regular file")
    # a path under a regular file: unwritable
    _one_line(_plan_to(str(plan_file / "x.json")), "cannot write")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and d.is_dir() and list(d.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "somedir"]   # no temp left


def test_unwritable_directory(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        _one_line(_plan_to(str(ro / "p.json")), str(ro / "p.json"), "cannot write")
    finally:
        ro.chmod(0o700)


def test_writes_through_symlinks(tmp_path: Path) -> None:
    real = tmp_path / "real" / "plan.json"
    real.parent.mkdir()
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.json"
    os.symlink(real, link)
    assert _plan_to(str(link)).returncode == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text())["meta"]["spec"]["kind"] == "all_reduce"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640          # the file's mode is kept
    assert sorted(p.name for p in real.parent.iterdir()) == ["plan.json"]  # temp went beside it
    # a dangling link: its target is created
    dangling = tmp_path / "dangling.json"
    os.symlink(tmp_path / "real" / "new.json", dangling)
    write_atomic(dangling, "{}")
    assert dangling.is_symlink() and (tmp_path / "real" / "new.json").read_text() == "{}"
    # a chain of links
    chain = tmp_path / "chain.json"
    os.symlink(link, chain)
    write_atomic(chain, b"bytes")
    assert chain.is_symlink() and link.is_symlink() and real.read_bytes() == b"bytes"
    # links to what is not a regular file are refused, the thing untouched
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    to_fifo, to_dir = tmp_path / "to_fifo", tmp_path / "to_dir"
    os.symlink(fifo, to_fifo)
    os.symlink(real.parent, to_dir)
    _one_line(_plan_to(str(to_fifo)), "regular file")
    _one_line(_plan_to(str(to_dir)), "directory")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and to_fifo.is_symlink() and to_dir.is_symlink()
    # a loop
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    with pytest.raises(OSError):
        output_target(loop)


def test_regular_files_are_replaced_atomically(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")
    inode = target.stat().st_ino
    write_atomic(target, "new")
    assert target.read_text() == "new" and target.stat().st_ino != inode    # a rename, not in place
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
    write_atomic(tmp_path / "a" / "b" / "c.txt", "x")                      # parents made
    assert (tmp_path / "a" / "b" / "c.txt").read_text() == "x"


# ---- 3. the simulation cache ----------------------------------------------------------------

def _key() -> str:
    topo = hc.load_topology("h200x4")
    spec = CollectiveSpec(kind="all_reduce", world_size=topo.world_size, dtype="bf16", nbytes=1 << 20)
    return SimCache.key(topo, spec, Candidate("ring", {"chunks": 1}))


def test_cache_key_carries_the_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _key()
    monkeypatch.setattr(SimCache, "MODEL_VERSION", SimCache.MODEL_VERSION + 1)
    bumped = _key()
    monkeypatch.undo()
    monkeypatch.setattr(hc, "__version__", "0.0.0-other")
    assert len({before, bumped, _key()}) == 3


@pytest.mark.parametrize("content", [
    b"[]", b'"x"', b"null", b'{"k": "x"}', b'{"k": [1, 2]}', b'{"k": [1, true, 3]}',
    b'{"k": [1, NaN, 3]}', b'{"k": {"a": 1}}', b"\xff\xfe", b"{", b"[" * 5000 + b"]" * 5000, b"",
])
def test_cache_of_the_wrong_shape_is_empty(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "sim-cache.json"
    path.write_bytes(content)
    cache = SimCache(path)
    assert cache.get("k") is None
    cache.put("k2", [1.0, 2.0, 3.0])
    cache.save()
    assert json.loads(path.read_text()) == {"k2": [1.0, 2.0, 3.0]}


def test_cache_keeps_good_entries_beside_bad(tmp_path: Path) -> None:
    path = tmp_path / "sim-cache.json"
    path.write_text(json.dumps({"good": [1, 2.5, 3], "bad": [1, 2], "worse": None}))
    cache = SimCache(path)
    assert cache.get("good") == [1.0, 2.5, 3.0] and cache.get("bad") is None


def test_cache_merges_two_writers(tmp_path: Path) -> None:
    path = tmp_path / "sim-cache.json"
    a, b = SimCache(path), SimCache(path)
    a.put("a", [1.0, 1.0, 1.0])
    b.put("b", [2.0, 2.0, 2.0])
    a.save()
    b.save()
    assert json.loads(path.read_text()) == {"a": [1.0, 1.0, 1.0], "b": [2.0, 2.0, 2.0]}


def test_cache_never_corrupt_under_concurrent_writers(tmp_path: Path) -> None:
    path = tmp_path / "sim-cache.json"
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(i: int) -> None:
        try:
            for j in range(40):
                c = SimCache(path)
                c.put(f"{i}-{j}", [float(i), float(j), 1.0])
                c.save()
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    def reader() -> None:
        while not stop.is_set():
            if path.exists():
                try:
                    json.loads(path.read_text())
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)
                    return

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    watch = threading.Thread(target=reader)
    watch.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watch.join()
    assert errors == []
    data = json.loads(path.read_text())
    assert all(SimCache._valid(v) for v in data.values()) and len(data) >= 40
    assert [p.name for p in tmp_path.iterdir()] == ["sim-cache.json"]


def test_unwritable_cache_is_only_slower(tmp_path: Path) -> None:
    d = tmp_path / "cache-is-a-dir"
    d.mkdir()
    cache = SimCache(d)
    cache.put("k", [1.0, 2.0, 3.0])
    cache.save()                     # no exception: the run goes on without a cache
    assert d.is_dir()
