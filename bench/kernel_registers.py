"""Registers a thread of the row kernel's variants, compiled for sm_90 on any machine
(Triton's bundled ptxas, `-v`): how many CTAs of each fit an SM, which is what the auto grid's
cap rests on (lowering.DEFAULT_MAX_CTAS, SIDE_WORK_SMS: a CTA that spins needs every CTA it
waits on resident at once).

    python bench/kernel_registers.py      # writes bench/results/kernel_registers.{json,md}
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from bench.common import RESULTS, command_line, stamp  # noqa: E402
from hiercoll.files import write_atomic  # noqa: E402
from hiercoll.kernels.program import NUM_WARPS, _program_kernel  # noqa: E402

SM_REGISTERS = 65536      # an H100/H200 SM's register file (32-bit registers)
SIG = {"table": "*i64", "data": "*bf16", "sig": "*i32", "epoch_ptr": "*i32", "err_ptr": "*i64",
       "first_row": "i32", "num_rows": "i32", "spin_limit": "i32", "REDUCE": "constexpr",
       "ACC": "constexpr", "ALIGNED": "constexpr", "VEC": "constexpr", "BLOCK": "constexpr",
       "LANES": "constexpr", "BUMP_EPOCH": "constexpr", "FUSED": "constexpr",
       "PTX": "constexpr", "ALSO": "constexpr"}


def registers(ptx: str) -> int:
    """Registers a thread, from ptxas -v on `ptx` for sm_90a."""
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        out = subprocess.run([str(ptxas), "-v", "-arch=sm_90a", str(src), "-o",
                              str(Path(tmp) / "k.cubin")], capture_output=True, text=True,
                             check=True)
    return int(re.search(r"Used (\d+) registers", out.stderr + out.stdout).group(1))


def row_kernel(aligned: bool, fused: bool, also: bool) -> int:
    consts = {"REDUCE": 0, "ACC": triton.language.float32, "ALIGNED": aligned, "VEC": 8,
              "BLOCK": 4096, "LANES": 32 * NUM_WARPS, "BUMP_EPOCH": False, "FUSED": fused,
              "PTX": True, "ALSO": also}
    attrs = {(k,): [["tt.divisibility", 16]] for k in range(5)}
    src = ASTSource(fn=_program_kernel, signature=SIG, constexprs=consts, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": NUM_WARPS}).asm["ptx"]
    return registers(ptx)


def main() -> None:
    rows = []
    for aligned in (True, False):
        for fused in (True, False):
            for also in (False, True):
                regs = row_kernel(aligned, fused, also)
                threads = 32 * NUM_WARPS
                rows.append({"kernel": "row (bf16 sum)", "aligned": aligned, "fused": fused,
                             "also": also, "registers_per_thread": regs,
                             "threads_per_cta": threads,
                             "ctas_per_sm": SM_REGISTERS // (regs * threads)})
    meta = stamp(command_line())
    md = [f"# Registers of the row kernel, sm_90 (ptxas -v)\n\n`{meta['command']}`  \n"
          f"{meta['date']}, {meta['machine']}, git {meta['git_sha']}\n\n"
          "| variant | registers / thread | threads / CTA | CTAs an SM (by registers) |\n"
          "|---|---|---|---|"]
    for r in rows:
        name = ", ".join(k for k in ("aligned", "fused", "also") if r[k]) or "plain"
        md.append(f"| {name} | {r['registers_per_thread']} | {r['threads_per_cta']} | "
                  f"{r['ctas_per_sm']} |")
    write_atomic(RESULTS / "kernel_registers.json",
                 json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    write_atomic(RESULTS / "kernel_registers.md", "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
