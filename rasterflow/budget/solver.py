"""The fix solver: changes to the spec that make a refused job pass, each verified by estimating again, and the YAML
a user pastes."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

from rasterflow.budget.constants import CACHE_CANDIDATES, ORDER_STATISTICS
from rasterflow.budget.model import BudgetInputs, BudgetReport, Fix, PipelineShape
from rasterflow.budget.paths import code_path
from rasterflow.budget.verdict import estimate
from rasterflow.budget.workers import gdal_cache_bytes
from rasterflow.units import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.spec.models import Spec


def solve_fixes(shape: PipelineShape, inputs: BudgetInputs) -> tuple[Fix, ...]:
    """Solve for changes that make a refused job pass, and verify each one by estimating again.

    Candidates: time whole (for order statistics), the largest square spatial chunk that fits (a multiple of the
    source COG tiles when known, else of 256), a smaller GDAL cache, fewer threads per worker (with the checked
    worker count and limit pinned), float32, and a lower ``max_items``. Patches name only what changes; print them
    with :func:`fix_text`, which merges the spec's own values in.
    """
    fixes: list[Fix] = []
    base = inputs
    base_patch: dict[str, Any] = {}
    if shape.reduce_method in ORDER_STATISTICS and code_path(shape, inputs) == "tree":
        base = dataclasses.replace(inputs, chunk_time=-1)
        base_patch = {"chunks": {"time": -1}}

    def passes(candidate: BudgetInputs) -> BudgetReport | None:
        report = estimate(shape, candidate)
        return report if report.ok else None

    def add(description: str, candidate: BudgetInputs, patch: dict[str, Any]) -> bool:
        report = passes(candidate)
        if report is not None:
            fixes.append(Fix(description, patch, report.peak_per_worker, report.fraction_of_limit))
        return report is not None

    if base is not inputs:
        add("keep time whole: chunks.time: -1", base, base_patch)
    side = largest_square_chunk(shape, base)
    if side is not None:
        cy, cx = base.chunk_yx
        if side < max(cy, cx):
            candidate = dataclasses.replace(base, chunk_y=side, chunk_x=side)
            patch = merge_nested(base_patch, {"chunks": {"y": side, "x": side}})
            aligned = f", a multiple of the {base.source_tile[0]}-px source tiles" if base.source_tile else ""
            add(f"chunks.y = chunks.x = {side} (the largest square chunk that fits{aligned})", candidate, patch)
    cache = gdal_cache_bytes(shape, base)
    for value in CACHE_CANDIDATES:
        if value < cache:
            candidate = dataclasses.replace(base, gdal_cachemax=value)
            if add(f"cluster.gdal_cachemax: {value // 10**6}MB (every block is read once: a cache cannot help)",
                   candidate, merge_nested(base_patch, {"cluster": {"gdal_cachemax": f"{value // 10**6}MB"}})):
                break
    for threads in range(base.threads_per_worker - 1, 0, -1):
        candidate = dataclasses.replace(base, threads_per_worker=threads)
        if passes(candidate):
            # the layout it was checked on: with n_workers or memory_limit "auto", fewer threads would start
            # more workers with less memory each
            add(f"cluster.threads_per_worker: {threads} (each thread holds a working set; {base.n_workers} "
                f"worker(s) × {format_bytes(base.memory_limit)} kept)", candidate,
                merge_nested(base_patch, {"cluster": {"threads_per_worker": threads, "n_workers": base.n_workers,
                                                "memory_limit": base.memory_limit}}))
            break
    if base.dtype == "float64":
        add("grid.dtype: float32 (halves every array)", dataclasses.replace(base, dtype="float32"),
            merge_nested(base_patch, {"grid": {"dtype": "float32"}}))
    if not fixes:
        # no single change fits: a smaller GDAL cache together with a smaller chunk or fewer threads
        cached = next((dataclasses.replace(base, gdal_cachemax=v) for v in CACHE_CANDIDATES if v < cache), None)
        if cached is not None:
            cache_patch = merge_nested(base_patch, {"cluster": {"gdal_cachemax": f"{cached.gdal_cachemax // 10**6}MB"}})
            side = largest_square_chunk(shape, cached)
            if side is not None and side < max(cached.chunk_yx):
                add(f"cluster.gdal_cachemax: {cached.gdal_cachemax // 10**6}MB and chunks.y = chunks.x = {side}",
                    dataclasses.replace(cached, chunk_y=side, chunk_x=side),
                    merge_nested(cache_patch, {"chunks": {"y": side, "x": side}}))
            for threads in range(cached.threads_per_worker - 1, 0, -1):
                if add(f"cluster.gdal_cachemax: {cached.gdal_cachemax // 10**6}MB and threads_per_worker: {threads} "
                       f"({base.n_workers} worker(s) × {format_bytes(base.memory_limit)} kept)",
                       dataclasses.replace(cached, threads_per_worker=threads),
                       merge_nested(cache_patch, {"cluster": {"threads_per_worker": threads, "n_workers": base.n_workers,
                                                        "memory_limit": base.memory_limit}})):
                    break
    if not fixes and base.n_time > 1:
        items = largest_passing(lambda n: passes(with_items(base, n)) is not None, base.n_time - 1)
        if items:
            add(f"source.stac.max_items: {items} (a shorter time axis: the result then covers {items} items, not "
                f"{base.n_time})", with_items(base, items),
                merge_nested(base_patch, {"source": {"stac": {"max_items": items}}}))
    return tuple(fixes)


def with_items(inputs: BudgetInputs, n: int) -> BudgetInputs:
    dates = None if inputs.n_dates is None else max(1, min(inputs.n_dates, n))
    group = None if inputs.group_dates is None else max(1, min(inputs.group_dates, n))
    return dataclasses.replace(inputs, n_time=n, n_dates=dates, group_dates=group,
                               time_source="max_items" if inputs.time_source != "search" else "search")


def largest_passing(fits: Any, upper: int) -> int | None:
    """The largest n in 1..upper with fits(n) (fits is monotone: fewer items never need more memory)."""
    if upper < 1 or not fits(1):
        return None
    low, high = 1, upper
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def largest_square_chunk(shape: PipelineShape, inputs: BudgetInputs) -> int | None:
    """The largest square spatial chunk whose estimate passes: a multiple of the source tiles when known (reads then
    decode no neighbour's tiles), else of 256 (64 below 256)."""
    height, width = inputs.grid_shape
    tile = max(inputs.source_tile) if inputs.source_tile else None
    cy, cx = inputs.chunk_yx
    if tile:
        steps = [tile]
    else:
        steps = [256, 64]
    for step in steps:
        side = (max(cy, cx) // step) * step
        if side >= max(cy, cx):
            side -= step
        while side >= step:
            candidate = dataclasses.replace(inputs, chunk_y=side, chunk_x=side)
            if estimate(shape, candidate).ok:
                return side
            side -= step
    return None


def merge_nested(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = {k: merge_nested(v, {}) if isinstance(v, dict) else v for k, v in a.items()}
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_nested(out[key], value)
        else:
            out[key] = merge_nested(value, {}) if isinstance(value, dict) else value
    return out


def complete_patch(spec: Spec, patch: dict[str, Any]) -> dict[str, Any]:
    """The sections a fix touches, complete: the spec's own values (as written, defaults left to the defaults) with
    the fix merged in, so that pasting a section over the old one changes nothing else."""
    data = spec.model_dump(mode="json", exclude_unset=True, by_alias=True)
    return {section: merge_nested(data.get(section) or {}, values) for section, values in patch.items()}


def fix_text(spec: Spec, fix: Fix) -> str:
    """A fix as YAML ready to paste: complete sections (see :func:`complete_patch`)."""
    import yaml

    return yaml.safe_dump(complete_patch(spec, fix.patch), sort_keys=False, default_flow_style=None).rstrip()


def with_fixes(report: BudgetReport, shape: PipelineShape) -> BudgetReport:
    """The report with its fixes solved (only when it refuses)."""
    if report.ok:
        return report
    return dataclasses_replace(report, fixes=solve_fixes(shape, report.inputs))


T = TypeVar("T")


def dataclasses_replace(obj: T, **changes: Any) -> T:
    """``dataclasses.replace``, kept under this name for the planner."""
    return dataclasses.replace(obj, **changes)  # type: ignore[type-var]  # T is a dataclass at every call
