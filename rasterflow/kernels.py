"""The per-chunk kernels: NumPy only, so they can be tested without Dask and run inside one task.

One task takes its items one at a time (an :class:`ItemStream` of raw source values per asset, or loaded
:class:`Planes`) and runs the mask (on the raw values), nodata, scale/offset, the band expressions and the reduction
over time on them, so intermediates never leave the task and never cross workers. The order of work and what
stays alive here is what ``budget.py`` counts; change one, change the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from rasterflow import lookup
from rasterflow.expr import Expression

__all__ = [
    "Program", "Planes", "ItemStream", "TaskItems", "task_items", "absent_bands", "absent_is_nan", "working_plane", "band_block", "reduce_block", "reduce_statistics", "reduce_time", "nanquantile_time", "solar_day_steps",
    "std_partials", "combine_std_partials", "finish_std",
]


@dataclass(frozen=True)
class Composite:
    """A reduction over several bands at once: a geomedian (GA's ``geomad``) or a best-pixel composite."""

    method: str
    """``geomedian`` or ``best``."""
    inputs: tuple[str, ...]
    """geomedian: the bands of the geometric median; best: the bands taken from the chosen date."""
    outputs: tuple[str, ...]
    """The variables written, in the order of the task's result slots."""
    mads: bool = True
    maxiters: int = 1000
    eps: float = 1e-4
    by: str = ""
    order: str = "max"


@dataclass(frozen=True)
class Program:
    """What a task computes, small and picklable (it travels to the workers with every task)."""

    assets: tuple[str, ...]
    """Names of the loaded assets, in the order of the task's planes."""
    mask: Expression | None
    masked_assets: tuple[str, ...]
    """Assets the bands read: NaN where the mask drops a pixel."""
    bands: tuple[tuple[str, Expression], ...]
    dtype: str
    reduce_method: str | None = None
    quantiles: tuple[float, ...] = ()
    groups: tuple[tuple[int, ...], ...] = ()
    """Output-date indices of each period; empty = one group of every date."""
    steps: tuple[tuple[int, ...], ...] = ()
    """Item indices that make up each output date (``source.group_by: solar_day``: the tiles of one pass, mosaicked
    per pixel after masking); empty = every item is its own date."""
    mask_cleanup: tuple[tuple[str, int], ...] = ()
    """Morphology applied in order to each date's mask (``(operation, disk radius)``); tasks read a halo of
    :attr:`halo` pixels around their window for it (:func:`rasterflow.tasks.cleaned_stream`)."""
    halo: int = 0
    """Pixels read around every window for ``mask_cleanup``: the plan's (``Spec.cleanup_halo``, the rule the budget
    counts too)."""
    aoi: str = ""
    """The area of interest in the grid's CRS (GeoJSON text; ``source.stac.intersects``): results are nodata outside
    it; empty = no clipping."""
    composite: Composite | None = None
    """A geomedian or best-pixel composite: one result slot per output variable, a band axis of one."""
    statistics: tuple[tuple[str, str, float | None], ...] = ()
    """Several statistics from one read (a list ``reduce``): per output slot ``(name, method, q)``, the variables
    named ``{band}_{name}``; empty = the one ``reduce_method`` (with ``quantiles``, one slot per quantile)."""

    @property
    def band_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.bands)

    @property
    def output_names(self) -> tuple[str, ...]:
        """The output's variables: the bands, ``{band}_{statistic}`` for each band and statistic of a list, or a
        composite's outputs."""
        if self.composite is not None:
            return self.composite.outputs
        if self.statistics:
            return tuple(f"{band}_{name}" for band in self.band_names for name, _, _ in self.statistics)
        return self.band_names

    @property
    def band_assets(self) -> tuple[str, ...]:
        """The assets the band expressions read (directly)."""
        read = set().union(*(expression.names for _, expression in self.bands))
        return tuple(a for a in self.assets if a in read)

    @property
    def n_groups(self) -> int:
        return max(1, len(self.groups))

    @property
    def n_quantiles(self) -> int:
        """Result slots per band and group: a composite's outputs, the statistics of a list, else the quantiles
        (at least 1)."""
        if self.composite is not None:
            return len(self.composite.outputs)
        return len(self.statistics) or max(1, len(self.quantiles))

    @property
    def n_result_bands(self) -> int:
        """The band axis of a fused task's result: 1 for a composite, else every band."""
        return 1 if self.composite is not None else len(self.bands)


@dataclass(frozen=True)
class Planes:
    """One task's loaded pixels: per asset a ``(t, y, x)`` array of the *raw* source values, and how to read them.

    Raw means as stored in the files (integers for most sources): the mask runs on these, so bit tests on QA bands
    work and a nodata class (SCL 0) is a value like any other. Band math sees :func:`working_plane` values.
    """

    raw: tuple[np.ndarray, ...]
    """Per asset ``(t, y, x)`` in the asset's load dtype; pixels no file covers hold the asset's fill value."""
    covered: tuple[np.ndarray | None, ...]
    """Per asset a ``(t, y, x)`` boolean array of the pixels some file covered, where the fill value could be real
    data (an integer asset without one nodata value); None where the fill value is itself "no data"."""
    nodata: np.ndarray
    """``(t, asset)`` raw nodata value per item (NaN = none declared)."""
    scale: np.ndarray
    """``(t, asset)`` scale per item."""
    offset: np.ndarray
    """``(t, asset)`` offset per item."""
    drop: np.ndarray | None = None
    """``(t, y, x)`` boolean: the mask already evaluated and cleaned (``mask_cleanup``, over a halo the planes no
    longer hold); None = evaluate ``program.mask`` on the raw values."""

    @property
    def n_items(self) -> int:
        return int(self.nodata.shape[0])

    @property
    def spatial_shape(self) -> tuple[int, int]:
        height, width = self.raw[0].shape[1:]
        return int(height), int(width)

    def item(self, t: int) -> Planes:
        """Item ``t`` alone, as one-item planes (views, no copy)."""
        return Planes(raw=tuple(r[t:t + 1] for r in self.raw),
                      covered=tuple(None if c is None else c[t:t + 1] for c in self.covered),
                      nodata=self.nodata[t:t + 1], scale=self.scale[t:t + 1], offset=self.offset[t:t + 1],
                      drop=None if self.drop is None else self.drop[t:t + 1])

    def stream(self) -> ItemStream:
        """These planes as an :class:`ItemStream` (what the kernels consume)."""
        return ItemStream(n_items=self.n_items, spatial_shape=self.spatial_shape, read=self.item)


@dataclass(frozen=True)
class ItemStream:
    """A task's items read one at a time: ``read(t)`` gives local item ``t`` as one-item :class:`Planes`.

    The kernels take each item when its date is evaluated and drop it after, so the only date-deep arrays of a task
    are its band series (the raw block of every item is never alive at once); :func:`rasterflow.read.item_stream`
    reads each item's window when asked, into the arrays of the item before: a consumer takes what it needs of item
    ``t`` before it reads the next."""

    n_items: int
    spatial_shape: tuple[int, int]
    read: Callable[[int], Planes]


def _as_stream(source: Planes | ItemStream) -> ItemStream:
    return source.stream() if isinstance(source, Planes) else source


def working_plane(planes: Planes, t: int, a: int, dtype: np.dtype, drop: np.ndarray | None = None) -> np.ndarray:
    """Item ``t``'s asset ``a`` as a new ``(y, x)`` array in the working dtype: scale and offset (multiply then add,
    in the working dtype, as the float reference does), then NaN where the value is nodata, no file covers the
    pixel, or ``drop`` (the mask, boolean) is true."""
    return _working(planes, t, a, dtype, None if drop is None else lookup.nan_addend(drop, dtype))


def _working(planes: Planes, t: int, a: int, dtype: np.dtype,
             drop_addend: np.ndarray | tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """:func:`working_plane` with the mask as an addend (``-0.0`` keep, NaN drop; shared by the assets): a plane,
    or a per-value table and the raw plane it is gathered from (:func:`_drop_addend`).

    A small-integer asset is one gather from its :func:`rasterflow.lookup.working_table` (scale, offset and nodata
    of every raw value), with a table mask's addend gathered in the same pass; anything else the same arithmetic on
    the plane."""
    raw = planes.raw[a][t]
    scale, offset, nodata = planes.scale[t, a], planes.offset[t, a], planes.nodata[t, a]
    table = lookup.working_table(raw.dtype, dtype, scale, offset, nodata)
    if table is not None:
        fused = drop_addend if isinstance(drop_addend, tuple) else None
        values = lookup.gather(table, raw, addend=fused)
        if fused is not None:
            drop_addend = None
    else:
        values = lookup.scaled(raw, dtype, scale, offset, nodata)
    covered = planes.covered[a]
    if covered is not None:
        values += lookup.nan_addend(~covered[t], dtype)
    if isinstance(drop_addend, tuple):
        values += lookup.gather(*drop_addend)
    elif drop_addend is not None:
        values += drop_addend
    return values


def _drop_addend(planes: Planes, t: int, program: Program,
                 dtype: np.dtype) -> np.ndarray | tuple[np.ndarray, np.ndarray] | None:
    """Item ``t``'s mask (evaluated on the raw values) as an addend, NaN = drop, ``-0.0`` = keep; None without a
    mask. A mask of one small-integer asset (``scl in (3, 8, 9, 10)``) is its per-value table and that asset's raw
    plane, for each masked asset to gather with its own values (:func:`_working`); any other mask a plane."""
    mask = program.mask
    if mask is None:
        return None
    if planes.drop is not None:
        return lookup.nan_addend(planes.drop[t], dtype)
    if len(mask.names) == 1:
        (name,) = mask.names
        raw = planes.raw[program.assets.index(name)][t]
        table = lookup.mask_addend_table(mask, raw.dtype, dtype)
        if table is not None:
            return table, raw
    raw_env = {name: planes.raw[a][t] for a, name in enumerate(program.assets)}
    return lookup.nan_addend(np.asarray(np.asarray(mask.evaluate(raw_env)) != 0), dtype)  # true or nonzero = drop


def drop_plane(planes: Planes, t: int, program: Program) -> np.ndarray:
    """Item ``t``'s mask evaluated on the raw values, as a boolean ``(y, x)`` plane (true = drop)."""
    assert program.mask is not None
    raw_env = {name: planes.raw[a][t] for a, name in enumerate(program.assets)}
    return np.asarray(np.asarray(program.mask.evaluate(raw_env)) != 0)


def disk(radius: int) -> np.ndarray:
    """A disk-shaped structuring element of ``radius`` pixels: ``x² + y² <= r²`` (scikit-image's ``disk``)."""
    offsets = np.arange(-radius, radius + 1)
    return (offsets[:, None] ** 2 + offsets[None, :] ** 2) <= radius * radius


def clean_mask(mask: np.ndarray, steps: Sequence[tuple[str, int]]) -> np.ndarray:
    """``mask_cleanup``: each ``(operation, radius)`` in order with scipy.ndimage's binary morphology and a
    :func:`disk` (odc-algo's ``mask_cleanup`` with ``binary_opening``/``binary_dilation``...). Outside the array
    counts as not masked (scipy's default border)."""
    from scipy import ndimage

    operations = {"opening": ndimage.binary_opening, "closing": ndimage.binary_closing,
                  "dilation": ndimage.binary_dilation, "erosion": ndimage.binary_erosion}
    out = mask
    for operation, radius in steps:
        out = operations[operation](out, structure=disk(radius))
    return np.asarray(out, dtype=bool)


def working_assets(program: Program) -> tuple[str, ...]:
    """The assets a task turns into working-dtype planes: those the bands read (an asset only the mask reads, like
    SCL, is used raw and never converted)."""
    return program.band_assets or program.assets


def _masked_assets(planes: Planes, t: int, program: Program, dtype: np.dtype) -> dict[str, np.ndarray]:
    """Item ``t``'s assets the bands read, as working-dtype planes; the mask, evaluated on the raw values, sets NaN
    in the assets the bands read."""
    drop = _drop_addend(planes, t, program, dtype)
    masked = set(program.masked_assets)
    env: dict[str, np.ndarray] = {}
    for a, name in enumerate(program.assets):
        if name in working_assets(program):
            env[name] = _working(planes, t, a, dtype, drop if name in masked else None)
    return env


def _valid(env: dict[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    valid: np.ndarray = ~np.isnan(env[names[0]])
    for name in names[1:]:
        valid &= ~np.isnan(env[name])
    return valid


@dataclass(frozen=True)
class TaskItems:
    """Which of the program's items and dates one task holds: those with a file meeting its chunk
    (``plan.ChunkIndex``). An item none of whose files meets the chunk (absent) would hold only NaN there: its
    date is left out of the series, or its band values are those of an all-NaN item (:func:`absent_bands`)."""

    n_dates: int
    """Dates of the task (its time slice, or every date with solar-day steps)."""
    dates: tuple[int, ...]
    """Per local date, its index among the task's dates (ascending)."""
    steps: tuple[tuple[int, ...], ...]
    """Per local date, the local items (indices into the task's planes) mosaicked in it."""
    starts_absent: tuple[bool, ...]
    """Per local date: the first item of its pass is absent, so the mosaic starts from an all-NaN item (as it did
    when the absent item was loaded as nodata)."""


def task_items(program: Program, items: Sequence[int], first: int, count: int,
               step_of: Any = None) -> TaskItems:
    """The :class:`TaskItems` of a task reading ``items`` (ascending indices of the plan's items, in
    ``first .. first + count``). With solar-day steps the task holds every date; ``step_of`` (an int array) gives
    each item's date."""
    if not program.steps:
        return TaskItems(n_dates=count, dates=tuple(int(t) - first for t in items),
                         steps=tuple((p,) for p in range(len(items))), starts_absent=(False,) * len(items))
    assert step_of is not None, "solar-day steps need the date of each item"
    local = np.asarray(items, dtype=np.int64)
    of = np.asarray(step_of)[local]
    order = np.argsort(of, kind="stable")  # by date, the items of one date in time order
    ordered = of[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1]))) if len(ordered) else order
    dates = ordered[starts].tolist()
    firsts = local[order[starts]].tolist()
    bounds = starts.tolist() + [len(order)]
    positions = order.tolist()
    return TaskItems(n_dates=len(program.steps), dates=tuple(dates),
                     steps=tuple(tuple(positions[a:b]) for a, b in zip(bounds[:-1], bounds[1:])),
                     starts_absent=tuple(program.steps[d][0] != first for d, first in zip(dates, firsts)))


def _all_items(program: Program, n_items: int) -> TaskItems:
    n_dates = len(program.steps) or n_items
    return TaskItems(n_dates=n_dates, dates=tuple(range(n_dates)),
                     steps=program.steps or tuple((t,) for t in range(n_items)), starts_absent=(False,) * n_dates)


def _absent_env(program: Program, shape: tuple[int, ...], dtype: np.dtype) -> dict[str, np.ndarray]:
    """What :func:`_masked_assets` gives for an item no file of which meets the chunk: every asset NaN (nodata or
    uncovered -> NaN, scale 1, offset 0; the mask can only set NaN)."""
    return {name: np.full(shape, np.nan, dtype=dtype) for name in working_assets(program)}


def absent_bands(program: Program, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """The band values of an absent item's date: the bands evaluated on all-NaN assets (NaN for most band math;
    ``where(isnan(red), 0, red)`` or a comparison give numbers)."""
    dtype = np.dtype(program.dtype)
    env = _absent_env(program, shape, dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for name, expression in program.bands:
            env[name] = np.asarray(expression.evaluate(env), dtype=dtype)
    return {name: env[name] for name in program.band_names}


def absent_is_nan(bands: tuple[tuple[str, Expression], ...], assets: tuple[str, ...], dtype: str) -> bool:
    """True when every band is NaN where no item is (then a date without an item in a chunk changes no reduction
    there and a task leaves it out); checked on a one-pixel plane."""
    program = Program(assets=assets, mask=None, masked_assets=(), bands=bands, dtype=dtype)
    return all(bool(np.isnan(plane).all()) for plane in absent_bands(program, (1, 1)).values())


def _band_series(source: Planes | ItemStream, program: Program, view: TaskItems | None = None) -> dict[str, np.ndarray]:
    """Mask and evaluate the bands of one task's items: every band's ``(date, y, x)`` values in the working dtype,
    one per local date of ``view`` (default: every item, each date of ``program.steps``).

    Everything is per pixel, so the work runs one date at a time and takes each item from ``source`` when its date
    is evaluated: the temporaries are ``(y, x)`` planes, and the only date-deep arrays are one output series per
    band (and, with :class:`Planes`, the caller's loaded block). With solar-day steps the tiles of a pass are
    mosaicked per pixel: a pixel takes *every* asset from the first tile in which the assets the bands read are all
    valid (not nodata, not masked), so red and nir of one pixel never come from different tiles.
    """
    stream = _as_stream(source)
    dtype = np.dtype(program.dtype)
    view = view or _all_items(program, stream.n_items)
    shape = stream.spatial_shape
    series = {name: np.empty((len(view.steps), *shape), dtype=dtype) for name in program.band_names}
    judged = working_assets(program)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for step, (indices, absent_first) in enumerate(zip(view.steps, view.starts_absent)):
            rest = indices
            if absent_first:
                env = _absent_env(program, shape, dtype)
            else:
                env, rest = _masked_assets(stream.read(indices[0]), 0, program, dtype), indices[1:]
            if rest:
                filled = _valid(env, judged)
                for t in rest:
                    more = _masked_assets(stream.read(t), 0, program, dtype)
                    take = _valid(more, judged)
                    take &= ~filled
                    for name, plane in env.items():
                        np.copyto(plane, more[name], where=take)
                    filled |= take
                    del more, take
                del filled
            for name, expression in program.bands:
                slot = series[name][step]
                result = expression.evaluate(env, out=slot)  # the last operation writes into the series if it can
                if result is not slot:
                    slot[...] = np.asarray(result, dtype=dtype)
                env[name] = slot
                del result
            del env
    return series


def band_block(planes: Planes | ItemStream, program: Program, view: TaskItems | None = None) -> np.ndarray:
    """Mask and band math of one task: -> ``(date, band, y, x)``, every date of the task; with ``view`` the dates
    without an item of the planes hold :func:`absent_bands`."""
    values = _band_series(planes, program, view)
    if view is None:
        n_dates = len(program.steps) or planes.n_items
        dates: Sequence[int] = range(n_dates)
    else:
        n_dates, dates = view.n_dates, view.dates
    out = np.empty((n_dates, len(values), *planes.spatial_shape), dtype=program.dtype)
    absent = absent_bands(program, planes.spatial_shape) if len(dates) < n_dates else {}
    if absent:
        missing = np.setdiff1d(np.arange(n_dates), np.asarray(dates, dtype=np.intp))
    for index, name in enumerate(program.band_names):
        if absent:
            out[missing, index] = absent[name]
            out[list(dates), index] = values.pop(name)
        else:
            out[:, index] = values.pop(name)
    return out


def reduce_block(planes: Planes | ItemStream, program: Program, view: TaskItems | None = None) -> np.ndarray:
    """The fused task: -> ``(group, quantile, band, y, x)``; the planes hold every date (or, with ``view``, the
    items meeting the chunk: a period's dates without one are NaN there and left out, or, where the band math
    gives a number for no data, take :func:`absent_bands`, in their place, as when every item was loaded)."""
    values = _band_series(planes, program, view)
    n_dates = view.n_dates if view is not None else len(program.steps) or planes.n_items
    groups = program.groups or (tuple(range(n_dates)),)
    position = {d: p for p, d in enumerate(view.dates)} if view is not None else None
    absent = absent_bands(program, planes.spatial_shape) if position is not None and len(position) < n_dates else {}
    out = np.empty((len(groups), program.n_quantiles, program.n_result_bands, *planes.spatial_shape),
                   dtype=program.dtype)
    if program.composite is not None:
        for group_index, indices in enumerate(groups):
            dates = list(indices) if position is None else [position[d] for d in indices if d in position]
            period = _dates_of(dates)
            out[group_index, :, 0] = composite_result(program, {name: values[name][period]
                                                                for name in composite_inputs(program.composite)},
                                                      planes.spatial_shape)
        return out
    for band_index, name in enumerate(program.band_names):
        series = values.pop(name)
        fill = absent.get(name)
        keep = fill is not None and not bool(np.isnan(fill).all())
        for group_index, indices in enumerate(groups):
            if not indices:  # a period of the window without a date: NaN, a count of 0
                out[group_index, :, band_index] = empty_result(program, planes.spatial_shape)
                continue
            if position is None:
                local: Sequence[int] = indices
            else:
                local = [position[d] for d in indices if d in position]
            if keep and len(local) < len(indices):
                assert position is not None and fill is not None
                subset = np.stack([series[position[d]] if d in position else fill for d in indices])
            elif not local:  # no item of the period meets the chunk: the period's all-NaN series, one date of it
                assert fill is not None
                subset = fill[None]
            else:
                subset = series if len(local) == series.shape[0] else series[list(local)]
            if program.statistics:
                out[group_index, :, band_index] = reduce_statistics(subset, program.statistics)
            else:
                out[group_index, :, band_index] = reduce_time(subset, program.reduce_method or "", program.quantiles)
        del series
    return out


def _dates_of(dates: Sequence[int]) -> slice | list[int]:
    """A period's dates as an index of the series: a slice (a view, no copy of every band's series) when they
    follow each other, as a period's dates do; else the list."""
    if dates and list(dates) == list(range(dates[0], dates[0] + len(dates))):
        return slice(dates[0], dates[0] + len(dates))
    return list(dates) if dates else slice(0, 0)


def reduce_time(values: np.ndarray, method: str, quantiles: Sequence[float] = ()) -> np.ndarray:
    """NaN-aware reduction over axis 0: ``(t, y, x)`` -> ``(q, y, x)`` (q = 1 unless quantiles are given).

    Pixels with no valid value are NaN for every method except count (0). ``sum`` is NaN there too, not 0:
    "no observation" is not "zero".
    """
    import bottleneck as bn

    from rasterflow import fastreduce

    dtype = values.dtype
    with np.errstate(invalid="ignore", divide="ignore"):
        one_pass = fastreduce.one_pass_time(values, method) if (
            method in fastreduce.ONE_PASS and fastreduce.supports(values)) else None
        if one_pass is not None:  # the compiled kernel: bottleneck's values, ~10x faster
            result = one_pass
        elif method == "median" and fastreduce.supports(values):
            # pixel-major sorted blocks: ~3x faster than bottleneck at 36 dates, the same values bit for bit
            result = fastreduce.nanmedian_time(values)
        elif method == "median":
            result = bn.nanmedian(values, axis=0)
        elif method == "quantile":
            return nanquantile_time(values, quantiles)
        elif method == "mean":
            result = bn.nanmean(values, axis=0)
        elif method == "std":
            result = bn.nanstd(values, axis=0)
        elif method == "min":
            result = bn.nanmin(values, axis=0) if values.shape[0] else np.full(values.shape[1:], np.nan)
        elif method == "max":
            result = bn.nanmax(values, axis=0) if values.shape[0] else np.full(values.shape[1:], np.nan)
        elif method == "sum":
            valid = ~np.isnan(values)
            result = bn.nansum(values, axis=0)
            result = np.where(valid.any(axis=0), result, np.nan)
        elif method == "count":
            result = (~np.isnan(values)).sum(axis=0)
        else:
            raise ValueError(f"unknown reduction {method!r}")
    return np.asarray(result, dtype=dtype)[None]


def composite_inputs(composite: Composite) -> tuple[str, ...]:
    """The band series a composite reads: its inputs, and ``by`` for a best-pixel composite."""
    extra = (composite.by,) if composite.method == "best" and composite.by not in composite.inputs else ()
    return composite.inputs + extra


def composite_result(program: Program, series: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """A composite of one period's ``(date, y, x)`` series per band -> ``(outputs, y, x)``."""
    composite = program.composite
    assert composite is not None
    dtype = np.dtype(program.dtype)
    if composite.method == "geomedian":
        from rasterflow.geomedian import geomedian_block

        stack = [series[name] for name in composite.inputs]
        if not stack[0].shape[0]:  # a period without a date: NaN, a count of 0
            result = np.full((len(composite.outputs), *shape), np.nan, dtype=np.float32)
            result[-1] = 0
            return result.astype(dtype, copy=False)
        return geomedian_block(stack, mads=composite.mads, maxiters=composite.maxiters,
                               eps=composite.eps).astype(dtype, copy=False)
    from rasterflow.bestpixel import best_pixel

    by = series[composite.by]
    if not by.shape[0]:
        return np.full((len(composite.outputs), *shape), np.nan, dtype=dtype)
    return best_pixel(by, [series[name] for name in composite.inputs],
                      "min" if composite.order == "min" else "max").astype(dtype, copy=False)


def empty_result(program: Program, shape: tuple[int, int]) -> np.ndarray:
    """The result slots of a period without a date: NaN, 0 for a count."""
    slots = program.statistics or tuple((m, m, q) for m in (program.reduce_method or "",)
                                        for q in (program.quantiles or (None,)))
    return np.stack([np.full(shape, 0 if method == "count" else np.nan, dtype=program.dtype)
                     for _, method, _ in slots])


def reduce_statistics(values: np.ndarray, statistics: Sequence[tuple[str, str, float | None]]) -> np.ndarray:
    """Several statistics of one ``(t, y, x)`` series -> ``(len(statistics), y, x)``, each as
    :func:`reduce_time` computes it alone; the quantiles of a list share one sort."""
    out = np.empty((len(statistics), *values.shape[1:]), dtype=values.dtype)
    quantile_slots = [(slot, q) for slot, (_, method, q) in enumerate(statistics) if method == "quantile"]
    if quantile_slots:
        out[[slot for slot, _ in quantile_slots]] = reduce_time(values, "quantile", [q for _, q in quantile_slots
                                                                                   if q is not None])
    for slot, (_, method, _q) in enumerate(statistics):
        if method != "quantile":
            out[slot] = reduce_time(values, method)[0]
    return out


def nanquantile_time(values: np.ndarray, quantiles: Sequence[float]) -> np.ndarray:
    """Quantiles over axis 0 ignoring NaN, equal to ``np.nanquantile(..., method="linear")`` but vectorised.

    ``np.nanquantile`` loops over pixels in Python-level chunks for small time axes; a sort along time (NaN sorts
    last) plus the per-pixel valid count gives every quantile from one sort. float32 / float64 series take
    :func:`rasterflow.fastreduce.nanquantile_sorted` (the same sort, pixel-major in small blocks: 2-4x faster at
    36 dates, no sorted copy of the series, and NumPy's float64 lerp for a list of quantiles, bit for bit); the
    axis-0 sort below (float32 lerp) is for anything else.
    """
    from rasterflow import fastreduce

    if fastreduce.supports(values):
        return fastreduce.nanquantile_sorted(values, quantiles)
    ordered = np.sort(values, axis=0)
    count = (~np.isnan(values)).sum(axis=0)
    last = np.maximum(count - 1, 0)
    out = np.empty((len(quantiles), *values.shape[1:]), dtype=values.dtype)
    for index, q in enumerate(quantiles):
        position = q * last
        low = np.floor(position).astype(np.intp)
        high = np.minimum(low + 1, last)
        fraction = (position - low).astype(values.dtype)
        below = np.take_along_axis(ordered, low[None], axis=0)[0]
        above = np.take_along_axis(ordered, high[None], axis=0)[0]
        diff = above - below
        # NumPy's lerp: from below for fraction < 0.5, from above otherwise (the same rounding as np.quantile).
        result = np.where(fraction >= 0.5, above - diff * (1 - fraction), below + diff * fraction)
        out[index] = np.where(count > 0, result, np.nan)
    return out


def std_partials(values: np.ndarray) -> np.ndarray:
    """Streaming partials of a NaN-aware std over axis 0: ``(t, y, x)`` -> ``(3, y, x)`` = count, mean, M2.

    Welford's update, one date at a time, in the input's dtype: the temporaries are four ``(y, x)`` planes whatever
    ``t`` is (``da.nanstd`` builds float64 copies of the whole series: ``A - mean``, its square, the mask). Partials
    of time chunks combine with :func:`combine_std_partials`; :func:`finish_std` turns them into the std (ddof 0).
    """
    dtype = values.dtype
    out = np.zeros((3, *values.shape[1:]), dtype=dtype)
    count, mean, m2 = out[0], out[1], out[2]
    invalid = np.empty(values.shape[1:], dtype=bool)
    delta = np.empty(values.shape[1:], dtype=dtype)
    after = np.empty(values.shape[1:], dtype=dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        for t in range(values.shape[0]):
            x = values[t]
            np.isnan(x, out=invalid)
            np.subtract(x, mean, out=delta)
            np.copyto(delta, 0, where=invalid)
            np.add(count, 1, out=count, where=~invalid)
            np.divide(delta, np.maximum(count, 1, out=after), out=after)
            mean += after
            np.subtract(x, mean, out=after)
            np.copyto(after, 0, where=invalid)
            after *= delta
            m2 += after
    return out


def combine_std_partials(parts: np.ndarray) -> np.ndarray:
    """Combine ``(k, 3, y, x)`` partials of k time chunks into one ``(3, y, x)`` (Chan et al.'s pairwise update)."""
    total: np.ndarray = parts[0].copy()
    count, mean, m2 = total[0], total[1], total[2]
    with np.errstate(invalid="ignore", divide="ignore"):
        for other in parts[1:]:
            n_b, mean_b, m2_b = other[0], other[1], other[2]
            n = count + n_b
            safe = np.maximum(n, 1)
            delta = mean_b - mean
            mean += delta * (n_b / safe)
            m2 += m2_b + delta * delta * (count * n_b / safe)
            count[...] = n
    return total


def finish_std(partials: np.ndarray) -> np.ndarray:
    """``(3, y, x)`` partials -> the std ``(y, x)`` (ddof 0); NaN where no date is valid."""
    count, m2 = partials[0], partials[2]
    with np.errstate(invalid="ignore", divide="ignore"):
        result = np.sqrt(np.maximum(m2, 0) / count)
    result[count == 0] = np.nan
    finished: np.ndarray = result.astype(partials.dtype, copy=False)
    return finished


def solar_day_steps(items: Sequence[dict[str, Any]]) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """Group items (sorted by time) into passes: the same local solar day at the item's longitude.

    One satellite pass crosses several tiles within seconds; their UTC dates can differ across the date line, their
    solar day does not (the rule odc-stac's ``groupby="solar_day"`` uses). Returns each step's first datetime and
    the item indices of each step.
    """
    import datetime as dt

    keys = []
    for item in items:
        stamp = dt.datetime.fromisoformat(item["properties"]["datetime"].replace("Z", "+00:00"))
        bbox = item.get("bbox") or [0, 0, 0, 0]
        longitude = (bbox[0] + bbox[2]) / 2
        keys.append((stamp + dt.timedelta(hours=longitude / 15)).date().isoformat())
    steps: dict[str, list[int]] = {}
    for index, key in enumerate(keys):
        steps.setdefault(key, []).append(index)
    first = tuple(items[indices[0]]["properties"]["datetime"] for indices in steps.values())
    return first, tuple(tuple(indices) for indices in steps.values())


