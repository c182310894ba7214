"""Windows of local tiled GeoTIFFs decoded tile by tile with tifffile and imagecodecs instead of through GDAL.

Why: libtiff keeps a decoder per open file until the file is closed (0.84 MB for ZSTD), and a task keeps every file
of its chunk open across its sub-blocks, so a worker's memory grew with the dates (108 files at 36 dates). Decoding
a tile from its bytes keeps nothing between calls: the compressed bytes are read with ``os.pread`` at the offset the
file's tile index gives, decoded by imagecodecs (through tifffile, which knows the TIFF's codec, predictor and byte
order) and copied into the window. It is also about twice as fast as GDAL's per-window read of the same tiles
(benchmarks/README.md). 16-bit ZSTD/DEFLATE tiles with the horizontal predictor (Sentinel-2's uint16 COGs) are only
decompressed by imagecodecs; the compiled kernels undo the predictor straight into the window
(``rasterflow._native.undo_horizontal_u16``, bit for bit the same sums).

Only what decodes to exactly GDAL's values takes this path: a local, tiled, single-band, single-IFD-sample image with
a lossless codec (none, LZW, DEFLATE, ZSTD) and the usual predictors, read on its own full-resolution grid. Anything
else (remote files, strips, JPEG, warped reads, sparse tiles) is read by GDAL as before. ``RASTERFLOW_TILE_DECODER=gdal``
in the environment sends every read through GDAL.
"""

from __future__ import annotations

import os
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rasterflow import compiled
from rasterflow.readplan import ENV_SWITCH, LOSSLESS_CODECS, decoder_available, decodes  # noqa: F401

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from tifffile import TiffFile

#: tifffile's ``TiffPage.decode``: ``decode(bytes, index) -> (segment, indices, shape)``.
_Decode = Callable[..., "tuple[npt.NDArray[Any] | None, tuple[int, ...], tuple[int, ...]]"]
#: imagecodecs' decompressor (``decompress(data, out=size) -> bytes``) and the compiled kernel
#: ``undo_horizontal_u16(raw, tile_height, tile_width, row, col, target)``.
_Predicted = tuple[Callable[..., "bytes | bytearray"], Callable[..., None]]

__all__ = ["LOSSLESS_CODECS", "ENV_SWITCH", "TileIndex", "decoder_available", "decodes", "tile_index", "read_window",
           "window_tiles", "place_tile", "page_index"]

@dataclass(frozen=True, eq=False)
class TileIndex:
    """Where each tile of a file's full-resolution image lies in the file, and how to decode one."""

    path: str
    height: int
    width: int
    tile_height: int
    tile_width: int
    dtype: np.dtype[Any]
    offsets: Sequence[int]
    """Per tile, in the file's order (row-major); an unsigned 64-bit ``array``: 8 bytes a tile, where a tuple of
    Python ints took 36 (a worker keeps the index of every file of its chunk: 108 at 36 dates)."""
    byte_counts: Sequence[int]
    decode: _Decode
    """tifffile's ``TiffPage.decode``: ``decode(bytes, index) -> (segment, indices, shape)``."""
    predicted: _Predicted | None = None
    """For 16-bit tiles with the horizontal predictor in the machine's byte order, ZSTD or DEFLATE, where the
    compiled kernels are installed: imagecodecs' decompressor and ``rasterflow._native.undo_horizontal_u16``, which
    turns its output into values straight in the window (2.6x faster than imagecodecs' delta decode plus the copy);
    None: ``decode``."""

    @property
    def tiles_across(self) -> int:
        return -(-self.width // self.tile_width)


def tile_index(path: str, *, band_count: int, dtype: npt.DTypeLike, shape: tuple[int, int],
               block_shape: tuple[int, int]) -> TileIndex | None:
    """The tile index of the local file ``path`` when its pixels can be decoded here bit for bit as GDAL reads them
    (see the module docstring), else None. ``band_count``, ``dtype``, ``shape`` and ``block_shape`` are what GDAL
    says of the file: the index must describe the same image."""
    if not decoder_available() or band_count != 1 or not os.path.isfile(path):
        return None
    import numpy as np
    import tifffile

    try:
        with tifffile.TiffFile(path) as tif:
            index = page_index(tif, path)
    except Exception:  # anything tifffile cannot parse is GDAL's to read (and to report, if GDAL cannot either)
        return None
    if index is None or index.dtype != np.dtype(dtype) or (index.height, index.width) != tuple(shape) \
            or (index.tile_height, index.tile_width) != tuple(block_shape):
        return None
    return index


def page_index(tif: TiffFile, path: str) -> TileIndex | None:
    """The :class:`TileIndex` of the full-resolution image (first page) of an open ``tifffile.TiffFile``, when it
    is one this module decodes bit for bit as GDAL (see the module docstring), else None. ``path`` names it in
    errors (a local path or a URL)."""
    import numpy as np

    if not decoder_available():
        return None
    page = tif.pages.first
    if not (page.is_tiled and page.samplesperpixel == 1 and page.imagedepth == 1
            and page.compression in LOSSLESS_CODECS and page.predictor in (1, 2, 3)
            and page.fillorder == 1 and not page.is_subsampled and page.dtype is not None):
        return None
    offsets, counts = array("Q", page.dataoffsets), array("Q", page.databytecounts)
    height, width = int(page.imagelength), int(page.imagewidth)
    tile_height, tile_width = int(page.tilelength), int(page.tilewidth)
    tiles = -(-height // tile_height) * -(-width // tile_width)
    if len(offsets) != tiles or len(counts) != tiles:
        return None
    dtype = np.dtype(page.dtype)
    predicted = _predicted_16_bit(page.compression, page.predictor, dtype,
                                  tif.byteorder == ("<" if sys.byteorder == "little" else ">"), tile_width)
    return TileIndex(path=path, height=height, width=width, tile_height=tile_height, tile_width=tile_width,
                     dtype=dtype, offsets=offsets, byte_counts=counts, decode=page.decode, predicted=predicted)


def _predicted_16_bit(compression: int, predictor: int, dtype: np.dtype[Any], native_order: bool,
                      tile_width: int) -> _Predicted | None:
    """imagecodecs' decompressor and the compiled predictor kernel for the tiles :func:`read_window` undoes the
    predictor of itself (no wider than the kernel's row, ``MAX_PREDICTED_TILE_WIDTH``), else None."""
    kernels = compiled.module()
    if kernels is None or predictor != 2 or dtype.itemsize != 2 or dtype.kind not in "ui" or not native_order \
            or tile_width > kernels.MAX_PREDICTED_TILE_WIDTH:
        return None
    import imagecodecs

    decompress = {50000: imagecodecs.zstd_decode, 8: imagecodecs.zlib_decode,
                  32946: imagecodecs.zlib_decode}.get(compression)
    return None if decompress is None else (decompress, kernels.undo_horizontal_u16)


def window_tiles(index: TileIndex, row: int, col: int, height: int, width: int) -> list[int]:
    """The numbers of the tiles (row-major, as in the file's tile index) that the window of ``height`` x ``width``
    pixels from ``row``, ``col`` touches, in row-major order."""
    th, tw, across = index.tile_height, index.tile_width, index.tiles_across
    return [ty * across + tx for ty in range(row // th, (row + height - 1) // th + 1)
            for tx in range(col // tw, (col + width - 1) // tw + 1)]


def place_tile(index: TileIndex, number: int, data: bytes | memoryview | None, row: int, col: int, out: npt.NDArray[Any],
               fill: float = 0) -> None:
    """Decode tile ``number`` from its compressed ``data`` and copy its part of the window from ``row``, ``col``
    into ``out`` (any strides). ``data`` None: a sparse tile (absent from the file), which holds ``fill`` (GDAL
    gives the file's nodata there, else 0). A tile that does not decode raises ``OSError`` naming it."""
    th, tw = index.tile_height, index.tile_width
    height, width = out.shape
    ty, tx = divmod(number, index.tiles_across)
    r0, c0 = ty * th, tx * tw
    y0, y1 = max(row, r0), min(row + height, r0 + th)
    x0, x1 = max(col, c0), min(col + width, c0 + tw)
    target = out[y0 - row:y1 - row, x0 - col:x1 - col]
    if data is None:
        target[...] = fill
        return
    if index.predicted is not None and target.strides[1] == 2:
        decompress, undo_predictor = index.predicted
        raw = decompress(data, out=th * tw * 2)
        if len(raw) != th * tw * 2:
            raise OSError(f"tile {number} of {index.path} decoded to {len(raw)} bytes, not {th * tw * 2}")
        undo_predictor(raw, th, tw, y0 - r0, x0 - c0, target)
        return
    segment = index.decode(data, number)[0]
    if segment is None:
        raise OSError(f"tile {number} of {index.path} did not decode")
    tile = segment.reshape(segment.shape[-3], segment.shape[-2])  # (1, th, tw, 1) -> (th, tw)
    target[...] = tile[y0 - r0:y1 - r0, x0 - c0:x1 - c0]


def read_window(index: TileIndex, row: int, col: int, out: npt.NDArray[Any]) -> bool:
    """Fill ``out`` (``(height, width)``, any strides) with the file's pixels from ``row``, ``col``.

    Returns False, with ``out`` untouched, when a tile of the window is absent from the file (a sparse tile: GDAL
    gives its nodata there, so the caller reads the window with GDAL). A short read or a tile that does not decode
    raises ``OSError`` / the codec's error, naming the tile.
    """
    height, width = out.shape
    if row < 0 or col < 0 or row + height > index.height or col + width > index.width:
        raise ValueError(f"window {row}:{row + height}, {col}:{col + width} outside the {index.height} x "
                         f"{index.width} image of {index.path}")
    tiles = window_tiles(index, row, col, height, width)
    if any(index.byte_counts[number] == 0 for number in tiles):
        return False
    descriptor = os.open(index.path, os.O_RDONLY)
    try:
        for number in tiles:
            count, offset = index.byte_counts[number], index.offsets[number]
            data = os.pread(descriptor, count, offset)
            if len(data) != count:
                raise OSError(f"tile {number} of {index.path}: {len(data)} of its {count} bytes at offset {offset} "
                              "could be read (a truncated file?)")
            place_tile(index, number, data, row, col, out)
    finally:
        os.close(descriptor)
    return True
