"""The simulator's own model constants, in one place, with units in their names.

Everything a calibration should fit (bandwidths, latencies, launch cost, reduce efficiency) is a
topology parameter; this holds only what the simulator must assume when the topology is silent,
and its numerical tolerances.
"""

from __future__ import annotations

EPS_BYTES = 1e-6          # a transfer this small completes instantly (no flow is created)
RATE_RTOL = 1e-12         # a recomputed rate this close to the old one keeps its wake-up
SATURATED_RTOL = 1e-12    # a link with less than this fraction of capacity left is full

