"""Order statistics over the time axis of a ``(t, y, x)`` series, pixel-major and block by block.

The series a task reduces is C-contiguous ``(t, y, x)``: one pixel's dates are ``y × x`` elements apart. Reducing
along that axis directly (``bottleneck.nanmedian(axis=0)``, ``np.sort(axis=0)``) walks memory with a stride of one
plane per step, and bottleneck selects each pixel's median one pixel at a time (on contiguous pixel-major rows it is
no faster: 412 vs 404 ms at 1024² x 36). NumPy's vectorised sort of short contiguous rows is what is fast (152 ms
for the whole median). So the series is cut into blocks of whole rows (about :data:`BLOCK_PIXELS` pixels), each
block is transposed into a small reused ``(pixels, t)`` buffer (every pixel's dates contiguous, the buffer stays in
cache) and sorted in place along its last axis (NaN sorts last, so the first ``count`` entries of a row are its
valid dates in order). The median and every quantile are then read from the sorted rows by index.

Where it is installed, the compiled kernel ``rasterflow._native`` (:mod:`rasterflow.compiled`) does the same job ~3x faster
and picks the same elements with the same arithmetic: 32 pixels at a time are sorted together by one comparator
network of vector min/max instructions, with no transpose (see ``_native.c``). The NumPy path below stays for
installs without a C compiler and as the kernel's reference in the tests.

Exactness: the values picked are the same elements NumPy picks, and the arithmetic on them is NumPy's:

- median: the middle element for an odd count; ``(a + b) * 0.5`` in the input dtype for an even count, which is
  ``np.nanmedian``'s mean of the two middle elements (``(a + b) / 2``; halving is exact) and bottleneck's
  ``0.5 * (a + b)``. The only representable difference is the sign of a zero median of ``-0.0`` and ``+0.0``
  values, which NumPy's summation (started from ``+0.0``) and this code may round differently; ``==`` holds.
- quantile: the ``linear`` method (NumPy's default) with NumPy's own two-sided lerp as ``np.nanquantile`` runs it
  for a *list* of quantiles: ``b - a`` in the input dtype, the weight and the lerp in float64 (the quantiles array
  is float64), one rounding to the input dtype at the end. For float32 this is within 1 ulp of, and usually equal
  to, the all-float32 lerp ``np.nanquantile`` uses for a single Python-float ``q`` (weak promotion) and that the
  previous kernel used; float64 is identical either way.

Memory: at most ``BLOCK_PIXELS × t`` elements of buffer (and a boolean one of the same shape) plus per-block index
vectors, about 1.5 MB at 36 float32 dates whatever the chunk size, on top of the ``(q, y, x)`` result; the input
is never modified and never copied whole.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Iterator, Sequence

import numpy as np

from rasterflow import compiled

__all__ = ["BLOCK_PIXELS", "NATIVE_MAX_DATES", "ONE_PASS", "nanmedian_time", "nanquantile_sorted", "one_pass_time",
           "supports"]

NATIVE_MAX_DATES = 4096
"""The most dates the compiled kernel takes (its comparator network grows as t log² t); longer series use NumPy."""

BLOCK_PIXELS = 8192
"""Pixels per transposed block: 8192 × 36 dates × 4 B = 1.2 MB, small enough to stay in L2/L3 while it is
transposed, sorted and read (1024² × 36 float32 on this machine: 4k-16k-pixel blocks are fastest, ~1.5x faster
than sorting one whole-chunk transposed copy; 2k pays per-call overhead, 32k falls out of cache)."""


def supports(values: np.ndarray) -> bool:
    """Whether the pixel-major path handles this series: a 3-D float32 / float64 ``(t, y, x)`` array with dates.

    Not float16: NumPy's median of float16 adds the two middle values in float32, not float16."""
    return values.ndim == 3 and values.dtype in (np.float32, np.float64) and values.shape[0] > 0


def _sorted_blocks(values: np.ndarray) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """Yield ``(y0, y1, rows, count)`` per block of image rows: ``rows`` is the block's ``(pixels, t)`` buffer with
    each pixel's dates sorted ascending (NaN last), ``count`` its valid dates per pixel. The buffer is reused: use it
    before asking for the next block."""
    t, height, width = values.shape
    rows_per_block = max(1, min(height, BLOCK_PIXELS // max(1, width)))  # a small chunk: no bigger buffer than it
    buffer = np.empty(rows_per_block * width * t, dtype=values.dtype)
    missing = np.empty(rows_per_block * width * t, dtype=bool)
    counter = np.uint8 if t <= np.iinfo(np.uint8).max else np.intp
    for y0 in range(0, height, rows_per_block):
        y1 = min(height, y0 + rows_per_block)
        n = (y1 - y0) * width
        rows = buffer[: n * t].reshape(n, t)
        # (t, r, x) -> (r, x, t): one strided gather per block, every pixel's dates end up contiguous
        np.copyto(rows.reshape(y1 - y0, width, t), values[:, y0:y1].transpose(1, 2, 0))
        rows.sort(axis=1)
        # valid dates per pixel, counted date by date on the (t, r, x) slice: a sum over the short contiguous axis
        # of the buffer is ~2x slower; uint8 sums (t <= 255) are half the time of intp ones
        nan = missing[: n * t].reshape(t, y1 - y0, width)
        np.isnan(values[:, y0:y1], out=nan)
        count = np.add.reduce(nan.view(np.uint8), axis=0, dtype=counter).reshape(n).astype(np.intp)
        np.subtract(t, count, out=count)
        yield y0, y1, rows, count


def _native_for(values: np.ndarray, native: bool | None) -> ModuleType | None:
    """The compiled kernels to use on ``values``, or None for the NumPy path. ``native`` True: the compiled kernel
    (an error where it is not installed); False: NumPy; None: the compiled kernel where installed and switched on.
    """
    kernels = compiled.chosen(native)
    return kernels if values.shape[0] <= NATIVE_MAX_DATES else None


ONE_PASS = ("mean", "sum", "count", "min", "max")
"""The reductions :func:`one_pass_time` computes in the compiled kernel."""


def one_pass_time(values: np.ndarray, method: str, *, native: bool | None = None) -> np.ndarray | None:
    """``mean`` / ``sum`` / ``count`` / ``min`` / ``max`` over axis 0 of a float ``(t, y, x)`` series, NaN ignored,
    in the compiled kernel: ``(y, x)`` in the input dtype, NaN where no date is valid (count: 0). None where the
    kernel is not installed or ``native`` is False: the caller's bottleneck path gives the same values.

    bottleneck's values bit for bit (tests/test_fast_reduce.py): each pixel's dates are summed in date order in the
    input dtype and the mean divides by the count, min / max keep the last of equal values (``-0.0`` / ``+0.0``).
    One pass over the series in its own (date-major) order, every pixel of a row at once: ~10x faster than
    bottleneck's pixel-by-pixel walk along the strided time axis (512² x 36 float32: 5 vs 58 ms for the mean).
    """
    if method not in ONE_PASS:
        raise ValueError(f"one_pass_time: {method!r} is not one of {', '.join(ONE_PASS)}")
    kernels = _native_for(values, native)
    if kernels is None:
        return None
    out = np.empty(values.shape[1:], dtype=values.dtype)
    kernels.reduce_simple(values, method, out)
    return out


def nanmedian_time(values: np.ndarray, *, native: bool | None = None) -> np.ndarray:
    """NaN-ignoring median over axis 0: ``(t, y, x)`` -> ``(y, x)`` in the input dtype; NaN where no date is valid.

    Equal to ``np.nanmedian(values, axis=0)`` (see the module docstring for the one sign-of-zero caveat).
    ``native``: the compiled kernel (True), the NumPy path (False) or the kernel where installed (None).
    """
    out = np.empty(values.shape[1:], dtype=values.dtype)
    kernels = _native_for(values, native)
    if kernels is not None:
        kernels.nanmedian(values, out)
        return out
    flat = out.reshape(-1)
    width = values.shape[2]
    half = values.dtype.type(0.5)
    # infinities are values: inf + -inf is NaN and a sum near the dtype's maximum overflows to inf, as in np.median
    with np.errstate(invalid="ignore", over="ignore"):
        _median_blocks(values, flat, width, half)
    return out


def _median_blocks(values: np.ndarray, flat: np.ndarray, width: int, half: Any) -> None:
    for y0, y1, rows, count in _sorted_blocks(values):
        index = np.arange(rows.shape[0])
        low = rows[index, np.maximum(count - 1, 0) // 2]  # count 0: the row is all NaN, so is the result
        high = rows[index, np.minimum(count // 2, rows.shape[1] - 1)]
        middle = low + high
        middle *= half
        target = flat[y0 * width:y1 * width]
        np.copyto(target, middle)
        # odd count: the middle element itself (as np.median and bottleneck; no overflow of a + a)
        np.copyto(target, low, where=(count & 1).astype(bool))


def nanquantile_sorted(values: np.ndarray, quantiles: Sequence[float], *, native: bool | None = None) -> np.ndarray:
    """NaN-ignoring quantiles over axis 0 (``method="linear"``): ``(t, y, x)`` -> ``(q, y, x)``; NaN where no date
    is valid. ``np.nanquantile(values, list(quantiles), axis=0)``'s lerp (see the module docstring), on pixel-major
    sorted blocks. ``native`` as in :func:`nanmedian_time`."""
    dtype = values.dtype
    out = np.empty((len(quantiles), *values.shape[1:]), dtype=dtype)
    kernels = _native_for(values, native)
    if kernels is not None:
        kernels.nanquantile(values, [float(q) for q in quantiles], out)
        return out
    flat = out.reshape(len(quantiles), values.shape[1] * values.shape[2])  # -1 is ambiguous for q = 0
    width = values.shape[2]
    for y0, y1, rows, count in _sorted_blocks(values):
        index = np.arange(rows.shape[0])
        last = np.maximum(count - 1, 0)
        empty = count == 0
        for q_index, q in enumerate(quantiles):
            position = float(q) * last
            low = np.floor(position).astype(np.intp)
            high = np.minimum(low + 1, last)
            fraction = position - low  # float64, as NumPy's gamma for an array of quantiles
            below = rows[index, low]
            above = rows[index, high]
            # infinities are values: inf - inf is NaN, as in np.nanquantile
            with np.errstate(invalid="ignore", over="ignore"):
                diff = (above - below).astype(np.float64)  # b - a in the input dtype, then NumPy promotes
                # NumPy's lerp: from below for fraction < 0.5, from above otherwise, in float64, rounded once
                result = np.where(fraction >= 0.5, above - diff * (1 - fraction), below + diff * fraction)
            result[empty] = np.nan
            flat[q_index, y0 * width:y1 * width] = result
    return out
