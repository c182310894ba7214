"""The tree code path: a streaming reduction with time chunked. One task per (time chunk, spatial chunk) evaluates
the bands into a ``(date, band, y, x)`` block (``tasks.chunk_bands``); per band, each time chunk's block becomes
partials (``tasks.tree_partials``), combined :data:`~rasterflow.budget.TREE_SPLIT_EVERY` at a time and finished.

Its cost (:func:`tree_stages`; what a worker holds between tasks: :func:`tree_held`) beside its tasks
(:func:`build`, :func:`_tree_reduce`). The module imports no NumPy, Dask or xarray: the building functions import
them when they run.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rasterflow.budget.constants import (
    REDUCTION_EXTRA_PLANES,
    STD_PARTIAL_PLANES,
    TREE_CHUNK_EXTRA_PLANES,
    TREE_PARTIAL_PLANES,
    TREE_SPLIT_EVERY,
)
from rasterflow.budget.model import BudgetInputs, PipelineShape, TaskShape
from rasterflow.budget.taskshapes import result_periods_with_dates, concurrent_tasks, task_shapes
from rasterflow.paths.common import (
    ItemTerms,
    PathTasks,
    bands_out,
    held_blocks,
    item_stages,
    projected_task_bytes,
    time_chunks,
)
from rasterflow.units import dtype_itemsize

if TYPE_CHECKING:
    import dask.array as da

    from rasterflow import kernels
    from rasterflow.graph import Leads
    from rasterflow.layers import Task
    from rasterflow.planning import JobPlan


def tree_stages(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape,
                terms: ItemTerms) -> list[tuple[str, int, str]]:
    """The tree (:func:`_tree_reduce`): the band task (the shared stages and the band block), then per band one
    task of partials (``tasks.tree_partials``: :data:`TREE_CHUNK_EXTRA_PLANES` working copies, std's
    :data:`STD_PARTIAL_PLANES`), then the combination of :data:`TREE_SPLIT_EVERY` partials at a time."""
    stages = list(terms.stages) + [bands_out(shape, terms)]
    one, series = terms.one, terms.series
    n_bands, w = len(shape.bands), dtype_itemsize(inputs.dtype)
    block_out = n_bands * series
    method = shape.reduce_method or ""
    partial = tree_partial(shape, inputs, task)
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


def tree_partial(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape) -> float:
    """One band's partial of one time chunk (median/quantile are refused here: counted as a copy of the series)."""
    w = dtype_itemsize(inputs.dtype)
    one = task.pixels * w
    method = shape.reduce_method or ""
    return TREE_PARTIAL_PLANES[method](w) * one if method in TREE_PARTIAL_PLANES else task.dates * one


def tree_partials_held(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, own: bool) -> int:
    """Partials of every time chunk of a spatial chunk, every band (``own``: the running task's counted too); with
    periods a time chunk holds a partial per period it touches (tasks.tree_partials; the period's dates are copied
    out of the block inside the task, counted there)."""
    partials = inputs.n_time_chunks
    if shape.has_period:
        group = min(inputs.group_dates or task.dates, inputs.n_time)
        partials = result_periods_with_dates(inputs) * min(inputs.n_time_chunks,
                                                      math.ceil(group / inputs.time_per_chunk) + 1)
    if not own:
        partials = max(0, partials - 1)
    return int(partials * len(shape.bands) * tree_partial(shape, inputs, task))


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
        return tree_partials_held(shape, inputs, task, own=False)
    return held_blocks(shape, inputs, running, running) + tree_partials_held(shape, inputs, task, own=True)


#: What a worker holds between this path's tasks (the registry's name: :data:`rasterflow.paths.PATHS`).
held = tree_held


def task_stages(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, block: tuple[int, int], *,
                writes: bool = True) -> list[tuple[str, int, str]]:
    """``(stage, bytes, detail)`` of one tree task of ``task``'s shape: the shared stages
    (:func:`~rasterflow.paths.common.item_stages`), then :func:`tree_stages`. ``block`` and ``writes`` are the fused
    path's (sub-blocks, its write stage): the tree's stages are the same whatever they are."""
    terms = item_stages(shape, inputs, task, block, fused=False)
    return tree_stages(shape, inputs, task, terms)


def build(plan: JobPlan) -> PathTasks:
    """The tree's lazy variables: one band-block task per (time chunk, spatial chunk) (``tasks.chunk_bands``),
    each band reduced by its own tree (:func:`_tree_reduce`); and their projected memory per task.

    Parameters
    ----------
    plan : JobPlan
        A plan made with the searched items, whose budget chose this path.

    Returns
    -------
    PathTasks
    """
    from rasterflow.graph import reduced_band, task_array
    from rasterflow.tasks import chunk_bands

    program = plan.program
    assert program is not None, "a plan without items has no tasks"
    n_bands = len(program.bands)
    item_chunks, date_chunks = time_chunks(plan)
    keep_period, keep_quantile = bool(plan.period_labels), plan.quantile_dim
    bands = task_array(plan, "rasterflow-bands", chunk_bands, item_chunks, (date_chunks, (n_bands,)),
                        program.dtype)
    variables = {name: reduced_band(_tree_reduce(_time_chunked_band(bands, index, name), program, name), 0, name,
                                     keep_period, keep_quantile)
                 for index, name in enumerate(program.band_names)}
    return PathTasks(variables, {}, projected_task_bytes(plan, task_stages))


def _time_chunked_band(bands: da.Array, band: int, name: str) -> da.Array:
    """Band ``band`` of the ``(date, band, y, x)`` series, chunked in time as the series (``bands[:, band]``), as its
    own lazy layer."""
    from rasterflow.graph import select_blocks

    leads: Leads = {
        (k,): ((k, 0), (slice(None), band)) for k in range(bands.numblocks[0])}
    return select_blocks(bands, name, leads, (bands.chunks[0],))


class _TreePartials:
    """The task of block ``(k, 0, i, j)`` of a tree's partials: one band's time chunk ``k`` -> its partials."""

    def __init__(self, source: str, method: str, local: list[tuple[tuple[int, ...], ...]]) -> None:
        self.source, self.method, self.local = source, method, local

    def __call__(self, block: tuple[int, ...]) -> Task:
        from rasterflow import tasks  # a worker's module: not imported with the budget

        k, i, j = block[0], block[-2], block[-1]
        return (tasks.tree_partials, (self.source, k, i, j), self.method, self.local[k])


class _TreeCombine:
    """The task of block ``(c, 0, i, j)`` of a tree level: up to ``fan_in`` partials of the level below combined."""

    def __init__(self, source: str, below: int, fan_in: int, method: str) -> None:
        self.source, self.below, self.fan_in, self.method = source, below, fan_in, method

    def __call__(self, block: tuple[int, ...]) -> Task:
        from rasterflow import tasks  # a worker's module: not imported with the budget

        c, i, j = block[0], block[-2], block[-1]
        keys = [(self.source, k, 0, i, j) for k in range(c * self.fan_in, min((c + 1) * self.fan_in, self.below))]
        return (tasks.tree_combine, keys, self.method)


class _TreeFinish:
    """The task of block ``(0, 0, 0, i, j)``: the combined partials of a spatial chunk -> the reduction."""

    def __init__(self, source: str, method: str, n_groups: int) -> None:
        self.source, self.method, self.n_groups = source, method, n_groups

    def __call__(self, block: tuple[int, ...]) -> Task:
        from rasterflow import tasks  # a worker's module: not imported with the budget

        return (tasks.tree_finish, (self.source, 0, 0, block[-2], block[-1]), self.method, self.n_groups)


def _tree_reduce(series: da.Array, program: kernels.Program, band_name: str) -> da.Array:
    """A streaming reduction over a chunked time axis (median/quantile are refused here by the budget) ->
    ``(group, 1, 1, y, x)``, one block per spatial chunk, shaped as the fused task's result so that
    :func:`reduced_band` cuts it the same way. Partials per time chunk (:func:`rasterflow.tasks.tree_partials`),
    combined :data:`~rasterflow.budget.TREE_SPLIT_EVERY` at a time, then finished: each a lazy
    :class:`~rasterflow.layers.TaskLayer` whose functions live in :mod:`rasterflow.tasks`, so the workers import
    neither dask.array nor xarray for them (Dask's nan-reductions did). The partial and combine levels' blocks are
    ``{period: partials}`` dicts (a time chunk holds only its own periods'); their declared chunks only place them
    in the graph, nothing reads them as arrays."""
    import dask

    from rasterflow import tasks
    from rasterflow.budget import TREE_SPLIT_EVERY
    from rasterflow.graph import block_bounds, lazy_task_array

    method = program.reduce_method
    assert method in tasks.TREE_PARTS, f"{method} needs time whole (chunks.time: -1)"
    groups = program.groups or (tuple(range(series.shape[0])),)
    edges = block_bounds(series.chunks[0])
    local = [tuple(tuple(d - t0 for d in group if t0 <= d < t1) for group in groups) for t0, t1 in edges]
    ny, nx = series.numblocks[-2:]
    spatial = series.chunks[-2:]
    n_groups, n_parts = len(groups), tasks.TREE_PARTS[method]
    token = dask.base.tokenize(series.name, method, groups)
    prefix = f"rasterflow-tree-{method}-{band_name}"
    level = lazy_task_array(f"{prefix}-partials-{token}", (len(edges), 1, ny, nx),
                        _TreePartials(series.name, method, local),
                        ((n_groups,) * len(edges), (n_parts,), *spatial), series.dtype, dependencies=[series])
    below, depth = len(edges), 0
    while below > 1:
        count = -(-below // TREE_SPLIT_EVERY)
        level = lazy_task_array(f"{prefix}-combine{depth}-{token}", (count, 1, ny, nx),
                            _TreeCombine(level.name, below, TREE_SPLIT_EVERY, method),
                            ((n_groups,) * count, (n_parts,), *spatial), series.dtype, dependencies=[level])
        below, depth = count, depth + 1
    return lazy_task_array(f"{prefix}-{token}", (1, 1, 1, ny, nx), _TreeFinish(level.name, method, n_groups),
                       ((n_groups,), (1,), (1,), *spatial), series.dtype, dependencies=[level])
