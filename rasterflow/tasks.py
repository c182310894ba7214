"""The functions the workers run for the read-and-reduce tasks, in a module that imports no Dask and no xarray.

A worker imports the module of every function it is sent. Kept here, the fused task (:func:`chunk_reduce`) and the
series task (:func:`chunk_bands`) bring NumPy, the reader and the kernels into a worker process, not ``dask.array``
(which imports xarray and pandas whenever xarray is installed: ~45 MB of a worker's ~150 MB before any pixel,
measured 2026-12-05). :mod:`rasterflow.graph` builds the tasks that call them; ``tests/test_lean_workers.py`` holds
the workers of a real run to this.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from rasterflow import kernels
from rasterflow.allocator import release_free_memory
from rasterflow.errors import RasterflowError
from rasterflow.layers import prefetch_with
from rasterflow.read import ReadJob, gdal_env, item_stream
from rasterflow.read.prefetch import ahead, starts_ahead, task_reads

__all__ = ["chunk_reduce", "chunk_bands"]


def _portable_errors(task: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """A task whose rasterflow errors reach the client as themselves: raised again outside the handler, without the
    GDAL errors chained under them. distributed pickles a task's exception with its ``__context__``; rasterio's
    ``CPLE_*`` errors do not unpickle, and the client then gets a bare ``Exception`` holding the error's repr
    (``ReadFailedError``'s href, status and tries lost). GDAL's words are already in the message."""
    @functools.wraps(task)
    def run(*args: Any, **kwargs: Any) -> np.ndarray:
        try:
            return task(*args, **kwargs)
        except RasterflowError as err:
            error = err
        error.__context__ = error.__cause__ = None
        error.__suppress_context__ = True
        raise error

    return run


@_portable_errors
def chunk_reduce(job: ReadJob, rows: tuple[int, int], cols: tuple[int, int], program: kernels.Program,
                 view: kernels.TaskItems | None = None, block: tuple[int, int] = (0, 0),
                 across: bool = False) -> np.ndarray:
    """The fused task: read every date of one chunk (the items of ``view``) and reduce it ->
    ``(group, quantile, band, y, x)``.

    With ``block`` (the budget's :func:`~rasterflow.budget.sub_block`, ``(rows, cols)``) the chunk is read and
    reduced in sub-blocks of that size, one after the other, down each column of sub-blocks (``across``: across
    each row of them, the budget's :func:`~rasterflow.budget.sub_blocks_across`): every pixel's series is whole in
    its sub-block, so the result is the same, and the task holds one sub-block's series instead of the chunk's
    (memory does not grow with the dates)."""
    try:
        policy = job.read_policy()
        windows = list(_sub_blocks(rows, cols, block, across))
        with gdal_env(policy), task_reads(job.reads, job.grid, _read_windows(job, windows, program), policy):
            return clip(_chunk_reduce(job, rows, cols, program, view, windows), job, rows, cols, program)
    finally:
        release_free_memory()  # what the task freed goes back now, not when the heap's top happens to be free


def clip(result: np.ndarray, job: ReadJob, rows: tuple[int, int], cols: tuple[int, int],
         program: kernels.Program) -> np.ndarray:
    """``result`` (``(..., y, x)`` of the window) with nodata (NaN) where a pixel's centre lies outside the area of
    interest (``program.aoi``); as it is without one."""
    if not program.aoi:
        return result
    import json

    from rasterflow.aoi import outside

    a, b, c, d, e, f = job.grid.transform
    window = (a, b, c + cols[0] * a, d, e, f + rows[0] * e)
    out = outside(json.loads(program.aoi), window, (rows[1] - rows[0], cols[1] - cols[0]))
    if out.any():
        result[..., out] = np.nan
    return result


def _halo(window: tuple[tuple[int, int], tuple[int, int]], halo: int,
          shape: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """``window`` grown by ``halo`` pixels on every side, within the grid."""
    (r0, r1), (c0, c1) = window
    return (max(0, r0 - halo), min(shape[0], r1 + halo)), (max(0, c0 - halo), min(shape[1], c1 + halo))


def _read_windows(job: ReadJob, windows: list[tuple[tuple[int, int], tuple[int, int]]],
                  program: kernels.Program) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """What a task reads for its windows: each with the mask cleanup's halo."""
    if not program.halo:
        return windows
    return [_halo(w, program.halo, job.grid.shape) for w in windows]


def cleaned_stream(job: ReadJob, rows: tuple[int, int], cols: tuple[int, int],
                   program: kernels.Program) -> kernels.ItemStream:
    """The items of window ``rows`` x ``cols`` for the kernels, with ``mask_cleanup`` applied: each item is read
    with a halo, its mask evaluated and cleaned there (:func:`rasterflow.kernels.clean_mask`), then the planes and
    the cleaned mask cut to the window. Without a cleanup, the plain :func:`~rasterflow.read.item_stream`."""
    if not program.mask_cleanup or program.mask is None:
        return item_stream(job, rows, cols)
    (r0, r1), (c0, c1) = grown = _halo((rows, cols), program.halo, job.grid.shape)
    inner = item_stream(job, *grown)
    cut = (slice(rows[0] - r0, rows[1] - r0), slice(cols[0] - c0, cols[1] - c0))

    def read(t: int) -> kernels.Planes:
        planes = inner.read(t)
        drop = kernels.clean_mask(kernels.drop_plane(planes, 0, program), program.mask_cleanup)
        return kernels.Planes(raw=tuple(r[(slice(None), *cut)] for r in planes.raw),
                              covered=tuple(None if c is None else c[(slice(None), *cut)] for c in planes.covered),
                              nodata=planes.nodata, scale=planes.scale, offset=planes.offset,
                              drop=drop[cut][None])

    return kernels.ItemStream(n_items=inner.n_items, spatial_shape=(rows[1] - rows[0], cols[1] - cols[0]),
                              read=read)


def _sub_blocks(rows: tuple[int, int], cols: tuple[int, int], block: tuple[int, int],
                across: bool = False) -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
    """The windows a fused task reads, in its order: the chunk, or its sub-blocks down each column of them (GDAL's
    block cache keeps a tile cut by strips for the next strip), or with ``across`` across each row of them (the
    concurrent remote reader fetches a row of tiles in one request and holds it until the row is done)."""
    height, width = rows[1] - rows[0], cols[1] - cols[0]
    block_rows, block_cols = min(block[0] or height, height), min(block[1] or width, width)
    tops, lefts = range(rows[0], rows[1], block_rows), range(cols[0], cols[1], block_cols)
    pairs = ((top, left) for top in tops for left in lefts) if across else \
        ((top, left) for left in lefts for top in tops)
    for top, left in pairs:
        yield (top, min(top + block_rows, rows[1])), (left, min(left + block_cols, cols[1]))


def _chunk_reduce(job: ReadJob, rows: tuple[int, int], cols: tuple[int, int], program: kernels.Program,
                  view: kernels.TaskItems | None,
                  windows: list[tuple[tuple[int, int], tuple[int, int]]]) -> np.ndarray:
    if len(windows) == 1:
        return kernels.reduce_block(cleaned_stream(job, rows, cols, program), program, view)
    height, width = rows[1] - rows[0], cols[1] - cols[0]
    out: np.ndarray | None = None
    for sub_rows, sub_cols in windows:
        part = kernels.reduce_block(cleaned_stream(job, sub_rows, sub_cols, program), program, view)
        if out is None:
            out = np.empty((*part.shape[:-2], height, width), dtype=part.dtype)
        out[..., sub_rows[0] - rows[0]:sub_rows[1] - rows[0], sub_cols[0] - cols[0]:sub_cols[1] - cols[0]] = part
        del part
        release_free_memory()  # the sub-block's series and temporaries: the next one starts from a trimmed heap
    assert out is not None
    return out


@_portable_errors
def chunk_bands(job: ReadJob, rows: tuple[int, int], cols: tuple[int, int], program: kernels.Program,
                view: kernels.TaskItems | None = None) -> np.ndarray:
    """Read a time slice of one chunk (the items of ``view``) and evaluate the bands -> ``(date, band, y, x)``."""
    policy = job.read_policy()
    with gdal_env(policy), task_reads(job.reads, job.grid, _read_windows(job, [(rows, cols)], program), policy):
        return clip(kernels.band_block(cleaned_stream(job, rows, cols, program), program, view), job, rows, cols,
                    program)


def _reduce_ahead(job: ReadJob, rows: tuple[int, int], cols: tuple[int, int], program: kernels.Program,
                  view: kernels.TaskItems | None = None, block: tuple[int, int] = (0, 0),
                  across: bool = False) -> Callable[[], None] | None:
    """Start the reads of :func:`chunk_reduce`'s task before it runs (the same windows, in the same order)."""
    windows = list(_sub_blocks(rows, cols, block, across))
    return ahead(job.reads, job.grid, _read_windows(job, windows, program), job.read_policy())


def _bands_ahead(job: ReadJob, rows: tuple[int, int], cols: tuple[int, int], program: kernels.Program,
                 view: kernels.TaskItems | None = None) -> Callable[[], None] | None:
    """Start the reads of :func:`chunk_bands`' task before it runs."""
    return ahead(job.reads, job.grid, _read_windows(job, [(rows, cols)], program), job.read_policy())


def _starts_reads(job: ReadJob, *args: object) -> bool:
    """Whether the task's reads can start ahead (:func:`rasterflow.read.prefetch.ahead` would start some): the
    concurrent reader reads its files. Reads nothing."""
    return starts_ahead(job.reads, job.read_policy())


prefetch_with(chunk_reduce, _reduce_ahead, _starts_reads)
prefetch_with(chunk_bands, _bands_ahead, _starts_reads)

# ---------------------------------------------------------------------------------------------------------------
# The tree path (time chunked, a streaming reduction): partials per time chunk, combined four at a time, finished.
# Written here rather than with dask.array's reductions so that these workers, too, import neither dask.array nor
# xarray; the memory of each step is NumPy's nan-reductions' (what budget.py counts).

TREE_PARTS = {"mean": 2, "sum": 2, "count": 1, "min": 1, "max": 1, "std": 3}
"""Planes of one group's partial: mean/sum: (total, valid count); count; min/max: the extreme; std: count, mean, M2."""


def tree_partials(block: np.ndarray, method: str, groups: tuple[tuple[int, ...], ...]) -> dict[int, np.ndarray]:
    """One band's ``(t, y, x)`` time chunk -> ``{group: (part, y, x)}`` partials of ``method`` for the groups
    (periods) with dates in this chunk, each over those dates (``groups``: local indices per group). A chunk holds
    the partials of its own periods only, as Dask's per-period reductions did."""
    out: dict[int, np.ndarray] = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for g, local in enumerate(groups):
            if not local:
                continue
            subset = block if len(local) == block.shape[0] else block[list(local)]
            if method == "std":
                out[g] = kernels.std_partials(subset)
                continue
            part = np.empty((TREE_PARTS[method], *block.shape[1:]), dtype=block.dtype)
            if method in ("min", "max"):
                (np.fmin if method == "min" else np.fmax).reduce(subset, axis=0, out=part[0])
            elif method == "count":
                part[0] = np.count_nonzero(~np.isnan(subset), axis=0)
            else:
                np.nansum(subset, axis=0, out=part[0])
                part[1] = np.count_nonzero(~np.isnan(subset), axis=0)
            out[g] = part
            del subset
    return out


def tree_combine(parts: list[dict[int, np.ndarray]], method: str) -> dict[int, np.ndarray]:
    """The partials of several time chunks -> one ``{group: (part, y, x)}``: per group, those that have it combined."""
    out: dict[int, np.ndarray] = {}
    for g in sorted(set().union(*parts)):
        have = [p[g] for p in parts if g in p]
        if len(have) == 1:
            out[g] = have[0]
        elif method == "std":
            out[g] = kernels.combine_std_partials(np.stack(have))
        else:
            total = have[0].copy()
            for other in have[1:]:
                if method in ("min", "max"):
                    (np.fmin if method == "min" else np.fmax)(total, other, out=total)
                else:
                    total += other
            out[g] = total
    return out


def tree_finish(partials: dict[int, np.ndarray], method: str, n_groups: int) -> np.ndarray:
    """Combined ``{group: (part, y, x)}`` partials -> the reduction ``(group, 1, 1, y, x)`` (quantile and band axes
    of one, as the fused task's result), NaN where a group has no valid date (count: 0)."""
    first = next(iter(partials.values()))
    out = np.full((n_groups, 1, 1, *first.shape[1:]), np.nan, dtype=first.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        for g, part in partials.items():
            if method == "std":
                out[g, 0, 0] = kernels.finish_std(part)
            elif method in ("min", "max", "count"):
                out[g, 0, 0] = part[0]
            else:
                total, valid = part[0], part[1]
                result = total / valid if method == "mean" else total.copy()
                result[valid == 0] = np.nan
                out[g, 0, 0] = result
    if method == "count":
        np.nan_to_num(out, copy=False, nan=0.0)  # a group absent from every chunk: no valid date
    return out
