"""The simulator: validate a schedule (deadlock, races, postcondition) and time it
(a cursor per rank and channel on an event clock, max-min fair fluid flows over the
topology's links)."""

from hiercoll.sim.bounds import lower_bound
from hiercoll.sim.check import CheckReport, check
from hiercoll.sim.result import LinkStat, SimResult
from hiercoll.sim.simulate import simulate

__all__ = ["CheckReport", "LinkStat", "SimResult", "check", "lower_bound", "simulate"]
