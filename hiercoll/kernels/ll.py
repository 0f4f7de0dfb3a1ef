"""The LL kernel: walks an LL program's rows (ll_protocol.py says which plans and why).

Everything moves as 32-bit data words (two bf16/fp16 elements, or one fp32). A push stores each
word with the call's epoch in its high half as one 8-byte store into the receiver's LL area
(relaxed, system scope: the word is single-copy atomic, so a reader that sees the epoch sees the
data that came with it; nothing else needs ordering, so there is no release). A reader loads its
own LL words (relaxed, system scope) until every one carries the epoch: that load is the wait,
and no acquire fence is needed because the data it reads is the word it checked. Plain sources
(the input) are read as words too, unpacked to fp32, reduced in row order (the simple kernel's
arithmetic, so ranks agree bit for bit), packed and stored.

Rows run in the order the lowering gives (by dependency level); a row that reads an earlier
row's local result reads the same words of it, so the same CTA computed them (a CTA barrier
between rows). Each CTA keeps its own call counter (`epoch_ptr[1 + pid]`): CTAs of one launch never wait for
each other, so there is no point at which one could publish a shared counter safely; every CTA
runs every call, so the counters agree. The LL area is double-buffered by the epoch's parity.
"""

# no `from __future__ import annotations`: Triton reads `in_delta: tl.int64` as a type only
# when the annotation is the dtype object itself
import triton
import triton.language as tl

from hiercoll.kernels import abi as _t
from hiercoll.kernels.rows import F_ACC, F_COUNT, F_DST, F_NSRC, F_REDUCE, F_SCALE, F_SRC, ROW_WORDS, combine

F_LL = tl.constexpr(_t.F_LL)
TAG_SHIFT = tl.constexpr(_t.TAG_SHIFT)
TAG_MASK = tl.constexpr((1 << _t.TAG_SHIFT) - 1)
TAG_INPUT = tl.constexpr(_t.TAG_INPUT)
TAG_OUTPUT = tl.constexpr(_t.TAG_OUTPUT)

BLOCK_WORDS = _t.LL_STEP_WORDS    # data words one CTA moves per step of a row
SOURCES = 8              # a reduce's sources polled and loaded together ([SOURCES, BLOCK_WORDS])
FORMATS = {4: 0, "bf16": 1, "fp16": 2}     # FMT: how a word holds elements


@triton.jit
def _store_word(ptrs, v, live, PTX: tl.constexpr):
    """One 8-byte store per lane at system scope (relaxed): data and epoch land together."""
    if PTX:
        tl.inline_asm_elementwise(
            "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $3, 0;\n\t"
            "@p st.relaxed.sys.global.b64 [$1], $2;\n\tmov.b32 $0, 0;\n\t}", "=r,l,l,r",
            [ptrs, v, live.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.atomic_xchg(ptrs, v, mask=live, sem="relaxed", scope="sys")


@triton.jit
def _load_word(ptrs, live, PTX: tl.constexpr):
    """One 8-byte load per live lane at system scope (relaxed); dead lanes read 0."""
    if PTX:
        return tl.inline_asm_elementwise(
            "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $2, 0;\n\tmov.b64 $0, 0;\n\t"
            "@p ld.relaxed.sys.global.b64 $0, [$1];\n\t}", "=l,l,r",
            [ptrs, live.to(tl.int32)], dtype=tl.int64, is_pure=False, pack=1)
    else:
        return tl.where(live, tl.atomic_add(ptrs, 0, mask=live, sem="relaxed", scope="sys"), 0)


@triton.jit
def poll_words(ptrs, live, want, spin_limit, PTX: tl.constexpr):
    """Every live lane's 8-byte LL word, once each carries `want` (its high half). All lanes
    load at once (one round trip however many sources), then only the short ones again. With a
    spin limit, gives up after that many polls: the lanes still short come back set (the caller
    records what it waited for)."""
    v = _load_word(ptrs, live, PTX)
    short = live & ((v >> 32).to(tl.int32) != want)
    pending = tl.sum(tl.sum(short.to(tl.int32), axis=1), axis=0)
    spins = 0
    while pending > 0:
        v = tl.where(short, _load_word(ptrs, short, PTX), v)
        short = live & ((v >> 32).to(tl.int32) != want)
        pending = tl.sum(tl.sum(short.to(tl.int32), axis=1), axis=0)
        spins += 1
        if spin_limit > 0:
            if spins > spin_limit:
                pending = 0
    return v, short


@triton.jit
def _poll_ll(ptrs, live, want, spin_limit, err_ptr, row, PTX: tl.constexpr):
    """`poll_words`; giving up records the row in the error record (wait index -1: an LL
    word)."""
    v, short = poll_words(ptrs, live, want, spin_limit, PTX)
    if spin_limit > 0:
        if tl.sum(tl.sum(short.to(tl.int32), axis=1), axis=0) > 0:
            low = tl.min(tl.min(tl.where(short, (v >> 32).to(tl.int32), 2**31 - 1), axis=1),
                         axis=0)
            tl.atomic_xchg(err_ptr + 1, tl.cast(row, tl.int64))
            tl.atomic_xchg(err_ptr + 2, tl.cast(-1, tl.int64))
            tl.atomic_xchg(err_ptr + 3, low.to(tl.int64))
            tl.atomic_xchg(err_ptr + 4, tl.max(tl.max(want, axis=1), axis=0).to(tl.int64))
            tl.atomic_xchg(err_ptr + 0, 1)
    return v


@triton.jit
def _unpack(w, FMT: tl.constexpr):
    """A data word's (first, second) elements in fp32 (fp32 words: the element twice)."""
    if FMT == 1:
        return (w << 16).to(tl.float32, bitcast=True), (w & -65536).to(tl.float32, bitcast=True)
    elif FMT == 2:
        lo = (w & 65535).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        return lo, hi
    else:
        x = w.to(tl.float32, bitcast=True)
        return x, x


@triton.jit
def _half_bits(x, FMT: tl.constexpr):
    """An fp32 value rounded (to nearest even) to the 16-bit data type, as its 16 bits."""
    if FMT == 1:
        h = x.to(tl.bfloat16)
    else:
        h = x.to(tl.float16)
    return h.to(tl.int16, bitcast=True).to(tl.int32) & 65535


@triton.jit
def _pack(lo, hi, FMT: tl.constexpr):
    """fp32 element(s) rounded to the data type (to nearest even) and packed into a word."""
    if FMT == 0:
        return lo.to(tl.int32, bitcast=True)
    else:
        return _half_bits(lo, FMT) | (_half_bits(hi, FMT) << 16)


@triton.jit
def _plain(off, in_delta, out_delta):
    """A plain address's element offset from the data allocation: own input/output addresses
    are tagged offsets into that buffer (abi.TAG_*), based where this call's buffer is."""
    tag = off >> TAG_SHIFT
    base = off & TAG_MASK
    return base + tl.where(tag == TAG_INPUT, in_delta, tl.where(tag == TAG_OUTPUT, out_delta, 0))


@triton.jit
def _sources(table, sstart, k0, nsrc, llmask, words, area, offs, mask, want, spin_limit, err_ptr,
             row, in_delta, out_delta, NS: tl.constexpr, EPW: tl.constexpr, PTX: tl.constexpr):
    """Sources k0 .. k0 + NS - 1 of a row, this step's data words as [NS, BLOCKW] (dead sources
    read 0): LL sources polled until they carry the epoch, plain ones (the rank's input) loaded;
    every source's loads go out together."""
    k = k0 + tl.arange(0, NS)
    take = k < nsrc
    off = tl.load(table + sstart + k, mask=take, other=0)
    ll = take & (((llmask >> (1 + k)) & 1) != 0)
    live = take[:, None] & mask[None, :]
    ll2 = ll[:, None] & mask[None, :]
    at = _plain(off, in_delta, out_delta) // EPW
    plain = tl.load(words + at[:, None] + offs[None, :], mask=live & (ll2 == 0), other=0)
    v = _poll_ll(area + (off // 2)[:, None] + offs[None, :], ll2, want, spin_limit, err_ptr, row,
                 PTX)
    return tl.where(ll2, v.to(tl.int32), plain), live


@triton.jit
def _reduce(x, live, REDUCE: tl.constexpr):
    """The sources' combination down axis 0 (a fixed tree: every rank adds in the same order)."""
    if REDUCE == 1:
        return tl.max(tl.where(live, x, float("-inf")), axis=0)
    elif REDUCE == 2:
        return tl.min(tl.where(live, x, float("inf")), axis=0)
    else:
        return tl.sum(tl.where(live, x, 0.0), axis=0)


@triton.jit(do_not_specialize=["first_row", "num_rows", "spin_limit", "ll_half", "in_delta",
                              "out_delta"])
def ll_kernel(table, data, sig, epoch_ptr, err_ptr, first_row, num_rows, spin_limit, ll_half,
              in_delta: tl.int64, out_delta: tl.int64, REDUCE: tl.constexpr, FMT: tl.constexpr,
              EPW: tl.constexpr,
              BLOCKW: tl.constexpr, NS: tl.constexpr, PTX: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = tl.load(epoch_ptr + 1 + pid) + 1
    words = data.to(tl.pointer_type(tl.int32), bitcast=True)
    # this call's parity of every rank's LL area, as 8-byte words (addresses are int32 slots)
    area = (sig + (epoch & 1) * ll_half).to(tl.pointer_type(tl.int64), bitcast=True)
    first = (tl.arange(0, NS) == 0)[:, None]
    for r in range(first_row, first_row + num_rows):
        # a row may read what an earlier row of this CTA stored (a local result pushed on, or
        # reduced again: the same words, so the same CTA): the CTA barrier orders the threads
        tl.debug_barrier()
        row = table + r * ROW_WORDS
        count = tl.load(row + F_COUNT) // EPW
        dst = tl.load(row + F_DST)       # LL slots (a push) or a plain address (below)
        plain_dst = _plain(dst, in_delta, out_delta) // EPW
        nsrc = tl.load(row + F_NSRC)
        sstart = tl.load(row + F_SRC)
        is_reduce = tl.load(row + F_REDUCE)
        acc_flag = tl.load(row + F_ACC)
        scale = tl.load(row + F_SCALE).to(tl.int32).to(tl.float32, bitcast=True)
        llmask = tl.load(row + F_LL)
        for start in range(pid * BLOCKW, count, nprog * BLOCKW):
            offs = start + tl.arange(0, BLOCKW)
            mask = offs < count
            if (llmask == 1) & (is_reduce == 0):     # a push of plain words: no poll
                src = _plain(tl.load(table + sstart), in_delta, out_delta)
                w = tl.load(words + src // EPW + offs, mask=mask, other=0)
            else:
                want = tl.zeros([NS, BLOCKW], tl.int32) + epoch
                w2, live = _sources(table, sstart, 0, nsrc, llmask, words, area, offs, mask, want,
                                    spin_limit, err_ptr, r, in_delta, out_delta, NS, EPW, PTX)
                if is_reduce != 0:
                    lo2, hi2 = _unpack(w2, FMT)
                    lo = _reduce(lo2, live, REDUCE)
                    hi = _reduce(hi2, live, REDUCE)
                    for k0 in range(NS, nsrc, NS):      # more sources than one block holds
                        w2, live = _sources(table, sstart, k0, nsrc, llmask, words, area, offs,
                                            mask, want, spin_limit, err_ptr, r, in_delta,
                                            out_delta, NS, EPW, PTX)
                        lo2, hi2 = _unpack(w2, FMT)
                        lo = combine(lo, _reduce(lo2, live, REDUCE), REDUCE)
                        hi = combine(hi, _reduce(hi2, live, REDUCE), REDUCE)
                    lo = lo * scale
                    hi = hi * scale
                    if acc_flag != 0:
                        olo, ohi = _unpack(tl.load(words + plain_dst + offs, mask=mask, other=0),
                                           FMT)
                        lo = lo + olo
                        hi = hi + ohi
                    w = _pack(lo, hi, FMT)
                else:              # a copy: source 0's bits
                    w = tl.sum(tl.where(first & live, w2, 0), axis=0)
            if llmask & 1:         # into a peer: each word with the epoch, into its LL area
                v = (epoch.to(tl.int64) << 32) | (w.to(tl.int64) & 4294967295)
                _store_word(area + dst // 2 + offs, v, mask, PTX)
            else:
                tl.store(words + plain_dst + offs, w, mask=mask)
    if num_rows > 0:
        tl.store(epoch_ptr + 1 + pid, epoch)
