import json

from hiercoll.cli.main import main


def test_simulate_json_trace_and_png(tmp_path, capsys):
    plan = tmp_path / "p.json"
    assert main(["plan", "-t", "dgx-h100", "-n", "2", "-c", "all_reduce", "-b", "8MiB", "-a", "hier",
                 "-o", str(plan)]) == 0
    capsys.readouterr()
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    assert main(["simulate", str(plan), "--json", "--trace", str(trace), "--png", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("time_us", "algbw_gbps", "busbw_gbps", "lower_bound_us", "bytes_intra", "bytes_inter"):
        assert key in out
    assert out["bytes_inter"] == 2 * (2 - 1) * (8 << 20)     # hier all_reduce: 2(N-1)S
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["ph"] == "X" for e in events) and any(e["ph"] == "C" for e in events)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_simulate_table(tmp_path, capsys):
    plan = tmp_path / "p.json"
    main(["plan", "-t", "h200x4", "-c", "reduce_scatter", "-b", "1MiB", "-a", "direct", "-o", str(plan)])
    assert main(["simulate", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "busbw" in out and "busiest links" in out and "of bound" in out


def test_verify_large_plan_uses_static_check(tmp_path, capsys):
    plan = tmp_path / "p.json"
    main(["plan", "-t", "h200x4", "-c", "all_reduce", "-b", "64MiB", "-a", "ring", "-o", str(plan)])
    capsys.readouterr()
    assert main(["verify", str(plan), "--max-memory", "1MiB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)   # too large for 1 MiB: ran as a size-reduced copy
    assert out["ok"] and out["check"]["ok"] and out["reference"]["reduced_by"] > 1
    assert out["skipped"] is None


def test_simulate_reports_progress(tmp_path, capsys):
    """simulate(progress=...) hears (ops ended, ops to run) as it goes, ending at (n, n); the
    CLI shows it as a bar on a terminal's stderr and prints nothing extra elsewhere."""
    import io

    from rich.console import Console

    import hiercoll as hc
    from hiercoll.collectives import CollectiveSpec
    from hiercoll.progress import terminal_bar
    topo = hc.load_topology("dgx-h100", 8)
    spec = CollectiveSpec(kind="all_reduce", world_size=64, dtype="bf16", nbytes=64 << 14)
    sched = hc.plan(topo, spec, "ring", {"chunks": 4})
    seen: list[tuple[int, int]] = []
    res = hc.simulate(sched, topo, mode="exact", progress=lambda done, total: seen.append((done, total)))
    n = sum(len(sched.rank_ops(r)) for r in range(64))
    assert len(seen) >= 3 and seen[-1] == (n, n) == (res.num_ops, res.num_ops)
    assert all(a[0] <= b[0] and a[1] == n for a, b in zip(seen, seen[1:]))
    assert seen[0][0] < n                      # heard before the end, not only at it

    plan = tmp_path / "p.json"
    assert main(["plan", "-t", "dgx-h100", "-n", "8", "-c", "all_reduce", "-b", "1MiB", "-a", "ring",
                 "-p", "chunks=4", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["simulate", str(plan), "--exact"]) == 0
    assert capsys.readouterr().err == ""       # not a terminal: no bar
    screen = io.StringIO()
    with terminal_bar("simulating", console=Console(file=screen, force_terminal=True, width=100)) as report:
        report(5, 10)
    assert "simulating" in screen.getvalue()
    before = io.StringIO()        # before the first report: setting up, not a bar stuck at 0/?
    with terminal_bar("simulating", console=Console(file=before, force_terminal=True, width=100)):
        pass
    assert "simulating: preparing" in before.getvalue()
    quiet = io.StringIO()
    with terminal_bar("simulating", console=Console(file=quiet)) as report:
        report(5, 10)
    assert quiet.getvalue() == ""              # not a terminal: a no-op
