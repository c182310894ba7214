"""The geomedian and MADs of one block (issue 29 item 2): Geoscience Australia's ``geomad`` kernel inside a task.

``reduce: {method: geomedian, bands: [red, green, nir, swir16], mads: true}`` writes, per pixel, the geometric
median of the multi-band time series (one variable per band), its three median absolute deviations and the
number of observations used:

``emad``
    the median over time of the Euclidean distance ``||x_t - gm||``;
``smad``
    the median over time of the cosine ("spectral") distance ``1 - x_t . gm / (||x_t|| ||gm||)``;
``bcmad``
    the median over time of the Bray-Curtis distance ``sum_b |x_tb - gm_b| / sum_b |x_tb + gm_b|``;
``count``
    the observations with every band valid.

These are geomad's definitions (``geomad.emad_pcm``, ``smad_pcm``, ``bcmad_pcm``: a per-date distance, then NumPy's
``nanmedian`` over time), as odc-algo's ``geomedian_with_mads`` computes them (``_gm_mads_compute_f32``): float32
data in geomad's ``(y, x, band, time)`` layout, ``nangeomedian_pcm(..., nocheck=True)``, ``num_threads=1`` because
Dask already runs one task per thread, then the MADs of the same array against that geomedian. The MADs' distances
are computed here as geomad's loops compute them and their median by :mod:`rasterflow.fastreduce` (NumPy's
``nanmedian`` bit for bit): the same values, in 0.3 s instead of 0.8 s per 512² x 24-date x 4-band block
(``nanmedian`` over geomad's strided time axis was most of it); tests/test_geomedian.py checks them bit for bit
against geomad's functions.

Missing data
    NaN (and, here, +-inf) marks a masked value. An observation (date) is used only when *every* band is valid at
    that pixel; ``count`` counts those (odc-algo's rule). A pixel without one is NaN in every variable, count 0;
    with one, the geomedian is that observation and the MADs are 0 (smad within rounding: ``1 - x.x/|x|^2``).
    Where geomad's MADs have no value at all (the geomedian is the zero vector: the cosine distance is undefined;
    the geomedian and every observation are zero: so is Bray-Curtis) they are NaN, without the "All-NaN slice"
    warning NumPy's ``nanmedian`` would raise.

Defaults
    ``maxiters = 1000`` (odc-algo's and odc-stats' value; geomad's own 10,000 only matters for pixels that never
    settle, where 1000 Weiszfeld steps already move by less than float32 resolution) and ``eps = 1e-4`` (geomad's
    and odc-algo's default for float data). ``eps`` is in the units of the bands: the iteration stops when a step
    moves the estimate by less than ``eps`` (Euclidean, over the bands). For reflectances in 0..1 that is 1 DN of
    Sentinel-2 L2A; measured on a 200² x 24-date x 4-band stack of reflectances with 30 % gaps and 10 % clouds
    against a run to ``eps = 1e-8``, the geomedian differs by 1.8e-5 (median), 1.5e-4 (99th percentile),
    8.6e-4 (max); ``eps = 1e-5`` (what odc-stats' ``gm-s2`` gets on DN with ``scale=1e-4``: 0.1 DN) gives
    1.9e-6 / 1.6e-5 / 2.2e-4 for 1.25x the time. For bands in DN (0..10,000, no scale applied) use ``eps`` ~ 0.1-1:
    1e-4 DN is below float32 resolution there and runs most pixels to ``maxiters`` (3.6x slower in the same test).

Memory
    The kernel streams the block through geomad in slabs of whole rows (``work_pixels``): per slab one
    ``(rows, x, band, time)`` float32 copy (the layout geomad reads), two boolean ``(rows, x, time)`` planes for
    the valid observations, geomad's geomedian and each MAD's per-date distances and their float64 sums (taken in
    eighths of the slab). :func:`geomedian_work_bytes` is the measured peak of one slab,
    ``4 T.B.P + 5 T.P + 4 B.P + 10 P + 1 MiB`` bytes for T dates, B bands, P pixels per slab (measurements in the
    source); :func:`geomedian_output_bytes` the result. The caller's input stack is not copied whole, so with the
    default 128² slabs the kernel adds ``(4 B + 5) x 16 KiB`` per date (0.3 MiB at 4 bands) whatever the block
    size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rasterflow.composites import MAD_NAMES, geomedian_variables

__all__ = [
    "DEFAULT_EPS",
    "DEFAULT_MAXITERS",
    "DEFAULT_WORK_PIXELS",
    "MAD_NAMES",
    "geomedian_block",
    "geomedian_output_bytes",
    "geomedian_variables",
    "geomedian_work_bytes",
    "slab_rows",
]

DEFAULT_MAXITERS = 1000
"""Most Weiszfeld iterations per pixel (odc-algo's ``geomedian_with_mads`` and odc-stats' default)."""
DEFAULT_EPS = 1e-4
"""Stop when an iteration moves the estimate by less than this, in band units (geomad's and odc-algo's float
default)."""
DEFAULT_WORK_PIXELS = 128 * 128
"""Pixels per slab handed to geomad: the ``(y, x, band, time)`` copy is ``time x band x 64 KiB`` at this size (9 MiB
at 36 dates x 4 bands). The slab size hardly changes the speed: a 512² x 24-date x 4-band block took 1.95 s as one
slab, 1.87 s in 512² slabs, 1.84 s in 256², 1.89 s in 16 rows and 1.99 s row by row (best of 2, 1 thread); a 128 x
512 x 24-date x 4-band sub-block 0.60-0.61 s in 256² slabs and 0.51-0.57 s in 128² (three runs each, 2026-12-06),
for a quarter of the work memory (a 4096² x 24-date geomedian: 280 -> 220 MB projected per worker)."""
_MAD_PIECES = 8
"""The MADs of a slab are taken in this many row pieces: a piece's distances hold ~24 bytes per pixel and date (two
float64 sums, a float32 plane and the float32 distances), more than the slab copy itself (16 at 4 bands)."""


def geomedian_output_bytes(n_bands: int, pixels: int, mads: bool = True) -> int:
    """Bytes of :func:`geomedian_block`'s result: ``(n_bands + 4) x pixels`` float32 (``+ 1`` without MADs)."""
    return 4 * (n_bands + (len(MAD_NAMES) if mads else 0) + 1) * pixels


# Peak working memory of one slab, measured with benchmarks/geomedian_memory.py (numpy 2.4.6, geomad 1.0.0, Python
# 3.11, x86_64 Linux). Each size in a fresh subprocess: the input stack (time, band, y, x) float32 built one date at a
# time (30 % of the dates masked per pixel), a one-row warm-up call (imports, OpenMP, NumPy caches), ru_maxrss read,
# geomedian_block on the whole block as one slab (work_pixels=None), ru_maxrss read again; "RSS" is the delta minus
# the output array. A second subprocess per size takes tracemalloc's peak of the same call minus the output: every
# NumPy array (geomad's own C buffers are O(band + time) per OpenMP thread, nothing at these sizes). RSS stayed at
# or below tracemalloc's number in every size, so the formula is fitted to tracemalloc's (least squares over the ten
# sizes: 4.003 T.B.P + 4.86 T.P + 3.91 B.P + 9.7 P + 0.07 MB, largest residual 0.04 %) and rounded up:
#
#    4 T.B.P   the (y, x, band, time) float32 slab copy geomad reads
#    5 T.P     the two boolean (y, x, time) planes (valid observation, finite band) + one MAD piece (an eighth of the
#              slab: ~23 B per pixel-date with geomad's own MADs; ~24 B with the MADs computed here, _MAD_PIECES)
#    4 B.P     geomad's geomedian (y, x, band) float32
#    10 P      the count (int64) and a MAD piece's results
#    1 MiB     NumPy's small temporaries
#
#    time  band    pixels  RSS (MB)  tracemalloc (MB)  formula (MB)  RSS/formula
#      12     4    262144         64.8           72.4         73.9      0.88
#      24     4    262144        130.5          138.0        140.0      0.93
#      36     4    262144        196.2          203.7        206.0      0.95
#      72     4    262144        393.4          400.7        404.2      0.97
#      36     2    262144        122.7          126.1        128.5      0.96
#      36     6    262144        269.6          281.3        283.6      0.95
#      36    10    262144        416.6          436.5        438.8      0.95
#      36     4     65536         49.5           51.0         52.3      0.95
#      36     4   1048576        775.3          814.6        821.0      0.94
#      24     6   1048576        705.3          761.6        766.5      0.92
_BYTES_PER_TIME_BAND_PIXEL = 4
_BYTES_PER_TIME_PIXEL = 5
_BYTES_PER_BAND_PIXEL = 4
_BYTES_PER_PIXEL = 10
_BYTES_CONSTANT = 1 << 20


def geomedian_work_bytes(n_time: int, n_bands: int, pixels: int) -> int:
    """Peak working memory of :func:`geomedian_block` for one slab of ``pixels`` pixels, beyond its input and its
    output (:func:`geomedian_output_bytes`): the ``(y, x, band, time)`` copy geomad reads plus its work arrays.

    Parameters
    ----------
    n_time : int
        Dates in the block.
    n_bands : int
        Bands of the geomedian.
    pixels : int
        Pixels of one slab: ``slab_rows(height, width, work_pixels) * width`` (the whole block with
        ``work_pixels=None``).

    Returns
    -------
    int
        Bytes; measured, with the measurements beside the formula in this module's source.
    """
    t, b, p = max(1, n_time), max(1, n_bands), max(0, pixels)
    return (_BYTES_PER_TIME_BAND_PIXEL * t * b * p + _BYTES_PER_TIME_PIXEL * t * p + _BYTES_PER_BAND_PIXEL * b * p
            + _BYTES_PER_PIXEL * p + _BYTES_CONSTANT)


def slab_rows(height: int, width: int, work_pixels: int | None = DEFAULT_WORK_PIXELS) -> int:
    """Rows per slab for a ``height x width`` block: as many whole rows as fit in ``work_pixels`` (at least one);
    the whole block for None."""
    if work_pixels is None:
        return max(1, height)
    if work_pixels < 1:
        raise ValueError(f"work_pixels must be a positive number of pixels, got {work_pixels}")
    return max(1, min(height, work_pixels // max(1, width)))


def _as_bands(stack: np.ndarray | Sequence[np.ndarray]) -> list[np.ndarray]:
    if isinstance(stack, np.ndarray):
        if stack.ndim != 4:
            raise ValueError(f"expected a (time, band, y, x) stack, got {stack.ndim} dimensions {stack.shape}")
        return [stack[:, b] for b in range(stack.shape[1])]
    bands = [np.asarray(band) for band in stack]
    if not bands:
        raise ValueError("the geomedian needs at least one band")
    shapes = {band.shape for band in bands}
    if len(shapes) != 1 or bands[0].ndim != 3:
        raise ValueError(f"expected per-band (time, y, x) arrays of one shape, got {sorted(shapes)}")
    return bands


def geomedian_block(stack: np.ndarray | Sequence[np.ndarray], *, mads: bool = True,
                    maxiters: int = DEFAULT_MAXITERS, eps: float = DEFAULT_EPS, num_threads: int = 1,
                    work_pixels: int | None = DEFAULT_WORK_PIXELS) -> np.ndarray:
    """Geomedian, MADs and count of one block.

    Parameters
    ----------
    stack : ndarray or sequence of ndarray
        ``(time, band, y, x)`` (:func:`rasterflow.kernels.band_block`'s ``(date, band, y, x)`` layout), or one
        ``(time, y, x)`` array per band (the task's band series). Float, NaN (or +-inf) where masked; converted to
        float32 slab by slab (geomad computes in float32).
    mads : bool
        Also compute ``emad``, ``smad`` and ``bcmad``.
    maxiters : int
        Most iterations per pixel (default :data:`DEFAULT_MAXITERS` = 1000).
    eps : float
        Convergence tolerance in band units (default :data:`DEFAULT_EPS` = 1e-4; see the module docstring).
    num_threads : int
        geomad's OpenMP threads (default 1: Dask runs a task per thread).
    work_pixels : int or None
        Pixels per slab given to geomad (whole rows; default :data:`DEFAULT_WORK_PIXELS`); None = the whole block
        at once. Results do not depend on it (geomad restarts every row).

    Returns
    -------
    ndarray
        ``(n_bands + 4, y, x)`` float32: the geomedian of each band, ``emad``, ``smad``, ``bcmad``, ``count``
        (:func:`geomedian_variables`); ``(n_bands + 1, y, x)`` without MADs. ``count`` holds whole numbers.

    Raises
    ------
    ValueError
        For a stack of the wrong shape, ``maxiters < 1``, ``eps <= 0`` or ``num_threads < 1``.
    """
    import geomad

    bands = _as_bands(stack)
    if maxiters < 1:
        raise ValueError(f"maxiters must be at least 1, got {maxiters}")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    if num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")
    n_time, height, width = bands[0].shape
    n_bands = len(bands)
    n_out = n_bands + (len(MAD_NAMES) if mads else 0) + 1
    out = np.empty((n_out, height, width), dtype=np.float32)
    if height == 0 or width == 0:
        return out
    if n_time == 0:
        out[:-1] = np.nan
        out[-1] = 0
        return out
    rows = slab_rows(height, width, work_pixels)
    slab = np.empty((rows, width, n_bands, n_time), dtype=np.float32)
    valid = np.empty((rows, width, n_time), dtype=bool)
    finite = np.empty((rows, width, n_time), dtype=bool)
    for top in range(0, height, rows):
        bottom = min(height, top + rows)
        n = bottom - top
        x, ok, fin = slab[:n], valid[:n], finite[:n]
        ok[...] = True
        for index, band in enumerate(bands):
            plane = x[:, :, index, :]
            np.copyto(plane, band[:, top:bottom, :].transpose(1, 2, 0), casting="unsafe")
            np.isfinite(plane, out=fin)
            ok &= fin
            if not fin.all():
                np.logical_not(fin, out=fin)
                np.copyto(plane, np.float32(np.nan), where=fin)
        count = ok.sum(axis=-1)
        empty = count == 0
        gm = geomad.nangeomedian_pcm(x, maxiters=int(maxiters), eps=float(eps), num_threads=int(num_threads),
                                     nocheck=True)
        gm[empty] = np.nan
        out[:n_bands, top:bottom] = gm.transpose(2, 0, 1)
        out[-1, top:bottom] = count
        if mads:
            _mads(x, gm, out[n_bands:n_bands + len(MAD_NAMES), top:bottom])
        del gm, count, empty
    return out


def _mads(x: np.ndarray, gm: np.ndarray, out: np.ndarray) -> None:
    """emad, smad, bcmad of one slab into ``out`` ``(3, rows, x)``, in row pieces (see :data:`_MAD_PIECES`).

    The per-date distances are geomad's (``__emad``, ``__smad``, ``__bcmad`` in its ``pcm.pyx``), computed the way
    its loops do: each band's difference, product or sum rounded to float32, then summed over the bands in order in
    float64, the distance stored as float32. Their median over time is :func:`rasterflow.fastreduce.nanmedian_time`
    (equal to NumPy's ``nanmedian``, which geomad's ``*_pcm`` call, bit for bit): the MADs are geomad's bit for bit
    (tests/test_geomedian.py), without the ``nanmedian`` over a strided time axis that took ~60 % of the kernel.
    A date with a NaN band, and a pixel without a valid date, give NaN; so does smad where the geomedian is the
    zero vector (0/0) and bcmad where it and every observation are zero."""
    from rasterflow.fastreduce import nanmedian_time

    rows, width, n_bands, n_time = x.shape
    step = max(1, math.ceil(rows / _MAD_PIECES))
    for top in range(0, rows, step):
        piece = slice(top, min(rows, top + step))
        n = piece.stop - piece.start
        xs, gs = x[piece], gm[piece]
        bands = [xs[:, :, b, :].transpose(2, 0, 1) for b in range(n_bands)]  # (time, rows, x) views
        planes = [gs[:, :, b] for b in range(n_bands)]
        one = np.empty((n_time, n, width), dtype=np.float32)
        first = np.zeros((n_time, n, width), dtype=np.float64)
        second = np.empty((n_time, n, width), dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            # emad: sqrt(sum_b (x_b - gm_b)^2)
            for xb, gb in zip(bands, planes):
                np.subtract(xb, gb, out=one)
                np.multiply(one, one, out=second, dtype=np.float64)
                first += second
            np.sqrt(first, out=first)
            out[0, piece] = nanmedian_time(first.astype(np.float32))
            # smad: 1 - sum_b x_b gm_b / (sqrt(sum_b x_b^2) sqrt(sum_b gm_b^2))
            first[...] = 0.0
            second[...] = 0.0
            norm_gm = np.zeros((n, width), dtype=np.float64)
            for xb, gb in zip(bands, planes):
                norm_gm += np.multiply(gb, gb)
                np.multiply(xb, gb, out=one)
                first += one
                np.multiply(xb, xb, out=one)
                second += one
            np.sqrt(norm_gm, out=norm_gm)
            np.sqrt(second, out=second)
            second *= norm_gm
            np.divide(first, second, out=first)
            np.subtract(1.0, first, out=first)
            out[1, piece] = nanmedian_time(first.astype(np.float32))
            # bcmad: sum_b |x_b - gm_b| / sum_b |x_b + gm_b|
            first[...] = 0.0
            second[...] = 0.0
            for xb, gb in zip(bands, planes):
                np.subtract(xb, gb, out=one)
                np.abs(one, out=one)
                first += one
                np.add(xb, gb, out=one)
                np.abs(one, out=one)
                second += one
            np.divide(first, second, out=first)
            out[2, piece] = nanmedian_time(first.astype(np.float32))
        del one, first, second
