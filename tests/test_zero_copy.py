"""Zero-copy calls on `Communicator.empty` tensors: which plans may run with one tensor as input
and output (in place), and the row table rebased onto the caller's memory.

The in-place rule is checked twice, independently: statically (sim.check.in_place_problems on
the schedule the kernels run) and by the weak-memory emulator running the lowered program with
each rank's output cells being its input cells. They must agree both ways: a plan called safe
must emulate right, and plans called unsafe must be caught by the emulator (else the emulator
could not tell)."""

from __future__ import annotations

import pytest
from helpers import bf16_spec, check_emulation, h200_topology, lowering_cases

from hiercoll.errors import VerificationError
from hiercoll.executor.cuda.lowering import CudaOptions, lower, runs_in_place
from hiercoll.executor.cuda.table import Moved, encode
from hiercoll.kernels.abi import F_DST, F_SRC, ROW_WORDS
from hiercoll.planner import plan
from hiercoll.schedule import INPUT, OUTPUT
from hiercoll.sim.check import in_place_problems

# the options that change what the kernels run: LL (default, small sizes), the copy engine,
# one CTA, the simple protocol (forwarded pulls)
OPTIONS = (CudaOptions(ctas=3), CudaOptions(ctas=2, ce_threshold_bytes=64),
           CudaOptions(ctas=2, protocol="simple"))
CASES = [c for c in lowering_cases(((1, 4), (2, 2))) if c[2] in ("all_reduce", "all_to_all")]


@pytest.mark.parametrize(("nodes", "gpus", "kind", "algo"), CASES)
def test_in_place_verdict_agrees_with_the_emulator(nodes, gpus, kind, algo):
    s = plan(h200_topology(nodes, gpus), bf16_spec(kind, nodes * gpus), algo).expand()
    for seed, opts in enumerate(OPTIONS):
        if runs_in_place(s, opts):
            check_emulation(s, opts, seed, in_place=True)
        else:      # a race shows on some interleavings: one of a few seeds must hit it
            assert not all(_emulates_right(s, opts, 10 * seed + k) for k in range(8))


def _emulates_right(s, opts, seed):
    try:
        check_emulation(s, opts, seed, in_place=True)
    except (AssertionError, VerificationError):
        return False
    return True


def test_the_verdict_is_on_what_the_kernels_run_not_on_the_plan():
    """`rd` as planned is safe in place; forwarded (the simple protocol pulls the peer's input
    when reducing instead of receiving a copy first) it is not: the peer may already have
    overwritten that input with its result."""
    s = plan(h200_topology(1, 2), bf16_spec("all_reduce", 2), "rd").expand()
    assert in_place_problems(s) == []
    assert not runs_in_place(s, CudaOptions(ctas=2, protocol="simple"))
    assert runs_in_place(s, CudaOptions(ctas=2, protocol="simple", forward=False))


def test_plans_whose_sizes_differ_are_refused_in_one_line():
    s = plan(h200_topology(1, 4), bf16_spec("reduce_scatter", 4), "ring").expand()
    (line,) = in_place_problems(s)
    assert "input 148 and output 37 elements differ" in line


def test_moved_regions_encode_to_the_callers_memory():
    """Rows that touch the input or output address the caller's allocation (its per-rank
    deltas); scratch stays in the plan's data allocation."""
    s = plan(h200_topology(1, 2), bf16_spec("all_reduce", 2, 4096), "ring").expand()
    prog = lower(s, 0, CudaOptions(ctas=1, protocol="simple", forward=False))
    lay = prog.layout
    data_delta = [0, 100_000]
    moved_in = Moved(lay.offsets[INPUT], lay.sizes[INPUT], (-50_000, 70_000))
    moved_out = Moved(lay.offsets[OUTPUT], lay.sizes[OUTPUT], (-40_000, 90_000))
    plain = encode(prog, data_delta, [0, 7])
    table = encode(prog, data_delta, [0, 7], (moved_in, moved_out))
    seen = set()
    rows = [r for x in ([y for v in prog.streams.values() for y in v] + [prog.end_barrier])
            for r in x.rows]
    for i, row in enumerate(rows):
        w = table.words[i * ROW_WORDS:(i + 1) * ROW_WORDS]
        p = plain.words[i * ROW_WORDS:(i + 1) * ROW_WORDS]
        for addr, got, was in ([(row.dst, w[F_DST], p[F_DST])] if row.dst else []) + [
                (a, table.words[w[F_SRC] + k], plain.words[p[F_SRC] + k])
                for k, a in enumerate(row.srcs)]:
            assert was == data_delta[addr.rank] + addr.offset
            for m, name in ((moved_in, INPUT), (moved_out, OUTPUT)):
                if m.start <= addr.offset < m.start + m.size:
                    assert got == m.delta[addr.rank] + addr.offset - m.start
                    seen.add(name)
                    break
            else:
                assert got == was
                seen.add("scratch")
    assert seen == {INPUT, OUTPUT, "scratch"}


def test_ll_programs_keep_their_own_zero_copy():
    s = plan(h200_topology(1, 2), bf16_spec("all_reduce", 2), "direct").expand()
    prog = lower(s, 0, CudaOptions(ctas=3))
    assert prog.ll_half
    with pytest.raises(AssertionError, match="by tag"):
        encode(prog, [0, 1], [0, 1], (Moved(0, 1, (0, 0)),))


def test_the_library_substitution_counts_copies_only_where_a_call_makes_them():
    """The communicator gives a plan's call to NCCL where the plan wins by less than its copies
    (torch/staging.py); a call on comm.empty tensors makes none, unless one tensor is input and
    output and the kernels are not safe in place."""
    pytest.importorskip("torch")
    from hiercoll.torch.communicator import Communicator
    simple = CudaOptions(protocol="simple")
    spec = bf16_spec("all_reduce", 4, 1 << 20)
    ring = plan(h200_topology(1, 4), spec, "ring").expand()
    direct = plan(h200_topology(1, 4), spec, "direct").expand()
    assert Communicator._copies_nothing(ring, simple, placed=True, in_place=True)
    assert not Communicator._copies_nothing(direct, simple, placed=True, in_place=True)
    assert Communicator._copies_nothing(direct, simple, placed=True, in_place=False)
    assert not Communicator._copies_nothing(ring, simple, placed=False, in_place=False)
    assert Communicator._copies_nothing(direct, CudaOptions(), placed=False, in_place=False) \
        == (lower(direct, 0, CudaOptions()).ll_half > 0)


def test_the_overhead_bench_replots_its_committed_json(tmp_path):
    """`bench/comm_overhead.py --replot` draws the PNG of a committed run without a GPU."""
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    pytest.importorskip("matplotlib")
    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "comm_overhead.json"
    shutil.copy(root / "bench/results/gpu/zero-copy-w4/comm_overhead.json", src)
    proc = subprocess.run([sys.executable, str(root / "bench/comm_overhead.py"), "--replot",
                           str(src)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    png = src.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(src.read_text())["rows"][3]["empty_path"] == "rebased"


def test_rebased_copy_engine_copies_move_the_callers_memory(monkeypatch):
    """`backend.rebased` on a program with copy-engine copies: a copy from or to the input or
    output region moves the caller's tensors (their peer views), scratch stays in the plan's
    data, and the row table is re-encoded with the moved regions. CPU: the slabs of the
    one-GPU cluster stand in for symmetric memory; kernel binding is stubbed."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from hiercoll.executor.cuda import backend
    from hiercoll.executor.cuda.lowering import CopyLaunch
    from hiercoll.executor.cuda.one_gpu import slabs
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: SimpleNamespace())
    monkeypatch.setattr(backend, "_bind", lambda prepared: None)
    s = plan(h200_topology(1, 4), bf16_spec("all_gather", 4, 1 << 20), "ring").expand()
    opts = CudaOptions(ce_threshold_bytes=1024, protocol="simple", forward=False)
    prog = lower(s, 0, opts)
    copies = [x for v in prog.streams.values() for x in v if isinstance(x, CopyLaunch)]
    assert copies, "the plan has copy-engine copies at this threshold"
    dev = torch.device("cpu")
    data = slabs(4, prog.layout.total, torch.bfloat16, dev)
    sigs = slabs(4, prog.num_slots, torch.int32, dev)
    base = backend.build_prepared(s, prog, data[0], sigs[0], 4, opts, dev)
    n_in, n_out = s.spec.input_count(0), s.spec.output_count(0)
    src, dst = slabs(4, n_in, torch.bfloat16, dev), slabs(4, n_out, torch.bfloat16, dev)
    twin = backend.rebased(base, src[0], dst[0])
    assert twin is not None and twin.kernel.epoch is base.kernel.epoch
    assert twin.input_view.data_ptr() == src[0].tensor.data_ptr()
    assert twin.output_view.data_ptr() == dst[0].tensor.data_ptr()
    lay = prog.layout
    moved = 0
    for item in copies:
        got = twin.copies[id(item)]
        for addr, view in ((item.src, got.src), (item.dst, got.dst)):
            for name, user in ((INPUT, src), (OUTPUT, dst)):
                start = lay.offsets[name]
                if start <= addr.offset < start + lay.sizes[name]:
                    want = user[0].peer_view(addr.rank, addr.offset - start, item.count)
                    moved += 1
                    break
            else:
                want = data[0].peer_view(addr.rank, addr.offset, item.count)
            assert view.data_ptr() == want.data_ptr() and view.numel() == item.count
    assert moved and twin.table.words != base.table.words
    # a placement off the 16-byte grid (the rows' vector width assumes it) is not rebased
    odd = SimpleNamespace(base_ptrs=[b + 2 for b in src[0].base_ptrs], tensor=src[0].tensor,
                          peer_view=src[0].peer_view)
    assert backend.rebased(base, odd, None) is None
    # nor an LL program: it runs on any tensor already (its own and peers' areas by tag)
    ll = plan(h200_topology(1, 4), bf16_spec("all_reduce", 4, 8192), "direct").expand()
    ll_prog = lower(ll, 0, CudaOptions())
    assert ll_prog.ll_half
    ll_base = backend.build_prepared(ll, ll_prog, slabs(4, ll_prog.layout.total, torch.bfloat16,
                                                        dev)[0],
                                     slabs(4, ll_prog.num_slots, torch.int32, dev)[0], 4,
                                     CudaOptions(), dev)
    assert backend.rebased(ll_base, src[0], src[0]) is None


def test_the_communicator_rebases_a_plan_once_per_placement_and_only_where_it_may(monkeypatch):
    """`Communicator._on_user_memory` on fakes (no GPU): one tensor as input and output is
    rebased only where the kernels are safe in place; overlapping distinct tensors copy; a
    placement's twin is made once and reused while its plan stands, made again for a new
    prepared plan (the pool grew)."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from hiercoll.executor.cuda import backend
    from hiercoll.torch.communicator import Communicator
    made: list[tuple] = []

    def fake_rebased(prepared, at_in, at_out):  # type: ignore[no-untyped-def]
        made.append((prepared, at_in, at_out))
        return ("twin", len(made))
    monkeypatch.setattr(backend, "rebased", fake_rebased)
    comm = SimpleNamespace(_rebased={})
    t = torch.zeros(64)
    at = SimpleNamespace(parent=object(), byte_offset=0)

    def call(prepared, inp, out, a_in=at, a_out=at):  # type: ignore[no-untyped-def]
        entry = SimpleNamespace(key="k", prepared=prepared)
        return Communicator._on_user_memory(comm, entry, inp, out, a_in, a_out)  # type: ignore[arg-type]
    unsafe, safe = SimpleNamespace(in_place_ok=False), SimpleNamespace(in_place_ok=True)
    assert call(unsafe, t, t) is None and made == []
    assert call(safe, t[:40], t[20:], a_out=SimpleNamespace(parent=at.parent, byte_offset=80)) \
        is None and made == []
    assert call(safe, t, t) == ("twin", 1) and call(safe, t, t) == ("twin", 1)
    assert call(SimpleNamespace(in_place_ok=True), t, t) == ("twin", 2)    # a new prepared plan
    assert call(safe, t, t, None, None) is None and len(made) == 2
