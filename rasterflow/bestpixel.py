"""Best-pixel composites (issue 29 item 3): ``reduce: {method: best, by: ndvi, order: max}``.

At every pixel one date is chosen, the one where ``by`` is largest (``order: max``) or smallest (``min``), and every
output band takes its value from that date (Earth Engine's ``qualityMosaic``: max NDVI, least cloud...). So the bands
of a pixel always come from one observation, unlike a per-band max.

Rules
    ``by`` is NaN where masked. Ties go to the earliest date. A pixel where ``by`` is NaN at every date is NaN in
    every band. Only NaN is missing: ``+-inf`` in ``by`` compare as numbers. A band that is NaN at the chosen date
    is NaN there (the pixel's bands come from one date, never from another one).

Memory
    One streaming pass over the dates keeps, per pixel, the best value so far and its date, so the work arrays are
    ``(y, x)`` planes whatever the number of dates: :func:`best_work_bytes`. The bands are then gathered one at a
    time at the chosen dates; nothing of shape ``(band, time, y, x)`` or ``(time, y, x)`` is copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

__all__ = ["best_index", "best_pixel", "best_work_bytes", "select_dates"]

Order = Literal["max", "min"]


def best_index(by: np.ndarray, order: Order = "max") -> np.ndarray:
    """Per pixel, the date at which ``by`` is largest (``max``) or smallest (``min``).

    Parameters
    ----------
    by : ndarray
        ``(time, y, x)`` float, NaN where masked.
    order : {"max", "min"}
        Which extreme wins.

    Returns
    -------
    ndarray
        ``(y, x)`` intp: the date index, the earliest of equal values; -1 where ``by`` is NaN at every date.

    Raises
    ------
    ValueError
        For an ``order`` other than max / min, or ``by`` not 3-D.
    """
    if order not in ("max", "min"):
        raise ValueError(f"order must be 'max' or 'min', got {order!r}")
    by = np.asarray(by)
    if by.ndim != 3:
        raise ValueError(f"expected by as (time, y, x), got shape {by.shape}")
    shape = by.shape[1:]
    index = np.full(shape, -1, dtype=np.intp)
    best = np.full(shape, -np.inf if order == "max" else np.inf,
                   dtype=by.dtype if np.issubdtype(by.dtype, np.floating) else np.float64)
    better = np.empty(shape, dtype=bool)
    first = np.empty(shape, dtype=bool)
    present = np.empty(shape, dtype=bool)
    beats = np.greater if order == "max" else np.less
    for t in range(by.shape[0]):
        value = by[t]
        beats(value, best, out=better)             # NaN never beats; equal does not: ties stay with the earlier date
        np.less(index, 0, out=first)               # nothing chosen yet: any valid value (even -inf for max) counts
        np.equal(value, value, out=present)
        first &= present
        better |= first
        np.copyto(best, value, where=better, casting="unsafe")
        np.copyto(index, t, where=better)
    return index


def select_dates(bands: np.ndarray | Sequence[np.ndarray], index: np.ndarray) -> np.ndarray:
    """Every band at the date ``index`` gives per pixel (-1 = NaN).

    Parameters
    ----------
    bands : ndarray or sequence of ndarray
        ``(band, time, y, x)``, or one ``(time, y, x)`` array per band.
    index : ndarray
        ``(y, x)`` date indices, -1 for none (:func:`best_index`).

    Returns
    -------
    ndarray
        ``(band, y, x)`` in the bands' float dtype (float32 for integer bands, so that NaN fits).
    """
    planes = list(bands) if not isinstance(bands, np.ndarray) else [bands[b] for b in range(bands.shape[0])]
    if isinstance(bands, np.ndarray) and bands.ndim != 4:
        raise ValueError(f"expected bands as (band, time, y, x), got shape {bands.shape}")
    shapes = {np.shape(p) for p in planes}
    if len(shapes) > 1 or any(len(s) != 3 for s in shapes):
        raise ValueError(f"expected per-band (time, y, x) arrays of one shape, got {sorted(shapes)}")
    if planes and np.shape(planes[0])[1:] != index.shape:
        raise ValueError(f"bands of (y, x) {np.shape(planes[0])[1:]} do not match the index's {index.shape}")
    dtype = np.result_type(*(np.asarray(p).dtype for p in planes), np.float32) if planes else np.dtype(np.float32)
    out = np.empty((len(planes), *index.shape), dtype=dtype)
    if not planes:
        return out
    missing = index < 0
    chosen = np.maximum(index, 0)[None]
    if np.shape(planes[0])[0] == 0:
        out[...] = np.nan
        return out
    for b, plane in enumerate(planes):
        out[b] = np.take_along_axis(np.asarray(plane), chosen, axis=0)[0]
    if missing.any():
        out[:, missing] = np.nan
    return out


def best_pixel(by: np.ndarray, bands: np.ndarray | Sequence[np.ndarray], order: Order = "max") -> np.ndarray:
    """The best-pixel composite: every band from the date at which ``by`` is largest / smallest.

    Parameters
    ----------
    by : ndarray
        ``(time, y, x)``, NaN where masked (may be one of the bands).
    bands : ndarray or sequence of ndarray
        ``(band, time, y, x)``, or one ``(time, y, x)`` array per band.
    order : {"max", "min"}

    Returns
    -------
    ndarray
        ``(band, y, x)``; NaN where ``by`` has no valid date (rules in the module docstring).
    """
    index = best_index(by, order)
    if isinstance(bands, np.ndarray) and bands.ndim == 4 and bands.shape[1] != np.shape(by)[0]:
        raise ValueError(f"bands have {bands.shape[1]} dates, by has {np.shape(by)[0]}")
    return select_dates(bands, index)


def best_work_bytes(pixels: int, by_itemsize: int = 4, band_itemsize: int = 4) -> int:
    """Peak working memory of :func:`best_pixel` on a block of ``pixels`` pixels, beyond its inputs and its
    ``(band, y, x)`` output: the index (intp), the best value so far, three boolean planes, then per band the clipped
    index, the missing mask and one gathered plane, plus NumPy's fancy-indexing buffers (checked with tracemalloc
    in ``tests/test_bestpixel.py``: 23.2 bytes per pixel at 256² with float32, against 21 + 256 KiB here)."""
    scan = 8 + by_itemsize + 3
    gather = 8 + 8 + 1 + band_itemsize   # index, clipped index, missing mask, one gathered plane
    return max(scan, gather) * max(0, pixels) + (256 << 10)
