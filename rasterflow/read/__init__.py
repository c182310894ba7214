"""rasterflow's reader: one task's pixels, per item and asset, read with rasterio into the task's planes.

Per item and asset, the window of the output chunk is read on the file's native grid straight into the plane when
the file's grid is the output grid (same CRS and resolution, whole-pixel offset); otherwise through a WarpedVRT of
the file on the output grid. Files that the metadata places outside the chunk are not opened. A file that cannot be
opened or read is an error naming the item, the asset and the href (:class:`~rasterflow.errors.SourceReadError`):
never a silent hole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rasterflow.errors import SourceReadError
from rasterflow.kernels import Planes
from rasterflow.read.datasets import GDAL_OPEN_OPTIONS, open_source, reason, warped_source
from rasterflow.sources import AssetRead, AssetSource, grid_offset

__all__ = ["ReadJob", "read_planes", "read_asset"]


@dataclass(frozen=True)
class ReadJob:
    """What one task reads: its items' asset reads (None: no file of that item covers the chunk)."""

    reads: tuple[tuple[AssetRead | None, ...], ...]
    """``[item][asset]`` in the order of ``assets``."""
    assets: tuple[AssetSource, ...]
    grid: Any
    """The output :class:`~rasterflow.plan.GridPlan`."""
    resampling: str


def read_planes(job: ReadJob, rows: tuple[int, int], cols: tuple[int, int]) -> Planes:
    """Read the output window ``rows`` x ``cols`` of every item and asset of ``job``.

    Returns
    -------
    Planes
        Raw values per asset ``(item, y, x)`` in its load dtype, coverage where needed, and the per-item nodata,
        scale and offset.
    """
    import rasterio

    n_items, height, width = len(job.reads), rows[1] - rows[0], cols[1] - cols[0]
    raw, covered = [], []
    nodata = np.full((n_items, len(job.assets)), np.nan)
    scale = np.ones((n_items, len(job.assets)))
    offset = np.zeros((n_items, len(job.assets)))
    for a, source in enumerate(job.assets):
        fill = source.fill
        raw.append(np.full((n_items, height, width), 0 if fill is None else fill, dtype=source.load_dtype))
        covered.append(np.zeros((n_items, height, width), dtype=bool) if fill is None else None)
        if fill is not None:
            nodata[:, a] = fill  # what an item whose file misses the chunk holds there
    with rasterio.Env(**GDAL_OPEN_OPTIONS):
        for t, item_reads in enumerate(job.reads):
            for a, read in enumerate(item_reads):
                if read is None:
                    continue
                nodata[t, a] = math.nan if read.nodata is None else read.nodata
                scale[t, a], offset[t, a] = read.scale, read.offset
                plane_covered = covered[a][t] if covered[a] is not None else None
                read_asset(read, job.grid, job.resampling, job.assets[a].fill, rows, cols, raw[a][t], plane_covered)
    return Planes(raw=tuple(raw), covered=tuple(covered), nodata=nodata, scale=scale, offset=offset)


def read_asset(read: AssetRead, grid: Any, resampling: str, fill: float | None, rows: tuple[int, int],
               cols: tuple[int, int], out: np.ndarray, covered: np.ndarray | None) -> None:
    """Read one file's part of the output window into ``out`` (a ``(y, x)`` plane); mark ``covered`` pixels."""
    from rasterio.windows import Window

    dataset = open_source(read)
    try:
        direct = _direct_offset(dataset, grid)
        if direct is not None:
            row_off, col_off = direct
            r0, r1 = max(rows[0], row_off), min(rows[1], row_off + dataset.height)
            c0, c1 = max(cols[0], col_off), min(cols[1], col_off + dataset.width)
            if r0 >= r1 or c0 >= c1:
                return
            target = out[r0 - rows[0]:r1 - rows[0], c0 - cols[0]:c1 - cols[0]]
            window = Window(c0 - col_off, r0 - row_off, c1 - c0, r1 - r0)
            if target.dtype == np.dtype(dataset.dtypes[0]) and target.flags.c_contiguous:
                dataset.read(1, window=window, out=target)  # no copy: the common case of whole-width chunks
            else:
                target[...] = dataset.read(1, window=window)
            if covered is not None:
                covered[r0 - rows[0]:r1 - rows[0], c0 - cols[0]:c1 - cols[0]] = True
            return
        vrt = warped_source(read, grid, resampling, fill)
        window = Window(cols[0], rows[0], cols[1] - cols[0], rows[1] - rows[0])
        if covered is not None:
            data = vrt.read((1, vrt.count), window=window)
            out[...] = data[0]
            covered |= data[1] > 0
        else:
            out[...] = vrt.read(1, window=window)
    except SourceReadError:
        raise
    except Exception as err:  # a truncated or corrupt file, a network failure mid-read
        raise SourceReadError(f"cannot read {read.describe()}: {reason(err)}") from None


def _direct_offset(dataset: Any, grid: Any) -> tuple[int, int] | None:
    """Where the file's first pixel lies on the output grid, from the file itself (see :func:`grid_offset`)."""
    crs = dataset.crs.to_string() if dataset.crs is not None else None
    return grid_offset(crs, tuple(dataset.transform)[:6], grid)
