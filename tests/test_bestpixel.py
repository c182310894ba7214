"""rasterflow.bestpixel: best-pixel composites against a plain NumPy loop."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from rasterflow.bestpixel import best_index, best_pixel, best_work_bytes, select_dates


def loop_reference(by: np.ndarray, bands: np.ndarray, order: str) -> tuple[np.ndarray, np.ndarray]:
    """Pixel by pixel, date by date: the first date with the strictly best valid value."""
    n_time, height, width = by.shape
    index = np.full((height, width), -1)
    out = np.full((bands.shape[0], height, width), np.nan)
    for row in range(height):
        for col in range(width):
            best = None
            for t in range(n_time):
                value = float(by[t, row, col])
                if math.isnan(value):
                    continue
                if best is None or (value > best if order == "max" else value < best):
                    best, index[row, col] = value, t
            if index[row, col] >= 0:
                out[:, row, col] = bands[:, index[row, col], row, col]
    return index, out


def sample(t: int, b: int, y: int, x: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    by = rng.integers(0, 6, size=(t, y, x)).astype(np.float32) / 5   # few distinct values: many ties
    by[rng.random((t, y, x)) < 0.35] = np.nan
    by[:, 0, 0] = np.nan                                               # no valid date
    bands = rng.normal(size=(b, t, y, x)).astype(np.float32)
    bands[rng.random((b, t, y, x)) < 0.05] = np.nan                    # a band NaN at some dates
    return by, bands


@pytest.mark.parametrize("order", ["max", "min"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_a_loop(order, seed):
    by, bands = sample(9, 3, 11, 7, seed)
    index, expected = loop_reference(by, bands, order)
    np.testing.assert_array_equal(best_index(by, order), index)
    out = best_pixel(by, bands, order)
    assert out.dtype == np.float32 and out.shape == (3, 11, 7)
    np.testing.assert_array_equal(out, expected.astype(np.float32))
    np.testing.assert_array_equal(best_pixel(by, [bands[b] for b in range(3)], order), out)


def test_against_nanargmax():
    by, bands = sample(12, 2, 6, 5, 3)
    usable = ~np.isnan(by).all(axis=0)
    index = best_index(by, "max")
    np.testing.assert_array_equal(index[usable], np.nanargmax(by[:, usable], axis=0))
    np.testing.assert_array_equal(best_index(by, "min")[usable], np.nanargmin(by[:, usable], axis=0))


def test_ties_go_to_the_earliest_date_and_all_nan_is_nan():
    by = np.array([[[np.nan, 1.0, 2.0, np.nan]], [[np.nan, 1.0, 5.0, 3.0]], [[np.nan, 0.5, 5.0, 3.0]]],
                  dtype=np.float32)                                    # (3 dates, 1, 4)
    bands = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 1, 4)
    assert best_index(by, "max").tolist() == [[-1, 0, 1, 1]]
    assert best_index(by, "min").tolist() == [[-1, 2, 0, 1]]
    out = best_pixel(by, bands, "max")
    assert np.isnan(out[:, 0, 0]).all()
    np.testing.assert_array_equal(out[:, 0, 1:], bands[:, [0, 1, 1], 0, [1, 2, 3]])


def test_infinities_compare_as_numbers():
    by = np.array([[[-np.inf, 1.0]], [[-np.inf, np.inf]], [[np.nan, np.nan]]])
    assert best_index(by, "max").tolist() == [[0, 1]]   # -inf is a value: the first one wins, not "no date"
    assert best_index(by, "min").tolist() == [[0, 0]]


def test_integer_bands_become_float32_and_integer_by_works():
    by = np.array([[[3, 1]], [[5, 1]]], dtype=np.int16)
    bands = np.array([[[[10, 20]], [[30, 40]]]], dtype=np.uint16)     # (1 band, 2 dates, 1, 2)
    out = best_pixel(by, bands, "max")
    assert out.dtype == np.float32 and out.tolist() == [[[30.0, 20.0]]]
    assert best_pixel(by.astype(np.float64), bands.astype(np.float64)).dtype == np.float64


def test_no_dates_and_bad_input():
    empty = best_pixel(np.empty((0, 2, 2), np.float32), np.empty((1, 0, 2, 2), np.float32))
    assert empty.shape == (1, 2, 2) and np.isnan(empty).all()
    with pytest.raises(ValueError, match="order must be 'max' or 'min'"):
        best_index(np.zeros((1, 1, 1)), "largest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected by as \\(time, y, x\\)"):
        best_index(np.zeros((1, 1)))
    with pytest.raises(ValueError, match="bands have 2 dates, by has 3"):
        best_pixel(np.zeros((3, 1, 1)), np.zeros((1, 2, 1, 1)))
    with pytest.raises(ValueError, match="do not match"):
        select_dates(np.zeros((1, 2, 3, 3)), np.zeros((2, 2), dtype=np.intp))


def test_working_memory_is_planes_not_date_deep():
    """tracemalloc: the work arrays are (y, x) planes whatever the number of dates (no (band, time, y, x) copy)."""
    height = width = 256
    for n_time in (4, 40):
        by, bands = sample(n_time, 4, height, width, 4)
        best_pixel(by[:, :1], bands[:, :, :1])
        tracemalloc.start()
        try:
            best_pixel(by, bands, "max")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        output = 4 * 4 * height * width
        assert 0.7 * best_work_bytes(height * width) <= peak - output <= best_work_bytes(height * width), (
            n_time, peak - output)
