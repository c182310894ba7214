"""What the code paths share: the stages every task has (one item loaded, the mask, the bands: :func:`item_stages`,
:class:`ItemTerms`), the band block the tree and the series end their band task with (:func:`bands_out`), the
write of a finished block (:func:`write_extra_bytes`), the blocks held between tasks (:func:`held_blocks`); and
what a path's ``build`` returns (:class:`PathTasks`) with its tasks' projected memory
(:func:`projected_task_bytes`).

Follow :mod:`rasterflow.kernels`, :mod:`rasterflow.tasks` and the writers, and change them together. Imports no
NumPy, Dask or xarray: the budget (planning, ``validate``) reads these functions.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rasterflow.budget.cogclient import cog_tile_layout
from rasterflow.budget.constants import (
    COG_TILE_BYTES_RATIO,
    ENCODE_PLANES,
    HALVE_BYTES_PER_PIXEL,
    LOAD_COPIES,
    TABLE_DTYPES,
    ZARR_WRITE_PLANES,
)
from rasterflow.budget.model import BudgetInputs, PipelineShape, TaskShape
from rasterflow.budget.taskshapes import largest_tasks, result_periods, shards_per_side, task_shapes
from rasterflow.expr import Expression, parse_expression
from rasterflow.units import dtype_itemsize

if TYPE_CHECKING:
    from rasterflow.graph import Coordinate, Variable
    from rasterflow.planning import JobPlan

#: A path's stages of one task: ``(shape, inputs, task, block, *, writes)`` -> ``[(stage, bytes, detail), ...]``
#: (``task_stages`` of :mod:`~rasterflow.paths.fused`, :mod:`~rasterflow.paths.tree`, :mod:`~rasterflow.paths.series`).
TaskStages = Callable[..., list[tuple[str, int, str]]]


@dataclass(frozen=True)
class PathTasks:
    """What a code path's ``build`` returns: its lazy variables and their projected memory."""

    variables: dict[str, Variable]
    """One lazy variable per output variable (its dims and its Dask array)."""
    coords: dict[str, Coordinate]
    """The coordinates the path adds to the grid's (the series' ``time``)."""
    task_bytes: int
    """The projected peak of one task: the plan's largest task, by the path's own ``task_stages`` (the function the
    budget counted it with: the budget report's ``peak_task_bytes``)."""


def time_chunks(plan: JobPlan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(items per time chunk, dates per time chunk)`` of ``plan``'s task arrays: the dates are the items' unless
    the items make passes (``group_by: solar_day``), whose dates are in one chunk."""
    program = plan.program
    assert program is not None, "a plan without items has no tasks"
    n_items = len(plan.items)
    per_chunk = plan.chunks["time"]
    item_chunks = tuple(min(per_chunk, n_items - start) for start in range(0, n_items, per_chunk))
    n_dates = len(plan.times)
    date_chunks = (n_dates,) if program.steps else item_chunks
    return item_chunks, date_chunks


def projected_task_bytes(plan: JobPlan, task_stages: TaskStages) -> int:
    """The per-task peak of ``plan``'s largest task by ``task_stages``, with the plan's sub-blocks and the budget's
    own shape and inputs: what the budget counted for one task.

    Parameters
    ----------
    plan : JobPlan
        The plan the path's tasks are built from.
    task_stages : TaskStages
        The path's stage function (its module's ``task_stages``).

    Returns
    -------
    int
        Bytes at the task's peak stage.
    """
    shape, inputs = plan.shape, plan.report.inputs
    task = task_shapes(shape, inputs)[0]
    return max(nbytes for _, nbytes, _ in task_stages(shape, inputs, task, plan.sub_block))


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
    n_groups = result_periods(shape, inputs)  # every period of the output, whatever dates the chunk has
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
    n_work = len(working_asset_names(shape))
    # with solar_day the next tile's raw planes, its working planes and the filled/take masks
    mosaic = n_work + 0.5 if shape.mosaics_passes else 0
    next_tile = item if shape.mosaics_passes else 0
    cover_plane = 1 if inputs.coverage_assets else 0  # a coverage plane's NaN addend while it is added
    base = f"one item + {n_bands} band series of {part.dates} dates" + (" + the chunk's result" if striped else "")
    if shape.mask is not None:
        temps = mosaic + mask_planes(shape, inputs, n_work) + cover_plane
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


def working_asset_names(shape: PipelineShape) -> tuple[str, ...]:
    """``kernels.working_assets``: the loaded assets the bands read (each becomes a working-dtype plane per date)."""
    read = set().union(*(expr.names for _, expr in shape.bands)) if shape.bands else set()
    return tuple(a for a in shape.assets_loaded if a in read) or shape.assets_loaded


def asset_dtype(shape: PipelineShape, inputs: BudgetInputs, asset: str) -> str:
    if inputs.asset_dtypes and asset in shape.assets_loaded:
        return inputs.asset_dtypes[shape.assets_loaded.index(asset)]
    return inputs.load_dtype or inputs.dtype


def mask_planes(shape: PipelineShape, inputs: BudgetInputs, n_work: int) -> float:
    """One-date planes alive while the mask is applied (``kernels._drop_addend`` and ``_masked_assets``): a mask of
    one small-integer asset is a per-value table gathered with each working asset (no plane of its own); any other
    is evaluated on the raw values (its temporaries, counted as working planes) into one NaN-addend plane that stays
    while the working assets are made."""
    mask = shape.mask
    assert mask is not None
    if len(mask.names) == 1 and asset_dtype(shape, inputs, next(iter(mask.names))) in TABLE_DTYPES:
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
    return band_temporary_planes(expr.text, tuple(sorted(expr.names)), expr.live_arrays)


@functools.lru_cache(maxsize=256)
def band_temporary_planes(text: str, names: tuple[str, ...], live: int) -> int:
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


def bands_out(shape: PipelineShape, terms: ItemTerms) -> tuple[str, int, str]:
    """The tree's and the series' band task ends with ``kernels.band_block`` copying the series into one
    ``(date, band, y, x)`` block, one band at a time."""
    return ("bands out", int(terms.held + terms.series), f"{terms.base} + the first band of the (date, band) block")


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


def held_blocks(shape: PipelineShape, inputs: BudgetInputs, running: int, n_held: int) -> int:
    """The ``(date, band)`` blocks of the ``n_held`` tasks ranked after the ``running`` ones.

    Each thread's finished block waits while the thread runs its next task: its reduction or write is queued
    behind the next band tasks (counting it for one thread only left the two-thread tree rows of
    budget_accuracy.py at 0.81-0.88 of their measured peak with either decoder, 2026-12-04). The running tasks are
    counted elsewhere as the largest; a held block is another task's, so the blocks are those of the tasks ranked
    after them: on a grid of equal chunks the same size, on a grid of a few uneven ones smaller (a 1400² grid of
    1024² chunks on two threads was predicted 1.60x its measured peak counting the largest block twice more)."""
    itemsize = dtype_itemsize(inputs.dtype)
    return sum(len(shape.bands) * other.dates * other.pixels * itemsize
               for other in largest_tasks(shape, inputs, running + n_held)[running:])
