"""Dependency labels: how a recipe names an op that peers depend on (see builder.py).

One NamedTuple per family of labels, so a label of the wrong shape is a type error. Each keeps
its family's tag (the `family` field, last so that it defaults) next to its numbers: labels of
different families on one rank stay distinct, as plain tuples with a leading tag were. Labels
never leave the planner: `finish` resolves them to op indices.
"""

from __future__ import annotations

from typing import Literal, NamedTuple


# ---- ring (ring.py); a piece is one of chunks x channels --------------------------------------
class RingRsLabel(NamedTuple):
    """Reduce-scatter step `step` of piece `piece`: the push into the successor's slot."""

    step: int
    piece: int
    family: Literal["rs"] = "rs"


class RingRsFinalLabel(NamedTuple):
    """The final reduce of my own block's piece `piece`."""

    piece: int
    family: Literal["rsf"] = "rsf"


class RingOwnLabel(NamedTuple):
    """all_gather: the copy of my own piece from input to output."""

    piece: int
    family: Literal["own"] = "own"


class RingAgLabel(NamedTuple):
    """All-gather step `step` of piece `piece`: the copy into the successor's output."""

    step: int
    piece: int
    family: Literal["ag"] = "ag"


# ---- direct and two_shot (direct.py, two_shot.py) ---------------------------------------------
class PutLabel(NamedTuple):
    """Chunk `chunk` of my piece for `peer` (the owner of a block, or a destination)."""

    chunk: int
    peer: int
    family: Literal["put"] = "put"


class OwnerReduceLabel(NamedTuple):
    """The owner's reduce of chunk `chunk` of its block."""

    chunk: int
    family: Literal["red"] = "red"


class TwoShotGatherLabel(NamedTuple):
    """two_shot's all-gather: chunk `chunk` of my reduced slice, copied to `peer`."""

    chunk: int
    peer: int
    family: Literal["ag"] = "ag"


# ---- flat group_reduce (group.py) --------------------------------------------------------------
class GroupSendLabel(NamedTuple):
    """Segment `segment` of my stream to `dst`, copied into dst's staging."""

    dst: int
    segment: int
    family: Literal["send"] = "send"


# ---- hier reduce-scatter (hier/reduce_scatter.py; hier_2d reuses the scatter) -----------------
class ScatterLabel(NamedTuple):
    """Chunk `chunk` of my piece of shard (target node, local `peer`), copied to that peer."""

    target: int
    chunk: int
    peer: int
    family: Literal["sc"] = "sc"


class NodeReduceLabel(NamedTuple):
    """The node-partial of my shard of node `target`, chunk `chunk` (before its RDMA send)."""

    target: int
    chunk: int
    family: Literal["red"] = "red"


class NodeSendLabel(NamedTuple):
    """The RDMA send of that node-partial to node `target`."""

    target: int
    chunk: int
    family: Literal["x"] = "x"


class FinalReduceLabel(NamedTuple):
    """The final reduce of chunk `chunk` of my shard (hier and hier_2d)."""

    chunk: int
    family: Literal["fin"] = "fin"


# ---- hier all-gather (hier/all_gather.py) ------------------------------------------------------
class GatherOwnLabel(NamedTuple):
    """all_gather: the copy of chunk `chunk` of my shard from input to output."""

    chunk: int
    family: Literal["gown"] = "gown"


class GatherStageLabel(NamedTuple):
    """The staging copy of chunk `chunk` of my shard to my gateway."""

    chunk: int
    family: Literal["gst"] = "gst"


class GatherSendLabel(NamedTuple):
    """The RDMA send of chunk `chunk` of my shard to node `target`."""

    target: int
    chunk: int
    family: Literal["gx"] = "gx"


class GatherDistributeLabel(NamedTuple):
    """The copy of shard (src_node, my local rank) chunk `chunk` to local `peer`'s output."""

    src_node: int
    chunk: int
    peer: int
    family: Literal["gd"] = "gd"


# ---- hier all_to_all and group collectives (hier/all_to_all.py, hier/group.py) ---------------
class A2ASendLabel(NamedTuple):
    """The aggregated send of my blocks for node `target`, chunk `chunk`."""

    target: int
    chunk: int
    family: Literal["x"] = "x"


class CastSendLabel(NamedTuple):
    """group_cast: the RDMA send of input split `split` to node `target`, chunk `chunk`."""

    split: int
    target: int
    chunk: int
    family: Literal["x"] = "x"


class CombineSendLabel(NamedTuple):
    """group_reduce: the node-partial of atom `atom` of destination `dst`, chunk `chunk`."""

    dst: int
    atom: int
    chunk: int
    family: Literal["x"] = "x"


# ---- hier_2d (hier/hier_2d.py) -----------------------------------------------------------------
class RailRsLabel(NamedTuple):
    """Inter-node reduce-scatter along the rail: `where` is the ring step (inter=ring) or the
    target node (inter=direct)."""

    where: int
    chunk: int
    family: Literal["rs"] = "rs"


class RailOneShotLabel(NamedTuple):
    """inter=direct all_reduce: my partial of shard node `shard` sent to rail peer on `target`."""

    target: int
    shard: int
    chunk: int
    family: Literal["os"] = "os"


class RailAgLabel(NamedTuple):
    """Inter-node all-gather along the rail: `where` as in RailRsLabel."""

    where: int
    chunk: int
    family: Literal["ag"] = "ag"


# ---- hier_tiers (hier/tiers.py) ---------------------------------------------------------------
class TierSendLabel(NamedTuple):
    """Reduce-scatter: my partial of shard (node `target`, my local rank) chunk `chunk`, sent
    at the lowest level where `target`'s position differs from mine (once per target)."""

    target: int
    chunk: int
    family: Literal["tx"] = "tx"


class TierGatherLabel(NamedTuple):
    """All-gather: shard (node `shard`, my local rank) chunk `chunk` sent to node `target`."""

    target: int
    shard: int
    chunk: int
    family: Literal["tg"] = "tg"


# ---- tree (tree.py): NCCL's double binary tree ---------------------------------------------------
class TreeLabel(NamedTuple):
    """Tree `tree`'s chunk `chunk`: `up` the partial sum this rank passes towards the root (the
    root's head writes the result), `down` the result this rank holds for the ranks below it."""

    tree: int
    chunk: int
    phase: Literal["up", "down"]
    family: Literal["tree"] = "tree"


# ---- log-depth families (fold.py, halving_doubling.py, recursive_doubling.py, bruck.py) -------
class FoldLabel(NamedTuple):
    """Non-power-of-two fold: an extra rank's data copied into its partner (before the steps)."""

    family: Literal["fold"] = "fold"


class LogStepLabel(NamedTuple):
    """Step `step` of phase `phase` (rhd's reduce-scatter / all-gather, rd's exchange), chunk
    `chunk`: my send to that step's partner."""

    phase: Literal["rs", "ag", "rd"]
    step: int
    chunk: int
    family: Literal["log"] = "log"


class BruckLabel(NamedTuple):
    """Bruck all-to-all step `step`: chunk `chunk` of block `block` (destined to origin +
    block) sent onwards."""

    step: int
    block: int
    chunk: int
    family: Literal["bruck"] = "bruck"


Label = (RingRsLabel | RingRsFinalLabel | RingOwnLabel | RingAgLabel
         | PutLabel | OwnerReduceLabel | TwoShotGatherLabel | GroupSendLabel
         | ScatterLabel | NodeReduceLabel | NodeSendLabel | FinalReduceLabel
         | GatherOwnLabel | GatherStageLabel | GatherSendLabel | GatherDistributeLabel
         | A2ASendLabel | CastSendLabel | CombineSendLabel
         | FoldLabel | LogStepLabel | BruckLabel
         | RailRsLabel | RailOneShotLabel | RailAgLabel | TreeLabel
         | TierSendLabel | TierGatherLabel)

