"""The cluster description: pydantic models, one per piece of hardware, units in field names.

`_gbps` is 1e9 bytes/s in one direction, `_us` microseconds. Global rank = node * gpus_per_node +
local_rank everywhere in hiercoll.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

from hiercoll.topology.tier_layout import check_tier_layouts

# Plausible ranges: numbers outside them are typos or fuzz (5e-324 GB/s made a simulation spin on
# a flow that never ends; 1e308 overflowed to inf). 1 MB/s .. 1 PB/s; latencies up to 1000 s.
MIN_GBPS = 1e-3
MAX_GBPS = 1e6
MAX_US = 1e9

class _Strict(BaseModel):
    """Hardware models: no unknown fields; strict types (an int field takes no bool, no "2", no
    2.0; a float field takes a number, ints included, but no bool or string); floats finite (an
    infinite latency or NaN bandwidth would make every time and bound meaningless)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Gpu(_Strict):
    name: str = Field(description="Marketing name, e.g. H200")
    hbm_gbps: float = Field(ge=MIN_GBPS, le=MAX_GBPS, description="HBM bandwidth, read+write combined, 1e9 B/s")
    num_sms: int = Field(gt=0, description="Streaming multiprocessors (CUs on AMD)")
    memory_gib: float = Field(default=80.0, gt=0)


class IntraKind(StrEnum):
    NVSWITCH = "nvswitch"   # every GPU has one port into a switch: egress/ingress limits only
    MESH = "mesh"           # point-to-point links per pair (xGMI): a link per (src, dst)
    PCIE = "pcie"           # every GPU on a PCIe link to a host bridge with its own limit


class IntraFabric(_Strict):
    kind: Annotated[IntraKind, Strict(False)]   # the value as text ("nvswitch"), as files give it
    gbps: float = Field(ge=MIN_GBPS, le=MAX_GBPS, description="nvswitch/pcie: per-GPU port bandwidth per direction; "
                        "mesh: bandwidth of one link per direction")
    latency_us: float = Field(ge=0, le=MAX_US, description="one-hop latency of a transfer inside the node")
    links_per_pair: int = Field(default=1, ge=1, description="mesh only: parallel links per GPU pair")
    bridge_gbps: float | None = Field(default=None, ge=MIN_GBPS, le=MAX_GBPS,
                                      description="pcie only: host bridge limit per direction")


# A GPU's path to its NIC when the file gives none: twice the NIC (a PCIe Gen5 x16 switch port
# beside a 400G NIC), so the NIC, not its PCIe path, is the bottleneck.
DEFAULT_GPU_NIC_PER_NIC_RATIO = 2.0


class FabricTier(_Strict):
    """One scale-out switch layer above the NICs (leaf, spine, super-spine). A tier's *group* is
    what one set of its switches joins: `group_size` nodes (scale-up domains) for the first tier,
    `group_size` groups of the tier below for the others. Every switch of a group has `uplinks`
    ports, one to each switch of the tier above (a folded Clos); the outermost tier joins all."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="e.g. leaf, spine, super_spine")
    group_size: int | None = Field(default=None, ge=1, description="nodes (first tier) or groups "
                                   "of the tier below under one group of this tier; the outermost "
                                   "tier may leave it out (everything)")
    uplinks: int | None = Field(default=None, ge=1, description="ports per switch toward the "
                                "tier above, one per parent switch (default 1; none on the "
                                "outermost tier)")
    uplink_gbps: float | None = Field(default=None, ge=MIN_GBPS, le=MAX_GBPS, description="per uplink port per "
                                      "direction, 1e9 B/s; default from oversubscription")
    oversubscription: float | None = Field(default=None, ge=1.0, description="a switch's "
                                           "downlink over uplink capacity (default 1: "
                                           "non-blocking); or give uplink_gbps")
    latency_us: float = Field(default=0.0, ge=0, le=MAX_US, description="added per extra hop through a "
                              "switch of this tier (inter.latency_us counts one leaf)")
    radix: int | None = Field(default=None, ge=2, description="ports per switch; checked "
                              "against the downlinks plus uplinks the layout needs")
    rails: bool = Field(default=False, description="first tier only: one leaf per NIC rail in "
                        "each group (rail-optimised): NIC i of every node meets on leaf i")


class InterFabric(_Strict):
    num_nics: int = Field(ge=1, description="NICs per node")
    nic_gbps: float = Field(ge=MIN_GBPS, le=MAX_GBPS, description="per-NIC bandwidth per direction (400 Gb/s = 50)")
    latency_us: float = Field(ge=0, le=MAX_US, description="one-way latency GPU->NIC->switch->NIC->GPU")
    nic_affinity: list[int] | None = Field(
        default=None, description="for each NIC, the local rank it is nearest to (rails); "
        "default spreads NICs evenly: NIC i nearest to local rank i*gpus_per_node/num_nics")
    gpu_nic_gbps: float | None = Field(
        default=None, ge=MIN_GBPS, le=MAX_GBPS,
        description="GPU<->NIC path (PCIe switch) per direction; default nic_gbps*2")
    oversubscription: float = Field(default=1.0, ge=1.0,
                                    description="switch fabric oversubscription: 1.0 = non-blocking")
    tiers: list[FabricTier] | None = Field(
        default=None, description="scale-out switch tiers from the leaf outwards (outermost last; "
        "schema_version 2); absent: one switch joins every node (the schema-1 fabric, with "
        "`oversubscription` on each node's uplink). docs/topology.md")
    routing: Literal["ecmp", "spray"] = Field(
        default="ecmp", description="with tiers: a flow takes one uplink per tier by a seeded "
        "hash of its endpoints (ecmp), or splits evenly over all of them (spray)")
    ecmp_seed: int = Field(default=0, ge=0, description="with tiers and ecmp: the hash's seed")

    @model_validator(mode="after")
    def _check_tiers(self) -> InterFabric:
        if self.tiers is None:
            if self.routing != "ecmp" or self.ecmp_seed != 0:
                raise ValueError("routing/ecmp_seed: only meaningful with tiers; add inter.tiers "
                                 "or remove them")
            return self
        if not self.tiers:
            raise ValueError("tiers: an empty list; give at least one tier (a leaf) or remove it")
        if self.oversubscription != 1.0:
            raise ValueError("oversubscription: with tiers, give each tier's oversubscription "
                             "instead of inter.oversubscription")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tiers: names {names} repeat; name each tier once")
        last = len(self.tiers) - 1
        for i, tier in enumerate(self.tiers):
            where = f"tiers[{i}] ({tier.name})"
            if i == last:
                if (tier.uplinks, tier.uplink_gbps, tier.oversubscription) != (None, None, None):
                    raise ValueError(f"{where}: the outermost tier has no uplinks; remove "
                                     "uplinks/uplink_gbps/oversubscription")
            else:
                if tier.group_size is None:
                    raise ValueError(f"{where}: group_size is required below the outermost tier")
                if tier.uplink_gbps is not None and tier.oversubscription is not None:
                    raise ValueError(f"{where}: give uplink_gbps or oversubscription, not both")
            if tier.rails and i != 0:
                raise ValueError(f"{where}: rails: only the first (leaf) tier can be "
                                 "rail-optimised")
        if self.tiers[0].rails and len(self.tiers) == 1:
            raise ValueError("tiers[0]: rails: a rail-optimised leaf needs a tier above it "
                             "(cross-rail traffic crosses it); add a spine tier")
        return self

    def gpu_path_gbps(self) -> float:
        """GB/s of one GPU's path to its NIC (the file's value, else the default ratio)."""
        return self.gpu_nic_gbps or DEFAULT_GPU_NIC_PER_NIC_RATIO * self.nic_gbps


class NodeOverride(_Strict):
    """One node that differs from the rest (a slower NIC, a degraded link, another GPU bin):
    what breaks symmetry in real clusters. Enters the simulator's link capacities and the bounds;
    the planners plan as if every node were alike."""

    node: int = Field(ge=0, description="the node (scale-up domain) index")
    nic: int | None = Field(default=None, ge=0, description="only this NIC of the node "
                            "(nic_gbps only); default every NIC")
    nic_gbps: float | None = Field(default=None, ge=MIN_GBPS, le=MAX_GBPS,
                                   description="per-NIC bandwidth per direction")
    hbm_gbps: float | None = Field(default=None, ge=MIN_GBPS, le=MAX_GBPS, description="each GPU's HBM bandwidth")
    intra_gbps: float | None = Field(default=None, ge=MIN_GBPS, le=MAX_GBPS, description="each GPU's scale-up "
                                     "port (mesh: link) bandwidth per direction")


# Link kinds of the simulator's network (sim/links.py names links KIND[indices]); a tier's ports
# are TIERNAME_up / TIERNAME_down.
LINK_KINDS = ("hbm", "nvl_out", "nvl_in", "xgmi", "pcie_up", "pcie_down", "bridge", "gpu_to_nic",
              "nic_tx", "nic_rx", "nic_to_gpu", "fabric_up", "fabric_down")


class DegradedLink(_Strict):
    """One link running below its speed (a flapping cable, a port down to a lower rate)."""

    link: str = Field(pattern=r"^[a-z][a-z0-9_]*\[\d+(,\d+)*\]$", description="the link as "
                      "`hiercoll simulate` names it, e.g. leaf_up[0,3,5] or nic_tx[2,1]")
    factor: float = Field(gt=0, le=1.0, description="fraction of its speed it still has")


class ModeCosts(_Strict):
    """Costs that depend on how a call is launched: eagerly by the host, or replayed from a CUDA
    graph. Calls are timed back to back (as benchmarks and nccl-tests do): an eager call takes
    the longer of its host launch work and its device work (they overlap with the neighbouring
    calls); a replayed call adds `call_us` to its device work."""

    call_us: float = Field(default=0.0, ge=0, description="per call (us): eager, the host's "
                           "launch work for the call; graph, the replay's cost before its work")
    issue_us: float = Field(default=0.0, ge=0, description="eager: host time per kernel launch "
                            "(us): consecutive SM ops of one channel share a launch, as the cuda "
                            "backend lowers them; ranks that share a host thread (shared_gpu) add "
                            "up. 0 in graph mode")
    ce_issue_us: float = Field(default=0.0, ge=0, description="eager: host time per copy-engine "
                               "op (us): its fence launch, the copy, its signal launch. 0 in "
                               "graph mode")


class LibraryCosts(_Strict):
    """NCCL's own costs where they differ from hiercoll's kernels (its calls and its protocol's
    per-step cost are NCCL's: its graph replay of a small all-reduce is not our kernel's), used
    when the library model is timed; None: the same as the plans'."""

    launch_us: float | None = Field(default=None, ge=0, description="per op of NCCL's kernels "
                                    "(a ring step's start and its wait), us")
    eager_call_us: float | None = Field(default=None, ge=0, description="per eager library call "
                                        "(host launch), us")
    graph_call_us: float | None = Field(default=None, ge=0, description="per library call "
                                        "replayed from a CUDA graph, us")
    intra_efficiency: float | None = Field(default=None, gt=0, le=1.0, description="fraction of "
                                           "the intra-node bandwidth NCCL's kernels reach (its "
                                           "protocols stage through buffers ours do not)")
    sync_us: float | None = Field(default=None, ge=0, description="per call of NCCL's Simple "
                                  "protocol on top of its LL's, us; set, the library model "
                                  "times both protocols (LL: twice the bytes on the wire) and "
                                  "takes the faster, as NCCL's tuner does; None: one, unmodelled")


class Costs(_Strict):
    """What a calibration fits besides bandwidths and latencies (`hiercoll calibrate`).

    Defaults are uncalibrated guesses: 2 us per op, no per-call cost, links at their rated speed."""

    launch_us: float = Field(default=2.0, ge=0, description="per op on the device: kernel or row "
                             "start, signal wait round trip (us)")
    sync_us: float = Field(default=0.0, ge=0, description="per call of the cuda backend's "
                           "simple protocol (us): its start and end barriers, a signal and a wait "
                           "across the ranks each; LL calls have none (simulate's `protocol`)")
    barrier_row_us: float = Field(default=0.0, ge=0, description="per barrier half a simple "
                                  "call's fused kernel walks as a row of its own (us): its start "
                                  "wait or end arrival where the first or last level splits the "
                                  "grid (sim/row_merge.barrier_rows)")
    ll_unpack_us: float = Field(default=0.0, ge=0, description="per LL call whose receivers "
                                "unpack pushed words into their output (all-gather, all-to-all): "
                                "the pass that polls each word for the call's epoch (us)")
    ll_launch_us: float | None = Field(default=None, ge=0, description="per op of an LL call "
                                       "on the device (us): a row of flagged-word pushes that "
                                       "waits for no reply and no barrier; None: launch_us")
    ce_launch_us: float | None = Field(default=None, ge=0, description="per copy-engine op on "
                                       "the device (us): its fence kernel, the copy's start, its "
                                       "signal kernel; None: launch_us")
    reduce_efficiency: float = Field(default=0.8, gt=0, le=1.0,
                                     description="fraction of HBM bandwidth copies and reduces "
                                     "reach (their HBM reads and writes share it)")
    intra_efficiency: float = Field(default=1.0, gt=0, le=1.0,
                                    description="fraction of the intra-node port/link bandwidth "
                                    "transfers reach")
    nic_efficiency: float = Field(default=1.0, gt=0, le=1.0,
                                  description="fraction of the NIC bandwidth transfers reach")
    pull_efficiency: float = Field(default=1.0, gt=0, le=1.0,
                                   description="fraction of a link's bandwidth a reduce's reads "
                                   "of peer memory reach (SM loads over NVLink: a pull reaches "
                                   "less of the link than a push of the same bytes)")
    sm_op_gbps: float | None = Field(default=None, ge=MIN_GBPS, le=MAX_GBPS, description="most one SM-driven op "
                                     "(a kernel's CTAs copying or reducing) moves, GB/s; None: "
                                     "only links limit it")
    ce_op_gbps: float | None = Field(default=None, ge=MIN_GBPS, le=MAX_GBPS, description="most one copy-engine copy "
                                     "moves, GB/s; None: only links limit it")
    ce_concurrent_gbps: float | None = Field(
        default=None, ge=MIN_GBPS, le=MAX_GBPS, description="what a GPU's copy engines move in all, GB/s, while two "
        "or more of its copies run at once (copies to three peers at once measured 199 GB/s per "
        "H200 where one copy moves 380); None: only per-copy caps and links limit them")
    ce_threshold_bytes: int = Field(default=8 << 20, ge=0, description="copies of at least this "
                                    "many bytes run on a copy engine (the cuda backend's "
                                    "--ce-threshold)")
    eager: ModeCosts = Field(default_factory=ModeCosts, description="eager launches")
    graph: ModeCosts = Field(default_factory=ModeCosts, description="CUDA-graph replays")
    library: LibraryCosts = Field(default_factory=LibraryCosts,
                                  description="NCCL's own per-op and per-call costs (the "
                                  "library model's timing)")

    def as_library(self) -> Costs:
        """These costs as NCCL's calls pay them: its own launch and per-call costs where
        calibrated, and no copy on a copy engine (NCCL moves every byte with SMs)."""
        lib = self.library
        return self.model_copy(update={
            "ce_threshold_bytes": NO_COPY_ENGINE_BYTES,
            "launch_us": self.launch_us if lib.launch_us is None else lib.launch_us,
            "intra_efficiency": (self.intra_efficiency if lib.intra_efficiency is None
                                 else lib.intra_efficiency),
            "sync_us": lib.sync_us or 0.0, "ll_unpack_us": 0.0,     # NCCL's, not our kernels'
            "barrier_row_us": 0.0,
            "eager": self.eager if lib.eager_call_us is None else self.eager.model_copy(
                update={"call_us": lib.eager_call_us}),
            "graph": self.graph if lib.graph_call_us is None else self.graph.model_copy(
                update={"call_us": lib.graph_call_us})})

    def for_mode(self, mode: str) -> ModeCosts:
        """The per-call costs of `mode` (eager or graph; graph ops are never host-issued)."""
        if mode == "graph":
            return ModeCosts(call_us=self.graph.call_us)
        return self.eager

    def prices_protocols(self) -> bool:
        """Whether these costs were fitted with the cuda protocols' terms (`sync_us`,
        `ll_unpack_us`): only then does the simulator time a call by the protocol it runs."""
        return self.sync_us > 0 or self.ll_unpack_us > 0 or self.ll_launch_us is not None

    def engine_links(self) -> bool:
        """Whether an op's links depend on the engine that runs it (per-op caps, or a GPU's copy
        engines shared by concurrent copies)."""
        return (self.sm_op_gbps is not None or self.ce_op_gbps is not None
                or self.ce_concurrent_gbps is not None)

    def engines_differ(self) -> bool:
        """Whether a copy is timed differently on a copy engine than on SMs (links, device
        start or host issue): only then does the copy-engine threshold change a time."""
        return self.engine_links() or self.ce_launch_us is not None or self.eager.ce_issue_us != 0.0

    def op_launch_us(self, on_copy_engine: bool) -> float:
        """Device time before an op's bytes move: a row start, or a copy-engine op's fences."""
        if on_copy_engine and self.ce_launch_us is not None:
            return self.ce_launch_us
        return self.launch_us

    def min_launch_us(self) -> float:
        """The least any op pays before its bytes move (for lower bounds)."""
        return min(self.launch_us, self.op_launch_us(True))


class Calibration(BaseModel):
    """Where a calibrated topology's costs came from (written by `hiercoll calibrate`). Not part
    of the fingerprint: it describes the values, it does not change them."""

    model_config = ConfigDict(extra="allow", frozen=True)
    date_utc: str
    sources: list[str]
    fitted: dict[str, float]
    unconstrained: list[str] = Field(default_factory=list)
    rows: int = 0
    fit_geomean_error: float | None = None
    holdout_geomean_error: float | None = None
    worst_error: float | None = None
    base_fingerprint: str | None = Field(default=None, description="fingerprint of the "
                                         "uncalibrated topology the fit started from: rows "
                                         "measured on it still belong to this machine")


# The most ranks a topology may have: 2^20, several times the largest GPU clusters (~10^5 GPUs).
# Plans, plan files and simulations grow at least linearly with the ranks (a library call's plan
# holds each rank's buffers), so 10^6 nodes of 8 GPUs would run for minutes and take GBs before
# failing; refused when the topology is made instead.
MAX_WORLD_SIZE = 1 << 20
SCHEMA_VERSION: Literal[2] = 2


class Topology(_Strict):
    name: str = Field(default="custom")
    num_nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    gpu: Gpu
    intra: IntraFabric
    inter: InterFabric | None = Field(default=None, description="required when num_nodes > 1")
    costs: Costs = Field(default_factory=Costs)
    shared_gpu: bool = Field(default=False, description="every rank is a process on ONE GPU "
                             "(the one-GPU harness): one HBM for all, one host thread launching")
    calibration: Calibration | None = Field(default=None, description="provenance of fitted "
                                            "costs (hiercoll calibrate); absent: uncalibrated")
    node_overrides: list[NodeOverride] = Field(default_factory=list, description="nodes that "
                                               "differ from the rest (schema_version 2)")
    degraded_links: list[DegradedLink] = Field(default_factory=list, description="links below "
                                               "their speed (schema_version 2)")
    schema_version: Literal[1, 2] = Field(default=SCHEMA_VERSION, description="2 (files "
                                          "without it or with 1 are read as version 1 and "
                                          "converted: topology.versions)")

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: object) -> object:
        from hiercoll.topology.versions import upgrade
        return upgrade(data)

    @field_validator("schema_version", mode="before")
    @classmethod
    def _version_not_bool(cls, v: object) -> object:
        if isinstance(v, bool):      # True == 1 would pass the Literal
            raise ValueError("should be the integer 1 or 2")
        return v

    @model_validator(mode="after")
    def _check(self) -> Topology:
        if self.world_size > MAX_WORLD_SIZE:
            raise ValueError(f"num_nodes x gpus_per_node: {self.num_nodes} x {self.gpus_per_node}"
                             f" = {self.world_size} ranks, above the {MAX_WORLD_SIZE} hiercoll "
                             "plans for; use fewer nodes or GPUs per node")
        if self.num_nodes > 1 and self.inter is None:
            raise ValueError("inter: a topology with num_nodes > 1 needs an 'inter' section "
                             "(num_nics, nic_gbps, latency_us)")
        if self.inter is not None and self.inter.num_nics > self.gpus_per_node:
            raise ValueError(f"inter.num_nics: {self.inter.num_nics} NICs for {self.gpus_per_node} "
                             "GPUs per node; a GPU sends through one NIC here, so give at most "
                             "gpus_per_node NICs (several NICs per GPU: one NIC with their summed "
                             "nic_gbps)")
        if self.inter is not None and self.inter.nic_affinity is not None:
            aff = self.inter.nic_affinity
            if len(aff) != self.inter.num_nics:
                raise ValueError(f"inter.nic_affinity: has {len(aff)} entries for "
                                 f"{self.inter.num_nics} NICs; give one local rank per NIC")
            bad = [a for a in aff if not 0 <= a < self.gpus_per_node]
            if bad:
                raise ValueError(f"inter.nic_affinity: local ranks {bad} outside "
                                 f"0..{self.gpus_per_node - 1}")
        if self.shared_gpu and self.num_nodes != 1:
            raise ValueError("shared_gpu: every rank on one GPU means one node; set num_nodes: 1")
        if self.intra.kind != IntraKind.MESH and self.intra.links_per_pair != 1:
            raise ValueError("intra.links_per_pair: only meaningful for kind 'mesh'; remove it")
        if self.inter is not None and self.inter.tiers is not None:
            check_tier_layouts(self.inter.tiers, self.num_nodes, self.inter.num_nics,
                               self.inter.nic_gbps)
        self._check_overrides()
        self._check_degraded()
        return self

    def _check_degraded(self) -> None:
        tiers = self.inter.tiers if self.inter is not None and self.inter.tiers else []
        kinds = set(LINK_KINDS) | {f"{t.name}_{d}" for t in tiers[:-1] for d in ("up", "down")}
        seen: set[str] = set()
        for i, d in enumerate(self.degraded_links):
            kind = d.link.split("[", 1)[0]
            if kind not in kinds:
                raise ValueError(f"degraded_links[{i}].link: {kind!r} is no link kind of this "
                                 f"topology; use one of {', '.join(sorted(kinds))}")
            if d.link in seen:
                raise ValueError(f"degraded_links[{i}].link: {d.link} appears twice; keep one")
            seen.add(d.link)

    def _check_overrides(self) -> None:
        seen: set[tuple[int, int | None]] = set()
        for i, o in enumerate(self.node_overrides):
            where = f"node_overrides[{i}]"
            if o.node >= self.num_nodes:
                raise ValueError(f"{where}.node: {o.node} is not a node of 0..{self.num_nodes - 1}")
            if (o.node, o.nic) in seen:
                raise ValueError(f"{where}: node {o.node} (nic {o.nic}) is overridden twice; "
                                 "merge them")
            seen.add((o.node, o.nic))
            if o.nic is not None:
                if self.inter is None or o.nic >= self.inter.num_nics:
                    raise ValueError(f"{where}.nic: {o.nic} is not a NIC of the node")
                if o.hbm_gbps is not None or o.intra_gbps is not None or o.nic_gbps is None:
                    raise ValueError(f"{where}: with nic, give nic_gbps alone (the NIC's speed)")
            if (o.nic_gbps, o.hbm_gbps, o.intra_gbps) == (None, None, None):
                raise ValueError(f"{where}: give at least one of nic_gbps, hbm_gbps, intra_gbps")
            if o.nic_gbps is not None and self.inter is None:
                raise ValueError(f"{where}.nic_gbps: the topology has no inter section")

    def node_override(self, node: int, nic: int | None = None) -> NodeOverride | None:
        """The override of `node` (with `nic`: the one of that NIC, else the node's)."""
        found = None
        for o in self.node_overrides:
            if o.node == node and o.nic is None:
                found = found or o
            if o.node == node and nic is not None and o.nic == nic:
                return o
        return found

    def nic_gbps_of(self, node: int, nic: int) -> float:
        """A NIC's bandwidth per direction, overrides included."""
        assert self.inter is not None
        o = self.node_override(node, nic)
        return o.nic_gbps if o is not None and o.nic_gbps is not None else self.inter.nic_gbps

    def hbm_gbps_of(self, node: int) -> float:
        o = self.node_override(node)
        return o.hbm_gbps if o is not None and o.hbm_gbps is not None else self.gpu.hbm_gbps

    def intra_gbps_of(self, node: int) -> float:
        o = self.node_override(node)
        return o.intra_gbps if o is not None and o.intra_gbps is not None else self.intra.gbps

    @property
    def symmetric_nodes(self) -> bool:
        """Every node and link alike (no overrides, nothing degraded): what translation
        folding needs."""
        return not self.node_overrides and not self.degraded_links

    # ---- ranks -------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local_rank_of(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def rank_of(self, node: int, local_rank: int) -> int:
        return node * self.gpus_per_node + local_rank

    def same_node(self, a: int, b: int) -> bool:
        return a // self.gpus_per_node == b // self.gpus_per_node

    def node_peers(self, rank: int) -> list[int]:
        """Ranks on the same node, in local-rank order, including `rank`."""
        base = self.node_of(rank) * self.gpus_per_node
        return list(range(base, base + self.gpus_per_node))

    def rail_peers(self, rank: int) -> list[int]:
        """Ranks with the same local rank on every node (the rail), in node order."""
        lr = self.local_rank_of(rank)
        return [self.rank_of(n, lr) for n in range(self.num_nodes)]

    # ---- what one GPU can move at once --------------------------------------------------------
    def gpu_intra_gbps(self) -> float:
        """GB/s one GPU sends to (or receives from) all its node peers at once: its switch port,
        or its mesh links to every peer; 0 alone in a node."""
        f = self.intra
        if self.gpus_per_node == 1:
            return 0.0
        if f.kind == IntraKind.MESH:
            return f.gbps * f.links_per_pair * (self.gpus_per_node - 1)
        return f.gbps

    def gpu_inter_gbps(self) -> float:
        """GB/s one GPU sends off its node alone: its NIC or its path to it, whichever is less;
        0 on one node."""
        if self.num_nodes == 1 or self.inter is None:
            return 0.0
        return min(self.inter.nic_gbps, self.inter.gpu_path_gbps())

    # ---- NICs --------------------------------------------------------------------------------
    def nic_affinity(self) -> list[int]:
        assert self.inter is not None
        if self.inter.nic_affinity is not None:
            return list(self.inter.nic_affinity)
        n, g = self.inter.num_nics, self.gpus_per_node
        return [(i * g) // n for i in range(n)]

    def nic_of_local_rank(self, local_rank: int) -> int:
        """The NIC a GPU uses: its own rail NIC, else the nearest one below it (round robin)."""
        aff = self.nic_affinity()
        if local_rank in aff:
            return aff.index(local_rank)
        below = [i for i, a in enumerate(aff) if a <= local_rank]
        return below[-1] if below else 0

    def fingerprint(self) -> str:
        """Stable hash of everything that shapes a plan or its timing (not the display name, not
        the calibration's provenance)."""
        data = self.model_dump(mode="json", exclude={"name", "calibration"})
        if not self.shared_gpu:
            data.pop("shared_gpu")      # files from before the field hash as they always did
        from hiercoll.topology.versions import fingerprint_view
        data = fingerprint_view(data)   # what schema 1 could say hashes as schema 1 did
        costs = data["costs"]
        for mode in ("eager", "graph"):
            if costs[mode].get("ce_issue_us") == 0.0:
                costs[mode].pop("ce_issue_us")   # added later: files hash as they did
        for key in ("intra_efficiency", "sync_us"):            # added later, likewise
            if costs["library"].get(key) is None:
                costs["library"].pop(key, None)
        for key, default in _COST_DEFAULTS.items():
            if costs.get(key) == default:
                costs.pop(key)          # likewise for cost terms left at their defaults
        return _hash(data)

    def base_fingerprint(self) -> str:
        """The fingerprint of the uncalibrated machine this topology was fitted from (its own
        where it was never calibrated, or calibrated before the base was recorded): rows measured
        there belong to this machine and to every calibration of it."""
        base = self.calibration.base_fingerprint if self.calibration is not None else None
        return base or self.fingerprint()

    def with_costs(self, **changes: Any) -> Topology:
        """This topology with some cost fields replaced (a calibration's variant, a bench row's
        copy-engine threshold, an LL call's per-op cost): one place that copies costs."""
        return self.model_copy(update={"costs": self.costs.model_copy(update=changes)})

    def shape_fingerprint(self) -> str:
        """Hash of what a measurement's plan depends on: ranks, nodes, the kinds of fabric and
        NIC placement (on several nodes); not bandwidths, latencies or costs. Measurements taken on a machine
        calibrate any topology file of the same shape."""
        data = {"num_nodes": self.num_nodes, "gpus_per_node": self.gpus_per_node,
                "gpu": self.gpu.name, "intra": self.intra.kind.value,
                "links_per_pair": self.intra.links_per_pair, "shared_gpu": self.shared_gpu,
                "nics": None if self.inter is None or self.num_nodes == 1 else [
                    self.inter.num_nics, self.nic_affinity()]}
        return _hash(data)

    def calibration_label(self) -> str:
        """One line on where the costs come from, for every report that quotes a time."""
        c = self.calibration
        if c is None:
            return "defaults, uncalibrated"
        err = ("" if c.holdout_geomean_error is None
               else f", held-out geomean error {c.holdout_geomean_error:.1%}")
        return f"calibrated {c.date_utc[:10]} on {c.rows} rows{err}"


_COST_DEFAULTS = {"sync_us": 0.0, "barrier_row_us": 0.0, "ll_unpack_us": 0.0, "ll_launch_us": None,
                  "intra_efficiency": 1.0, "nic_efficiency": 1.0, "pull_efficiency": 1.0,
                  "sm_op_gbps": None,
                  "ce_op_gbps": None, "ce_threshold_bytes": 8 << 20, "ce_launch_us": None,
                  "ce_concurrent_gbps": None,
                  "eager": {"call_us": 0.0, "issue_us": 0.0},
                  "graph": {"call_us": 0.0, "issue_us": 0.0},
                  "library": {"launch_us": None, "eager_call_us": None, "graph_call_us": None}}
NO_COPY_ENGINE_BYTES = 1 << 62      # a copy-engine threshold no copy reaches


def _hash(data: object) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
