"""The ``raster:bands`` statistics of what was written: minimum, maximum, mean, standard deviation and valid
percentage of the stored values, added block by block in a fixed order, so the sums do not depend on who computed
a block or when (the write tasks compute their chunks' and tiles'; the rest is read back from the outputs).

Standard library at import time; numpy, rasterio and zarr load inside the functions.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from rasterflow.write.files import is_remote

if TYPE_CHECKING:  # pragma: no cover
    import numpy.typing as npt

__all__ = ["BlockStats", "ChunkStatistics", "chunk_statistics", "cog_statistics", "tile_statistics",
           "zarr_statistics", "STATISTICS_CACHEMAX"]


@dataclasses.dataclass
class BlockStats:
    """Streaming minimum, maximum, mean, standard deviation and valid percentage of stored values."""

    count: int = 0
    total: int = 0
    sum: float = 0.0
    sumsq: float = 0.0
    min: float = float("inf")
    max: float = float("-inf")

    @classmethod
    def of(cls, values: npt.ArrayLike, nodata: float | None, *, native: bool | None = None) -> BlockStats:
        """The statistics of one block: NaN and ``nodata`` left out, sums in float64 left to right (the compiled
        ``block_stats`` in one pass where installed, ``native``: see :func:`rasterflow.compiled.chosen`; else
        NumPy, the same values)."""
        import numpy as np

        from rasterflow import compiled

        array = np.asarray(values)
        block = cls(total=array.size)
        if nodata is not None and np.isnan(nodata):
            nodata = None
        kernels = compiled.chosen(native)
        if kernels is not None and array.dtype.char in "fdbBhHiI":
            count, total, squares, low, high = kernels.block_stats(np.ascontiguousarray(array), nodata)
            if count:
                block.count, block.sum, block.sumsq, block.min, block.max = count, total, squares, low, high
            return block
        valid = array
        if array.dtype.kind == "f":
            valid = valid[~np.isnan(valid)]
        if nodata is not None:
            valid = valid[valid != nodata]
        if valid.size == 0:
            return block
        as_float = valid.astype(np.float64).ravel()
        block.count = valid.size
        block.sum = float(np.cumsum(as_float)[-1])  # left to right, as the compiled pass adds
        block.sumsq = float(np.cumsum(as_float * as_float)[-1])
        block.min, block.max = float(as_float.min()), float(as_float.max())
        return block

    def add(self, block: BlockStats) -> None:
        """Add a block's statistics (blocks added in one order give the same sums whoever computed them)."""
        self.total += block.total
        if not block.count:
            return
        self.count += block.count
        self.sum += block.sum
        self.sumsq += block.sumsq
        self.min, self.max = min(self.min, block.min), max(self.max, block.max)

    def as_stac(self) -> dict[str, float]:
        """The ``statistics`` of a ``raster:bands`` entry.

        Returns
        -------
        dict
            ``minimum``, ``maximum``, ``mean``, ``stddev`` (population) and ``valid_percent``; only
            ``valid_percent`` (0) when no value is valid.
        """
        percent = 100.0 * self.count / self.total if self.total else 0.0
        if not self.count:
            return {"valid_percent": 0.0}
        mean = self.sum / self.count
        variance = max(0.0, self.sumsq / self.count - mean * mean)
        return {"minimum": self.min, "maximum": self.max, "mean": mean, "stddev": variance ** 0.5,
                "valid_percent": percent}


def _threads() -> int:
    """Threads for the Zarr statistics pass: it runs in the client after the workers are done (decoding and NumPy
    release the GIL); 121 Zarr chunks of 4 MB took 2.1 s on one thread, 1.45 s on two."""
    return max(1, min(4, os.cpu_count() or 1))


STATISTICS_CACHEMAX = 16 * 2**20
"""GDAL's block cache while the statistics pass reads a COG: each block is read once, in order, so a cache only
fills up. With GDAL's default (5% of RAM) the pass over the season's 10980² output held the whole raster: 585 MB
and 3.5 s in a fresh process, 105 MB and 1.6 s with this (2026-12-05); in the run's client it came after the
memory samples and took the process from ~0.7 GB to 1.1 GB."""


def cog_statistics(path: str) -> list[dict[str, float]]:
    """Per band of a COG: the statistics of its stored values, read back block by block in the file's order.

    Parameters
    ----------
    path : str
        A local path or a URL GDAL reads (``s3://`` with the endpoint boto users set).

    Returns
    -------
    list of dict
        :meth:`BlockStats.as_stac` per band.
    """
    # One handle, one thread: reading the blocks on several threads (a handle each) made the client of a 10980²
    # COG run peak at 1.21 GB instead of 0.81 GB (GDAL's block caches), for 0.2 s less
    import rasterio

    options: dict[str, str] = {}
    if is_remote(path):  # GDAL's names of the endpoint boto users set (AWS_ENDPOINT_URL -> AWS_S3_ENDPOINT...)
        from rasterflow.gdalenv import aws_endpoint_options

        options = aws_endpoint_options()
    with rasterio.Env(GDAL_PAM_ENABLED="NO", GDAL_CACHEMAX=STATISTICS_CACHEMAX, **options), \
            rasterio.open(path) as src:  # no .aux.xml beside the output
        stats = [BlockStats() for _ in range(src.count)]
        for _ij, window in src.block_windows(1):
            block = src.read(window=window)
            for band, acc in enumerate(stats):
                acc.add(BlockStats.of(block[band], src.nodata))
    return [s.as_stac() for s in stats]


def tile_statistics(known: Mapping[tuple[int, ...], BlockStats], bands: int) -> list[dict[str, float]]:
    """A COG's statistics from its full-resolution tiles', added per band in row-major tile order: the order
    :func:`cog_statistics` reads the file in, so the sums are the same.

    Parameters
    ----------
    known : mapping
        ``(band, tile row, tile column)`` -> :class:`BlockStats`, what the workers computed.
    bands : int
        The number of bands.

    Returns
    -------
    list of dict
        :meth:`BlockStats.as_stac` per band.
    """
    out: list[dict[str, float]] = []
    for band in range(bands):
        acc = BlockStats()
        for key in sorted(k for k in known if k[0] == band):
            acc.add(known[key])
        out.append(acc.as_stac())
    return out


ChunkStatistics = Mapping[tuple[int, ...], "BlockStats"]
"""The statistics of Zarr chunks, by chunk index (what a write task returns: :func:`chunk_statistics`)."""


def chunk_statistics(values: npt.NDArray[Any], start: Sequence[int], chunks: Sequence[int],
                     nodata: float | None) -> dict[tuple[int, ...], BlockStats]:
    """The statistics of each Zarr chunk of a region: what :func:`zarr_statistics` computes reading those chunks
    back, computed by the task that wrote them instead (issue 13: the client read the whole output back, O(output)
    in one process).

    Parameters
    ----------
    values : numpy.ndarray
        The stored values of a region of an array.
    start : sequence of int
        Where the region starts in the array, on chunk boundaries.
    chunks : sequence of int
        The array's chunk shape.
    nodata : float or None
        The array's fill value.

    Returns
    -------
    dict
        Chunk index -> :class:`BlockStats`.
    """
    import itertools

    ranges = [range(0, n, c) for n, c in zip(values.shape, chunks)]
    out: dict[tuple[int, ...], BlockStats] = {}
    for offsets in itertools.product(*ranges):
        index = tuple((s + o) // c for s, o, c in zip(start, offsets, chunks))
        region = tuple(slice(o, o + c) for o, c in zip(offsets, chunks))
        out[index] = BlockStats.of(values[region], nodata)
    return out


def zarr_statistics(path: str, names: Sequence[str], known: Mapping[str, ChunkStatistics] | None = None,
                    nodata: float | None | Literal["fill_value"] = "fill_value") -> list[dict[str, float]]:
    """Per array: the statistics of every chunk, from ``known`` (what this run's write tasks returned) or read back
    (chunks an earlier, interrupted run wrote), added in chunk order whoever computed them.

    Parameters
    ----------
    path : str
        The Zarr store.
    names : sequence of str
        The arrays (bands), in order.
    known : mapping, optional
        Array name -> :data:`ChunkStatistics`.
    nodata : float, None or "fill_value"
        The value left out (the output's ``encoding.nodata``; NaN is always left out); ``"fill_value"``: each
        array's own, right for format 2 only (format 3 keeps xarray's ``_FillValue`` apart from zarr's
        ``fill_value``: 0 for an int16 band whose nodata is -32768).

    Returns
    -------
    list of dict
        :meth:`BlockStats.as_stac` per array.
    """
    import concurrent.futures
    import itertools

    import numpy as np
    import zarr

    group = zarr.open_group(str(path), mode="r")
    out: list[dict[str, float]] = []
    with concurrent.futures.ThreadPoolExecutor(_threads()) as pool:
        for name in names:
            array = group[name]
            assert isinstance(array, zarr.Array), f"{name} in {path} is not an array"
            fill = array.fill_value
            missing = (None if fill is None else float(fill)) if isinstance(nodata, str) else nodata
            have = (known or {}).get(name, {})
            ranges = [range(0, n, c) for n, c in zip(array.shape, array.chunks)]
            indices = [tuple(s // c for s, c in zip(starts, array.chunks)) for starts in itertools.product(*ranges)]

            def stats(index: tuple[int, ...]) -> BlockStats:
                hit = have.get(index)
                if hit is not None:
                    return hit
                region = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(index, array.chunks, array.shape))
                return BlockStats.of(np.asarray(array[region]), missing)

            acc = BlockStats()
            for block in pool.map(stats, indices):
                acc.add(block)  # in chunk order: the sums do not depend on timing or on who computed a chunk
            out.append(acc.as_stac())
    return out
