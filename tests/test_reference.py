"""The test reference's own shortcuts equal the NumPy functions they stand in for."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from reference import nanquantile_by_count


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("q", [0.5, [0.1, 0.9], [0.0, 0.25, 1.0], np.array([0.33])])
def test_nanquantile_by_count_is_numpys_nanquantile(dtype, q):
    rng = np.random.default_rng(7)
    series = rng.normal(size=(9, 37, 23)).astype(dtype)
    series[rng.random(series.shape) < 0.35] = np.nan
    series[:, 0, :5] = np.nan  # pixels without one valid value
    series[:, 1, :7] = 0.5  # ties
    series[3:, 2, :3] = np.nan  # a few values only
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # All-NaN slice
        expected = np.nanquantile(series, q, axis=0)
    got = nanquantile_by_count(series, q)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
