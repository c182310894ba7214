"""The fused code path: a reduction with time whole (or ``group_by: solar_day``), one task per spatial chunk that
reads, masks, evaluates and reduces its chunk (``tasks.chunk_reduce``), in sub-blocks for a deep series.

Its cost (:func:`fused_stages`, :func:`reduce_work`; what a worker holds between tasks: :func:`fused_held`) beside
its tasks (:func:`build`). The module imports no NumPy, Dask or xarray: :func:`build` imports them when it runs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rasterflow.budget.constants import COG_RESULT_WAITING, REDUCTION_EXTRA_PLANES
from rasterflow.budget.model import BudgetInputs, PipelineShape, TaskShape
from rasterflow.budget.taskshapes import result_periods, concurrent_tasks, shards_per_side, task_shapes, units_in_flight
from rasterflow.paths.common import (
    ItemTerms,
    PathTasks,
    item_stages,
    projected_task_bytes,
    time_chunks,
    write_extra_bytes,
)
from rasterflow.units import dtype_itemsize

if TYPE_CHECKING:
    import dask.array as da

    from rasterflow.graph import Leads, Variable
    from rasterflow.planning import JobPlan


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
        # the write task of one of the chunk's entries, its whole result alive (graph.reduced_band selects views)
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


def fused_held(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Finished chunk results waiting for their writes (every entry and band of a chunk's result). None for Zarr
    without shards: its writer runs a chunk's reduction and its writes as one task (``write.submit.run_units``'
    ``one_task_per_unit``), whose write stage counts the result."""
    if shape.output_format != "cog" and shards_per_side(shape, inputs) <= 1:
        return 0
    task = task_shapes(shape, inputs)[0]
    one = task.pixels * dtype_itemsize(inputs.dtype)
    n_groups = result_periods(shape, inputs)
    # a finished chunk's result waits for its write tasks while the thread that made it runs its next reduction:
    # the worker starts the next task it has before the scheduler has sent the writes. With a COG whose tiles
    # the workers make, a 3-band 1536² median on 2 threads held 4 results (managed 113 MB) while two tile tasks
    # ran, 414 MB measured where 283 MB was predicted without them (2026-12-06); so one waiting result per
    # running task, as far as the writer's cap leaves other chunks in flight (Zarr with 3 bands on 2 threads:
    # 2 chunks in flight, none waiting). A result with periods or quantiles stays whole while its entries are
    # written (graph.reduced_band selects views of it): at least one is held.
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


#: What a worker holds between this path's tasks (the registry's name: :data:`rasterflow.paths.PATHS`).
held = fused_held


def task_stages(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, block: tuple[int, int], *,
                writes: bool = True) -> list[tuple[str, int, str]]:
    """``(stage, bytes, detail)`` of one fused task of ``task``'s shape reducing its chunk in sub-blocks of
    ``block``: the shared stages (:func:`~rasterflow.paths.common.item_stages`), then :func:`fused_stages` (with
    its write stage when ``writes``)."""
    terms = item_stages(shape, inputs, task, block, fused=True)
    return fused_stages(shape, inputs, task, terms, writes=writes)


def build(plan: JobPlan) -> PathTasks:
    """The fused path's lazy variables: one task per spatial chunk (``tasks.chunk_reduce``, in the plan's
    sub-blocks), each output variable cut out of its result; and their projected memory per task.

    Parameters
    ----------
    plan : JobPlan
        A plan made with the searched items, whose budget chose this path.

    Returns
    -------
    PathTasks
    """
    from rasterflow.graph import reduced_band, task_array
    from rasterflow.tasks import chunk_reduce

    program = plan.program
    assert program is not None, "a plan without items has no tasks"
    n_items = len(plan.items)
    item_chunks, _ = time_chunks(plan)
    keep_period, keep_quantile = bool(plan.period_labels), plan.quantile_dim
    variables: dict[str, Variable]
    fused = task_array(plan, f"rasterflow-{program.reduce_method}", chunk_reduce,
                        (n_items,) if program.steps else item_chunks,
                        ((program.n_groups,), (program.n_quantiles,), (program.n_result_bands,)), program.dtype,
                        (plan.sub_block, plan.sub_blocks_across))
    if program.composite is not None:  # a geomedian or best-pixel composite: a variable per result slot
        variables = {name: _statistic_band(fused, 0, slot, name, keep_period)
                     for slot, name in enumerate(program.composite.outputs)}
    elif program.statistics:  # several statistics: one variable per band and statistic, {band}_{statistic}
        variables = {f"{name}_{statistic}": _statistic_band(fused, index, slot, f"{name}_{statistic}",
                                                            keep_period)
                     for index, name in enumerate(program.band_names)
                     for slot, (statistic, _, _) in enumerate(program.statistics)}
    else:
        variables = {name: reduced_band(fused, index, name, keep_period, keep_quantile)
                     for index, name in enumerate(program.band_names)}
    return PathTasks(variables, {}, projected_task_bytes(plan, task_stages))


def _statistic_band(fused: da.Array, band: int, slot: int, name: str, keep_period: bool) -> Variable:
    """Statistic ``slot`` of band ``band`` of the fused ``(group, slot, band, y, x)`` array: dims ``([period,] y,
    x)``, its own lazy layer (block ``(p, i, j)`` is the fused block ``(i, j)`` at ``[p:p+1, slot, band]``)."""
    from rasterflow.graph import select_blocks

    groups = fused.shape[0]
    leads: Leads = {}
    for p in range(groups) if keep_period else (None,):
        lead = () if p is None else (p,)
        leads[lead] = ((0, 0, 0), (0 if p is None else slice(p, p + 1), slot, band))
    lead_chunks = ((1,) * groups,) if keep_period else ()
    return (*(("period",) if keep_period else ()), "y", "x"), select_blocks(fused, name, leads, lead_chunks)
