"""Each code path's tasks and what one of them holds, stage by stage: the fused task (:func:`fused_stages`), the tree
(:func:`tree_stages`) and the series (:func:`series_stages`), after the stages every path shares (one item loaded,
the mask, the bands: :func:`item_stages`), and the write that follows each (:func:`write_extra_bytes`); what a
worker holds between tasks on each path (:func:`fused_held`, :func:`tree_held`, :func:`series_held`); the sub-blocks
of the fused task (:func:`sub_block`) and the task counts (:func:`estimate_task_count`).

The cost of a path is in its function: follow :mod:`rasterflow.kernels`, :mod:`rasterflow.tasks` and the writers
there, and change them together.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from rasterflow.budget.cogclient import _cog_files, cog_tile_layout
from rasterflow.budget.constants import (
    COG_BATCH_BYTES,
    COG_INFLIGHT_PER_THREAD,
    COG_RESULT_WAITING,
    COG_TILE_BYTES_RATIO,
    ENCODE_PLANES,
    HALVE_BYTES_PER_PIXEL,
    IN_FLIGHT_PER_THREAD,
    LOAD_COPIES,
    MIN_STRIP_ROWS,
    REDUCTION_EXTRA_PLANES,
    STD_PARTIAL_PLANES,
    TABLE_DTYPES,
    TILES_INFLIGHT_PER_THREAD,
    TREE_CHUNK_EXTRA_PLANES,
    TREE_PARTIAL_PLANES,
    TREE_SPLIT_EVERY,
    QUEUED_UNITS,
    ZARR_WRITE_PLANES,
)
from rasterflow.budget.model import BudgetInputs, PipelineShape, TaskShape, _sizes
from rasterflow.expr import Expression, parse_expression
from rasterflow.units import dtype_itemsize
from rasterflow.writeplan import SHARDS_IN_FLIGHT, shard_side  # stdlib only


def code_path(shape: PipelineShape, inputs: BudgetInputs) -> str:
    """What ``graph.build_dataset`` runs: "fused", "tree" or "series" (see the module docstring)."""
    if shape.reduce_method is None:
        return "series"
    if shape.mosaics_passes or inputs.time_per_chunk >= inputs.n_time:
        return "fused"
    return "tree"


def task_shapes(shape: PipelineShape, inputs: BudgetInputs) -> tuple[TaskShape, ...]:
    """The root tasks of the graph by shape, largest first (edge chunks at their real size).

    With solar_day, or a reduction with time whole, a task reads every item whose files meet its chunk (the plan's
    chunk index: ``inputs.depth()``; without one every item), and the fused path's series holds only their dates;
    otherwise one task per time chunk, whose dates are its items (and which reads those meeting its chunk).
    """
    cy, cx = inputs.chunk_yx
    height, width = inputs.grid_shape
    depth = inputs.depth()
    fused = bool(shape.reduce_method) and code_path(shape, inputs) == "fused"
    if shape.mosaics_passes or fused:
        items = inputs.n_time if depth is None else depth.items
        dates = depth.dates if depth is not None and fused else inputs.dates
        times = [(items, dates, 1)]
    else:
        most = inputs.n_time if depth is None else depth.items
        times = [(min(size, most), size, n) for size, n in _sizes(inputs.n_time, inputs.time_per_chunk)]
    grow = 2 * shape.halo  # mask_cleanup reads a halo around every window (counted for the whole task)
    out = [TaskShape(rows + grow, cols + grow, items, dates, ny * nx * nt)
           for rows, ny in _sizes(height, cy) for cols, nx in _sizes(width, cx) for items, dates, nt in times]
    return tuple(sorted(out, key=lambda t: (t.pixels * t.items, t.pixels), reverse=True))


def strip_target(inputs: BudgetInputs) -> int:
    """The per-task working set above which a fused task reduces its chunk in sub-blocks: :data:`STRIP_TARGET_BYTES`,
    or :data:`ONE_PROCESS_STRIP_TARGET_BYTES` when the run is one process. Read from the package, so that a value set
    there (``budget.STRIP_TARGET_BYTES = ...``, as the tests do) is the one used."""
    from rasterflow import budget

    return budget.ONE_PROCESS_STRIP_TARGET_BYTES if inputs.one_process else budget.STRIP_TARGET_BYTES


def sub_blocks_across(inputs: BudgetInputs) -> bool:
    """Whether a fused task takes its sub-blocks across each row of them rather than down each column
    (``tasks.chunk_reduce``): when the concurrent remote reader fetches its files. That reader asks for a row of the
    chunk's tiles of a file in one request and holds it until the row's last sub-block is decoded
    (:func:`remote_io_bytes`), so the sub-blocks of a row must follow each other; down each column, GDAL's block
    cache keeps a tile that strips cut for the next strip."""
    return inputs.remote_fetch


def sub_block(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape | None = None) -> tuple[int, int]:
    """``(rows, cols)`` of the sub-blocks the fused task reduces its chunk in (``tasks.chunk_reduce``); ``(0, 0)``
    = the whole chunk at once.

    A fused task holds its pixels' whole series, so its working set grows with the dates. Above
    :func:`strip_target` the chunk is reduced in sub-blocks whose working set, apart from the chunk's result
    they fill, fits it: when the source tiles
    are known, the widest block of whole tiles (whole columns of tiles of the chunk first) that fits with at least
    one tile's height, so that no tile is decoded for two sub-blocks; when not even one tile fits, strips of one
    tile's width (the sub-blocks of a tile follow each other, so its decoded blocks are still in GDAL's cache);
    without known tiles, full-width row strips. Strips are cut equal and never below :data:`MIN_STRIP_ROWS` rows.
    The job's largest task decides (``task``: for that task alone).
    """
    if code_path(shape, inputs) != "fused":
        return (0, 0)
    task = task or task_shapes(shape, inputs)[0]
    if _block_peak(shape, inputs, task, (task.rows, task.cols)) <= strip_target(inputs):
        return (0, 0)
    tile_y, tile_x = inputs.source_tile or (0, 0)
    widths = [task.cols]
    if tile_x and tile_x < task.cols:
        widths += [k * tile_x for k in range(task.cols // tile_x, 0, -1) if k * tile_x < task.cols]
    for cols in widths:
        rows = _fitting_rows(shape, inputs, task, cols)
        if tile_y and rows >= tile_y:
            rows = min(task.rows, rows // tile_y * tile_y)
            return (0, 0) if (rows, cols) == (task.rows, task.cols) else (rows, cols)
    cols = tile_x if tile_x and tile_x < task.cols else task.cols
    rows = _fitting_rows(shape, inputs, task, cols)
    rows = max(MIN_STRIP_ROWS, math.ceil(task.rows / math.ceil(task.rows / rows)))  # equal strips
    if tile_y and rows < tile_y and inputs.one_process:
        # one process: strips no thinner than worker processes would cut (their target), up to a whole tile. Each
        # strip reads a window per item and asset and runs the kernels on it, under one GIL for both threads: a
        # 5490² x 36-date median ran 28-37 s in strips of 86 rows and 11-19 s in whole tiles, for 278 -> 323 MB
        # (benchmarks/README.md, remote_read.py's season); the task stays within the worker processes' target.
        from rasterflow import budget

        rows = max(rows, min(tile_y, _fitting_rows(shape, inputs, task, cols, budget.STRIP_TARGET_BYTES)))
        rows = math.ceil(tile_y / math.ceil(tile_y / rows))  # equal strips of a tile
    elif tile_y and rows < tile_y:
        rows = math.ceil(tile_y / math.ceil(tile_y / rows))  # equal strips of a tile
    return (0, 0) if (rows, cols) == (task.rows, task.cols) or rows >= task.rows and cols >= task.cols \
        else (min(rows, task.rows), cols)


def _fitting_rows(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, cols: int,
                  target: int | None = None) -> int:
    """The most rows of a ``cols``-wide sub-block whose working set, apart from the whole chunk's result, fits
    ``target`` (default :func:`strip_target`; at least :data:`MIN_STRIP_ROWS`): the working set is affine in the
    rows."""
    target = strip_target(inputs) if target is None else target
    result = _n_groups(shape, inputs) * max(1, shape.n_quantiles) * shape.result_bands * task.pixels \
        * dtype_itemsize(inputs.dtype)
    at_one = _block_peak(shape, inputs, task, (1, cols)) - result
    per_row = max(1, _block_peak(shape, inputs, task, (2, cols)) - result - at_one)
    return int(max(MIN_STRIP_ROWS, min(task.rows, (target - (at_one - per_row)) // per_row)))


def _block_peak(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, block: tuple[int, int]) -> int:
    """The reduction's peak with sub-blocks of ``block`` (the write that follows does not depend on them)."""
    return max(nbytes for _, nbytes, _ in _task_stages(shape, inputs, task, block, writes=False))


def _task_stages(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape,
                 block: tuple[int, int] | None = None, *, writes: bool = True) -> list[tuple[str, int, str]]:
    """(stage, bytes, detail) of one task of ``task``'s shape on the job's code path: the stages every path shares
    (:func:`item_stages`), then the path's own (:func:`fused_stages`, :func:`tree_stages`, :func:`series_stages`).

    A fused task reduces its chunk in sub-blocks of ``block`` (default: the job's :func:`sub_block`); ``writes``:
    with the fused path's write stage (:func:`_block_peak` leaves it out: it does not depend on the sub-blocks)."""
    path = code_path(shape, inputs)
    if block is None:
        block = sub_block(shape, inputs) if path == "fused" else (0, 0)
    terms = item_stages(shape, inputs, task, block, fused=path == "fused")
    if path == "fused":
        return fused_stages(shape, inputs, task, terms, writes=writes)
    if path == "tree":
        return tree_stages(shape, inputs, task, terms)
    return series_stages(shape, inputs, task, terms)


@dataclass(frozen=True)
class ItemTerms:
    """What a task holds while it evaluates its items' bands (:func:`item_stages`), for its path's own stages."""

    stages: list[tuple[str, int, str]]
    """load, mask and one stage per band."""
    part: TaskShape
    """The task, or the sub-block of its chunk a fused task reduces at a time."""
    striped: bool
    """A fused task in sub-blocks."""
    one: int
    """One date of one band in the working dtype, over ``part``."""
    series: int
    """One band's output series, over ``part``."""
    held: int
    """Alive for the whole evaluation: one item's raw planes, every band's series (and the chunk's result when
    ``striped``)."""
    result: int
    """Bytes per pixel of the reduction's result: groups × quantiles × bands × itemsize."""
    n_groups: int
    base: str
    """The words of ``held``."""
    strip_words: str


def item_stages(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, block: tuple[int, int], *,
                fused: bool) -> ItemTerms:
    """The stages every path shares, following :mod:`rasterflow.kernels`: one item loaded, the mask, each band.

    The reader hands the kernel one item at a time (``read.item_stream``): the loaded block is one item's raw values,
    the series the only date-deep arrays. A fused task (``fused``) reduces its chunk in sub-blocks of ``block``;
    then the whole chunk's result is alive beside the sub-block's working set."""
    rows, cols = min(block[0], task.rows), min(block[1], task.cols)
    striped = fused and rows > 0 and (rows, cols) != (task.rows, task.cols)
    part = dataclasses.replace(task, rows=rows, cols=cols) if striped else task
    w = dtype_itemsize(inputs.dtype)
    n_loaded, n_bands = len(shape.assets_loaded), len(shape.bands)
    one = part.pixels * w  # one date of one band in the working dtype, over the strip
    series = part.dates * one  # one band's output series
    load_px = sum(inputs.load_itemsizes(n_loaded)) + inputs.coverage_assets  # bytes per item and pixel
    item = LOAD_COPIES * part.pixels * load_px  # one item's raw planes
    n_groups = _n_groups(shape, inputs)  # every period of the output, whatever dates the chunk has
    result = n_groups * max(1, shape.n_quantiles) * shape.result_bands * w
    chunk_result = result * task.pixels if striped else 0  # filled strip by strip
    held = item + n_bands * series + chunk_result
    strip_words = f" (a {rows}×{cols} sub-block of the {task.rows}×{task.cols} chunk)" if striped else ""
    stages: list[tuple[str, int, str]] = []
    cover = f" + {inputs.coverage_assets} coverage plane(s)" if inputs.coverage_assets else ""
    stages.append(("load", item, f"{n_loaded} asset(s) of one item loaded as "
                                  f"{inputs.load_words(n_loaded)}{cover}{strip_words}; {task.items} items one by one"))
    # kernels._band_series, one date at a time: the mask evaluated on the raw values (kernels._drop_addend), the
    # assets the bands read as working planes (kernels.working_assets: an asset only the mask reads stays raw), then
    # each band written into its series. Counted as the kernel allocates (2026-12-06): a 3072² series task of 3
    # dates measured 313 MB above its start, the model then said 387 MB (6 one-date planes for the mask where the
    # kernel has 4: red, nir and NDVI's two temporaries); a float64 one-date series 1.41x its measured worker peak.
    n_work = len(_working_assets(shape))
    # with solar_day the next tile's raw planes, its working planes and the filled/take masks
    mosaic = n_work + 0.5 if shape.mosaics_passes else 0
    next_tile = item if shape.mosaics_passes else 0
    cover_plane = 1 if inputs.coverage_assets else 0  # a coverage plane's NaN addend while it is added
    base = f"one item + {n_bands} band series of {part.dates} dates" + (" + the chunk's result" if striped else "")
    if shape.mask is not None:
        temps = mosaic + _mask_planes(shape, inputs, n_work) + cover_plane
        stages.append(("mask", int(held + next_tile + temps * one),
                       f"{base} + {temps:g} one-date planes (the mask and the {n_work} working asset(s))"))
    for name, expr in shape.bands:
        own = band_temporaries(expr)
        temps = n_work + mosaic + own
        stages.append((f"band {name}", int(held + next_tile + temps * one),
                       f"{base} + {temps:g} one-date planes ({n_work} working asset(s), {own} temporaries of "
                       f"{expr.live_arrays} live)"))
    return ItemTerms(stages=stages, part=part, striped=striped, one=one, series=series, held=held, result=result,
                     n_groups=n_groups, base=base, strip_words=strip_words)


def fused_stages(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, terms: ItemTerms, *,
                 writes: bool = True) -> list[tuple[str, int, str]]:
    """The fused task (``tasks.chunk_reduce``): the shared stages, the reduction of each band's series
    (``kernels.reduce_block``: :func:`reduce_work`, a period's subset copy) into the chunk's result, and
    (``writes``) the write of one of the result's entries that follows on the worker (:func:`write_extra_bytes`)."""
    stages = list(terms.stages)
    part, one, held, result = terms.part, terms.one, terms.held, terms.result
    quantiles = max(1, shape.n_quantiles)
    method = shape.reduce_method or ""
    group = min(inputs.group_dates or part.dates, part.dates) * one
    work, work_words = reduce_work(shape, inputs, part, group)
    # a period's dates are a slice of the series (no copy) for a composite; the per-band statistics copy them
    subset = group if shape.has_period and not shape.composite else 0
    out = result * part.pixels
    stages.append((f"reduce {method}", int(held + work + subset + out),
                   f"{terms.base} + {work_words}" + (" + a period's subset" if subset else "")
                   + f" + the {terms.n_groups}×{quantiles}×{shape.result_bands} result{terms.strip_words}"))
    if writes:
        # the write task of one of the chunk's entries, its whole result alive (graph._reduced_band selects views)
        extra_write, words = write_extra_bytes(shape, inputs, task.pixels)
        stages.append(("write", int(result * task.pixels + extra_write),
                       f"the chunk's {terms.n_groups}×{quantiles}×{shape.result_bands} result + {words}"))
    return stages


def reduce_work(shape: PipelineShape, inputs: BudgetInputs, part: TaskShape, group: int) -> tuple[int, str]:
    """What the fused task's reduction allocates beside the band series and its result array, over ``part`` (the
    task or its sub-block; ``group``: one band's series of the largest period), and its words.

    - one statistic: :data:`REDUCTION_EXTRA_PLANES` of ``group``;
    - a list (``kernels.reduce_statistics``): the statistics run one after the other on the same series, so the
      largest working copies of its methods, plus the ``(statistics, y, x)`` block they fill for one band;
    - a geomedian (``kernels.composite_result``): geomad's measured work arrays for one slab
      (:func:`rasterflow.geomedian.geomedian_work_bytes`), its float32 result and, for float64, the cast copy;
    - a best-pixel composite: the selection's work (:func:`rasterflow.bestpixel.best_work_bytes`) and the gathered
      bands (in the working dtype).
    """
    w = dtype_itemsize(inputs.dtype)
    pixels = part.pixels
    n_out = max(1, shape.n_quantiles)
    if shape.composite == "geomedian":
        from rasterflow.geomedian import DEFAULT_WORK_PIXELS, geomedian_work_bytes, slab_rows

        slab = min(pixels, slab_rows(part.rows, part.cols, DEFAULT_WORK_PIXELS) * part.cols)
        kernel = geomedian_work_bytes(part.dates, len(shape.composite_inputs), slab)
        outputs = n_out * 4 * pixels + (n_out * w * pixels if w != 4 else 0)
        return kernel + outputs, (f"geomad's work for a {slab}-pixel slab + its float32 result of {n_out} variables"
                                  + (" and their cast" if w != 4 else ""))
    if shape.composite == "best":
        from rasterflow.bestpixel import best_work_bytes

        kernel = best_work_bytes(pixels, w, w)
        return kernel + n_out * w * pixels, f"the selection's work + the {n_out} gathered bands"
    methods = shape.statistic_methods or (shape.reduce_method or "",)
    copies = max(REDUCTION_EXTRA_PLANES.get(m, 1.0) for m in methods)
    if not shape.statistic_methods:
        return int(copies * group), f"{copies:g} working copies"
    block = shape.statistics * pixels * w
    return int(copies * group + block), (f"{copies:g} working copies (the largest of "
                                         f"{', '.join(methods)}) + the {shape.statistics} statistics of one band")


def _bands_out(shape: PipelineShape, terms: ItemTerms) -> tuple[str, int, str]:
    """The tree's and the series' band task ends with ``kernels.band_block`` copying the series into one
    ``(date, band, y, x)`` block, one band at a time."""
    return ("bands out", int(terms.held + terms.series), f"{terms.base} + the first band of the (date, band) block")


def tree_stages(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape,
                terms: ItemTerms) -> list[tuple[str, int, str]]:
    """The tree (``graph._tree_reduce``): the band task (the shared stages and the band block), then per band one
    task of partials (``tasks.tree_partials``: :data:`TREE_CHUNK_EXTRA_PLANES` working copies, std's
    :data:`STD_PARTIAL_PLANES`), then the combination of :data:`TREE_SPLIT_EVERY` partials at a time."""
    stages = list(terms.stages) + [_bands_out(shape, terms)]
    one, series = terms.one, terms.series
    n_bands, w = len(shape.bands), dtype_itemsize(inputs.dtype)
    block_out = n_bands * series
    method = shape.reduce_method or ""
    partial = _tree_partial(shape, inputs, task)
    subset = series if shape.has_period else 0  # the period's dates are taken (copied) from the block
    copies = TREE_CHUNK_EXTRA_PLANES[method](w) if method in TREE_CHUNK_EXTRA_PLANES else \
        REDUCTION_EXTRA_PLANES.get(method, 1.0)
    extra = copies * series + (STD_PARTIAL_PLANES * one if method == "std" else 0)
    stages.append((f"reduce {method} (tree)", int(block_out + subset + extra + partial),
                   f"the {n_bands}-band block + {copies:g} working copies of a band"
                   + (" + the period's subset" if shape.has_period else "") + " + its partial"))
    fan_in = min(inputs.n_time_chunks, TREE_SPLIT_EVERY)
    stages.append((f"combine {method} (tree)", int(fan_in * partial + 2 * one),
                   f"{fan_in} partials concatenated + the result"))
    return stages


def series_stages(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape,
                  terms: ItemTerms) -> list[tuple[str, int, str]]:
    """The series (no reduction): the band task (the shared stages and the band block), then the block held while
    its dates are written (:func:`write_extra_bytes` when a COG's tiles cost more than two one-date planes)."""
    stages = list(terms.stages) + [_bands_out(shape, terms)]
    one, n_bands = terms.one, len(shape.bands)
    block_out = n_bands * terms.series
    extra_write, words = write_extra_bytes(shape, inputs, task.pixels)
    if shape.output_format == "cog" and extra_write > 2 * one:
        stages.append(("write dates", int(block_out + extra_write), f"the {n_bands}-band block + {words}"))
    else:
        stages.append(("write dates", int(block_out + 2 * one),
                       f"the {n_bands}-band block while its dates are encoded and written"))
    return stages


def write_extra_bytes(shape: PipelineShape, inputs: BudgetInputs, pixels: int) -> tuple[int, str]:
    """What the worker task that writes one entry (a period, quantile or date: every band) of a finished block of
    ``pixels`` holds beside that block, and its words: for Zarr, per band, zarr's chunk buffer and the compressed
    chunk (:data:`ZARR_WRITE_PLANES`; plus the cast copy and NaN mask when the writer encodes); for a COG the bands
    stacked into one block (``write.cog._cube``), and, when the workers make the tiles (:func:`cog_tile_layout`), the
    compressed tiles (:data:`COG_TILE_BYTES_RATIO`) and the first overview's halving (:data:`HALVE_BYTES_PER_PIXEL`).
    0 for Zarr v3 shards (:func:`held_for_shards` counts the shard's write)."""
    w = dtype_itemsize(inputs.dtype)
    stored_w = dtype_itemsize(shape.stored_dtype or inputs.dtype)
    n_bands = len(shape.output_band_names)  # a COG file's bands
    if shape.output_format == "cog":
        stacked = n_bands * pixels * w
        layout = cog_tile_layout(shape, inputs)
        if layout is None:
            return stacked, "the bands stacked into the block the client writes"
        tiles = COG_TILE_BYTES_RATIO * n_bands * pixels * stored_w
        halve = n_bands * pixels * (HALVE_BYTES_PER_PIXEL + w / 4) if len(layout.levels) > 1 else 0
        return int(stacked + tiles + halve), "the bands stacked, their COG tiles and the first overview's halving"
    if shards_per_side(shape, inputs) > 1:
        return 0, "its shard (held for shards)"
    encoded = shape.stored_dtype is not None and shape.stored_dtype != inputs.dtype
    encode = (ENCODE_PLANES * stored_w + 1) * pixels if encoded else 0
    return int(ZARR_WRITE_PLANES * pixels * stored_w + encode), \
        f"{ZARR_WRITE_PLANES:g} one-band planes (zarr's chunk buffer, the compressed chunk)" \
        + (" + the encoded copy and its mask" if encoded else "")


def units_in_flight(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Spatial chunks one worker has in flight at once under the writer's cap (``write.submit.run_units``): the cap
    counts blocks (:data:`IN_FLIGHT_PER_THREAD` per thread of the cluster for Zarr, whose unit is every band and
    entry of a chunk; :data:`TILES_INFLIGHT_PER_THREAD` or :data:`COG_INFLIGHT_PER_THREAD` for a COG, whose unit is
    up to :data:`COG_BATCH_BYTES` of a chunk's files), shared by the workers, at most the chunks a worker gets."""
    threads = max(1, inputs.n_workers * inputs.threads_per_worker)
    n_bands = max(1, len(shape.output_band_names))
    if shape.output_format == "cog":
        per_thread = TILES_INFLIGHT_PER_THREAD if cog_tile_layout(shape, inputs) is not None \
            else COG_INFLIGHT_PER_THREAD
        cap = max(2, per_thread * threads)
        cy, cx = inputs.chunk_yx
        unit_bytes = dtype_itemsize(inputs.dtype) * n_bands * cy * cx
        keys = min(max(1, min(cap, COG_BATCH_BYTES // max(1, unit_bytes))), _cog_files(shape, inputs))
    else:
        cap = max(2, IN_FLIGHT_PER_THREAD * threads)
        keys = shape.result_bands * _n_groups(shape, inputs) * max(1, shape.n_quantiles)
    # on the fused path the Zarr writer keeps a chunk per thread and write.submit.QUEUED_UNITS more in flight (not
    # with shards): a thread that finishes a reduction may start the queued one before its result's writes arrive
    # (3 bands, 1536² chunks, 2 threads, 4 chunks in flight: 281-290 MB here, 362 MB on CI's machine, against 309 MB
    # projected without a waiting result)
    floor = threads + QUEUED_UNITS if (shape.output_format != "cog" and code_path(shape, inputs) == "fused"
                                       and shards_per_side(shape, inputs) <= 1) else 1
    units = max(1, cap // keys, floor)
    workers = max(1, inputs.n_workers)
    return max(1, min(math.ceil(inputs.n_spatial_chunks / workers), math.ceil(units / workers)))


def _working_assets(shape: PipelineShape) -> tuple[str, ...]:
    """``kernels.working_assets``: the loaded assets the bands read (each becomes a working-dtype plane per date)."""
    read = set().union(*(expr.names for _, expr in shape.bands)) if shape.bands else set()
    return tuple(a for a in shape.assets_loaded if a in read) or shape.assets_loaded


def _asset_dtype(shape: PipelineShape, inputs: BudgetInputs, asset: str) -> str:
    if inputs.asset_dtypes and asset in shape.assets_loaded:
        return inputs.asset_dtypes[shape.assets_loaded.index(asset)]
    return inputs.load_dtype or inputs.dtype


def _mask_planes(shape: PipelineShape, inputs: BudgetInputs, n_work: int) -> float:
    """One-date planes alive while the mask is applied (``kernels._drop_addend`` and ``_masked_assets``): a mask of
    one small-integer asset is a per-value table gathered with each working asset (no plane of its own); any other
    is evaluated on the raw values (its temporaries, counted as working planes) into one NaN-addend plane that stays
    while the working assets are made."""
    mask = shape.mask
    assert mask is not None
    if len(mask.names) == 1 and _asset_dtype(shape, inputs, next(iter(mask.names))) in TABLE_DTYPES:
        return n_work
    return max(mask.live_arrays - len(mask.names) + 1, n_work + 1)


def band_temporaries(expr: Expression) -> int:
    """One-date planes a band's evaluation allocates at its peak, its inputs not counted (``kernels._band_series``).

    ``live_arrays`` counts the result as a new array; the kernel has an outermost ``+ - * /`` write into the band's
    series (``Expression.evaluate(out=)``), so then the peak is the larger of the operands' own peaks (the left
    result alive while the right is evaluated) and the two results, not the whole count. Measured 2026-12-06
    (a one-off probe: one 1536² item of tests/test_budget_measured.py's scenes): NDVI 2.0 planes (live 5 - 2 inputs - 1 into the
    series), EVI 4.0 (its peak is inside the denominator: live 7 - 3 inputs, none saved); a whole 3072² series
    task of 3 dates 313 MB above its start, 311 MB predicted."""
    return _band_temporaries(expr.text, tuple(sorted(expr.names)), expr.live_arrays)


@functools.lru_cache(maxsize=256)
def _band_temporaries(text: str, names: tuple[str, ...], live: int) -> int:
    import ast

    whole = max(0, live - len(names))
    try:
        body = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:  # pragma: no cover - a parsed Expression's text parses
        return whole
    if not (isinstance(body, ast.BinOp) and isinstance(body.op, (ast.Add, ast.Sub, ast.Mult, ast.Div))):
        return whole

    def operand(node: ast.expr) -> tuple[int, int]:
        """(own peak, 1 when its result is a new array) of an operand."""
        if isinstance(node, ast.Name) or not any(isinstance(n, ast.Name) for n in ast.walk(node)):
            return 0, 0  # an input the caller holds, or a constant (a scalar)
        sub = parse_expression(ast.unparse(node), list(names), what="band")
        return max(0, sub.live_arrays - len(sub.names)), 1

    (left_peak, left), (right_peak, right) = operand(body.left), operand(body.right)
    return min(whole, max(left_peak, left + right_peak, left + right))


def _tree_partial(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape) -> float:
    """One band's partial of one time chunk (median/quantile are refused here: counted as a copy of the series)."""
    w = dtype_itemsize(inputs.dtype)
    one = task.pixels * w
    method = shape.reduce_method or ""
    return TREE_PARTIAL_PLANES[method](w) * one if method in TREE_PARTIAL_PLANES else task.dates * one


def held_between_tasks(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """What a worker holds besides its running tasks (measured, budget_accuracy.py and
    tests/test_budget_measured.py), on the job's code path: :func:`fused_held`, :func:`tree_held` or
    :func:`series_held`."""
    path = code_path(shape, inputs)
    if path == "fused":
        return fused_held(shape, inputs)
    if path == "tree":
        return tree_held(shape, inputs)
    return series_held(shape, inputs)


def fused_held(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Finished chunk results waiting for their writes (every entry and band of a chunk's result). None for Zarr
    without shards: its writer runs a chunk's reduction and its writes as one task (``write.submit.run_units``'
    ``one_task_per_unit``), whose write stage counts the result."""
    if shape.output_format != "cog" and shards_per_side(shape, inputs) <= 1:
        return 0
    task = task_shapes(shape, inputs)[0]
    one = task.pixels * dtype_itemsize(inputs.dtype)
    n_groups = _n_groups(shape, inputs)
    # a finished chunk's result waits for its write tasks while the thread that made it runs its next reduction:
    # the worker starts the next task it has before the scheduler has sent the writes. With a COG whose tiles
    # the workers make, a 3-band 1536² median on 2 threads held 4 results (managed 113 MB) while two tile tasks
    # ran, 414 MB measured where 283 MB was predicted without them (2026-12-06); so one waiting result per
    # running task, as far as the writer's cap leaves other chunks in flight (Zarr with 3 bands on 2 threads:
    # 2 chunks in flight, none waiting). A result with periods or quantiles stays whole while its entries are
    # written (graph._reduced_band selects views of it): at least one is held.
    entries = n_groups * max(1, shape.n_quantiles)
    running = concurrent_tasks(shape, inputs)
    waiting = min(running, max(0, units_in_flight(shape, inputs) - running))
    result = entries * shape.result_bands * one
    whole = entries > 1 and math.ceil(inputs.n_spatial_chunks / max(1, inputs.n_workers)) > running
    if shape.output_format == "cog":
        # a COG's results wait for tile tasks the client sends as soon as it learns they are done: at the next
        # tasks' peak about half of them still wait (COG_RESULT_WAITING, measured); a shard's wait for its shard
        return max(int(COG_RESULT_WAITING * waiting * result), result if whole else 0)
    return max(waiting, 1 if whole else 0) * result


def _held_blocks(shape: PipelineShape, inputs: BudgetInputs, running: int, n_held: int) -> int:
    """The ``(date, band)`` blocks of the ``n_held`` tasks ranked after the ``running`` ones.

    Each thread's finished block waits while the thread runs its next task: its reduction or write is queued
    behind the next band tasks (counting it for one thread only left the two-thread tree rows of
    budget_accuracy.py at 0.81-0.88 of their measured peak with either decoder, 2026-12-04). The running tasks are
    counted elsewhere as the largest; a held block is another task's, so the blocks are those of the tasks ranked
    after them: on a grid of equal chunks the same size, on a grid of a few uneven ones smaller (a 1400² grid of
    1024² chunks on two threads was predicted 1.60x its measured peak counting the largest block twice more)."""
    itemsize = dtype_itemsize(inputs.dtype)
    return sum(len(shape.bands) * other.dates * other.pixels * itemsize
               for other in _largest(shape, inputs, running + n_held)[running:])


def _tree_partials_held(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, own: bool) -> int:
    """Partials of every time chunk of a spatial chunk, every band (``own``: the running task's counted too); with
    periods a time chunk holds a partial per period it touches (tasks.tree_partials; the period's dates are copied
    out of the block inside the task, counted there)."""
    partials = inputs.n_time_chunks
    if shape.has_period:
        group = min(inputs.group_dates or task.dates, inputs.n_time)
        partials = _n_groups_with_dates(inputs) * min(inputs.n_time_chunks,
                                                      math.ceil(group / inputs.time_per_chunk) + 1)
    if not own:
        partials = max(0, partials - 1)
    return int(partials * len(shape.bands) * _tree_partial(shape, inputs, task))


def tree_held(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Finished band blocks waiting for their partials (one per thread) and the partials of a spatial chunk waiting
    for its last time chunk; when each thread has a spatial chunk of its own, only that chunk's other partials."""
    running = concurrent_tasks(shape, inputs)
    task = task_shapes(shape, inputs)[0]
    if math.ceil(inputs.n_spatial_chunks / max(1, inputs.n_workers)) <= running:
        # each thread reduces the time chunks of its own spatial chunk: beside the running task only the partials of
        # that chunk's other time chunks (its own partial is counted in its stage), no block of another chunk.
        # Measured 2026-12-06 (tests/test_budget_measured.py, one 3072² chunk, one thread): mean over 2 and 3 time
        # chunks 509 MB and 545 MB where a block and every partial held predicted 788 MB and 741 MB (1.55, 1.36);
        # std over 2 time chunks 893 MB (predicted 1118 MB, now 854 MB)
        return _tree_partials_held(shape, inputs, task, own=False)
    return _held_blocks(shape, inputs, running, running) + _tree_partials_held(shape, inputs, task, own=True)


def series_held(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Finished band blocks waiting to be written: none with time whole and one band, where a chunk's one band task
    is followed by its one write on the same thread before the thread's next band task (the write stage counts the
    block)."""
    running = concurrent_tasks(shape, inputs)
    if inputs.n_time_chunks <= 1 and len(shape.bands) == 1:
        # measured 2026-12-06 (budget_accuracy.py, time whole, one band): 279-282 MB where a held block predicted
        # 346 MB (row 18, 1.23), a 1400² grid of four uneven chunks on two threads 269 MB against 349 MB (row 25,
        # 1.30), solar_day 249 MB (row 33). With two bands (two writes of the block) the next chunk's band task ran
        # between them: row 20 measured 319 MB, 0.77 of the projection without a held block
        return 0
    # the writer's unit is a spatial chunk (every date of it): the blocks of all its time chunks wait for their
    # writes, queued behind its band tasks (2 threads, 4 time chunks of 1024²: 271 MB measured where one held block
    # per thread predicted 242 MB, 0.89, budget_accuracy.py row 19, 2026-12-06); at most two per thread (what was
    # measured: deeper units, more time chunks than that, were not)
    return _held_blocks(shape, inputs, running, max(running, min(inputs.n_time_chunks, 2 * running)))


def shards_per_side(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Chunks per side of the Zarr v3 shards the writer makes (1: no shards, also for COG and Zarr format 2)."""
    if shape.output_format != "zarr" or shape.zarr_format != 3:
        return 1
    itemsize = dtype_itemsize(shape.stored_dtype or inputs.dtype)
    return shard_side(inputs.chunk_yx, itemsize, _store_blocks(shape, inputs), shape.zarr_shards)


def _store_blocks(shape: PipelineShape, inputs: BudgetInputs) -> tuple[int, int]:
    """Chunks per axis of one output store: the grid's, or a tile's with ``output.tiling``."""
    cy, cx = inputs.chunk_yx
    height, width = inputs.grid_shape
    if shape.tile_size:  # each tile is a store of its own
        height, width = min(height, shape.tile_size), min(width, shape.tile_size)
    return math.ceil(height / cy), math.ceil(width / cx)


def held_for_shards(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """What a worker holds for Zarr v3 shards (``write.zarr``): a shard is written whole by one task, so every chunk
    result of the shard is held until its last chunk is done and then gathered on the writing worker, which encodes
    it into one stored-dtype array and zarr's encoded shard beside it. The writer keeps
    :data:`~rasterflow.writeplan.SHARDS_IN_FLIGHT` shard positions in flight: the writing worker holds one whole
    shard's results and its share of the next ones' (when the store has more shards). 0 without shards."""
    side = shards_per_side(shape, inputs)
    if side <= 1:
        return 0
    cy, cx = inputs.chunk_yx
    rows, cols = _store_blocks(shape, inputs)
    blocks = min(side, rows) * min(side, cols)
    entries = _n_groups(shape, inputs) * max(1, shape.n_quantiles)
    chunk_result = entries * shape.result_bands * cy * cx * dtype_itemsize(inputs.dtype)
    shard_results = blocks * chunk_result
    # the next shards' results, as far as there are next shards: a store of one shard has none (budget_accuracy.py
    # row 39, a 2048² store of 512² chunks in one 4x4 shard, 2 threads: 208-212 MB measured where counting a next
    # shard predicted 276 MB, 1.33; 2026-12-06)
    n_shards = math.ceil(rows / side) * math.ceil(cols / side)
    others = min(SHARDS_IN_FLIGHT - 1, n_shards - 1) * shard_results / max(1, inputs.n_workers)
    stored = blocks * cy * cx * dtype_itemsize(shape.stored_dtype or inputs.dtype)  # one band's shard, one entry
    return int(shard_results + others + 2 * stored)


def _n_groups(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Periods in the result (1 without ``reduce.period``). Without the dates (the static check) one period of every
    date: the period's subset is then counted at its largest, the small per-period results at one."""
    if not shape.has_period:
        return 1
    return inputs.n_periods or _n_groups_with_dates(inputs)


def _n_groups_with_dates(inputs: BudgetInputs) -> int:
    """Periods that hold dates (an empty period has no partials): at most every date's own, at least the dates over
    the largest period's."""
    return math.ceil(inputs.dates / max(1, inputs.group_dates or inputs.dates))


def concurrent_tasks(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Tasks a worker runs at once: its threads, but never more than the root tasks it gets (n_tasks / n_workers)."""
    n_tasks = sum(t.count for t in task_shapes(shape, inputs))
    return max(1, min(inputs.threads_per_worker, math.ceil(n_tasks / max(1, inputs.n_workers))))


def _largest(shape: PipelineShape, inputs: BudgetInputs, n: int) -> list[TaskShape]:
    """The ``n`` largest root tasks (one entry per task)."""
    out: list[TaskShape] = []
    for task in task_shapes(shape, inputs):
        out.extend([task] * min(task.count, n - len(out)))
        if len(out) >= n:
            break
    return out


def estimate_task_count(inputs: BudgetInputs, n_bands: int, reduce_method: str | None,
                        shape: PipelineShape | None = None) -> int:
    """Tasks in the graph ``graph.build_dataset`` builds and the writer runs, per spatial chunk: the fused path has
    the read+kernel task, a selection and a write per band; the tree path one band-block task per time chunk, a
    selection and a partial per band and time chunk, their combination and a write per band; the series path one
    band-block task per time chunk and a selection and a write per band and date."""
    if shape is None:
        shape = PipelineShape((), None, (), (("x", None),) * n_bands, reduce_method, 0)  # type: ignore[arg-type]
    spatial, time_chunks = inputs.n_spatial_chunks, inputs.n_time_chunks
    path = code_path(shape, inputs)
    if path == "fused":
        per_chunk = 1 + 2 * n_bands
    elif path == "tree":
        per_chunk = time_chunks * (1 + 2 * n_bands) + n_bands * (time_chunks + 1)
    else:
        per_chunk = (1 if shape.mosaics_passes else time_chunks) + 2 * n_bands * inputs.dates
    return spatial * per_chunk + 10
