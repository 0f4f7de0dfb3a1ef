"""One timed point, whatever file it came from: the row model every measurement reader builds
(bench JSON, nccl-tests logs, the baseline). Apart from the readers so that each of them can
build rows without importing another."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hiercoll.collectives import DType, Kind, ReduceOp


class Measurement(BaseModel):
    """One timed point: a collective, the plan that ran (or the library), its size and mode."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    source: str = Field(description="'path:LINE' for text logs, 'path#INDEX' for JSON rows")
    tool: Literal["nccl-tests", "hiercoll-bench", "baseline"]
    collective: Kind
    algorithm: str = Field(description="hiercoll algorithm, or 'nccl' for the library")
    params: dict[str, int | float | str | bool] = Field(default_factory=dict)
    world_size: int = Field(ge=1)
    num_nodes: int | None = Field(default=None, ge=1)
    dtype: DType
    reduce_op: ReduceOp = ReduceOp.SUM
    nbytes: int = Field(ge=1, description="S as nccl-tests counts it (its size column)")
    mode: Literal["eager", "graph"] = "eager"
    in_place: bool = False
    time_us: float = Field(gt=0, description="the point's central time")
    statistic: Literal["p50", "mean"] = Field(description="nccl-tests prints a mean; bench p50")
    p90_us: float | None = None
    p99_us: float | None = None
    iters: int | None = None
    one_gpu: bool = Field(default=False, description="every rank in one process on one GPU")
    topology: str | None = Field(default=None, description="the topology the row names")
    topology_fingerprint: str | None = None
    wrong: int = Field(default=0, ge=0, description="nccl-tests #wrong (kept only when allowed)")
    lowering: dict[str, int | float | str | bool | None] = Field(
        default_factory=dict, description="the cuda lowering's knobs the row ran with (a bench "
        "row's options: forward, fuse, ce_threshold_bytes, ctas, ...); the prediction times the "
        "schedule those knobs run")
