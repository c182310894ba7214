"""COG output: the tile layout the workers make (the same choice ``write.cog`` makes, with the same functions of
:mod:`rasterflow.writeplan`) and the client process that assembles the files, whose peak is checked against the
machine (:func:`client_peak_bytes`)."""

from __future__ import annotations

import math

from rasterflow.budget.constants import (
    ASSEMBLY_LEVEL_COPIES,
    CLIENT_BASELINE_BYTES,
    CLIENT_RESULT_COPIES,
    CLIENT_RESULTS_RECEIVED,
    COG_COPY_ROWS,
    COG_COPY_ROWS_PER_THREAD,
    COG_INFLIGHT_PER_THREAD,
    COG_WRITER_BYTES,
)
from rasterflow.budget.model import BudgetInputs, PipelineShape, axis_chunk_sizes
from rasterflow.units import dtype_itemsize
from rasterflow.writeplan import (
    TEMPLATE_CACHEMAX,
    Encoding,
    TileLayout,
    assembly_enabled,
    client_levels_bytes,
    compression_name,
    fast_layout,
)


def cog_files(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """COG files one write makes: one per period and quantile, or per date without a reduction."""
    if not shape.reduce_method:
        return inputs.dates
    files = max(1, shape.n_quantiles if shape.reduce_method == "quantile" and not shape.statistics else 1)
    if shape.has_period:
        files *= inputs.n_periods or math.ceil(inputs.dates / max(1, inputs.group_dates or inputs.dates))
    return files


def axis_chunks(size: int, chunk: int) -> tuple[int, ...]:
    return tuple(length for length, count in axis_chunk_sizes(size, chunk) for _ in range(count))


def cog_tile_layout(shape: PipelineShape, inputs: BudgetInputs) -> TileLayout | None:
    """The :class:`~rasterflow.writeplan.TileLayout` of a COG whose tiles the workers compress, or None when
    GDAL's COG driver copies the finished file instead (``write.cog`` makes the same choice)."""
    if shape.output_format != "cog":
        return None
    if not assembly_enabled():
        return None
    height, width = inputs.grid_shape
    if shape.tile_size:
        height, width = min(height, shape.tile_size), min(width, shape.tile_size)
    cy, cx = inputs.chunk_yx
    try:
        stored = Encoding(dtype=shape.stored_dtype).resolved(inputs.dtype)
    except ValueError:
        return None
    codec = compression_name(shape.compression, "cog")  # the writer's own choice of codec
    return fast_layout(
        height=height, width=width, chunks=(axis_chunks(height, cy), axis_chunks(width, cx)),
        blocksize=shape.cog_blocksize, resampling=shape.cog_resampling, computed_dtype=inputs.dtype, stored=stored,
        band_names=shape.output_band_names, compression=codec, predictor="auto",
        files=cog_files(shape, inputs))


def client_peak_bytes(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """The client process: its baseline; with COG output, when the workers compress the tiles
    (:func:`cog_tile_layout`), the finished blocks of tiles it receives (:data:`CLIENT_RESULTS_RECEIVED`, each
    :data:`CLIENT_RESULT_COPIES` times), the small overview levels it keeps per file, GDAL's cache while it makes the
    header and the last levels' halving; else the finished blocks in flight (``write.cog``: 2 per thread of the
    cluster, each all bands of one chunk), then its GDAL cache while GDAL's COG driver copies each file, capped by
    the output's size, and that copy's row buffers."""
    if shape.output_format != "cog":
        return CLIENT_BASELINE_BYTES
    w = dtype_itemsize(inputs.dtype)
    cy, cx = inputs.chunk_yx
    n_bands = len(shape.output_band_names)  # a file's bands
    n_files = cog_files(shape, inputs)
    units = n_files * inputs.n_spatial_chunks
    layout = cog_tile_layout(shape, inputs)
    if layout is not None:
        # the blocks in flight are computed on the workers; the client fetches the finished ones one by one and
        # spools each at once: it holds CLIENT_RESULTS_RECEIVED of them, each twice while unpacked (compressed tiles
        # are no larger than the block)
        received = min(units, CLIENT_RESULTS_RECEIVED) * CLIENT_RESULT_COPIES * n_bands * cy * cx \
            * dtype_itemsize(shape.stored_dtype or inputs.dtype)
        levels = client_levels_bytes(layout, w)
        return (CLIENT_BASELINE_BYTES + COG_WRITER_BYTES + received + (n_files + ASSEMBLY_LEVEL_COPIES) * levels
                + TEMPLATE_CACHEMAX)
    inflight = min(units, max(2, COG_INFLIGHT_PER_THREAD * inputs.n_workers * inputs.threads_per_worker))
    streaming = inflight * n_bands * cy * cx * w
    output = n_files * n_bands * inputs.grid_shape[0] * inputs.grid_shape[1] * w
    # first the blocks stream in, then (the blocks gone) each file is copied into a COG: the larger of the two
    return (CLIENT_BASELINE_BYTES + COG_WRITER_BYTES + max(streaming, cog_copy_bytes(shape, inputs))
            + min(inputs.client_cachemax, output))


def cog_copy_bytes(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """What GDAL's COG driver holds besides its cache while it copies one output file into a COG with overviews:
    :data:`COG_COPY_ROWS` rows, and :data:`COG_COPY_ROWS_PER_THREAD` more per further thread, of the file's width
    (a tile's with ``output.tiling``) × bands × stored itemsize."""
    width = inputs.grid_shape[1] if not shape.tile_size else min(inputs.grid_shape[1], shape.tile_size)
    row = width * len(shape.output_band_names) * dtype_itemsize(shape.stored_dtype or inputs.dtype)
    return int(row * (COG_COPY_ROWS + COG_COPY_ROWS_PER_THREAD * (max(1, inputs.client_cores) - 1)))
