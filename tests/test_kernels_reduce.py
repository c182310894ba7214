"""Unit tests for the time-reduction kernels in ``rasterflow.kernels``, checked against NumPy computed here.

The references are NumPy's own nan-functions (``np.nanmean``, ``np.nanmedian``, ...). The test computes them and
then applies the documented all-NaN rules itself, so nothing is shared with the kernel's implementation.
"""

from __future__ import annotations

import warnings
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rasterflow.kernels import nanquantile_time, reduce_time
from rasterflow.periods import label_of


def period_labels(times, period: str) -> list[str]:
    """Each date's period label, by rasterflow.periods (the one rule the planner uses)."""
    return [label_of(str(np.datetime_as_string(np.datetime64(t, "us"))), period) for t in times]


def group_indices(labels):
    """Distinct labels in order of first appearance and the indices of each (what the planner's groups are)."""
    order: dict = {}
    for index, label in enumerate(labels):
        order.setdefault(label, []).append(index)
    return tuple(order), tuple(tuple(v) for v in order.values())

DTYPES = (np.float32, np.float64)
METHODS = ("mean", "median", "min", "max", "std", "sum", "count")
EXACT_METHODS = {"min", "max", "count", "median"}
QUANTILES = (0.0, 0.1, 0.5, 0.9, 1.0)
TOLERANCE = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-12, atol=1e-12)}

# (t, y, x): an odd and an even time depth (the median of an even count averages two values) and a single date.
SHAPES = ((7, 4, 5), (8, 4, 5), (1, 4, 5))
NAN_FRACTIONS = (0.0, 0.3, 1.0)


def make_values(shape: tuple[int, int, int], dtype, nan_fraction: float, seed: int = 0) -> np.ndarray:
    """Random data with the given share of NaN; with some (not all) NaN, two pixels are NaN on every date."""
    rng = np.random.default_rng(seed)
    values = rng.normal(loc=2.0, scale=3.0, size=shape).astype(dtype)
    values[rng.random(shape) < nan_fraction] = np.nan
    if 0 < nan_fraction < 1:
        values[:, 0, 0] = np.nan
        values[:, -1, 2] = np.nan
        values[:, 1, 1] = values[0, 1, 1] if not np.isnan(values[0, 1, 1]) else 1.5  # one pixel of ties, no NaN
    return values


def _seed(*key) -> int:
    """A seed per parameter set that is the same in every run (``hash`` of a str is salted per process)."""
    return zlib.crc32(repr(key).encode())


def all_nan(values: np.ndarray) -> np.ndarray:
    return np.isnan(values).all(axis=0)


def numpy_reference(values: np.ndarray, method: str) -> np.ndarray:
    """The independent reference, ``(y, x)``, with the documented all-NaN rules applied explicitly."""
    empty = all_nan(values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices, ddof warnings
        if method == "mean":
            result = np.nanmean(values, axis=0)
        elif method == "median":
            result = np.nanmedian(values, axis=0)
        elif method == "min":
            result = np.nanmin(values, axis=0)
        elif method == "max":
            result = np.nanmax(values, axis=0)
        elif method == "std":
            result = np.nanstd(values, axis=0, ddof=0)
        elif method == "sum":
            result = np.nansum(values, axis=0)
        elif method == "count":
            result = np.count_nonzero(~np.isnan(values), axis=0).astype(values.dtype)
        else:
            raise AssertionError(method)
    result = np.array(result, dtype=np.float64)
    if method == "count":
        result[empty] = 0
    else:
        result[empty] = np.nan  # np.nansum gives 0 there; the kernel's rule is NaN
    return result


def assert_matches(actual: np.ndarray, expected: np.ndarray, dtype, exact: bool) -> None:
    if exact:
        np.testing.assert_array_equal(actual, expected.astype(dtype))
    else:
        np.testing.assert_allclose(actual, expected, equal_nan=True, **TOLERANCE[dtype])
    # NaN exactly where the reference is NaN (assert_allclose(equal_nan=True) already implies it; be explicit).
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))


# ---------------------------------------------------------------------------------------------- reduce_time


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"t{s[0]}")
@pytest.mark.parametrize("nan_fraction", NAN_FRACTIONS, ids=lambda f: f"nan{int(f * 100)}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("method", METHODS)
def test_reduce_time_matches_numpy(method, dtype, nan_fraction, shape):
    values = make_values(shape, dtype, nan_fraction, seed=_seed(method, nan_fraction, shape))
    before = values.copy()
    result = reduce_time(values, method)
    np.testing.assert_array_equal(values, before)  # the input is not modified
    assert result.shape == (1, *shape[1:])
    assert result.dtype == np.dtype(dtype)
    assert_matches(result[0], numpy_reference(values, method), dtype, exact=method in EXACT_METHODS)


@pytest.mark.parametrize("quantiles", [(q,) for q in QUANTILES] + [QUANTILES, (0.9, 0.1, 0.5)],
                         ids=lambda qs: "q" + "-".join(str(q) for q in qs))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"t{s[0]}")
@pytest.mark.parametrize("nan_fraction", NAN_FRACTIONS, ids=lambda f: f"nan{int(f * 100)}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_reduce_time_quantile_matches_numpy(dtype, nan_fraction, shape, quantiles):
    values = make_values(shape, dtype, nan_fraction, seed=_seed(quantiles, nan_fraction, shape))
    result = reduce_time(values, "quantile", quantiles)
    assert result.shape == (len(quantiles), *shape[1:])
    assert result.dtype == np.dtype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = np.nanquantile(values.astype(np.float64), list(quantiles), axis=0, method="linear")
    for index, q in enumerate(quantiles):
        # q = 0 and q = 1 are the smallest and largest valid value: taken from the data, so exact.
        if q in (0.0, 1.0):
            np.testing.assert_array_equal(result[index], expected[index].astype(dtype))
        else:
            np.testing.assert_allclose(result[index], expected[index], equal_nan=True, **TOLERANCE[dtype])
        np.testing.assert_array_equal(np.isnan(result[index]), all_nan(values))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("method", METHODS + ("quantile",))
def test_all_nan_pixels_follow_the_documented_rule(method, dtype):
    """NaN for every method on a pixel with no valid date, except count (0); sum is NaN, not 0."""
    values = np.full((5, 2, 3), np.nan, dtype=dtype)
    values[:, 0, 0] = [1, 2, np.nan, 4, 0]  # one pixel with data, to make sure the rule is per pixel
    quantiles = QUANTILES if method == "quantile" else ()
    result = reduce_time(values, method, quantiles)
    assert result.dtype == np.dtype(dtype)
    assert result.shape == (len(quantiles) or 1, 2, 3)
    empty = np.ones((2, 3), dtype=bool)
    empty[0, 0] = False
    for plane in result:
        if method == "count":
            assert (plane[empty] == 0).all()
            assert plane[0, 0] == 4
        else:
            assert np.isnan(plane[empty]).all(), plane
            assert not np.isnan(plane[0, 0])
    if method == "sum":
        assert result[0, 0, 0] == 7


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_single_date_series(dtype):
    """t = 1: every statistic is the value itself (std 0, count 1), NaN stays NaN (count 0)."""
    values = np.array([[[1.25, np.nan, -3.5]]], dtype=dtype)
    expected = {
        "mean": [1.25, np.nan, -3.5], "median": [1.25, np.nan, -3.5], "min": [1.25, np.nan, -3.5],
        "max": [1.25, np.nan, -3.5], "sum": [1.25, np.nan, -3.5], "std": [0, np.nan, 0], "count": [1, 0, 1],
    }
    for method, row in expected.items():
        np.testing.assert_array_equal(reduce_time(values, method), np.array([[row]], dtype=dtype), err_msg=method)
    np.testing.assert_array_equal(reduce_time(values, "quantile", (0.0, 0.3, 1.0)),
                                  np.array([[[1.25, np.nan, -3.5]]] * 3, dtype=dtype))


def test_reduce_time_unknown_method_raises():
    with pytest.raises(ValueError):
        reduce_time(np.zeros((2, 1, 1)), "mode")


# ---------------------------------------------------------------------------------------------- nanquantile_time


def _quantile_arrays(dtype):
    # A small pool of values makes ties frequent; NaN is drawn often enough to empty whole pixels.
    pool = st.sampled_from([np.nan, np.nan, -2.0, -0.5, 0.0, 0.0, 1.0, 1.0, 3.25, 7.5])
    any_value = st.floats(-1e3, 1e3, allow_nan=False, width=32 if dtype == np.float32 else 64)
    elements = st.one_of(pool, any_value, st.just(np.nan))
    shapes = st.tuples(st.integers(1, 6), st.integers(1, 3), st.integers(1, 3))
    return hnp.arrays(dtype, shapes, elements=elements)


_quantile_lists = st.lists(st.one_of(st.sampled_from([0.0, 1.0, 0.5]), st.floats(0, 1)), min_size=1, max_size=5)


def _check_nanquantile(values: np.ndarray, quantiles: list[float]) -> None:
    result = nanquantile_time(values, quantiles)
    assert result.shape == (len(quantiles), *values.shape[1:])
    assert result.dtype == values.dtype
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = np.nanquantile(values.astype(np.float64), quantiles, axis=0, method="linear")
    eps = np.finfo(values.dtype).eps
    scale = float(np.nanmax(np.abs(values))) if not np.isnan(values).all() else 0.0
    np.testing.assert_allclose(result, expected, rtol=4 * eps, atol=4 * eps * scale + 1e-300, equal_nan=True)
    np.testing.assert_array_equal(np.isnan(result), np.broadcast_to(all_nan(values), result.shape))
    for index, q in enumerate(quantiles):
        if q in (0.0, 1.0):  # taken from the data: exact
            np.testing.assert_array_equal(result[index], expected[index].astype(values.dtype))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=_quantile_arrays(np.float64), quantiles=_quantile_lists)
def test_nanquantile_time_property_float64(values, quantiles):
    _check_nanquantile(values, quantiles)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=_quantile_arrays(np.float32), quantiles=_quantile_lists)
def test_nanquantile_time_property_float32(values, quantiles):
    _check_nanquantile(values, quantiles)


@settings(max_examples=60, deadline=None)
@given(values=_quantile_arrays(np.float64))
def test_nanquantile_time_bounds_and_median(values):
    """q = 0 / 0.5 / 1 are nanmin / nanmedian / nanmax, and quantiles never decrease with q."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        low, median, high = np.nanmin(values, axis=0), np.nanmedian(values, axis=0), np.nanmax(values, axis=0)
    result = nanquantile_time(values, [0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_array_equal(result[0], low)
    np.testing.assert_array_equal(result[4], high)
    np.testing.assert_allclose(result[2], median, rtol=1e-15, atol=1e-12, equal_nan=True)
    valid = ~all_nan(values)
    assert (np.diff(result[:, valid], axis=0) >= 0).all()


def test_nanquantile_time_ties_and_hand_values():
    values = np.array([1, 1, 1, 5, np.nan], dtype=np.float64).reshape(5, 1, 1)
    result = nanquantile_time(values, [0.0, 0.5, 0.75, 0.9, 1.0])
    # valid sorted [1, 1, 1, 5], positions q * 3: 0, 1.5, 2.25, 2.7, 3
    np.testing.assert_allclose(result[:, 0, 0], [1, 1, 1 + 0.25 * 4, 1 + 0.7 * 4, 5], rtol=1e-15)
    assert nanquantile_time(values, []).shape == (0, 1, 1)


# ---------------------------------------------------------------------------------------------- period_labels


def _dates(*strings: str) -> list[np.datetime64]:
    return [np.datetime64(s) for s in strings]


def test_period_labels_month():
    times = _dates("2023-12-31", "2024-01-01", "2024-02-29", "2024-06-15T10:30:00")
    assert period_labels(times, "month") == ["2023-12", "2024-01", "2024-02", "2024-06"]


def test_period_labels_season():
    times = _dates("2023-12-15", "2024-01-10", "2024-02-29", "2024-03-01", "2024-05-31", "2024-06-01",
                   "2024-08-31", "2024-09-01", "2024-11-30", "2024-12-01")
    assert period_labels(times, "season") == [
        "2024-DJF", "2024-DJF", "2024-DJF", "2024-MAM", "2024-MAM", "2024-JJA", "2024-JJA", "2024-SON", "2024-SON",
        "2025-DJF",
    ]


def test_period_labels_year():
    times = _dates("2023-12-31T23:59:59", "2024-01-01", "2024-12-31")
    assert period_labels(times, "year") == ["2023", "2024", "2024"]


def test_period_labels_datetime64_array_with_ns_precision():
    times = np.array(["2023-12-15T12:00:00", "2024-03-01T00:00:00"], dtype="datetime64[ns]")
    assert period_labels(times, "season") == ["2024-DJF", "2024-MAM"]
    assert period_labels(times, "month") == ["2023-12", "2024-03"]


@pytest.mark.parametrize("period", ["week", "Month", "", "decade"])
def test_period_labels_unknown_period_raises(period):
    with pytest.raises(ValueError):
        period_labels(_dates("2024-01-01"), period)


# ---------------------------------------------------------------------------------------------- group_indices


def test_group_indices_order_of_first_appearance():
    labels, indices = group_indices(["b", "a", "b", "c", "a", "a"])
    assert labels == ("b", "a", "c")
    assert indices == ((0, 2), (1, 4, 5), (3,))


def test_group_indices_single_and_empty():
    assert group_indices(["x"]) == (("x",), ((0,),))
    assert group_indices([]) == ((), ())


# ---------------------------------------------------------------------------------------------- grouping + reduce

# Hand-written month lists, independent of period_labels' season table.
SEASON_MONTHS = {"DJF": (12, 1, 2), "MAM": (3, 4, 5), "JJA": (6, 7, 8), "SON": (9, 10, 11)}


def _hand_masks(times: np.ndarray, period: str) -> dict[str, np.ndarray]:
    months = times.astype("datetime64[M]").astype(int) % 12 + 1
    years = times.astype("datetime64[Y]").astype(int) + 1970
    masks: dict[str, np.ndarray] = {}
    if period == "year":
        for year in (2023, 2024):
            masks[f"{year}"] = years == year
    else:
        for year in (2023, 2024, 2025):
            for season, month_list in SEASON_MONTHS.items():
                in_months = np.isin(months, month_list)
                if season == "DJF":  # December belongs to the following year's winter
                    mask = in_months & (((months == 12) & (years == year - 1)) | ((months != 12) & (years == year)))
                else:
                    mask = in_months & (years == year)
                masks[f"{year}-{season}"] = mask
    return {label: mask for label, mask in masks.items() if mask.any()}


@pytest.mark.parametrize("method", ["mean", "median", "sum", "count", "max"])
@pytest.mark.parametrize("period", ["season", "year"])
def test_grouped_reduction_matches_masked_numpy(period, method):
    rng = np.random.default_rng(42)
    # Sorted dates from Nov 2023 to Dec 2024, about every 9 days, so every season has several dates.
    times = np.datetime64("2023-11-03") + np.arange(0, 420, 9).astype("timedelta64[D]")
    values = rng.normal(size=(len(times), 3, 4))
    values[rng.random(values.shape) < 0.3] = np.nan
    values[:, 0, 0] = np.nan  # a pixel with no data at all

    labels, indices = group_indices(period_labels(times, period))
    masks = _hand_masks(times, period)
    assert list(labels) == list(masks)  # sorted dates -> labels in chronological order
    for label, index in zip(labels, indices):
        np.testing.assert_array_equal(np.flatnonzero(masks[label]), index)
        result = reduce_time(values[list(index)], method)
        expected = numpy_reference(values[masks[label]], method)
        assert_matches(result[0], expected, np.float64, exact=method in EXACT_METHODS)

    if period == "season":
        assert labels == ("2023-SON", "2024-DJF", "2024-MAM", "2024-JJA", "2024-SON", "2025-DJF")
    else:
        assert labels == ("2023", "2024")
