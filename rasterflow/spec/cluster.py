"""The spec's cluster and budget sections: workers, memory thresholds and the static budget check."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator, model_validator

from rasterflow.spec.common import Size, SpecModel
from rasterflow.units import parse_bytes


class MemoryThresholds(SpecModel):
    """Dask worker memory thresholds, as fractions of the worker's memory limit (DOMAIN.md)."""

    target: Annotated[StrictFloat, Field(gt=0, le=1)] = Field(default=0.6, description="Spill managed data to disk.")
    spill: Annotated[StrictFloat, Field(gt=0, le=1)] = Field(default=0.7, description="Spill based on process RSS.")
    pause: Annotated[StrictFloat, Field(gt=0, le=1)] = Field(default=0.8, description="Stop starting new tasks.")
    terminate: Annotated[StrictFloat, Field(gt=0, le=1)] = Field(default=0.95, description="The nanny kills the worker.")

    @model_validator(mode="after")
    def _check_order(self) -> MemoryThresholds:
        if not (self.target <= self.spill <= self.pause <= self.terminate):
            raise ValueError("thresholds must rise: target <= spill <= pause <= terminate")
        return self


class Cluster(SpecModel):
    """The Dask cluster: a LocalCluster sized from the machine, or an existing scheduler."""

    address: StrictStr | None = Field(
        default=None,
        description="tcp://host:8786 = use that existing Dask cluster (or env DASK_SCHEDULER_ADDRESS); null = LocalCluster.",
    )
    n_workers: Literal["auto"] | Annotated[StrictInt, Field(gt=0)] = Field(
        default="auto", description="LocalCluster worker processes; auto = sized from cores and memory."
    )
    threads_per_worker: Annotated[StrictInt, Field(gt=0)] = Field(
        default=1, description="Threads per worker: tasks a worker runs at once (each holds a working set)."
    )
    memory_limit: Literal["auto"] | Size = Field(
        default="auto", description='Per-worker memory limit: auto = (RAM - reserve) / n_workers; or e.g. "4GB".'
    )
    gdal_cachemax: Literal["auto"] | Size = Field(
        default="auto",
        description="GDAL block cache per worker process, set before GDAL starts. auto = 16MB when plan finds every "
        "source file on the output grid with its tiles on the chunks' edges (each source block is then decoded "
        "once: a cache cannot help, it only fills), else 256MB (warped reads and tiles cut by chunk edges "
        "decode blocks again; the cache keeps them). The COG writer's cache (in the client) is 256MB with auto.",
    )
    memory: MemoryThresholds = Field(
        default_factory=MemoryThresholds, description="Worker memory thresholds (fractions of the memory limit)."
    )
    processes: Literal["auto"] | StrictBool = Field(
        default="auto",
        description=(
            "true = a LocalCluster of n_workers worker processes; false = one process (the run's own) with "
            "n_workers x threads_per_worker threads and memory_limit as its limit: no worker start-up, one "
            "interpreter instead of one per worker, no dashboard; auto = one process when n_workers is auto, the job's budget "
            "fits one process and plan estimates less than 20 s of compute, else worker processes. Ignored when address (or DASK_SCHEDULER_ADDRESS) is set."
        ),
    )

    @field_validator("address")
    @classmethod
    def _check_address(cls, address: str | None) -> str | None:
        if address is not None and not re.match(r"^(tcp|tls|inproc|ucx|ws|wss)://[^\s/]+(:[0-9]+)?/?$", address):
            raise ValueError(f"expected a scheduler address like tcp://host:8786 (got {address!r})")
        return address

    @field_validator("memory_limit")
    @classmethod
    def _check_memory_limit(cls, value: str | int) -> str | int:
        if value != "auto" and parse_bytes(value) <= 0:
            raise ValueError(f"must be a positive size like '4GB' (got {value!r})")
        return value

    @field_validator("gdal_cachemax")
    @classmethod
    def _check_cachemax(cls, value: str | int) -> str | int:
        if value != "auto":
            parse_bytes(value)
        return value


class Budget(SpecModel):
    """The static memory budget check."""

    max_fraction: Annotated[StrictFloat, Field(gt=0, le=1)] = Field(
        default=0.5, description="Refuse to run when the estimated peak per worker exceeds this fraction of its limit."
    )
    on_exceed: Literal["error", "warn"] = Field(default="error", description="error = refuse; warn = run anyway.")
