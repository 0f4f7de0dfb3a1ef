"""The communicator's parts without processes: size buckets, the LRU of plans, the CPU buffer
pool and the signal arena, op and dtype mapping, the Work handle."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hiercoll.collectives import ReduceOp  # noqa: E402
from hiercoll.errors import HiercollError  # noqa: E402
from hiercoll.torch.buffer_pool import ALIGN, BufferPool, PoolLimit, SlotArena  # noqa: E402
from hiercoll.torch.plan_cache import PlanCache, PlanKey, size_bucket  # noqa: E402
from hiercoll.torch.resolve import dtype_of, reduce_op  # noqa: E402
from hiercoll.torch.work import Work  # noqa: E402


def test_size_buckets_are_powers_of_two_at_least_the_minimum() -> None:
    assert [size_bucket(n, 256) for n in (0, 1, 256, 257, 1000, 1024, 1025)] == \
        [256, 256, 256, 512, 1024, 1024, 2048]
    for n in torch.randint(1, 1 << 24, (20,)).tolist():
        b = size_bucket(n, 1)
        assert b >= n and b & (b - 1) == 0 and b < 2 * n


def test_plan_cache_is_an_lru_that_counts() -> None:
    dropped: list[str] = []
    cache: PlanCache[str] = PlanCache(2, dropped.append)
    keys = [PlanKey("all_reduce", "bf16", "sum", b) for b in (256, 512, 1024)]
    cache.put(keys[0], "a")
    cache.put(keys[1], "b")
    assert cache.get(keys[0]) == "a"          # a is now the most recent
    cache.put(keys[2], "c")                   # evicts b
    assert dropped == ["b"] and keys[1] not in cache and len(cache) == 2
    assert cache.get(keys[1]) is None
    assert (cache.hits, cache.misses, cache.evictions) == (1, 1, 1)
    with pytest.raises(ValueError, match="max_plans"):
        PlanCache(0)


def test_cpu_pool_grows_geometrically_reuses_and_is_bounded() -> None:
    pool = BufferPool(torch.device("cpu"), max_bytes=64 << 20, min_bytes=1 << 20)
    assert pool.reserve(1000) and pool.capacity == 1 << 20 and pool.generation == 1
    assert not pool.reserve(5000)                     # fits: no new allocation
    assert pool.reserve((1 << 20) + 1)                # grows at least twofold
    assert pool.capacity == 2 << 20 and pool.allocations == 2
    t = pool.typed(ALIGN, 10, torch.bfloat16)
    assert t.dtype == torch.bfloat16 and t.numel() == 10
    with pytest.raises(PoolLimit, match="max_pool_bytes"):
        pool.reserve(65 << 20)
    pool.close()
    with pytest.raises(HiercollError, match="closed"):
        pool.reserve(10)


def test_signal_arena_hands_out_aligned_ranges_until_full() -> None:
    pool = BufferPool(torch.device("cpu"), min_bytes=1024)
    pool.reserve(1024)
    arena = SlotArena(pool)
    a, b = arena.take(3), arena.take(70)
    assert a == 0 and b == ALIGN and arena.take(200) is None      # 256 + 512 + 1024 > 1024
    pool.bytes(0, 1024).fill_(7)
    arena.reset()
    assert arena.take(1) == 0 and int(pool.bytes(0, 1024).sum()) == 0


def test_reduce_ops_and_dtypes_map_or_refuse_in_one_line() -> None:
    import torch.distributed as dist
    assert reduce_op(dist.ReduceOp.SUM) == ReduceOp.SUM
    assert reduce_op(dist.ReduceOp.MAX) == ReduceOp.MAX
    assert reduce_op("avg") == ReduceOp.AVG and reduce_op(ReduceOp.MIN) == ReduceOp.MIN
    with pytest.raises(HiercollError, match="op: .* not supported"):
        reduce_op(dist.ReduceOp.PRODUCT)
    assert dtype_of(torch.ones(1, dtype=torch.bfloat16), "x").value == "bf16"
    with pytest.raises(HiercollError, match="x: dtype torch.int32"):
        dtype_of(torch.ones(1, dtype=torch.int32), "x")


def test_a_gloo_work_handle_is_complete() -> None:
    w = Work()
    assert w.wait() and w.is_completed() and w.is_success()


def test_a_symmetric_view_offsets_tensor_bases_and_peer_views_alike() -> None:
    """A pool hands cuda plans views at a byte offset: this rank's tensor, every rank's base and
    the peer views must all point at the same place (checked with a stand-in handle on CPU)."""
    from hiercoll.executor.cuda.symm import SymmetricTensor, SymmetricView, deltas

    class Handle:
        buffer_ptrs = [1 << 20, 5 << 20]

        def __init__(self) -> None:
            self.asked: list[tuple[int, tuple[int, ...], torch.dtype, int]] = []

        def get_buffer(self, rank: int, sizes: tuple[int, ...], dtype: torch.dtype,
                       offset: int) -> torch.Tensor:
            self.asked.append((rank, sizes, dtype, offset))
            return torch.empty(sizes, dtype=dtype)

    raw = torch.arange(4096, dtype=torch.int32).view(torch.uint8)
    handle = Handle()
    parent = SymmetricTensor(raw, handle, list(handle.buffer_ptrs))
    view = SymmetricView(parent, 512, 100, torch.bfloat16)
    assert view.tensor.data_ptr() == raw.data_ptr() + 512 and view.tensor.numel() == 100
    assert view.base_ptrs == [(1 << 20) + 512, (5 << 20) + 512]
    assert deltas(view, 0, 2) == [0, (4 << 20) // 2]
    view.peer_view(1, 10, 7)
    assert handle.asked == [(1, (7,), torch.bfloat16, 256 + 10)]   # in elements of the dtype
    with pytest.raises(HiercollError, match="byte offset"):
        SymmetricView(parent, 2, 4, torch.float32)
