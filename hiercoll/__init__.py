"""hiercoll: a simulator-backed planner for hierarchical collective communication."""

from hiercoll.collectives import CollectiveSpec, DType, GroupSplits, Kind, ReduceOp, transpose
from hiercoll.errors import HiercollError, ScheduleError
from hiercoll.executor import execute, verify
from hiercoll.planner.search.select import plan_auto as plan
from hiercoll.schedule import Op, Region, Schedule
from hiercoll.sim import SimResult, check, simulate
from hiercoll.topology import Topology, load_topology

__version__ = "0.1.0"
__all__ = ["CollectiveSpec", "DType", "GroupSplits", "HiercollError", "Kind", "Op", "ReduceOp",
           "Region", "Schedule", "ScheduleError", "SimResult", "Topology", "check", "execute",
           "load_topology", "plan", "simulate", "transpose", "verify"]
