"""The write plan's light parts, below both the budget and the writers (ARCHITECTURE.md's layering: the budget and
planning decide, ``write/`` executes, and a layer imports only from the layers below it). The budget mirrors the
output's layout with these names and the writers write it with the same ones:

* how an output stores its values: :func:`compression_name`, :data:`ENCODING_DTYPES`, :class:`Encoding`
  (:mod:`rasterflow.write.encoding` keeps :func:`~rasterflow.write.encoding.encode_block`, which turns values into
  stored ones);
* the Zarr v3 shard layout: :func:`shard_side`, :data:`SHARD_BYTES`, :data:`MAX_SHARD_SIDE`,
  :data:`SHARD_ABOVE_CHUNKS` and the writer's :data:`SHARDS_IN_FLIGHT` (:mod:`rasterflow.write.shards`);
* the worker-compressed COG's layout (:mod:`rasterflow.write.cogtiles`, which makes the tiles): :class:`TileLayout`,
  :func:`fast_layout`, :func:`assembly_enabled`, :func:`level_shapes` (GDAL's overview levels),
  :func:`predictor_code`, :func:`client_levels_bytes`, :data:`TIFF_COMPRESSION`, :data:`CLIENT_LEVELS_MAX_BYTES`;
  and :data:`TEMPLATE_CACHEMAX`, GDAL's cache while it makes the COG's header (:mod:`rasterflow.write.cogassembly`).

Standard library only at import time (NumPy loads inside the functions that need a dtype), so ``validate`` and
``plan`` size an output without importing a writer, zarr or GDAL. The writers' modules re-export these names where
they were defined before.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import numpy.typing as npt

__all__ = [
    "CLIENT_LEVELS_MAX_BYTES",
    "ENCODING_DTYPES",
    "MAX_SHARD_SIDE",
    "SHARDS_IN_FLIGHT",
    "SHARD_ABOVE_CHUNKS",
    "SHARD_BYTES",
    "TEMPLATE_CACHEMAX",
    "TIFF_COMPRESSION",
    "Encoding",
    "TileLayout",
    "assembly_enabled",
    "client_levels_bytes",
    "compression_name",
    "fast_layout",
    "level_shapes",
    "predictor_code",
    "shard_side",
]

# --------------------------------------------------------------------------------------------------------------------
# the encoding


def compression_name(compression: str | None, fmt: str) -> str:
    """Normalise ``output.compression`` for a format; warns and substitutes when the format lacks the codec.

    Zarr has no LZW codec (deflate is used instead); GeoTIFF has no LZ4 (zstd is used instead).

    Parameters
    ----------
    compression : str or None
        As the spec gives it (aliases such as ``zlib``, ``gzip``, ``zstandard`` accepted); None = ``none``.
    fmt : {"zarr", "cog"}

    Returns
    -------
    str
        One of ``zstd``, ``deflate``, ``lzw``, ``lz4``, ``none``.

    Raises
    ------
    ValueError
        An unknown compression.
    """
    name = (compression or "none").lower()
    aliases = {"zlib": "deflate", "gzip": "deflate", "zstandard": "zstd", "": "none", "null": "none"}
    name = aliases.get(name, name)
    if name not in ("zstd", "deflate", "lzw", "lz4", "none"):
        raise ValueError(f"unknown compression {compression!r}; expected zstd, deflate, lzw, lz4 or none")
    if fmt == "zarr" and name == "lzw":
        warnings.warn("Zarr has no LZW codec; writing with deflate (zlib) instead", UserWarning, stacklevel=3)
        return "deflate"
    if fmt == "cog" and name == "lz4":
        warnings.warn("GeoTIFF has no LZ4 compression; writing with zstd instead", UserWarning, stacklevel=3)
        return "zstd"
    return name


#: Integer dtypes an output may be stored as, and the floats.
ENCODING_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "float64")


@dataclasses.dataclass(frozen=True)
class Encoding:
    """How physical values are stored: ``stored = round((physical - offset) / scale)``, NaN -> ``nodata``.

    Readers get the physical values back as ``stored * scale + offset`` (CF ``scale_factor``/``add_offset`` in Zarr,
    GDAL's band scale/offset in a GeoTIFF), the same convention in both.
    """

    dtype: str | None = None
    """The stored data type; None = the computed one (float32, or float64 when ``grid.dtype`` asks)."""
    scale: float = 1.0
    """Stored units per physical unit are ``1 / scale``; e.g. 0.0001 stores NDVI 0.1234 as 1234."""
    offset: float = 0.0
    """Added after scaling when reading."""
    nodata: float | None = None
    """The stored value of a missing pixel; None = NaN for floats, the dtype's minimum (signed) or maximum
    (unsigned) for integers."""

    def resolved(self, computed_dtype: npt.DTypeLike) -> Encoding:
        """This encoding with ``dtype`` and ``nodata`` filled in for data computed as ``computed_dtype``."""
        import numpy as np

        dtype = np.dtype(self.dtype or computed_dtype)
        if dtype.name not in ENCODING_DTYPES:
            raise ValueError(f"cannot store outputs as {dtype.name}; use one of {', '.join(ENCODING_DTYPES)}")
        if not self.scale or not np.isfinite(self.scale):
            raise ValueError(f"encoding scale must be a finite non-zero number (got {self.scale})")
        nodata = self.nodata
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            if nodata is None:
                nodata = float(info.min if dtype.kind == "i" else info.max)
            elif not (float(nodata).is_integer() and info.min <= nodata <= info.max):
                raise ValueError(f"encoding nodata {nodata} is not a valid {dtype.name} value ({info.min}..{info.max})")
        elif nodata is None:
            nodata = float("nan")
        return Encoding(dtype=dtype.name, scale=float(self.scale), offset=float(self.offset), nodata=float(nodata))

    @property
    def is_scaled(self) -> bool:
        """Whether stored values differ from physical ones (a scale other than 1 or an offset other than 0)."""
        return self.scale != 1.0 or self.offset != 0.0

    def valid_range(self) -> tuple[float, float]:
        """The physical values the stored dtype holds (nodata excluded when it is at an end of the range)."""
        import numpy as np

        dtype = np.dtype(self.dtype)
        if dtype.kind == "f":
            lo, hi = float(np.finfo(dtype).min), float(np.finfo(dtype).max)
        else:
            info = np.iinfo(dtype)
            lo, hi = float(info.min), float(info.max)
            if self.nodata == lo:
                lo += 1
            elif self.nodata == hi:
                hi -= 1
        ends = sorted((lo * self.scale + self.offset, hi * self.scale + self.offset))
        return ends[0], ends[1]

# --------------------------------------------------------------------------------------------------------------------
# Zarr v3 shards


#: At most this many bytes (stored dtype) and this many chunks per side in one shard. A write task holds one shard
#: (its Dask blocks, then the assembled shard): 64 MiB keeps that within a few chunks of the usual size.
SHARD_BYTES = 64 * 2**20
MAX_SHARD_SIDE = 8
#: By default only arrays of more chunks than this are sharded: a few hundred objects list and copy quickly, and an
#: unsharded store is what more readers open.
SHARD_ABOVE_CHUNKS = 1024
#: Shard positions a writer keeps in flight at once: one being finished and written while the next one's chunks are
#: computed, so no worker idles at a shard's end; each finished chunk is held until its whole shard is written.
SHARDS_IN_FLIGHT = 2


def shard_side(chunk_yx: tuple[int, int], itemsize: int, numblocks_yx: tuple[int, int],
               requested: int | None = None) -> int:
    """Chunks per shard side for a Zarr v3 store.

    Parameters
    ----------
    chunk_yx : (int, int)
        The Zarr chunk's rows and columns.
    itemsize : int
        Bytes per stored value.
    numblocks_yx : (int, int)
        Chunks of the array per axis.
    requested : int, optional
        ``output.zarr_shards``: used as given (1: no sharding).

    Returns
    -------
    int
        ``requested``, else 1 (no sharding) for an array of at most :data:`SHARD_ABOVE_CHUNKS` chunks, else the
        largest power of two up to :data:`MAX_SHARD_SIDE` whose square shard holds at most :data:`SHARD_BYTES` and
        does not exceed the array.
    """
    if requested is not None:
        if int(requested) < 1:
            raise ValueError(f"shards must be a positive number of chunks per shard side, got {requested}")
        return int(requested)
    side = 1
    if numblocks_yx[0] * numblocks_yx[1] <= SHARD_ABOVE_CHUNKS:
        return side
    chunk_bytes = chunk_yx[0] * chunk_yx[1] * itemsize
    while (side * 2 <= MAX_SHARD_SIDE and (side * 2) ** 2 * chunk_bytes <= SHARD_BYTES
           and side < max(numblocks_yx)):
        side *= 2
    return side

# --------------------------------------------------------------------------------------------------------------------
# the worker-compressed COG


#: TIFF Compression tag values of ``output.compression`` (GDAL writes deflate as Adobe's 8).
TIFF_COMPRESSION = {"zstd": 50000, "deflate": 8, "lzw": 5, "none": 1}
#: The most the client holds of the overview levels it compresses itself, over all files of one write: more, and
#: the writer uses GDAL's COG driver instead (one file at a time).
CLIENT_LEVELS_MAX_BYTES = 512 * 2**20
#: GDAL's block cache while it makes the sparse template: every block it reads is empty, none is read twice.
TEMPLATE_CACHEMAX = 16 * 2**20


@dataclasses.dataclass(frozen=True)
class TileLayout:
    """Where a block's tiles go, and how they are encoded: everything a worker task needs."""

    height: int
    width: int
    chunk: tuple[int, int]
    """The regular chunk edges (rows, columns); the last chunk of each axis may be shorter."""
    blocksize: int
    levels: tuple[tuple[int, int], ...]
    """(rows, columns) of level 0 (full resolution) and of each overview level."""
    worker_levels: int
    """Levels ``0 .. worker_levels - 1`` are compressed by the worker tasks; the next one is sent as a piece."""
    bands: int
    stored: Encoding
    """The resolved encoding (dtype, scale, offset, nodata) of the stored tiles."""
    band_names: tuple[str, ...]
    compression: int
    predictor: int
    contig: bool
    """Pixel-interleaved tiles (``PlanarConfiguration`` 1) when there are several bands; else one tile per band."""

    @property
    def client_level(self) -> int | None:
        """The first level the client compresses (None: the workers compress every level)."""
        return self.worker_levels if self.worker_levels < len(self.levels) else None

    def tiles_across(self, level: int) -> tuple[int, int]:
        rows, cols = self.levels[level]
        return math.ceil(rows / self.blocksize), math.ceil(cols / self.blocksize)

    def tile_count(self, level: int) -> int:
        """Entries of the level's TileOffsets: tiles, times the bands when they are planes of their own."""
        ty, tx = self.tiles_across(level)
        return ty * tx * (1 if self.contig else self.bands)


def assembly_enabled() -> bool:
    """Whether writes whose layout allows it compress their tiles on the workers (``RASTERFLOW_COG_WRITER=gdal``:
    GDAL's COG driver copies every finished file instead, for comparisons)."""
    return os.environ.get("RASTERFLOW_COG_WRITER", "").lower() != "gdal"


def level_shapes(height: int, width: int, blocksize: int) -> tuple[tuple[int, int], ...]:
    """Level 0 and GDAL's COG overview levels (``OVERVIEWS=AUTO``): halved, rounded down, until both edges fit
    one tile."""
    shapes = [(height, width)]
    while max(shapes[-1]) > blocksize:
        rows, cols = shapes[-1]
        if rows < 2 or cols < 2:
            break
        shapes.append((rows // 2, cols // 2))
    return tuple(shapes)


def predictor_code(predictor: str, compression: str, stored_dtype: str) -> int:
    """The TIFF Predictor GDAL writes for ``output.cog.predictor`` (auto: 3 for floats, 2 for integers; 1 without
    compression)."""
    if compression == "none" or predictor == "none":
        return 1
    if predictor == "standard":
        return 2
    if predictor == "floating_point":
        return 3
    import numpy as np

    return 3 if np.dtype(stored_dtype).kind == "f" else 2


def fast_layout(*, height: int, width: int, chunks: tuple[tuple[int, ...], tuple[int, ...]], blocksize: int,
                resampling: str, computed_dtype: npt.DTypeLike, stored: Encoding, band_names: tuple[str, ...],
                compression: str, predictor: str, files: int = 1) -> TileLayout | None:
    """The layout of the worker-compressed COG, or None when this write needs GDAL's COG driver instead.

    The tiles can be made block by block when the overviews are ``average`` over float results, every chunk but the
    last of each axis covers whole tiles, the chunk edges stay even down to the smallest overview (so each chunk's
    overview pixels are the whole image's), and the small levels the client keeps fit
    :data:`CLIENT_LEVELS_MAX_BYTES` for ``files`` files.
    """
    import numpy as np

    if resampling.lower() != "average" or np.dtype(computed_dtype).kind != "f" or compression not in TIFF_COMPRESSION:
        return None
    levels = level_shapes(height, width, blocksize)
    steps = len(levels) - 1
    edges: list[tuple[int, bool]] = []
    for axis_chunks in chunks:
        edge = int(axis_chunks[0])
        if any(int(c) != edge for c in axis_chunks[:-1]) or int(axis_chunks[-1]) > edge:
            return None
        single = len(axis_chunks) == 1
        if not single and (edge % blocksize or edge % (2 ** steps)):
            return None
        edges.append((edge, single))
    worker_levels = 0
    for level in range(len(levels)):
        if all(single or (edge >> level) % blocksize == 0 for edge, single in edges):
            worker_levels = level + 1
        else:
            break
    itemsize = np.dtype(computed_dtype).itemsize
    client_bytes = sum(rows * cols for rows, cols in levels[worker_levels:]) * len(band_names) * itemsize
    if client_bytes * files > CLIENT_LEVELS_MAX_BYTES:
        return None
    many = len(band_names) > 1
    return TileLayout(
        height=height, width=width, chunk=(edges[0][0], edges[1][0]), blocksize=blocksize, levels=levels,
        worker_levels=worker_levels, bands=len(band_names), stored=stored, band_names=band_names,
        compression=TIFF_COMPRESSION[compression], predictor=predictor_code(predictor, compression, stored.dtype or
                                                                             np.dtype(computed_dtype).name),
        contig=many,
    )


def client_levels_bytes(layout: TileLayout, itemsize: int) -> int:
    """What the client holds per file for the levels it compresses."""
    return sum(r * c for r, c in layout.levels[layout.worker_levels:]) * layout.bands * itemsize
