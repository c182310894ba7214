"""The per-chunk kernels: NumPy only, so they can be tested without Dask and run inside one task.

One task takes a loaded block ``(time, asset, y, x)`` and runs scale/offset, the mask, the band expressions and the
reduction over time on it, so intermediates never leave the task and never cross workers. The order of work and what
stays alive here is what ``budget.py`` counts; change one, change the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from rasterflow.expr import Expression

__all__ = [
    "Program", "band_block", "reduce_block", "reduce_time", "nanquantile_time", "solar_day_steps", "period_labels",
    "group_indices",
]


@dataclass(frozen=True)
class Program:
    """What a task computes, small and picklable (it travels to the workers with every task)."""

    assets: tuple[str, ...]
    """Names of the asset axis of the loaded block, in order."""
    mask: Expression | None
    masked_assets: tuple[str, ...]
    bands: tuple[tuple[str, Expression], ...]
    dtype: str
    reduce_method: str | None = None
    quantiles: tuple[float, ...] = ()
    groups: tuple[tuple[int, ...], ...] = ()
    """Time indices of each period; empty = one group of every date."""
    nodata: int | None = None
    """The raw value that means "no data" when blocks are loaded as integers (the source dtype); None for floats."""
    steps: tuple[tuple[int, ...], ...] = ()
    """Item indices that make up each output date (``source.group_by: solar_day``: the tiles of one pass, mosaicked
    first-valid after masking); empty = every item is its own date."""

    @property
    def band_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.bands)

    @property
    def n_groups(self) -> int:
        return max(1, len(self.groups))

    @property
    def n_quantiles(self) -> int:
        return max(1, len(self.quantiles))


def _time_slice(block_info: dict | None, length: int) -> slice:
    if not block_info:
        return slice(0, length)
    start, stop = block_info[0]["array-location"][0]
    return slice(start, stop)


def _working_plane(raw: np.ndarray, dtype: np.dtype, scale: float, offset: float, nodata: float | None) -> np.ndarray:
    """One asset's ``(y, x)`` plane as a new array in the working dtype: nodata -> NaN, then scale and offset.

    Scale and offset are applied in the working dtype, multiply then add, as the float reference does.
    """
    values = raw.astype(dtype, copy=True)
    if nodata is not None:
        np.copyto(values, np.nan, where=raw == nodata)
    if scale != 1:
        values *= dtype.type(scale)
    if offset != 0:
        values += dtype.type(offset)
    return values


def _band_series(block: np.ndarray, program: Program, scale: np.ndarray, offset: np.ndarray) -> dict[str, np.ndarray]:
    """Scale, mask and evaluate the bands of one block: every band's ``(t, y, x)`` values in the working dtype.

    The block is the raw load (integers with ``program.nodata``, or floats with NaN). Everything is elementwise, so
    the work runs one date at a time: the temporaries are ``(y, x)`` planes (1/t of the series, cache-sized for
    typical chunks), and the only ``t``-deep arrays are the block and one output series per band.
    """
    dtype = np.dtype(program.dtype)
    nodata = program.nodata if block.dtype.kind in "iu" else None
    steps = program.steps or tuple((t,) for t in range(block.shape[0]))
    series = {name: np.empty((len(steps), *block.shape[2:]), dtype=dtype) for name in program.band_names}
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for step, indices in enumerate(steps):
            env = _masked_assets(block, indices[0], program, dtype, scale, offset, nodata)
            for t in indices[1:]:  # the other tiles of the same pass fill what is still empty
                more = _masked_assets(block, t, program, dtype, scale, offset, nodata)
                for name, plane in env.items():
                    np.copyto(plane, more[name], where=np.isnan(plane))
                del more
            for name, expression in program.bands:
                env[name] = np.asarray(expression.evaluate(env), dtype=dtype)
                series[name][step] = env[name]
            del env
    return series


def _masked_assets(block: np.ndarray, t: int, program: Program, dtype: np.dtype, scale: np.ndarray,
                   offset: np.ndarray, nodata: int | None) -> dict[str, np.ndarray]:
    """Item ``t``'s assets as working-dtype planes, with the mask applied to the assets the bands read."""
    env: dict[str, np.ndarray] = {
        name: _working_plane(block[t, a], dtype, scale[t, a], offset[t, a], nodata)
        for a, name in enumerate(program.assets)
    }
    if program.mask is not None:
        drop = np.asarray(program.mask.evaluate(env), dtype=bool)
        for name in program.masked_assets:
            np.copyto(env[name], np.nan, where=drop)  # the planes are this item's own copies
    return env


def band_block(block: np.ndarray, program: Program, scale: np.ndarray, offset: np.ndarray,
               block_info: dict | None = None) -> np.ndarray:
    """Mask and band math of one block: ``(t, asset, y, x)`` -> ``(t, band, y, x)``."""
    times = _time_slice(block_info, scale.shape[0])
    values = _band_series(block, program, scale[times], offset[times])
    out = np.empty((len(program.steps) or block.shape[0], len(values), *block.shape[2:]), dtype=program.dtype)
    for index, name in enumerate(program.band_names):
        out[:, index] = values.pop(name)
    return out


def reduce_block(block: np.ndarray, program: Program, scale: np.ndarray, offset: np.ndarray,
                 block_info: dict | None = None) -> np.ndarray:
    """The fused task: ``(time, asset, y, x)`` -> ``(group, quantile, band, y, x)``; time must be whole."""
    values = _band_series(block, program, scale, offset)
    groups = program.groups or (tuple(range(len(program.steps) or block.shape[0])),)
    out = np.empty((len(groups), program.n_quantiles, len(values), *block.shape[2:]), dtype=program.dtype)
    for band_index, name in enumerate(program.band_names):
        series = values.pop(name)
        for group_index, indices in enumerate(groups):
            subset = series if len(indices) == series.shape[0] else series[list(indices)]
            out[group_index, :, band_index] = reduce_time(subset, program.reduce_method, program.quantiles)
        del series
    return out


def reduce_time(values: np.ndarray, method: str, quantiles: Sequence[float] = ()) -> np.ndarray:
    """NaN-aware reduction over axis 0: ``(t, y, x)`` -> ``(q, y, x)`` (q = 1 unless quantiles are given).

    Pixels with no valid value are NaN for every method except count (0). ``sum`` is NaN there too, not 0:
    "no observation" is not "zero".
    """
    import bottleneck as bn

    dtype = values.dtype
    with np.errstate(invalid="ignore", divide="ignore"):
        if method == "median":
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


def nanquantile_time(values: np.ndarray, quantiles: Sequence[float]) -> np.ndarray:
    """Quantiles over axis 0 ignoring NaN, equal to ``np.nanquantile(..., method="linear")`` but vectorised.

    ``np.nanquantile`` loops over pixels in Python-level chunks for small time axes; a sort along time (NaN sorts
    last) plus the per-pixel valid count gives every quantile from one sort.
    """
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


def solar_day_steps(items: Sequence[dict]) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
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


def period_labels(times: Sequence[np.datetime64], period: str) -> list[str]:
    """Label each date with its period: month "2024-06", season "2024-JJA" (December counts to the next DJF),
    year "2024"."""
    labels = []
    for value in times:
        stamp = np.datetime64(value, "D").astype(object)
        if period == "month":
            labels.append(f"{stamp.year:04d}-{stamp.month:02d}")
        elif period == "year":
            labels.append(f"{stamp.year:04d}")
        elif period == "season":
            season = {12: "DJF", 1: "DJF", 2: "DJF", 3: "MAM", 4: "MAM", 5: "MAM",
                      6: "JJA", 7: "JJA", 8: "JJA"}.get(stamp.month, "SON")
            year = stamp.year + 1 if stamp.month == 12 else stamp.year
            labels.append(f"{year:04d}-{season}")
        else:
            raise ValueError(f"unknown period {period!r}")
    return labels


def group_indices(labels: Sequence[str]) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """Distinct labels in order of first appearance (dates are sorted) and the time indices of each."""
    order: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        order.setdefault(label, []).append(index)
    return tuple(order), tuple(tuple(v) for v in order.values())
