"""The functions the workers run for the read-and-reduce tasks, in a module that imports no Dask and no xarray.

A worker imports the module of every function it is sent. Kept here, the fused task (:func:`chunk_reduce`) and the
series task (:func:`chunk_bands`) bring NumPy, the reader and the kernels into a worker process, not ``dask.array``
(which imports xarray and pandas whenever xarray is installed: ~45 MB of a worker's ~150 MB before any pixel,
measured 2026-12-05). :mod:`rasterflow.graph` builds the tasks that call them; ``tests/test_lean_workers.py`` holds
the workers of a real run to this.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from rasterflow import kernels
from rasterflow.allocator import release_free_memory
from rasterflow.errors import RasterflowError
from rasterflow.read import ReadJob, gdal_env, item_stream

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
                 view: kernels.TaskItems | None = None, block: tuple[int, int] = (0, 0)) -> np.ndarray:
    """The fused task: read every date of one chunk (the items of ``view``) and reduce it ->
    ``(group, quantile, band, y, x)``.

    With ``block`` (the budget's :func:`~rasterflow.budget.sub_block`, ``(rows, cols)``) the chunk is read and
    reduced in sub-blocks of that size, one after the other, down each column of sub-blocks: every pixel's series
    is whole in its sub-block, so the result is the same, and the task holds one sub-block's series instead of the
    chunk's (memory does not grow with the dates)."""
    try:
        with gdal_env():
            return _chunk_reduce(job, rows, cols, program, view, block)
    finally:
        release_free_memory()  # what the task freed goes back now, not when the heap's top happens to be free


def _chunk_reduce(job: ReadJob, rows: tuple[int, int], cols: tuple[int, int], program: kernels.Program,
                  view: kernels.TaskItems | None, block: tuple[int, int]) -> np.ndarray:
    height, width = rows[1] - rows[0], cols[1] - cols[0]
    block_rows, block_cols = min(block[0] or height, height), min(block[1] or width, width)
    if (block_rows, block_cols) == (height, width):
        return kernels.reduce_block(item_stream(job, rows, cols), program, view)
    out: np.ndarray | None = None
    for left in range(cols[0], cols[1], block_cols):
        sub_cols = (left, min(left + block_cols, cols[1]))
        for top in range(rows[0], rows[1], block_rows):
            sub_rows = (top, min(top + block_rows, rows[1]))
            part = kernels.reduce_block(item_stream(job, sub_rows, sub_cols), program, view)
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
    with gdal_env():
        return kernels.band_block(item_stream(job, rows, cols), program, view)
