"""The client's half of the worker-compressed COG (:mod:`rasterflow.write.cogtiles`): spool the tiles as they
arrive, compress the small overview levels, and write GDAL's header followed by the tiles.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rasterflow.write.cogtiles import BlockTiles, TileLayout, stored_values, halve, level_tiles, tile_order
from rasterflow.writeplan import TEMPLATE_CACHEMAX  # defined there for the budget, re-exported here

if TYPE_CHECKING:  # pragma: no cover
    from tifffile import TiffFile, TiffPage

    from rasterflow.write.stacstats import BlockStats

__all__ = ["Assembly", "make_template", "check_template", "TEMPLATE_CACHEMAX"]

#: TIFF tags of a tiled image's tiles.
TILE_OFFSETS, TILE_BYTE_COUNTS = 324, 325
CLASSIC_TIFF_LIMIT = 2**32 - 1


def make_template(sparse: str, template: str, cog_options: Mapping[str, Any]) -> None:
    """GDAL's COG of ``sparse`` (a tiled GTiff with its georeferencing and tags and no tile written) with
    ``SPARSE_OK``: the header of the output, every tile offset 0."""
    import rasterio
    import rasterio.shutil

    with rasterio.Env(GDAL_CACHEMAX=TEMPLATE_CACHEMAX):
        rasterio.shutil.copy(sparse, template, driver="COG", SPARSE_OK="TRUE", **cog_options)


def check_template(header: bytes, layout: TileLayout) -> None:
    """Raise RuntimeError unless GDAL's template has the levels, tiles and encoding the workers made."""
    from tifffile import TiffFile

    with TiffFile(io.BytesIO(header)) as tif:
        pages = _pages(tif)
        found = [(p.imagelength, p.imagewidth, p.tilelength, p.tilewidth, int(p.compression), int(p.predictor),
                  len(p.dataoffsets), int(p.planarconfig) if layout.bands > 1 else 1) for p in pages]
    expected = [(rows, cols, layout.blocksize, layout.blocksize, layout.compression, layout.predictor,
                 layout.tile_count(level), (1 if layout.contig else 2) if layout.bands > 1 else 1)
                for level, (rows, cols) in enumerate(layout.levels)]
    if found != expected:
        raise RuntimeError(f"GDAL's COG header does not match the tiles made by the workers: levels (rows, cols, tile "
                           f"rows, tile cols, compression, predictor, tiles, planar) {found} != {expected}")


def _pages(tif: TiffFile) -> list[TiffPage]:
    """Every IFD of an open TiffFile as a TiffPage (tifffile may hand out lighter TiffFrames)."""
    from tifffile import TiffPage

    pages = [page for page in tif.pages if isinstance(page, TiffPage)]
    if len(pages) != len(tif.pages):
        raise RuntimeError("GDAL's COG header has IFDs tifffile could not read as pages")
    return pages


class Assembly:
    """One output file's tiles on their way into a COG.

    ``add`` takes each block's :class:`~rasterflow.write.cogtiles.BlockTiles` as it arrives: its tiles are appended
    to the spool file, its piece of the client's level is copied in. ``write`` compresses the client's levels and
    writes the COG.
    """

    def __init__(self, layout: TileLayout, spool: str, dtype: npt.DTypeLike):
        self.layout = layout
        self.spool_path = spool
        self.spool = open(spool, "w+b")
        self.where: dict[tuple[int, int], tuple[int, int]] = {}
        self.size = 0
        self.checksum: str | None = None
        """The written file's ``file:checksum`` (set by the writer after :meth:`write`)."""
        self.statistics: dict[tuple[int, ...], BlockStats] = {}
        """``(band, tile row, tile column)`` -> the full-resolution tile's statistics (``BlockTiles.stats``)."""
        level = layout.client_level
        self.small: npt.NDArray[Any] | None = None
        if level is not None:
            rows, cols = layout.levels[level]
            self.small = np.full((layout.bands, rows, cols), np.nan, dtype=dtype)

    def _spool(self, level: int, entry: int, data: bytes) -> None:
        self.spool.write(data)
        self.where[(level, entry)] = (self.size, len(data))
        self.size += len(data)

    def add(self, result: BlockTiles) -> None:
        for level, entry, data in result.tiles:
            self._spool(level, entry, data)
        self.statistics.update(result.stats)
        if result.piece is not None and self.small is not None:
            top, left = result.piece_at
            rows, cols = result.piece.shape[-2:]
            self.small[:, top:top + rows, left:left + cols] = result.piece

    def finish_levels(self) -> None:
        """Compress the levels the client holds (the smallest overviews), then let them go."""
        first = self.layout.client_level
        if first is None or self.small is None:
            return
        values = self.small
        self.small = None
        for level in range(first, len(self.layout.levels)):
            for lvl, entry, data in level_tiles(stored_values(values, self.layout), level, 0, 0, self.layout):
                self._spool(lvl, entry, data)
            if level + 1 < len(self.layout.levels):
                values = halve(values)

    def close(self) -> None:
        self.spool.close()

    def write(self, template: bytes, path: str) -> tuple[int, str]:
        """Write the COG at ``path``: ``template`` (GDAL's sparse COG of the same options) with the tiles' offsets
        and sizes, then the tiles, smallest overview first, each behind its 4-byte size and followed by its last 4
        bytes (the ghost area's ``BLOCK_LEADER`` and ``BLOCK_TRAILER``). Returns the file's size and its
        ``file:checksum`` (SHA2-256 multihash of the bytes written, hashed in a second thread as they are written:
        the STAC Item need not read the file again)."""
        import concurrent.futures
        import hashlib

        from tifffile import TiffFile

        self.finish_levels()
        self.spool.flush()
        layout = self.layout
        order = list(tile_order(layout))
        missing = [key for key in order if key not in self.where]
        if missing:
            raise RuntimeError(f"{len(missing)} COG tile(s) never arrived, e.g. (level, entry) {missing[:3]}")
        offsets = [[0] * layout.tile_count(level) for level in range(len(layout.levels))]
        counts = [[0] * layout.tile_count(level) for level in range(len(layout.levels))]
        position = len(template)
        for level, entry in order:
            size = self.where[(level, entry)][1]
            position += 4
            offsets[level][entry], counts[level][entry] = position, size
            position += size + 4
        buffer = io.BytesIO(template)
        with TiffFile(buffer, mode="r+", name="template.tif") as tif:
            if not tif.is_bigtiff and position > CLASSIC_TIFF_LIMIT:
                raise RuntimeError(f"the COG would be {position} bytes, over classic TIFF's 4 GiB, and GDAL chose "
                                   "classic TIFF for it")
            for page, level_offsets, level_counts in zip(_pages(tif), offsets, counts):
                page.tags[TILE_OFFSETS].overwrite(level_offsets)
                page.tags[TILE_BYTE_COUNTS].overwrite(level_counts)
        header = buffer.getvalue()
        if len(header) != len(template):
            raise RuntimeError("the COG header moved while its tile offsets were written")
        spool = self.spool.fileno()
        digest = hashlib.sha256()
        # one thread: the updates run in the order they are submitted; hashlib lets the GIL go for large buffers
        with concurrent.futures.ThreadPoolExecutor(1) as hasher, open(path, "wb") as out:
            def put(data: bytes) -> None:
                out.write(data)
                hasher.submit(digest.update, data)

            put(header)
            for level, entry in order:
                offset, size = self.where[(level, entry)]
                data = os.pread(spool, size, offset)
                if len(data) != size:
                    raise RuntimeError(f"the tile spool {self.spool_path} is short at byte {offset}")
                put(struct.pack("<I", size))
                put(data)
                put(data[-4:])
            written = out.tell()
        if written != position:
            raise RuntimeError(f"wrote {written} bytes of a COG laid out as {position}")
        return written, "1220" + digest.hexdigest()
