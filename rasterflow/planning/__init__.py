"""A resolved job as frozen values: the grid, the chunks, the worker layout, the items and the budget verdict.

Planning is pure: no network and no Dask here. The catalog search and the cluster query happen in
``rasterflow.commands``, which hands their results (item dicts, a :class:`~rasterflow.sizing.WorkerLayout`) to
:func:`make_plan`. The :class:`JobPlan` holds every decision a run executes (the code path and its sub-blocks, the
read policy, the output and the cluster): nothing after :func:`make_plan` reads the spec.

The package is split by job: :mod:`~rasterflow.planning.grid` (the output grid), :mod:`~rasterflow.planning.chunks`
(the chunk index), :mod:`~rasterflow.planning.cost` (what a job reads and how long it takes),
:mod:`~rasterflow.planning.jobplan` (the frozen plan), :mod:`~rasterflow.planning.make` (:func:`make_plan`) and
:mod:`~rasterflow.planning.checks` (the checks before a run); every name is re-exported here.
"""

from __future__ import annotations

from rasterflow.planning.grid import (
    GridPlan as GridPlan,
    plan_aoi as plan_aoi,
    resolve_grid as resolve_grid,
    tiles_on_chunk_edges as tiles_on_chunk_edges,
)
from rasterflow.planning.chunks import (
    build_chunk_index as build_chunk_index,
    ChunkIndex as ChunkIndex,
    MAX_RECOUNT_CHUNKS as MAX_RECOUNT_CHUNKS,
)
from rasterflow.planning.cost import (
    DECODED_PX_PER_SECOND_PER_THREAD as DECODED_PX_PER_SECOND_PER_THREAD,
    job_cost as job_cost,
    JobCost as JobCost,
    remote_cost as remote_cost,
    RemoteCost as RemoteCost,
    RemoteProbe as RemoteProbe,
    SCHEDULER_SECONDS_PER_TASK as SCHEDULER_SECONDS_PER_TASK,
    STARTUP_SECONDS as STARTUP_SECONDS,
)
from rasterflow.planning.jobplan import (
    cluster_plan as cluster_plan,
    ClusterPlan as ClusterPlan,
    EncodingPlan as EncodingPlan,
    JobPlan as JobPlan,
    MemoryPlan as MemoryPlan,
    output_plan as output_plan,
    OutputPlan as OutputPlan,
)
from rasterflow.planning.make import (
    budget_inputs as budget_inputs,
    composite_of as composite_of,
    INTERPOLATING as INTERPOLATING,
    local_layout as local_layout,
    make_plan as make_plan,
    output_dates as output_dates,
    plan_periods as plan_periods,
    reduce_method as reduce_method,
    remote_fetch as remote_fetch,
    with_resampling as with_resampling,
)
from rasterflow.planning.checks import (
    check_items as check_items,
    static_check as static_check,
)

__all__ = [
    "ChunkIndex", "ClusterPlan", "EncodingPlan", "GridPlan", "OutputPlan", "cluster_plan", "output_plan", "JobCost", "JobPlan", "build_chunk_index", "tiles_on_chunk_edges", "job_cost", "resolve_grid", "local_layout", "budget_inputs", "make_plan", "static_check",
    "check_items", "output_dates",
]
