"""Summarise stress JSON files (from `hiercoll stress --out`) into one Markdown table.

    python bench/gpu/collate_stress.py OUT_DIR/stress-*.json > bench/gpu/results/stress.md
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def main(paths: list[str]) -> int:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for p in paths:
        for c in json.loads(Path(p).read_text())["cases"]:
            key = (c["collective"], c["world_size"], c["topology"], c["algorithm"], c["mode"])
            groups[key].append(c)
    print("| collective | W | topology | algorithm | mode | shapes | iterations | worst error "
          "| worst / bound | failed (first bad iteration) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    bad_total = 0
    for key in sorted(groups):
        cases = groups[key]
        worst = max(c["max_abs_error"] for c in cases)
        ratio = max((c["max_abs_error"] / c["bound"]) if c["bound"] else 0.0 for c in cases)
        bad = [c for c in cases if not c["ok"]]
        bad_total += len(bad)
        iters = f"{min(c['iterations'] for c in cases)}-{max(c['iterations'] for c in cases)}"
        fails = ", ".join(f"{c['nbytes']} B ({c['first_bad_iteration']})" for c in bad) or "0"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {len(cases)} | {iters} "
              f"| {worst:.3g} | {ratio:.2f} | {fails} |")
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
