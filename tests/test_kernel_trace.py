"""The in-kernel stamps' reader (executor/cuda/kernel_trace.py) on a record laid out as the
kernel writes it (kernels/abi.py TRACE_*): calls in start order, rows relative to the start,
unwritten records skipped. The kernel's side needs a GPU (bench/gpu/trace_small.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hiercoll.executor.cuda.kernel_trace import err_words, read_traces  # noqa: E402
from hiercoll.kernels.abi import ERR_WORDS, TRACE_CALLS, TRACE_STRIDE, TRACE_WORDS  # noqa: E402


def test_read_traces_orders_calls_and_makes_rows_relative():
    err = torch.zeros(err_words(True), dtype=torch.int64)
    assert err.numel() == ERR_WORDS + TRACE_WORDS and err_words(False) == ERR_WORDS
    for slot, start in ((3, 5000), (1, 1000)):        # epoch % TRACE_CALLS picks the slot
        base = ERR_WORDS + slot * TRACE_STRIDE
        err[base] = start
        for i in range(2):
            for k in range(4):
                err[base + 1 + 4 * i + k] = start + 100 * i + 10 * k
        err[base + TRACE_STRIDE - 1] = start + 400
    calls = read_traces(err, num_rows=2)
    assert [c.start_ns for c in calls] == [1000, 5000]        # start order, not slot order
    assert calls[0].rows == ((0, 10, 20, 30), (100, 110, 120, 130))
    assert all(c.kernel_ns == 400 for c in calls)
    assert len(calls) < TRACE_CALLS                            # empty slots are not calls
