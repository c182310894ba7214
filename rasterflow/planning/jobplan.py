"""The resolved job as frozen values: the JobPlan and the output and cluster plans it carries."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rasterflow import budget
from rasterflow.kernels import Program
from rasterflow.planning.chunks import ChunkIndex
from rasterflow.planning.cost import JobCost
from rasterflow.planning.grid import GridPlan
from rasterflow.readplan import ReadPolicy
from rasterflow.sizing import WorkerLayout
from rasterflow.sources import SourceTable

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.spec import Spec
    from rasterflow.statcost import StatisticsCost


@dataclass(frozen=True)
class EncodingPlan:
    """``output.encoding`` as given (None = the writer's default for the data type)."""

    dtype: str | None = None
    scale: float = 1.0
    offset: float = 0.0
    nodata: float | None = None


@dataclass(frozen=True)
class OutputPlan:
    """What the writers, the STAC documents and the run's description need of ``output`` (and of the search window,
    the period and the mask, which describe the output)."""

    format: str = "zarr"
    """``zarr`` or ``cog`` (given, or from the path's extension)."""
    path: str = ""
    """``output.path`` as written (dated paths are rendered by the run, which knows the time it ends at)."""
    policy: str = "error"
    """The effective ``if_exists``."""
    compression: str = "zstd"
    encoding: EncodingPlan = field(default_factory=EncodingPlan)
    zarr_format: int = 2
    zarr_shards: int | None = None
    cog_blocksize: int = 512
    cog_overview_resampling: str = "average"
    cog_predictor: str = "auto"
    tiling_size: int | None = None
    """``output.tiling.size`` (None: one output)."""
    datetime: str = ""
    """``source.stac.datetime`` as written: the run resolves a relative window against its own clock."""
    period: str | None = None
    """``reduce.period``."""
    mask: str | None = None
    """The mask expression's text."""
    catalog: str = ""
    """``source.stac.catalog`` (a local path made absolute against the spec's folder by the caller)."""
    aoi: str = ""
    """``source.stac.intersects`` as WGS84 GeoJSON text (the STAC Items' geometry is the footprint within it);
    empty without one."""


@dataclass(frozen=True)
class MemoryPlan:
    """Dask's worker memory thresholds (fractions of the memory limit)."""

    target: float = 0.6
    spill: float = 0.7
    pause: float = 0.8
    terminate: float = 0.95


@dataclass(frozen=True)
class ClusterPlan:
    """``cluster`` as plain values, with the attribute names :meth:`rasterflow.cluster.ClusterSettings.from_spec`
    reads (``gdal_cachemax`` here is the spec's; the run uses :attr:`JobPlan.gdal_cachemax`, ``auto`` resolved)."""

    address: str | None = None
    n_workers: int | str = "auto"
    threads_per_worker: int = 1
    memory_limit: int | str = "auto"
    gdal_cachemax: int | str = "auto"
    processes: bool | str = "auto"
    memory: MemoryPlan = field(default_factory=MemoryPlan)


def output_plan(spec: Spec) -> OutputPlan:
    """The :class:`OutputPlan` of a validated spec."""
    out = spec.output
    enc = out.encoding
    return OutputPlan(
        format=out.resolved_format, path=out.path, policy=out.policy, compression=out.compression,
        encoding=EncodingPlan(dtype=enc.dtype, scale=float(enc.scale), offset=float(enc.offset),
                              nodata=None if enc.nodata is None else float(enc.nodata)),
        zarr_format=int(out.zarr_format), zarr_shards=out.zarr_shards, cog_blocksize=int(out.cog.blocksize),
        cog_overview_resampling=out.cog.overview_resampling, cog_predictor=out.cog.predictor,
        tiling_size=None if out.tiling is None else int(out.tiling.size),
        datetime=str(spec.source.stac.datetime), period=spec.reduce_period,
        mask=spec.mask, catalog=str(spec.source.stac.catalog),
        aoi=json.dumps(spec.source.stac.intersects) if isinstance(spec.source.stac.intersects, dict) else "")


def cluster_plan(spec: Spec) -> ClusterPlan:
    """The :class:`ClusterPlan` of a validated spec."""
    c = spec.cluster
    m = c.memory
    return ClusterPlan(address=c.address, n_workers=c.n_workers, threads_per_worker=int(c.threads_per_worker),
                       memory_limit=c.memory_limit, gdal_cachemax=c.gdal_cachemax, processes=c.processes,
                       memory=MemoryPlan(target=float(m.target), spill=float(m.spill), pause=float(m.pause),
                                         terminate=float(m.terminate)))


@dataclass(frozen=True)
class JobPlan:
    """Everything a run needs, decided before any pixel is read."""

    grid: GridPlan
    layout: WorkerLayout
    shape: budget.PipelineShape
    report: budget.BudgetReport
    items: tuple[dict[str, Any], ...] = ()
    """Item dicts from the search (empty for a static plan)."""
    sources: SourceTable | None = None
    """Per item and asset: href, declared grid, dtype, nodata, scale/offset (None for a static plan)."""
    program: Program | None = None
    """What every task computes (None for a static plan)."""
    times: tuple[str, ...] = ()
    """The output dates (ISO 8601, UTC, no zone): one per item, or one per pass with ``group_by: solar_day``."""
    period_labels: tuple[str, ...] = ()
    """The output periods ("2024-06", "2024-JJA", "2024"), empty without ``reduce.period``."""
    outside_chunks: frozenset[tuple[int, int]] = frozenset()
    """``(chunk row, chunk column)`` of the chunks entirely outside ``source.stac.intersects``: their tasks read
    nothing (their blocks are nodata)."""
    period_bounds: tuple[tuple[str, str], ...] = ()
    """Per period, ``(start, end)`` as ISO 8601 UTC without a zone, the end exclusive: every period of the window,
    those without an item too (:func:`rasterflow.periods.window_periods`)."""
    quantile_dim: bool = False
    """True when the output has a quantile dimension (``reduce.q`` is a list)."""
    name: str = ""
    spec_sha256: str = ""
    """The SHA-256 of the spec's text after its variables (the output's fingerprint starts from it); empty for a
    plan made from a spec object without its file."""
    resampling: str = "nearest"
    expressions: tuple[tuple[str, str], ...] = ()
    """Band name -> expression text, for the outputs' metadata."""
    cost: JobCost | None = None
    """Bytes read and the estimated wall time (None for a static plan)."""
    chunk_index: ChunkIndex | None = None
    """Per spatial chunk, the items whose files meet it (None for a static plan)."""
    round_trip: float | None = None
    """Seconds of the remote header probe (``source.io.concurrency: auto`` follows it); None when not measured."""
    read_policy: ReadPolicy | None = None
    """How every read of the run behaves (retries, failure policy, signing, I/O), with the run's id: carried by each
    task (:attr:`rasterflow.read.ReadJob.policy`), not set per worker process (None for a static plan)."""
    output: OutputPlan = field(default_factory=OutputPlan)
    """Where and how the result is written."""
    cluster: ClusterPlan = field(default_factory=ClusterPlan)
    """What the run computes on (the worker layout itself is :attr:`layout`)."""
    statistics_cost: StatisticsCost | None = None
    """Per statistic of a list ``reduce`` (or of a geomedian or best-pixel composite), its terms in the budget's
    reduce stage for the largest task (:func:`rasterflow.statcost.statistics_cost`): the per-statistic lines of
    ``plan`` and ``profile``; None for a single statistic or without a reduction."""

    @property
    def code_path(self) -> str:
        """The code path the budget chose and the tasks run: ``fused``, ``tree`` or ``series``."""
        return self.report.path

    @property
    def places_reads(self) -> bool:
        """Whether the writer sends each chunk's tasks to a worker process it picks, the chunk's remote reads started
        there first (the budget's :func:`~rasterflow.budget.started_ahead` on worker processes): the run's
        LocalCluster then steals no work, which would move a task away from its started reads."""
        return not self.report.inputs.one_process and budget.started_ahead(self.shape, self.report.inputs)

    @property
    def sub_block(self) -> tuple[int, int]:
        """``(rows, cols)`` a fused task reduces its chunk in; ``(0, 0)`` = the whole chunk."""
        return self.report.sub_block

    @property
    def sub_blocks_across(self) -> bool:
        """Whether a fused task takes its sub-blocks across each row of them (the budget's
        :func:`~rasterflow.budget.sub_blocks_across`), else down each column."""
        return budget.sub_blocks_across(self.report.inputs)

    @property
    def gdal_cachemax(self) -> int:
        """GDAL's block cache per worker (``cluster.gdal_cachemax``, ``auto`` resolved: see
        :func:`tiles_on_chunk_edges`): what the budget counted, so what the workers get."""
        return self.report.inputs.gdal_cachemax

    @property
    def writer_cachemax(self) -> int:
        """GDAL's block cache of the COG writer in the client."""
        return self.report.inputs.client_cachemax

    @property
    def chunks(self) -> dict[str, int]:
        inputs = self.report.inputs
        cy, cx = inputs.chunk_yx
        return {"time": inputs.time_per_chunk, "y": cy, "x": cx}
