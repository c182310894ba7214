"""What each statistic of a ``reduce`` costs, for ``plan`` (issue 29 item 5).

No second model: the numbers are the terms the budget's reduce stage already adds up
(:func:`rasterflow.paths.fused.fused_stages`), split by statistic, for the job's largest task:

- ``work_bytes``: the statistic's working copies, ``REDUCTION_EXTRA_PLANES[method]`` one-band series of the task's
  (sub-)block (of a period's subset). The statistics of a list run one after the other on the same series, so the
  budget's stage counts the largest of them, not their sum, plus the block of one band's statistics they fill
  (:func:`rasterflow.paths.fused.reduce_work`, :attr:`StatisticsCost.work_bytes`). A composite's is the stage's
  whole work term: its kernel's work arrays and its result.
- ``result_bytes``: the result slots the budget counts for the statistic (groups × its variables × bands, one band
  for a composite, × itemsize × the chunk's pixels); they add up to the reduce stage's result term
  (:attr:`StatisticsCost.result_bytes`).
- ``output_bytes``: what the statistic's variables write per task (float32 for a geomedian:
  :func:`rasterflow.geomedian.geomedian_output_bytes`, else the working dtype).
- ``kernel_work_bytes`` (geomedian, best only): the kernel's own measured formula for one slab
  (:func:`rasterflow.geomedian.geomedian_work_bytes`) or the block (:func:`rasterflow.bestpixel.best_work_bytes`),
  the part of ``work_bytes`` that is the kernel's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from rasterflow.units import dtype_itemsize, format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.budget.model import BudgetInputs, PipelineShape, TaskShape
    from rasterflow.budget.paths import ItemTerms
    from rasterflow.spec.models import Spec

__all__ = ["StatisticCost", "StatisticsCost", "statistics_cost"]


@dataclass(frozen=True)
class StatisticCost:
    """One statistic (an output variable group) of one task."""

    name: str
    method: str
    variables: tuple[str, ...]
    work_bytes: int
    result_bytes: int
    output_bytes: int
    kernel_work_bytes: int | None = None


@dataclass(frozen=True)
class StatisticsCost:
    """Every statistic of the job's largest task, and the budget's reduce-stage terms they make up."""

    statistics: tuple[StatisticCost, ...]
    task_pixels: int
    dates: int
    work_bytes: int
    """The budget's work term (a list: the largest statistic's copies, they run one after the other, and one band's
    statistics; a composite: its kernel's work and result)."""
    result_bytes: int
    """The budget's result term (every statistic's slots)."""
    stage: str
    """The budget stage these terms belong to (``reduce <method>``)."""
    period_subset_bytes: int = 0
    """With ``period``: the period's subset of one band's series, copied before its statistics (shared by all)."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["statistics"] = [dict(asdict(s), variables=list(s.variables)) for s in self.statistics]
        return out

    def lines(self) -> list[str]:
        """The block ``plan`` prints (one line per statistic, then the budget's terms they make up)."""
        out = []
        for index, s in enumerate(self.statistics):
            label = "statistics" if index == 0 else ""
            kernel = (f"; kernel formula {format_bytes(s.kernel_work_bytes)}"
                      if s.kernel_work_bytes is not None else "")
            names = ", ".join(s.variables)
            if len(names) > 60:
                names = names[:57] + "..."
            out.append(f"  {label:<16} {s.name:<10} work {format_bytes(s.work_bytes):>9}, writes "
                       f"{format_bytes(s.output_bytes):>9} per task{kernel} ({names})")
        after = " (they run one after the other)" if len(self.statistics) > 1 else ""
        subset = (f" + a period's subset {format_bytes(self.period_subset_bytes)}"
                  if self.period_subset_bytes else "")
        out.append(f"  {'':<16} {'':<10} budget's {self.stage}: work {format_bytes(self.work_bytes)}{after}{subset} + "
                   f"results {format_bytes(self.result_bytes)}")
        return out


def _largest_task(shape: PipelineShape, inputs: BudgetInputs) -> tuple[TaskShape, ItemTerms]:
    """The budget's largest task and the terms of its (sub-)block, as :func:`fused_stages` sees them."""
    from rasterflow.budget.paths import code_path, item_stages, sub_block, task_shapes

    task = task_shapes(shape, inputs)[0]
    path = code_path(shape, inputs)
    block = sub_block(shape, inputs) if path == "fused" else (0, 0)
    return task, item_stages(shape, inputs, task, block, fused=path == "fused")


def statistics_cost(spec: Spec, shape: PipelineShape, inputs: BudgetInputs) -> StatisticsCost | None:
    """Per statistic of a list ``reduce``, or of a geomedian or best-pixel composite, its terms in the budget's
    reduce stage for the largest task; None for anything else (a single statistic: the stage table says it all)."""
    from rasterflow.budget.constants import REDUCTION_EXTRA_PLANES
    from rasterflow.budget.paths import result_periods, code_path, reduce_work

    reduce = spec.reduce if not isinstance(spec.reduce, list) else None
    composite = reduce is not None and reduce.method in ("geomedian", "best")
    if not (spec.statistics or composite) or code_path(shape, inputs) != "fused":
        return None
    task, terms = _largest_task(shape, inputs)
    part = terms.part
    w = dtype_itemsize(inputs.dtype)
    groups = result_periods(shape, inputs)
    n_bands = len(shape.bands)
    group = min(inputs.group_dates or part.dates, part.dates) * terms.one  # one band's series (of a period)
    band_names = [name for name, _ in shape.bands]
    stage_work, _ = reduce_work(shape, inputs, part, group)

    stats: list[StatisticCost] = []
    if reduce is not None and reduce.method == "geomedian":
        from rasterflow.geomedian import DEFAULT_WORK_PIXELS, geomedian_output_bytes, geomedian_work_bytes, slab_rows

        gm_bands = list(shape.composite_inputs)  # validation requires at least two
        variables = shape.composite_outputs
        slab = slab_rows(part.rows, part.cols, DEFAULT_WORK_PIXELS) * part.cols
        stats.append(StatisticCost(
            name="geomedian", method="geomedian", variables=variables, work_bytes=stage_work,
            result_bytes=groups * len(variables) * w * task.pixels,
            output_bytes=groups * geomedian_output_bytes(len(gm_bands), task.pixels, reduce.mads),
            kernel_work_bytes=geomedian_work_bytes(part.dates, len(gm_bands), min(slab, part.pixels))))
    elif reduce is not None and reduce.method == "best":
        from rasterflow.bestpixel import best_work_bytes

        variables = tuple(spec.bands)
        stats.append(StatisticCost(
            name="best", method="best", variables=variables, work_bytes=stage_work,
            result_bytes=groups * len(variables) * w * task.pixels,
            output_bytes=groups * len(variables) * w * task.pixels,
            kernel_work_bytes=best_work_bytes(part.pixels, w, w)))
    else:
        for name, method, _q in spec.statistics:
            stats.append(StatisticCost(
                name=name, method=method, variables=tuple(f"{band}_{name}" for band in band_names),
                work_bytes=int(REDUCTION_EXTRA_PLANES[method] * group), result_bytes=groups * n_bands * w * task.pixels,
                output_bytes=groups * n_bands * w * task.pixels))
    method = shape.reduce_method or ""
    return StatisticsCost(statistics=tuple(stats), task_pixels=task.pixels, dates=part.dates,
                          work_bytes=stage_work, result_bytes=groups * max(1, shape.n_quantiles)
                          * shape.result_bands * w * task.pixels, stage=f"reduce {method}",
                          period_subset_bytes=group if shape.has_period and not shape.composite else 0)
