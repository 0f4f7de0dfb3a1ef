"""The CLI: JSON output for scripts, one-line errors with exit 2, never a traceback."""

import json
import subprocess
import sys

import pytest

from hiercoll.cli.main import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_topo_show_json(capsys):
    code, out, _ = run(capsys, "topo", "show", "dgx-h100", "--nodes", "4", "--json")
    data = json.loads(out)
    assert code == 0 and data["world_size"] == 32 and len(data["fingerprint"]) == 16


def test_topo_schema_and_list(capsys):
    code, out, _ = run(capsys, "topo", "schema")
    assert code == 0 and "gpus_per_node" in json.loads(out)["properties"]
    code, out, _ = run(capsys, "topo", "list", "--json")
    assert "mi300x" in json.loads(out)["presets"]


def test_plan_then_verify(tmp_path, capsys):
    plan = tmp_path / "p.json"
    code, out, _ = run(capsys, "plan", "-t", "dgx-h100", "-n", "2", "-c", "all_reduce", "-b", "96KiB",
                       "-a", "two_shot", "-p", "chunks=2", "-o", str(plan), "--json")
    info = json.loads(out)
    assert code == 0 and info["algorithm"] == "two_shot" and info["params"]["chunks"] == 2
    code, out, _ = run(capsys, "verify", str(plan), "--trials", "2", "--json")
    assert code == 0 and json.loads(out)["ok"] is True


def test_verify_in_place_tells_plans_that_may_share_one_tensor(tmp_path, capsys):
    """`--in-place`: a ring all_reduce is right with each rank's output where its input is; a
    direct all_reduce (each rank reduces into its output while peers still read its input) is
    not, named in one line, exit 1."""
    for algo, want in (("ring", 0), ("direct", 1)):
        plan = tmp_path / f"{algo}.json"
        run(capsys, "plan", "-t", "h200x4", "-c", "all_reduce", "-b", "64KiB", "-a", algo,
            "-o", str(plan))
        code, out, _ = run(capsys, "verify", str(plan), "--in-place", "--trials", "1")
        assert code == want, out
        assert ("in place: right" in out) if want == 0 else ("in place: WRONG: race" in out)
        code, out, _ = run(capsys, "verify", str(plan), "--in-place", "--trials", "1", "--json")
        assert (json.loads(out)["in_place_problems"] == []) == (want == 0)


def test_verify_reports_a_wrong_plan(tmp_path, capsys):
    plan = tmp_path / "p.json"
    run(capsys, "plan", "-t", "h200x4", "-c", "all_gather", "-b", "64", "-a", "direct", "-o", str(plan))
    data = json.loads(plan.read_text())
    data["ranks"][2]["ops"].pop()          # rank 2 never sends its shard to its last peer
    plan.write_text(json.dumps(data))
    code, out, _ = run(capsys, "verify", str(plan), "--json")
    assert code == 1 and json.loads(out)["ok"] is False


def test_group_cast_with_splits_file(tmp_path, capsys):
    splits = {"ranks": [
        {"input": [{"size": 3, "peers": [1, 2, 3]}], "output": []},
        {"input": [], "output": [{"size": 3, "peers": [0]}]},
        {"input": [], "output": [{"size": 3, "peers": [0]}]},
        {"input": [{"size": 0, "peers": [0]}], "output": [{"size": 3, "peers": [0]}]},
    ]}
    f = tmp_path / "splits.yaml"
    f.write_text(json.dumps(splits))
    plan = tmp_path / "p.json"
    code, _, err = run(capsys, "plan", "-t", "h200x4", "-c", "group_cast", "--splits", str(f),
                       "-a", "direct", "-o", str(plan))
    assert code == 0, err
    code, _, _ = run(capsys, "verify", str(plan))
    assert code == 0


def test_all_to_all_v_from_a_counts_file(tmp_path, capsys):
    """`--splits` takes {counts: W x W}: it plans and verifies; a bad matrix is one line naming
    the file and the entry, exit 2."""
    f = tmp_path / "counts.yaml"
    f.write_text(json.dumps({"counts": [[0, 1, 2, 3], [4, 0, 5, 6], [7, 8, 0, 9], [1, 2, 3, 0]]}))
    plan = tmp_path / "p.json"
    code, _, err = run(capsys, "plan", "-t", "h200x4", "-c", "group_cast", "--splits", str(f),
                       "-a", "direct", "-o", str(plan))
    assert code == 0, err
    assert run(capsys, "verify", str(plan))[0] == 0
    f.write_text(json.dumps({"counts": [[0, 1, 2, 3], [4, 0, -5, 6], [7, 8, 0, 9], [1, 2, 3, 0]]}))
    code, _, err = run(capsys, "plan", "-t", "h200x4", "-c", "group_cast", "--splits", str(f),
                       "-a", "direct", "-o", str(plan))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and str(f) in lines[0] and "counts[1][2] = -5" in lines[0]


@pytest.mark.parametrize("argv,match", [
    (["topo", "show", "dgx-a100"], "unknown preset|neither a preset"),
    (["plan", "-t", "h200x4", "-c", "all_reduce", "-b", "12XB", "-a", "ring", "-o", "x.json"], "--bytes"),
    (["plan", "-t", "h200x4", "-c", "all_reduce", "-b", "1KiB", "-a", "magic", "-o", "x.json"], "unknown 'magic'"),
    (["plan", "-t", "h200x4", "-c", "all_reduce", "-b", "1KiB", "-a", "ring", "-p", "chunks", "-o", "x.json"], "key=value"),
    (["plan", "-t", "h200x4", "-c", "all_reduce", "-b", "1KiB", "-a", "ring", "-p", "color=3", "-o", "x.json"], "color: unknown field"),
    (["plan", "-t", "h200x4", "-c", "group_cast", "-a", "direct", "-o", "x.json"], "needs a splits file"),
    (["verify", "missing.json"], "cannot read"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    import re
    assert re.search(match, lines[0]), lines[0]


def test_inconsistent_splits_file(tmp_path, capsys):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"ranks": [{"input": [{"size": 2, "peers": [1]}]}, {"output": []}]}))
    code, _, err = run(capsys, "plan", "-t", "small.yaml" if False else "h200x4", "-c", "group_cast",
                       "--splits", str(f), "-a", "direct", "-o", str(tmp_path / "p.json"))
    assert code == 2 and "splits.ranks: 2 entries for world size 4" in err


def test_malformed_plan_file_via_subprocess_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"form": "expanded", "topology": {"num_nodes": 1}')
    proc = subprocess.run([sys.executable, "-m", "hiercoll", "verify", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "not valid JSON" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "hiercoll", "plan", "--topology"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_topology_help_names_every_preset(capsys):
    """--topology's help lists the presets there are (it once named five of nine by hand)."""
    from hiercoll.topology.presets import preset_names
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = "".join(capsys.readouterr().out.split())     # argparse may wrap at a hyphen
    for name in preset_names():
        assert name in text, name


@pytest.mark.parametrize("flag", ["--graph-calls", "--eager-calls"])
def test_bench_refuses_a_sample_of_no_calls_in_one_line(flag, capsys):
    assert main(["bench", "-c", "all_reduce", "-t", "h200x4", "--sizes", "8KiB", flag, "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and "at least 1" in err[0]
