"""An independent NumPy reference: read the sample COGs with rasterio, scale, mask and reduce with NumPy itself."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import rasterio


def load_items(sample, ids=None) -> list[dict]:
    items = json.loads(Path(sample.items_json).read_text())["features"]
    if ids is not None:
        items = [item for item in items if item["id"] in set(ids)]
    return sorted(items, key=lambda item: (item["properties"]["datetime"], item["id"]))


def read_asset_stack(items: list[dict], asset: str) -> np.ndarray:
    """(time, y, x) float32: raw values read with rasterio, nodata -> NaN, then scale and offset in float32."""
    planes = []
    for item in items:
        meta = item["assets"][asset]
        with rasterio.open(meta["href"]) as src:
            raw = src.read(1)
            nodata = src.nodata
        band = (meta.get("raster:bands") or [{}])[0]
        values = raw.astype(np.float32)
        if nodata is not None:
            values[raw == nodata] = np.nan
        scale, offset = band.get("scale", 1.0), band.get("offset", 0.0)
        if scale != 1 or offset != 0:
            values = values * np.float32(scale) + np.float32(offset)
        planes.append(values)
    return np.stack(planes)


def masked_ndvi(items: list[dict], drop_classes=(3, 8, 9, 10)) -> np.ndarray:
    red, nir, scl = (read_asset_stack(items, a) for a in ("red", "nir", "scl"))
    drop = np.isin(scl, drop_classes)
    red = np.where(drop, np.nan, red)
    nir = np.where(drop, np.nan, nir)
    with np.errstate(divide="ignore", invalid="ignore"):
        return ((nir - red) / (nir + red)).astype(np.float32)


def reduce_reference(series: np.ndarray, method: str, q=None) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if method == "median":
            return np.nanmedian(series, axis=0)
        if method == "mean":
            return np.nanmean(series, axis=0)
        if method == "quantile":
            return nanquantile_by_count(series, q)
        if method == "max":
            return np.nanmax(series, axis=0)
        if method == "min":
            return np.nanmin(series, axis=0)
        if method == "std":
            return np.nanstd(series, axis=0)
        if method == "count":
            return (~np.isnan(series)).sum(axis=0).astype(np.float32)
        if method == "sum":
            total = np.nansum(series, axis=0)
            return np.where((~np.isnan(series)).any(axis=0), total, np.nan)
    raise ValueError(method)


def nanquantile_by_count(series: np.ndarray, q) -> np.ndarray:
    """``np.nanquantile(series, q, axis=0)``, with NumPy's own ``np.quantile`` doing the arithmetic, a whole group
    of pixels at a time: pixels with the same number of valid values, those values gathered in front by a sort
    (NaN sorts last). ``np.nanquantile`` itself calls a Python function per pixel when any value is NaN (20 s of a
    test at 2 bands x 3 months of the sample); ``tests/test_reference.py`` holds the two equal."""
    n_quantiles = np.size(q)
    flat = series.reshape(series.shape[0], -1)
    ordered = np.sort(flat, axis=0)
    counts = (~np.isnan(flat)).sum(axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN first pixel
        dtype = np.nanquantile(flat[:, :1], q, axis=0).dtype  # NumPy's own promotion of the data and q
    out = np.full((n_quantiles, flat.shape[1]), np.nan, dtype=dtype)
    for count in np.unique(counts):
        if count == 0:
            continue  # all NaN: NaN, as np.nanquantile gives
        pixels = np.flatnonzero(counts == count)
        out[:, pixels] = np.quantile(ordered[:count, pixels], q, axis=0).reshape(n_quantiles, -1)
    out = out.reshape((n_quantiles, *series.shape[1:]))
    return out if np.ndim(q) else out[0]


def months(items: list[dict]) -> list[str]:
    return [item["properties"]["datetime"][:7] for item in items]


def assert_same(actual: np.ndarray, expected: np.ndarray, rtol: float = 2e-6, atol: float = 2e-6) -> None:
    actual = np.asarray(actual)
    expected = np.asarray(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg="NaN patterns differ")
    assert np.isfinite(expected).sum() > 0.5 * expected.size, "the reference is mostly NaN: a weak test"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
