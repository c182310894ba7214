"""Compile a plan into a lazy xarray Dataset: read (our reader) -> mask -> band math -> reduction, per chunk.

Nothing here computes: the result is a Dask-backed Dataset that a writer streams to storage chunk by chunk.
With time whole (the default) the read, mask, bands and reduction of a spatial chunk run in one task
(:func:`rasterflow.tasks.chunk_reduce`, in a module of its own so that workers need not import Dask's array
or xarray) that depends on no other task, so no intermediate leaves its task, the chunks spread over
all workers and no data moves between them. Each task carries only the items whose files meet its chunk (the
plan's :class:`~rasterflow.planning.ChunkIndex`) and, of those, the asset reads whose files cover it; it reads them one
item at a time and, for a deep series, reduces its chunk in sub-blocks (the budget's ``sub_block``), so its memory
does not grow with the dates. Each code path's tasks are built by its module in :mod:`rasterflow.paths`, beside its
cost (:data:`rasterflow.paths.PATHS`, the switch the budget uses too); the task arrays and selections they share are
here. Every array's layer is a :class:`~rasterflow.layers.TaskLayer`: a task is made when a
writer's batch asks for it, so the client holds no task per chunk (issue 13, step 4).
The graph is built from the plan alone (:class:`~rasterflow.planning.JobPlan`), with Dask's public API.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import TypeAlias

import dask
import dask.array as da
import numpy as np
import numpy.typing as npt
import xarray as xr

from rasterflow import kernels
from rasterflow.paths import PATHS
from rasterflow.planning import JobPlan
from rasterflow.read import ReadJob
from rasterflow.tasks import chunk_bands, chunk_reduce
from rasterflow.layers import Task, lazy_array

__all__ = ["build_dataset", "chunk_reduce", "chunk_bands", "read_jobs", "local_read_job", "task_array", "select_blocks",
           "reduced_band", "lazy_task_array", "block_bounds"]

#: A task function of :func:`task_array`: ``function(job, rows, cols, program, view, *extra)`` -> its block
#: (:func:`~rasterflow.tasks.chunk_reduce` with ``extra = (sub_block, sub_blocks_across)``, :func:`~rasterflow.tasks.chunk_bands`
#: with none); the arity varies with ``extra``, hence ``...``.
ChunkFunction: TypeAlias = Callable[..., np.ndarray]
#: Dask's chunks of an array: per dimension, the sizes of its blocks.
Chunks: TypeAlias = tuple[tuple[int, ...], ...]
#: An index into a block (NumPy basic indexing by integers and slices).
BlockIndex: TypeAlias = tuple[int | slice, ...]
#: :class:`_Selection`'s table: a selection's leading block indices -> (the source's leading block indices, the
#: index into that block).
Leads: TypeAlias = dict[tuple[int, ...], tuple[tuple[int, ...], BlockIndex]]
#: A coordinate of the Dataset: its values, or (its dim, its values[, its attributes]).
Coordinate: TypeAlias = np.ndarray | tuple[str, np.ndarray] | tuple[str, np.ndarray, dict[str, str]]
#: A variable of the Dataset: its dims and its lazy array.
Variable: TypeAlias = tuple[tuple[str, ...], da.Array]


def block_bounds(chunks: tuple[int, ...]) -> list[tuple[int, int]]:
    """``[start, end)`` of each block along one dimension chunked ``chunks``."""
    edges = np.cumsum((0, *chunks))
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def read_jobs(plan: JobPlan, items: slice, rows: tuple[int, int], cols: tuple[int, int]) -> ReadJob:
    """The reads of every item of ``items`` whose files may cover the output window (the others become None): the
    task of a plan without a chunk index, and the reference the indexed tasks equal."""
    assert plan.sources is not None
    reads = tuple(
        tuple(read if read.intersects(rows, cols) else None for read in item_reads)
        for item_reads in plan.sources.reads[items]
    )
    return ReadJob(reads=reads, assets=plan.sources.assets, grid=plan.grid, resampling=plan.resampling,
                   policy=plan.read_policy)


def local_read_job(plan: JobPlan, items: Sequence[int], rows: tuple[int, int], cols: tuple[int, int],
                   one_box: Sequence[bool] | None = None) -> ReadJob:
    """The reads of ``items`` (those the chunk index puts on this window), a file missing the window None.

    ``one_box[t]``: every file of item ``t`` has the same footprint, so the index's word that the item meets the
    window holds for each of them (its reads are taken as they are, shared with the plan's table)."""
    assert plan.sources is not None
    table = plan.sources.reads
    reads = tuple(table[t] if one_box is not None and one_box[t]
                  else tuple(read if read.intersects(rows, cols) else None for read in table[t]) for t in items)
    return ReadJob(reads=reads, assets=plan.sources.assets, grid=plan.grid, resampling=plan.resampling,
                   policy=plan.read_policy)


def _one_box(plan: JobPlan) -> list[bool]:
    """Per item: all its files share one footprint on the grid (the tiles of most collections)."""
    assert plan.sources is not None
    return [len({read.footprint for read in reads}) == 1 for reads in plan.sources.reads]


class _ChunkTasks:
    """The task of block ``(time chunk, 0.., y chunk, x chunk)`` of :func:`task_array`:
    ``(function, job, rows, cols, program, view, *extra)``, the job holding the items the plan's chunk index puts
    on the chunk (every item of the time chunk, the files missing the window None, without an index)."""

    def __init__(self, plan: JobPlan, function: ChunkFunction, item_edges: list[tuple[int, int]],
                 y_chunks: tuple[int, ...], x_chunks: tuple[int, ...], extra: tuple[object, ...]) -> None:
        program = plan.program
        assert program is not None
        self.plan, self.function, self.program, self.extra = plan, function, program, extra
        self.item_edges, self.rows, self.cols = item_edges, block_bounds(y_chunks), block_bounds(x_chunks)
        self.n_items = len(plan.items)
        self.index = plan.chunk_index
        self.one_box = _one_box(plan) if self.index is not None else None
        self.step_of: npt.NDArray[np.int64] | None = None
        if program.steps:
            self.step_of = np.zeros(self.n_items, dtype=np.int64)
            for d, indices in enumerate(program.steps):
                self.step_of[list(indices)] = d

    def __call__(self, block: tuple[int, ...]) -> Task:
        k, i, j = block[0], block[-2], block[-1]
        (t0, t1), rows, cols = self.item_edges[k], self.rows[i], self.cols[j]
        if self.index is None:
            return (self.function, read_jobs(self.plan, slice(t0, t1), rows, cols), rows, cols, self.program, None,
                    *self.extra)
        local = self.index.items_of(i, j)
        if (i, j) in self.plan.outside_chunks:  # outside source.stac.intersects: read nothing, nodata
            local = local[:0]
        if t0 > 0 or t1 < self.n_items:
            local = local[np.searchsorted(local, t0):np.searchsorted(local, t1)]
        items = local.tolist()
        view = kernels.task_items(self.program, items, t0, t1 - t0, self.step_of)
        return (self.function, local_read_job(self.plan, items, rows, cols, self.one_box), rows, cols, self.program,
                view, *self.extra)


class _Selection:
    """The task of block ``(*lead, y chunk, x chunk)`` of one band cut out of a task array (:func:`select_blocks`):
    ``(operator.getitem, source block, index)``, ``leads[lead]`` giving the source block's leading indices and
    the index into it."""

    def __init__(self, source: str, leads: Leads) -> None:
        self.source, self.leads = source, leads

    def __call__(self, block: tuple[int, ...]) -> Task:
        prefix, index = self.leads[block[:-2]]
        return (operator.getitem, (self.source, *prefix, *block[-2:]), index)


def lazy_task_array(name: str, numblocks: tuple[int, ...], make: Callable[[tuple[int, ...]], Task], chunks: Chunks,
                    dtype: npt.DTypeLike, dependencies: Sequence[da.Array] = (), *,
                    inline: bool = False) -> da.Array:
    """A Dask array whose block ``b`` is the task ``make(b)`` (:func:`rasterflow.layers.lazy_array`)."""
    return lazy_array(name, numblocks, make, chunks, dtype, dependencies, inline=inline)


def task_array(plan: JobPlan, prefix: str, function: ChunkFunction, time_chunks: tuple[int, ...], leading: Chunks,
                dtype: str, extra: tuple[object, ...] = ()) -> da.Array:
    """A Dask array with one independent task per (time chunk, y chunk, x chunk); each task holds only the items
    the plan's chunk index puts on its chunk (:class:`~rasterflow.kernels.TaskItems`); ``extra`` are more arguments
    of ``function`` after the view. Its layer is a :class:`~rasterflow.layers.TaskLayer`: a task is made when
    a writer's batch asks for it, so the client holds O(1) for the array, not O(chunks)."""
    program = plan.program
    assert program is not None, "a plan without items has no tasks"
    cy, cx = plan.chunks["y"], plan.chunks["x"]
    height, width = plan.grid.shape
    y_chunks = tuple(min(cy, height - start) for start in range(0, height, cy))
    x_chunks = tuple(min(cx, width - start) for start in range(0, width, cx))
    token = dask.base.tokenize(plan.name, [item.get("id") for item in plan.items], plan.grid, plan.chunks,
                               repr(program), plan.resampling)
    name = f"{prefix}-{token}"
    index = plan.chunk_index
    if index is not None and index.chunk_yx != (cy, cx):
        raise ValueError(f"the plan's chunk index is for chunks {index.chunk_yx}, its tasks are {(cy, cx)}")
    item_edges = block_bounds(time_chunks) if not program.steps else [(0, len(plan.items))]
    chunks = leading + (y_chunks, x_chunks)
    numblocks = (len(item_edges),) + (1,) * (len(leading) - 1) + (len(y_chunks), len(x_chunks))
    make = _ChunkTasks(plan, function, item_edges, y_chunks, x_chunks, extra)
    return lazy_task_array(name, numblocks, make, chunks, dtype)


def select_blocks(source: da.Array, band_name: str, leads: Leads, lead_chunks: Chunks) -> da.Array:
    """One band of a task array, as its own lazy layer (a :class:`~rasterflow.layers.TaskLayer` of
    :class:`_Selection`): block ``(*lead, i, j)`` is ``source_block[index]`` with ``leads[lead] = (source leading
    block, index)``, the leading dims chunked ``lead_chunks``. The same blocks as Dask's slicing and rechunking of
    ``source`` would give, without their layers of O(chunks) tasks."""
    name = f"rasterflow-{band_name}-{dask.base.tokenize(source.name, band_name, repr(leads))}"
    numblocks = tuple(len(c) for c in lead_chunks) + source.numblocks[-2:]
    return lazy_task_array(name, numblocks, _Selection(source.name, leads), lead_chunks + source.chunks[-2:],
                       source.dtype, dependencies=[source], inline=True)


def build_dataset(plan: JobPlan) -> xr.Dataset:
    """The lazy result: one variable per band, dims ``([period,] [quantile,] y, x)`` or ``(time, y, x)``."""
    from rasterflow.georef import write_georef

    program = plan.program
    if program is None or plan.sources is None:
        raise ValueError("build_dataset needs a plan made with the searched items")
    n_items = len(plan.items)
    height, width = plan.grid.shape
    minx, _, _, maxy = plan.grid.bounds
    res = plan.grid.resolution
    coords: dict[str, Coordinate] = {"y": maxy - res * (np.arange(height) + 0.5), "x": minx + res * (np.arange(width) + 0.5)}
    # the budget's path (one switch, rasterflow.paths.PATHS): the memory it checked is that of the tasks built here
    built = PATHS[plan.code_path].build(plan)
    variables = built.variables
    coords.update(built.coords)
    if plan.period_labels:
        # each period's start (CF-style bounds: period_end, exclusive), and the label files are named by
        coords["period"] = ("period", np.array([np.datetime64(a, "ns") for a, _ in plan.period_bounds]),
                            {"long_name": "start of the period", "bounds_end": "period_end"})
        coords["period_end"] = ("period", np.array([np.datetime64(b, "ns") for _, b in plan.period_bounds]),
                                {"long_name": "end of the period (exclusive)"})
        coords["period_label"] = ("period", np.array(plan.period_labels))
    if plan.quantile_dim:
        coords["quantile"] = np.array(program.quantiles)
    dataset = xr.Dataset(variables, coords=coords)
    dataset.attrs.update({"rasterflow_pipeline": plan.name, "rasterflow_items": n_items})
    expressions = dict(plan.expressions)
    if program.composite is not None:
        composite = program.composite
        for name in composite.outputs:
            attrs = dataset[name].attrs
            attrs.update(long_name=name, rasterflow_statistic=composite.method,
                         rasterflow_expression=expressions.get(name, name if name in composite.inputs else ""))
            if composite.method == "best":
                attrs.update(rasterflow_best_by=composite.by, rasterflow_best_order=composite.order)
    elif program.statistics:
        for band in program.band_names:
            for statistic, method, q in program.statistics:
                attrs = dataset[f"{band}_{statistic}"].attrs
                attrs.update(long_name=f"{band} {statistic}", rasterflow_expression=expressions.get(band, ""),
                             rasterflow_band=band, rasterflow_statistic=method)
                if q is not None:
                    attrs["rasterflow_quantile"] = q
    else:
        for name in program.band_names:
            dataset[name].attrs["long_name"] = name
            dataset[name].attrs["rasterflow_expression"] = expressions.get(name, "")
    return write_georef(dataset, plan.grid.crs, plan.grid.transform)


def reduced_band(fused: da.Array, band: int, name: str, keep_period: bool, keep_quantile: bool) -> Variable:
    """Band ``band`` of the fused ``(group, quantile, band, y, x)`` array with the dims a user expects (those of
    :func:`_reduced_dims`: period only with a period, quantile only for a list, each chunked 1), as its own lazy
    layer: block ``(p, q, i, j)`` is the fused block ``(i, j)`` at ``[p:p+1, q:q+1, band]``."""
    groups, quantiles = fused.shape[0], fused.shape[1]
    leads: Leads = {}
    for p in range(groups) if keep_period else (None,):
        for q in range(quantiles) if keep_quantile else (None,):
            lead = tuple(x for x in (p, q) if x is not None)
            index = (0 if p is None else slice(p, p + 1), 0 if q is None else slice(q, q + 1), band)
            leads[lead] = ((0, 0, 0), index)
    dims = [d for d, keep in (("period", keep_period), ("quantile", keep_quantile)) if keep]
    lead_chunks = tuple((1,) * n for n, keep in ((groups, keep_period), (quantiles, keep_quantile)) if keep)
    return (*dims, "y", "x"), select_blocks(fused, name, leads, lead_chunks)


def _reduced_dims(stacked: da.Array, keep_period: bool, keep_quantile: bool) -> Variable:
    """``(group, quantile, y, x)`` -> the dims a user expects: period only with a period, quantile only for a list.

    Dask's slicing and rechunking: no longer part of the graph (:func:`reduced_band` gives the same blocks as one
    lazy layer); kept as the reference construction ``tests/test_lazy_graph.py`` and ``benchmarks/bounded_submit.py``
    compare it with."""
    dims = ["period", "quantile", "y", "x"]
    index: list[int | slice] = [slice(None) if keep_period else 0, slice(None) if keep_quantile else 0]
    array = stacked[tuple(index)]
    names = [d for d, keep in zip(dims[:2], (keep_period, keep_quantile)) if keep] + ["y", "x"]
    chunks = {i: 1 for i in range(len(names) - 2)}
    return tuple(names), array.rechunk(chunks) if chunks else array
