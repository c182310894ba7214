"""Geomedian + MADs and best-pixel composites end to end (issue 29, items 2 and 3): a run's output equals GA's
``geomad`` on the masked stack read independently with rasterio (odc-algo's call), and NumPy's nanargmax /
nanargmin selection for a best-pixel composite; the output variables; the spec errors."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import rasterio
import xarray as xr
from click.testing import CliRunner

from rasterflow.cli import cli
from reference import load_items, read_asset_stack

DROP = (3, 8, 9, 10)


def _run(spec) -> None:
    result = CliRunner().invoke(cli, ["run", str(spec)], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def _masked(items, assets):
    drop = np.isin(read_asset_stack(items, "scl"), DROP)
    return {a: np.where(drop, np.nan, read_asset_stack(items, a)).astype(np.float32) for a in assets}


def test_geomedian_with_mads_equals_geomad_on_the_masked_stack(write_spec, sample, tmp_path):
    import geomad

    spec = write_spec(reduce="{method: geomedian, bands: [red, green, nir]}", output="out/gm.zarr")
    _run(spec)
    report = json.loads((tmp_path / "out" / "gm.zarr.report.json").read_text())
    items = load_items(sample, report["item_ids"])
    planes = _masked(items, ("red", "green", "nir"))
    stack = np.stack([planes[a] for a in ("red", "green", "nir")], axis=1)  # (t, band, y, x)
    yxbt = np.ascontiguousarray(stack.transpose(2, 3, 1, 0))
    gm = geomad.nangeomedian_pcm(yxbt, maxiters=1000, eps=1e-4, num_threads=1, nocheck=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mads = [geomad.emad_pcm(yxbt, gm, num_threads=1), geomad.smad_pcm(yxbt, gm, num_threads=1),
                geomad.bcmad_pcm(yxbt, gm, num_threads=1)]
    count = np.isfinite(stack).all(axis=1).sum(axis=0)
    with xr.open_zarr(tmp_path / "out" / "gm.zarr") as ds:
        assert sorted(ds.data_vars) == sorted(["red", "green", "nir", "emad", "smad", "bcmad", "count"])
        np.testing.assert_array_equal(ds["count"].values, count)
        valid = count > 0
        assert valid.mean() > 0.9
        actual = np.stack([ds[name].values for name in ("red", "green", "nir")], axis=-1)  # (y, x, band)
        assert np.isnan(actual[~valid]).all()
        # geomad starts a pixel's iteration from its row neighbour's result, so a chunk edge inside a row (x = 96,
        # 192 here) changes where it starts; where the minimum is flat (two observations: every point between them
        # is a geometric median) that moves the answer. So: identical almost everywhere, and everywhere a sum of
        # distances to the observations as small as geomad's on the whole tile
        same = (actual == gm).all(axis=-1) & valid
        assert same.sum() > 0.95 * valid.sum()
        points = stack.transpose(2, 3, 0, 1)  # (y, x, t, band)

        def total_distance(centre):
            with np.errstate(invalid="ignore"):
                return np.nansum(np.linalg.norm(points - centre[:, :, None, :], axis=-1), axis=-1)

        assert (total_distance(actual)[valid] <= total_distance(gm)[valid] * (1 + 1e-3) + 1e-6).all()
        for name, expected in zip(("emad", "smad", "bcmad"), mads):
            np.testing.assert_allclose(ds[name].values[same], expected[same], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("order", ["max", "min"])
def test_best_pixel_takes_every_band_from_the_date_of_the_best_ndvi(write_spec, sample, tmp_path, order):
    spec = write_spec(reduce=f"{{method: best, by: ndvi, order: {order}}}", output="out/best.tif",
                      bands='{ndvi: "(nir - red) / (nir + red)", nir_out: "nir * 1"}')
    _run(spec)
    report = json.loads((tmp_path / "out" / "best.tif.report.json").read_text())
    items = load_items(sample, report["item_ids"])
    planes = _masked(items, ("red", "nir"))
    with np.errstate(divide="ignore", invalid="ignore"):
        ndvi = ((planes["nir"] - planes["red"]) / (planes["nir"] + planes["red"])).astype(np.float32)
    valid = np.isfinite(ndvi).any(axis=0)
    filled = np.where(np.isnan(ndvi), -np.inf if order == "max" else np.inf, ndvi)
    index = filled.argmax(axis=0) if order == "max" else filled.argmin(axis=0)  # ties: the first date
    pick = lambda series: np.where(valid, np.take_along_axis(series, index[None], axis=0)[0], np.nan)  # noqa: E731
    with rasterio.open(tmp_path / "out" / "best.tif") as src:
        assert src.descriptions == ("ndvi", "nir_out")
        np.testing.assert_array_equal(src.read(1), pick(ndvi))
        np.testing.assert_array_equal(src.read(2), pick(planes["nir"]))
    assert valid.mean() > 0.9


@pytest.mark.parametrize("reduce,field,words", [
    ("{method: geomedian, bands: [red]}", "reduce.bands", "at least two bands"),
    ("{method: geomedian, bands: [red, swir]}", "reduce.bands.1", "'swir' is neither an asset nor a band"),
    ("{method: best}", "reduce.method", "needs by"),
    ("{method: best, by: evi}", "reduce.by", "names nothing"),
    ("[{method: median}, {method: geomedian, bands: [red, nir]}]", "reduce.1.method", "give it alone"),
    ("{method: median, by: ndvi}", "reduce.by", "only used with method: best"),
])
def test_bad_composites_are_refused_with_the_line(sample, tmp_path, reduce, field, words):
    from conftest import spec_text

    text = spec_text(sample, reduce=reduce)
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    line = next(i for i, t in enumerate(text.splitlines(), start=1) if t.startswith("reduce:"))
    assert f"bad.yaml:{line}" in result.output and field in result.output and words in result.output, result.output


def test_a_geomedian_with_time_chunked_is_refused_with_the_fix(sample, tmp_path):
    from conftest import spec_text

    path = tmp_path / "bad.yaml"
    path.write_text(spec_text(sample, reduce="{method: geomedian, bands: [red, nir]}", chunks="{time: 2, y: 96, x: 96}"))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2 and "chunks.time: -1" in result.output, result.output
