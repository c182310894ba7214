"""The pixel-major median / quantile kernels (``rasterflow.fastreduce``) against NumPy, bit for bit.

References are computed here with NumPy's own ``np.nanmedian`` and ``np.nanquantile(..., method="linear")`` on the
same dtype (and, for the median, bottleneck's ``nanmedian``, the kernel used before). Equality is bitwise on every
non-NaN result, NaN exactly where the reference is NaN. The one documented exception: a zero median of ``+0.0`` and
``-0.0`` values may differ in the sign of the zero (NumPy's summation starts from ``+0.0``); zeros compare with ``==``.
"""

from __future__ import annotations

import warnings

import bottleneck as bn
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rasterflow import compiled, fastreduce, kernels
from rasterflow.expr import parse_expression

QUANTILES = (0.0, 0.1, 0.5, 0.9, 1.0)
DEPTHS = (1, 2, 3, 5, 36, 73)  # 5, 36, 73: networks cut down from the next power of two
ENGINES = pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
DTYPES = (np.float32, np.float64)


def assert_bitwise(actual: np.ndarray, expected: np.ndarray) -> None:
    """Same dtype and shape, NaN at the same places, every other value the same bits (zeros: ``==``)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    keep = ~np.isnan(expected) & (expected != 0)
    bits = np.uint32 if actual.dtype == np.float32 else np.uint64
    mismatch = actual.view(bits)[keep] != expected.view(bits)[keep]
    assert not mismatch.any(), (actual[keep][mismatch][:5], expected[keep][mismatch][:5])
    np.testing.assert_array_equal(actual[expected == 0], 0)


def numpy_median(values: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices
        return np.nanmedian(values, axis=0)


def numpy_quantiles(values: np.ndarray, quantiles) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # NumPy returns float64 for some float32 shapes (its float64 lerp, not rounded back): round once, as the kernel
        return np.nanquantile(values, list(quantiles), axis=0, method="linear").astype(values.dtype, copy=False)


def cloudy(shape, dtype, seed: int, nan_fraction: float = 0.3, pool: int | None = None) -> np.ndarray:
    """Random series with ~30 % NaN, a block of all-NaN pixels, a pixel of ties; ``pool`` draws from few values
    (ties everywhere)."""
    rng = np.random.default_rng(seed)
    if pool:
        values = rng.integers(-pool, pool + 1, size=shape).astype(dtype) / 4
    else:
        values = rng.normal(0.3, 0.2, size=shape).astype(dtype)
    values[rng.random(shape) < nan_fraction] = np.nan
    values[:, :2, :3] = np.nan
    values[:, -1, -1] = values.dtype.type(0.75)
    return values


@ENGINES
@pytest.mark.parametrize("pool", [None, 3], ids=["continuous", "ties"])
@pytest.mark.parametrize("t", DEPTHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_median_is_numpys_and_bottlenecks_bit_for_bit(dtype, t, pool, native):
    values = cloudy((t, 37, 53), dtype, seed=t * 7 + (pool or 0), pool=pool)
    before = values.copy()
    result = fastreduce.nanmedian_time(values, native=native)
    np.testing.assert_array_equal(values, before)  # the input is not modified
    assert_bitwise(result, numpy_median(values))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert_bitwise(result, bn.nanmedian(values, axis=0))
    assert np.isnan(result[:2, :3]).all() and result[-1, -1] == 0.75


@ENGINES
@pytest.mark.parametrize("pool", [None, 3], ids=["continuous", "ties"])
@pytest.mark.parametrize("t", DEPTHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_quantiles_are_numpys_bit_for_bit(dtype, t, pool, native):
    values = cloudy((t, 19, 23), dtype, seed=t * 11 + (pool or 0), pool=pool)
    result = fastreduce.nanquantile_sorted(values, QUANTILES, native=native)
    assert_bitwise(result, numpy_quantiles(values, QUANTILES))
    # q = 0 / 1 are the smallest / largest valid value; q = 0.5 is the median up to rounding (NumPy's own
    # nanquantile(0.5) lerps a + (b - a) / 2 in float64, nanmedian takes (a + b) / 2 in the input dtype: apart by
    # the rounding of b - a, an ulp of the larger value, not of their mean, which may be near 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert_bitwise(result[0], np.nanmin(values, axis=0))
        assert_bitwise(result[-1], np.nanmax(values, axis=0))
    np.testing.assert_allclose(result[2], numpy_median(values), rtol=2 * np.finfo(dtype).eps,
                               atol=2 * np.finfo(dtype).eps * np.nanmax(np.abs(values)), equal_nan=True)


@ENGINES
def test_blocks_edges_and_layouts(native):
    """Rows wider than a block, a chunk that is not a whole number of blocks, a non-contiguous view, all NaN."""
    wide = cloudy((5, 3, fastreduce.BLOCK_PIXELS + 7), np.float32, seed=1)
    assert_bitwise(fastreduce.nanmedian_time(wide, native=native), numpy_median(wide))
    ragged = cloudy((36, fastreduce.BLOCK_PIXELS // 100 + 3, 100), np.float32, seed=2)  # last block: 3 rows
    assert_bitwise(fastreduce.nanmedian_time(ragged, native=native), numpy_median(ragged))
    assert_bitwise(fastreduce.nanquantile_sorted(ragged, QUANTILES, native=native), numpy_quantiles(ragged, QUANTILES))
    view = cloudy((9, 40, 30), np.float64, seed=3).transpose(0, 2, 1)[::2, ::3]  # strided in every axis
    assert_bitwise(fastreduce.nanmedian_time(view, native=native), numpy_median(view))
    assert_bitwise(fastreduce.nanquantile_sorted(view, (0.9, 0.1), native=native), numpy_quantiles(view, (0.9, 0.1)))
    empty = np.full((4, 3, 2), np.nan, dtype=np.float32)
    assert np.isnan(fastreduce.nanmedian_time(empty, native=native)).all()
    assert np.isnan(fastreduce.nanquantile_sorted(empty, QUANTILES, native=native)).all()
    assert fastreduce.nanquantile_sorted(empty, (), native=native).shape == (0, 3, 2)
    deep = cloudy((300, 3, 4), np.float32, seed=6)  # more dates than a uint8 counter holds
    assert_bitwise(fastreduce.nanmedian_time(deep, native=native), numpy_median(deep))
    assert_bitwise(fastreduce.nanquantile_sorted(deep, QUANTILES, native=native), numpy_quantiles(deep, QUANTILES))
    for shape in ((3, 0, 4), (3, 4, 0)):  # no pixels (an empty edge chunk)
        assert fastreduce.nanmedian_time(np.ones(shape, np.float32), native=native).shape == shape[1:]
        assert fastreduce.nanquantile_sorted(np.ones(shape, np.float32), QUANTILES, native=native).shape == (5, *shape[1:])


def test_reduce_time_takes_the_fast_path_only_where_it_applies():
    assert fastreduce.supports(np.zeros((3, 2, 2), np.float32))
    assert not fastreduce.supports(np.zeros((0, 2, 2), np.float32))  # no dates: bottleneck's NaN
    assert not fastreduce.supports(np.zeros((3, 2, 2), np.int16))
    assert not fastreduce.supports(np.zeros((3, 2, 2), np.float16))  # NumPy's float16 median adds in float32
    values = cloudy((36, 64, 48), np.float32, seed=4)
    assert_bitwise(kernels.reduce_time(values, "median")[0], numpy_median(values))
    assert_bitwise(kernels.nanquantile_time(values, QUANTILES), numpy_quantiles(values, QUANTILES))
    assert np.isnan(kernels.reduce_time(np.empty((0, 2, 2), np.float32), "median")).all()


def test_fused_task_median_and_quantile_of_masked_ndvi():
    """The whole fused kernel (mask on SCL, NDVI, reduction) at 36 dates against NumPy on its own band series."""
    rng = np.random.default_rng(5)
    t, y, x = 36, 48, 40
    red = rng.integers(1, 4000, (t, y, x), dtype=np.uint16)
    nir = rng.integers(1, 6000, (t, y, x), dtype=np.uint16)
    scl = np.where(rng.random((t, y, x)) < 0.3, 9, 4).astype(np.uint8)  # ~30 % cloud
    scl[:, :4, :4] = 9  # always cloudy
    planes = kernels.Planes(raw=(red, nir, scl), covered=(None, None, None), nodata=np.zeros((t, 3)),
                            scale=np.full((t, 3), 1e-4), offset=np.zeros((t, 3)))
    bands = (("ndvi", parse_expression("(nir - red) / (nir + red)", ["red", "nir"])),)
    mask = parse_expression("scl == 9", ["scl"])
    common = dict(assets=("red", "nir", "scl"), mask=mask, masked_assets=("red", "nir"), bands=bands, dtype="float32")
    series = kernels.band_block(planes, kernels.Program(**common))[:, 0]
    assert np.isnan(series).mean() > 0.25 and np.isnan(series[:, :4, :4]).all()
    median = kernels.reduce_block(planes, kernels.Program(**common, reduce_method="median"))
    assert median.shape == (1, 1, 1, y, x)
    assert_bitwise(median[0, 0, 0], numpy_median(series))
    quantiles = kernels.reduce_block(planes, kernels.Program(**common, reduce_method="quantile", quantiles=QUANTILES))
    assert_bitwise(quantiles[0, :, 0], numpy_quantiles(series, QUANTILES))


def _series(dtype):
    # few distinct values (ties), NaN often enough to empty whole pixels, and some arbitrary floats (incl. +-0.0)
    pool = st.sampled_from([np.nan, np.nan, -2.0, -0.5, 0.0, -0.0, 1.0, 1.0, 3.25, 7.5])
    width = 32 if dtype == np.float32 else 64
    elements = st.one_of(pool, st.floats(-1e6, 1e6, allow_nan=False, width=width), st.just(np.nan))
    shapes = st.tuples(st.sampled_from(DEPTHS), st.integers(1, 4), st.integers(1, 5))
    return hnp.arrays(dtype, shapes, elements=elements)


_quantile_lists = st.lists(st.one_of(st.sampled_from(QUANTILES), st.floats(0, 1)), min_size=1, max_size=5)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@ENGINES
@given(values=_series(np.float32), quantiles=_quantile_lists)
def test_property_float32(values, quantiles, native):
    assert_bitwise(fastreduce.nanmedian_time(values, native=native), numpy_median(values))
    assert_bitwise(fastreduce.nanquantile_sorted(values, quantiles, native=native), numpy_quantiles(values, quantiles))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@ENGINES
@given(values=_series(np.float64), quantiles=_quantile_lists)
def test_property_float64(values, quantiles, native):
    assert_bitwise(fastreduce.nanmedian_time(values, native=native), numpy_median(values))
    assert_bitwise(fastreduce.nanquantile_sorted(values, quantiles, native=native), numpy_quantiles(values, quantiles))


@ENGINES
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_infinities_signed_zeros_and_nan_payloads(dtype, native):
    """+-inf sort among the values (a valid +inf is not a missing date), -0.0 / +0.0 tie, any NaN is missing."""
    rng = np.random.default_rng(9)
    pool = np.array([np.inf, -np.inf, 0.0, -0.0, 1.5, -2.0, np.nan, np.nan], dtype=dtype)
    values = rng.choice(pool, size=(12, 17, 19))
    values[:, 0, 0] = np.inf  # all +inf: the median is +inf, not NaN
    values[:, 0, 1] = [np.inf, -np.inf] * 6  # the mean of -inf and +inf: NaN, as NumPy
    huge = np.finfo(dtype).max
    values[:, 0, 2] = [huge, huge * 0.75] + [np.nan] * 10  # a + b overflows in the dtype: inf, as NumPy's mean
    bits = np.uint32 if dtype == np.float32 else np.uint64
    payload = values.view(bits).copy()
    payload[3, 1:4, 1:4] = np.array(np.nan, dtype).view(bits) | 1  # a NaN that is not np.nan's bit pattern
    payload[4, 1:4, 1:4] = np.array(-np.nan, dtype).view(bits)  # a negative NaN
    values = payload.view(dtype)
    assert_bitwise(fastreduce.nanmedian_time(values, native=native), numpy_median(values))
    assert_bitwise(fastreduce.nanquantile_sorted(values, QUANTILES, native=native), numpy_quantiles(values, QUANTILES))
    result = fastreduce.nanmedian_time(values, native=native)
    assert result[0, 0] == np.inf and np.isnan(result[0, 1]) and result[0, 2] == np.inf


def test_native_kernel_is_built_and_checks_its_arguments():
    """setup.py builds the kernel wherever a C compiler is (CI's machines have one): a silent fallback to NumPy
    would only show as a 3x slower median."""
    assert compiled.available(), "rasterflow._native was not built: is a C compiler installed?"
    from rasterflow import _native

    values = cloudy((6, 4, 5), np.float32, seed=1)
    with pytest.raises(ValueError, match="output"):
        _native.nanmedian(values, np.empty((4, 5), np.float64))  # the wrong dtype
    with pytest.raises(ValueError, match="output"):
        _native.nanmedian(values, np.empty((4, 4), np.float32))  # the wrong size
    with pytest.raises(TypeError, match="3-D"):
        _native.nanmedian(values[0], np.empty((5,), np.float32))
    with pytest.raises(TypeError, match="3-D"):
        _native.nanmedian(np.zeros(values.shape, np.int32), np.empty((4, 5), np.float32))
    with pytest.raises(ValueError, match="outside"):
        _native.nanquantile(values, [0.5, 1.5], np.empty((2, 4, 5), np.float32))
    out = np.empty((2, 4, 5), np.float32)[:, ::-1]  # not C-contiguous
    with pytest.raises((ValueError, BufferError)):
        _native.nanquantile(values, [0.5, 0.9], out)
    # series longer than the kernel takes go to NumPy, with the same values
    deep = cloudy((fastreduce.NATIVE_MAX_DATES + 1, 2, 2), np.float32, seed=2)
    assert_bitwise(fastreduce.nanmedian_time(deep), numpy_median(deep))


def bottleneck_reference(values: np.ndarray, method: str) -> np.ndarray:
    """What kernels.reduce_time computes without the compiled kernel (bottleneck; NaN sum where nothing is valid)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if method == "sum":
            return np.where((~np.isnan(values)).any(axis=0), bn.nansum(values, axis=0), np.nan).astype(values.dtype)
        if method == "count":
            return (~np.isnan(values)).sum(axis=0).astype(values.dtype)
        return {"mean": bn.nanmean, "min": bn.nanmin, "max": bn.nanmax}[method](values, axis=0)


def assert_same_bits_with_zeros(actual: np.ndarray, expected: np.ndarray) -> None:
    """assert_bitwise, and zeros with their sign too (min / max keep bottleneck's choice between -0.0 and +0.0)."""
    assert_bitwise(actual, expected)
    zeros = expected == 0
    np.testing.assert_array_equal(np.signbit(actual[zeros]), np.signbit(expected[zeros]))


@pytest.mark.parametrize("method", fastreduce.ONE_PASS)
@pytest.mark.parametrize("t", DEPTHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_one_pass_reductions_are_bottlenecks_bit_for_bit(method, t, dtype):
    values = cloudy((t, 21, 45), dtype, seed=t * 13)
    values[:, 3, 4] = 0.0  # ties of zeros of both signs: min / max keep the last of equal values, as bottleneck
    values[::2, 3, 4] = -0.0
    values[0, 4, 5], values[-1, 4, 6] = np.inf, -np.inf
    before = values.copy()
    result = fastreduce.one_pass_time(values, method, native=True)
    np.testing.assert_array_equal(values, before)
    assert result is not None
    assert_same_bits_with_zeros(result, bottleneck_reference(values, method))
    assert_same_bits_with_zeros(kernels.reduce_time(values, method)[0], bottleneck_reference(values, method))
    assert fastreduce.one_pass_time(values, method, native=False) is None  # the caller's bottleneck path


@pytest.mark.parametrize("method", fastreduce.ONE_PASS)
def test_one_pass_reductions_on_views_and_nan_payloads(method):
    base = cloudy((9, 40, 30), np.float64, seed=3)
    bits = base.view(np.uint64)
    bits[2, 5:9, 5:9] |= 1  # NaN payloads and a negative NaN are missing dates too
    bits[3, 5:9, 5:9] = np.array(-np.nan).view(np.uint64)
    view = base.transpose(0, 2, 1)[::2, ::3]  # strided in every axis
    result = fastreduce.one_pass_time(view, method, native=True)
    assert result is not None
    assert_same_bits_with_zeros(result, bottleneck_reference(view, method))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=_series(np.float32), method=st.sampled_from(fastreduce.ONE_PASS))
def test_property_one_pass(values, method):
    assert_same_bits_with_zeros(kernels.reduce_time(values, method)[0], bottleneck_reference(values, method))
