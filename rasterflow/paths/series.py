"""The series code path (no reduction): one task per (time chunk, spatial chunk) evaluates the bands into a
``(date, band, y, x)`` block (``tasks.chunk_bands``), held until every date of it is written.

Its cost (:func:`series_stages`; what a worker holds between tasks: :func:`series_held`) beside its tasks
(:func:`build`). The module imports no NumPy, Dask or xarray: :func:`build` imports them when it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rasterflow.budget.model import BudgetInputs, PipelineShape, TaskShape
from rasterflow.budget.taskshapes import concurrent_tasks, shards_per_side
from rasterflow.paths.common import (
    ItemTerms,
    PathTasks,
    bands_out,
    held_blocks,
    item_stages,
    projected_task_bytes,
    time_chunks,
    write_extra_bytes,
)

if TYPE_CHECKING:
    import dask.array as da

    from rasterflow.graph import Leads, Variable
    from rasterflow.planning import JobPlan


def series_stages(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape,
                  terms: ItemTerms) -> list[tuple[str, int, str]]:
    """The series (no reduction): the band task (the shared stages and the band block), then the block held while
    its dates are written (:func:`write_extra_bytes` when a COG's tiles cost more than two one-date planes)."""
    stages = list(terms.stages) + [bands_out(shape, terms)]
    one, n_bands = terms.one, len(shape.bands)
    block_out = n_bands * terms.series
    extra_write, words = write_extra_bytes(shape, inputs, task.pixels)
    if shape.output_format == "cog" and extra_write > 2 * one:
        stages.append(("write dates", int(block_out + extra_write), f"the {n_bands}-band block + {words}"))
    else:
        stages.append(("write dates", int(block_out + 2 * one),
                       f"the {n_bands}-band block while its dates are encoded and written"))
    return stages


def series_held(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Finished band blocks waiting to be written: none with time whole and one band, where a chunk's one band task
    is followed by its one write on the same thread before the thread's next band task (the write stage counts the
    block), nor to Zarr without shards, where each band task and its dates' writes are one task (but a block per
    running task where two or more run at once or a task has several bands: measured)."""
    running = concurrent_tasks(shape, inputs)
    if inputs.n_time_chunks <= 1 and len(shape.bands) == 1:
        # measured 2026-12-06 (budget_accuracy.py, time whole, one band): 279-282 MB where a held block predicted
        # 346 MB (row 18, 1.23), a 1400² grid of four uneven chunks on two threads 269 MB against 349 MB (row 25,
        # 1.30), solar_day 249 MB (row 33). With two bands (two writes of the block) the next chunk's band task ran
        # between them (row 20, before each band task and its writes were one task)
        return 0
    if shape.output_format == "zarr" and shards_per_side(shape, inputs) <= 1:
        # each band task and its dates' writes are one task (``write_zarr``'s ``lead_groups``): no block waits for a
        # write (a 3072² task of 3 dates on one thread: 396 MB measured, 402 MB projected without a held block, 515 MB
        # with one, test_budget_measured.py). What the stages leave out elsewhere is counted as a block per running
        # task (measured 2026-12-07, RSS sampled every 2 ms): two threads' band tasks on the worker's one arena
        # (``allocator``) hold more than each alone (two 1024² x 4-date band tasks at once peaked at 101 MB over the
        # process's, one alone 44 MB; their worker 186-213 MB against 163 MB without the blocks, budget_accuracy.py
        # row 19), and a task of several bands holds its whole (date, band) block beside their series (two float64
        # bands of 512² x 16 dates: 139 MB alone against 102 MB in the stages; their worker 252-263 MB against 198 MB
        # without the block, row 20)
        return held_blocks(shape, inputs, running, running) if running > 1 or len(shape.bands) > 1 else 0
    # the writer's unit is a spatial chunk (every date of it): the blocks of all its time chunks wait for their
    # writes, queued behind its band tasks (2 threads, 4 time chunks of 1024²: 271 MB measured where one held block
    # per thread predicted 242 MB, 0.89, budget_accuracy.py row 19, 2026-12-06); at most two per thread (what was
    # measured: deeper units, more time chunks than that, were not)
    return held_blocks(shape, inputs, running, max(running, min(inputs.n_time_chunks, 2 * running)))


#: What a worker holds between this path's tasks (the registry's name: :data:`rasterflow.paths.PATHS`).
held = series_held


def task_stages(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, block: tuple[int, int], *,
                writes: bool = True) -> list[tuple[str, int, str]]:
    """``(stage, bytes, detail)`` of one series task of ``task``'s shape: the shared stages
    (:func:`~rasterflow.paths.common.item_stages`), then :func:`series_stages`. ``block`` and ``writes`` are the
    fused path's (sub-blocks, its write stage): the series' stages are the same whatever they are."""
    terms = item_stages(shape, inputs, task, block, fused=False)
    return series_stages(shape, inputs, task, terms)


def build(plan: JobPlan) -> PathTasks:
    """The series' lazy variables: one band-block task per (time chunk, spatial chunk) (``tasks.chunk_bands``),
    each band one date per chunk, with the dates as the ``time`` coordinate; and their projected memory per task.

    Parameters
    ----------
    plan : JobPlan
        A plan made with the searched items, whose budget chose this path.

    Returns
    -------
    PathTasks
    """
    import numpy as np

    from rasterflow.graph import task_array
    from rasterflow.tasks import chunk_bands

    program = plan.program
    assert program is not None, "a plan without items has no tasks"
    n_bands = len(program.bands)
    item_chunks, date_chunks = time_chunks(plan)
    bands = task_array(plan, "rasterflow-bands", chunk_bands, item_chunks, (date_chunks, (n_bands,)),
                        program.dtype)
    variables: dict[str, Variable] = {name: (("time", "y", "x"), _series_band(bands, index, name))
                                      for index, name in enumerate(program.band_names)}
    time = np.array([np.datetime64(t, "ns") for t in plan.times])
    return PathTasks(variables, {"time": time}, projected_task_bytes(plan, task_stages))


def _series_band(bands: da.Array, band: int, name: str) -> da.Array:
    """Band ``band`` of the ``(date, band, y, x)`` series, one date per chunk (what ``bands[:, band].rechunk({0: 1})``
    gives), as its own lazy layer."""
    from rasterflow.graph import block_bounds, select_blocks

    leads: Leads = {}
    for k, (t0, t1) in enumerate(block_bounds(bands.chunks[0])):
        for t in range(t0, t1):
            leads[(t,)] = ((k, 0), (slice(t - t0, t - t0 + 1), band))
    return select_blocks(bands, name, leads, ((1,) * bands.shape[0],))
