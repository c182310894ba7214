"""COG tiles compressed where the blocks are computed, assembled behind GDAL's own header (issue 13, the season's
COG row).

GDAL's COG driver makes a COG only from a finished raster: after the last block, one process reads it all back,
computes the overviews and compresses every tile again (~11 s of the 10980² x 36 season's 43 s, on both cores,
while the workers sit idle). Here instead:

1. each worker task compresses the TIFF tiles of its own block (:func:`block_tiles`), and of every overview level
   its block covers in whole tiles, as the block is computed; the smaller overview levels travel to the client as
   small arrays (a 1024² chunk sends a 256² piece at level 2);
2. the client (``write.cog``) appends the tiles' bytes to a spool file as they arrive, fills the small levels, and
   at the end compresses those (a few tens of MB for a 10980² tile);
3. the file is GDAL's own COG header, the IFDs of a *sparse* COG that GDAL's COG driver made with the same
   options, georeferencing and tags (no tile written), with the tiles' offsets and sizes filled in
   (``tifffile``'s ``TiffTag.overwrite``), followed by the tiles, smallest overview first, each with the block
   leader and trailer the header's ghost area announces (``BLOCK_LEADER=SIZE_AS_UINT4``,
   ``BLOCK_TRAILER=LAST_4_BYTES_REPEATED``), so GDAL reports ``LAYOUT=COG`` and COG validators accept it.

Overviews are the ``average`` resampling, level by level: each pixel the mean of the valid (non-NaN) pixels of its
2 x 2 block of the level above, NaN where none is valid. Level sizes are GDAL's, each half the one above, rounded
down (10980 -> 5490 -> 2745 -> 1372 -> ...): an odd level's last row or column is left out of the next.

The layout (:class:`TileLayout`, :func:`fast_layout`, the levels, :data:`TIFF_COMPRESSION`, ...) is defined in
:mod:`rasterflow.writeplan`, which the budget uses too, and re-exported here. This module imports NumPy and the
codecs only: it runs in worker processes (see ``rasterflow.tasks``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rasterflow.write.common import encode_block
from rasterflow.writeplan import (
    CLIENT_LEVELS_MAX_BYTES,
    TIFF_COMPRESSION,
    TileLayout,
    assembly_enabled,
    client_levels_bytes,
    fast_layout,
    level_shapes,
    predictor_code,
)

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.write.stacstats import BlockStats

__all__ = [
    "TileLayout", "BlockTiles", "fast_layout", "assembly_enabled", "level_shapes", "predictor_code",
    "client_levels_bytes", "halve", "stored_values", "encode_tile", "level_tiles", "block_tiles", "tile_statistics",
    "tile_order", "TIFF_COMPRESSION", "ZSTD_LEVEL", "DEFLATE_LEVEL", "CLIENT_LEVELS_MAX_BYTES",
]

#: The ZSTD level of COG tiles: the Zarr writer's (``write.zarr``); GDAL's own default is 9, which cost ~3.5 s more
#: on the 10980² season's file for 2% less size (GDAL's copy, benchmarks/README.md, "What is left").
ZSTD_LEVEL = 3
#: GDAL's default ZLEVEL.
DEFLATE_LEVEL = 6


# --------------------------------------------------------------------------------------------------------------------
# the pixels


def halve(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The next overview level of ``(bands, rows, cols)`` physical values: each pixel the mean of the non-NaN pixels
    of its 2 x 2 block (NaN if none), an odd last row or column left out. Summed in float64 over the four strided
    quarter views (4x faster than a masked copy of the whole block reshaped, the same values)."""
    bands, rows, cols = values.shape
    rows2, cols2 = rows // 2, cols // 2
    total = np.zeros((bands, rows2, cols2), dtype=np.float64)
    count = np.zeros((bands, rows2, cols2), dtype=np.uint8)
    for dy in (0, 1):
        for dx in (0, 1):
            part = values[:, dy:2 * rows2:2, dx:2 * cols2:2]
            valid = part == part  # not NaN
            count += valid
            total += np.where(valid, part, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
    return mean.astype(values.dtype, copy=False)


def stored_values(values: npt.NDArray[Any], layout: TileLayout) -> npt.NDArray[Any]:
    """``(bands, rows, cols)`` physical values -> the stored dtype (scale, offset, nodata applied)."""
    stored = layout.stored
    dtype = np.dtype(stored.dtype)
    plain = not stored.is_scaled and (stored.nodata is None or np.isnan(stored.nodata)) and dtype == values.dtype
    if plain:
        return values
    return np.stack([encode_block(values[k], stored, layout.band_names[k]) for k in range(values.shape[0])])


def _fill(layout: TileLayout) -> float:
    nodata = layout.stored.nodata
    return 0 if nodata is None else nodata


def encode_tile(tile: npt.NDArray[Any], layout: TileLayout) -> bytes:
    """One stored tile (``(rows, cols)`` or ``(rows, cols, bands)``, at most a tile's size) -> its TIFF bytes:
    padded to the full tile with the nodata value, the predictor applied, compressed."""
    from tifffile import TIFF

    size = layout.blocksize
    if tile.shape[0] != size or tile.shape[1] != size:
        pad = [(0, size - tile.shape[0]), (0, size - tile.shape[1])] + [(0, 0)] * (tile.ndim - 2)
        tile = np.pad(tile, pad, mode="constant", constant_values=_fill(layout))
    tile = np.ascontiguousarray(tile)
    if layout.predictor != 1:
        tile = TIFF.PREDICTORS[layout.predictor](tile, axis=1)
    if layout.compression == 1:
        return tile.tobytes()
    encoder = TIFF.COMPRESSORS[layout.compression]
    if layout.compression == TIFF_COMPRESSION["zstd"]:
        return bytes(encoder(tile, level=ZSTD_LEVEL))
    if layout.compression == TIFF_COMPRESSION["deflate"]:
        return bytes(encoder(tile, level=DEFLATE_LEVEL))
    return bytes(encoder(tile))


def level_tiles(stored: npt.NDArray[Any], level: int, row0: int, col0: int,
                layout: TileLayout) -> Iterator[tuple[int, int, bytes]]:
    """The tiles of ``stored`` (``(bands, rows, cols)`` of one level, its top left at ``(row0, col0)``, which are
    multiples of the tile size) -> ``(level, entry, bytes)``, ``entry`` the index in the level's TileOffsets."""
    size = layout.blocksize
    tiles_y, tiles_x = layout.tiles_across(level)
    per_plane = tiles_y * tiles_x
    bands, rows, cols = stored.shape
    for top in range(0, rows, size):
        for left in range(0, cols, size):
            ti, tj = (row0 + top) // size, (col0 + left) // size
            window = stored[:, top:top + size, left:left + size]
            if layout.contig:
                yield level, ti * tiles_x + tj, encode_tile(np.moveaxis(window, 0, -1), layout)
            else:
                for band in range(bands):
                    yield level, band * per_plane + ti * tiles_x + tj, encode_tile(window[band], layout)


@dataclasses.dataclass(frozen=True)
class BlockTiles:
    """What one block's task sends to the client."""

    tiles: list[tuple[int, int, bytes]]
    """``(level, entry, bytes)`` of every tile the block covers at the worker levels."""
    stats: dict[tuple[int, ...], BlockStats]
    """``(band, tile row, tile column)`` -> the :class:`~rasterflow.write.stac.BlockStats` of the stored values of
    that full-resolution tile (what the STAC Item's statistics add up, in the order a reader of the file would)."""
    piece: npt.NDArray[Any] | None
    """The block's physical values at the layout's client level (None when the workers do every level)."""
    piece_at: tuple[int, int]
    """Top left of ``piece`` in its level."""


def block_tiles(block: npt.ArrayLike, i: int, j: int, layout: TileLayout) -> BlockTiles:
    """The task: the finished block ``(i, j)`` (``(..., bands, rows, cols)``, physical values) -> its COG tiles and
    its piece of the client's level."""
    values = np.asarray(block)
    values = values.reshape(values.shape[-3:])
    tiles: list[tuple[int, int, bytes]] = []
    row0, col0 = i * layout.chunk[0], j * layout.chunk[1]
    stats: dict[tuple[int, ...], BlockStats] = {}
    for level in range(layout.worker_levels):
        stored = stored_values(values, layout)
        if level == 0:
            stats = tile_statistics(stored, row0, col0, layout)
        tiles.extend(level_tiles(stored, level, row0 >> level, col0 >> level, layout))
        del stored
        if level + 1 < len(layout.levels):
            values = halve(values)
    client = layout.client_level
    if client is None:
        return BlockTiles(tiles, stats, None, (0, 0))
    return BlockTiles(tiles, stats, np.ascontiguousarray(values), (row0 >> client, col0 >> client))


def tile_statistics(stored: npt.NDArray[Any], row0: int, col0: int,
                    layout: TileLayout) -> dict[tuple[int, ...], BlockStats]:
    """Per band and full-resolution tile of ``stored`` (its top left at ``(row0, col0)``, on the tile grid): the
    statistics of the tile's stored values, nodata left out (what ``write.stac`` reads back from a COG)."""
    from rasterflow.write.stac import BlockStats

    size = layout.blocksize
    out: dict[tuple[int, ...], BlockStats] = {}
    for top in range(0, stored.shape[1], size):
        for left in range(0, stored.shape[2], size):
            for band in range(stored.shape[0]):
                out[(band, (row0 + top) // size, (col0 + left) // size)] = BlockStats.of(
                    stored[band, top:top + size, left:left + size], layout.stored.nodata)
    return out


def tile_order(layout: TileLayout) -> Iterator[tuple[int, int]]:
    """``(level, entry)`` of every tile in the order of the file: the smallest overview first, full resolution last
    (what COG readers and validators expect), each level's TileOffsets order within."""
    for level in range(len(layout.levels) - 1, -1, -1):
        for entry in range(layout.tile_count(level)):
            yield level, entry
