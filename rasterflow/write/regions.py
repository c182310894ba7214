"""The write task of :mod:`rasterflow.write.zarr`: encode one region and write it into its Zarr object, on a worker.

Its own module, light at import time (NumPy and the stdlib; zarr and fsspec load inside), so that a worker that
writes regions imports neither Dask's array nor xarray (see :mod:`rasterflow.tasks`).
"""

from __future__ import annotations

import os
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from rasterflow.write.common import Encoding, encode_block, is_remote
from rasterflow.write.stac import BlockStats, chunk_statistics

__all__ = ["join", "write_region", "ZarrFormat"]

#: A Zarr format rasterflow writes (:mod:`rasterflow.write.zarr` explains the choice).
ZarrFormat = Literal[2, 3]


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def _touch(url: str) -> None:
    if is_remote(url):
        import fsspec.core

        fs, p = fsspec.core.url_to_fs(url)
        fs.pipe_file(p, b"")
        return
    directory = os.path.dirname(url)
    os.makedirs(directory, exist_ok=True)
    with open(url, "wb"):
        pass


def write_region(blocks: list[npt.NDArray[Any]], *, store: str, var: str, markers: str, zarr_format: ZarrFormat,
                 encoding: Encoding | None, region: tuple[tuple[int, int], ...], marker: str,
                 columns: int) -> dict[tuple[int, ...], BlockStats]:
    """Encode the Dask blocks of one write region (one Zarr chunk, or one shard of several chunks: ``blocks`` in
    row-major order, ``columns`` per row) into one array of the stored dtype, write it with one assignment, then
    leave its done-marker. Runs on a worker; no other task writes this region's objects. Returns the statistics of
    the chunks written (:func:`~rasterflow.write.stac.chunk_statistics`), for the STAC item."""
    import zarr

    array = zarr.open_array(store, path=var, mode="r+", zarr_format=zarr_format)
    stored: npt.NDArray[Any]
    if len(blocks) == 1:
        block = blocks[0]
        stored = encode_block(block, encoding, var) if encoding is not None else block
    else:
        # one shard: each block is encoded straight into its place, so the shard exists once, in the stored dtype,
        # beside the blocks Dask holds (not as row copies, a float copy and then an encoded copy)
        shape = tuple(stop - start for start, stop in region)
        stored = np.empty(shape, dtype=array.dtype)
        y0 = 0
        for k in range(0, len(blocks), columns):
            x0 = 0
            for block in blocks[k:k + columns]:
                rows, cols = block.shape[-2:]
                stored[..., y0:y0 + rows, x0:x0 + cols] = (
                    encode_block(block, encoding, var) if encoding is not None else block)
                x0 += cols
            y0 += blocks[k].shape[-2]
    values = np.asarray(stored, dtype=array.dtype)
    fill = array.fill_value
    # the band's nodata: in format 3 zarr's fill_value is not it (0 for an int16 band whose nodata is -32768)
    nodata = encoding.nodata if encoding is not None else (None if fill is None else float(fill))
    statistics = chunk_statistics(values, [start for start, _stop in region], array.chunks, nodata)
    if not _only_fill(values, fill, nodata, statistics):
        array[tuple(slice(start, stop) for start, stop in region)] = values
    _touch(join(markers, var, marker))
    return statistics


def _only_fill(values: npt.NDArray[Any], fill: Any, nodata: float | None,
               statistics: dict[tuple[int, ...], BlockStats]) -> bool:
    """Whether the region holds nothing but the array's fill value, so there is nothing to store: zarr stores no
    object for such a chunk (``write_empty_chunks`` off, its default) and reads it back as the fill value, and no
    earlier run of this job stored one (its staging store is this job's, whose blocks are the same). Skipping it
    saves zarr's own check and the removal of an object that is not there (a monthly output over a window with a
    month of no item wrote as many of these as real blocks). The statistics already counted the values other than
    ``nodata``: where it is the fill, none means nothing but the fill (else zarr decides)."""
    import zarr

    if fill is None or nodata is None or any(block.count for block in statistics.values()) or zarr.config.get(
            "array.write_empty_chunks"):
        return False
    fill = float(fill)
    if not (fill == nodata or (np.isnan(fill) and np.isnan(nodata))):
        return False
    if values.dtype.kind != "f":
        return True  # no valid value: every value is the fill (the statistics leave out only it)
    if np.isnan(fill):
        return True  # no valid value: every value is NaN
    return not bool(np.isnan(values).any())  # NaN beside a numeric fill is not the fill
