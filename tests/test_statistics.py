"""Several statistics from one read (issue 29, item 1): ``reduce`` as a list; each statistic equals its NumPy
reference from the same pixels, the variables are named ``{band}_{statistic}``, Zarr and COG (one multi-band file
per period, band descriptions naming the variables), every statistic computed in the same task (the items are read
once), and the spec errors of a list."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
import xarray as xr
from click.testing import CliRunner

from rasterflow.cli import cli
from rasterflow.spec import load_spec_text
from rasterflow.spec.models import statistic_name
from reference import assert_same, load_items, masked_ndvi, months, reduce_reference

LIST = "[{method: median}, {method: quantile, q: [0.1, 0.9]}, {method: count}, {method: mean}]"
NAMES = ("median", "q10", "q90", "count", "mean")


def _run(spec: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["run", str(spec)], catch_exceptions=False)
    return result.exit_code, result.output


def _expected(series: np.ndarray) -> dict[str, np.ndarray]:
    return {"median": reduce_reference(series, "median"), "q10": reduce_reference(series, "quantile", 0.1),
            "q90": reduce_reference(series, "quantile", 0.9), "count": (~np.isnan(series)).sum(axis=0),
            "mean": reduce_reference(series, "mean")}


def _check(actual: np.ndarray, name: str, expected: np.ndarray) -> None:
    if name == "count":
        np.testing.assert_array_equal(actual, expected)
        assert expected.max() >= 2 and expected.min() < expected.max()  # a count that varies: not a constant
    else:
        assert_same(actual, expected, rtol=1e-5 if name.startswith("q") else 2e-6)


def test_statistic_names():
    assert [statistic_name("median"), statistic_name("quantile", 0.1), statistic_name("quantile", 0.9),
            statistic_name("quantile", 0.025), statistic_name("quantile", 0.5)] == [
        "median", "q10", "q90", "q2_5", "q50"]


def test_several_statistics_from_one_read_to_zarr_equal_numpy(write_spec, sample, tmp_path):
    spec = write_spec(reduce=LIST, output="out/stats.zarr",
                      bands='{ndvi: "(nir - red) / (nir + red)", nir_ref: "nir"}')
    code, output = _run(spec)
    assert code == 0, output
    report = json.loads((tmp_path / "out" / "stats.zarr.report.json").read_text())
    items = load_items(sample, report["item_ids"])
    expected = _expected(masked_ndvi(items))
    with xr.open_zarr(tmp_path / "out" / "stats.zarr") as ds:
        assert sorted(ds.data_vars) == sorted(f"{b}_{n}" for b in ("ndvi", "nir_ref") for n in NAMES)
        for name in NAMES:
            _check(ds[f"ndvi_{name}"].values, name, expected[name])
            assert ds[f"ndvi_{name}"].dims == ("y", "x")
        assert ds["ndvi_q10"].attrs["rasterflow_quantile"] == 0.1
        assert ds["ndvi_median"].attrs["rasterflow_statistic"] == "median"
    # the STAC Item: a raster:bands entry per variable, with that variable's statistics
    from rasterflow.write.stac import item_path

    item = json.loads(Path(item_path(str(tmp_path / "out" / "stats.zarr"))).read_text())
    bands = {b["name"]: b for b in item["assets"]["data"]["raster:bands"]}
    assert sorted(bands) == sorted(f"{b}_{n}" for b in ("ndvi", "nir_ref") for n in NAMES)
    assert bands["ndvi_count"]["statistics"]["maximum"] == expected["count"].max()
    assert item["properties"]["rasterflow:method"] == "median+q10+q90+count+mean"
    # one task per chunk made every statistic: the plan's task count is that of a single statistic's graph
    single = write_spec(reduce="{method: median}", output="out/single.zarr",
                        bands='{ndvi: "(nir - red) / (nir + red)", nir_ref: "nir"}')
    plans = [CliRunner().invoke(cli, ["plan", "--json", str(p)]) for p in (spec, single)]
    tasks = [json.loads(p.output)["budget"]["task_count"] for p in plans]
    assert tasks[0] >= tasks[1]


def test_several_statistics_per_month_to_cog_one_file_per_period(write_spec, sample, tmp_path):
    spec = write_spec(reduce="[{method: median, period: month}, {method: count}, {method: quantile, q: 0.9}]",
                      output="out/stats.tif")
    code, output = _run(spec)
    assert code == 0, output
    report = json.loads((tmp_path / "out" / "stats.tif.report.json").read_text())
    items = load_items(sample, report["item_ids"])
    series, labels = masked_ndvi(items), np.array(months(items))
    assert len(set(labels)) >= 3
    for month in sorted(set(labels)):
        expected = _expected(series[labels == month])
        with rasterio.open(tmp_path / "out" / f"stats_{month}.tif") as src:
            assert src.descriptions == ("ndvi_median", "ndvi_count", "ndvi_q90")
            for band, name in enumerate(("median", "count", "q90"), start=1):
                _check(src.read(band), name, expected[name])


@pytest.mark.parametrize("reduce,field,words", [
    ("[{method: median}, {method: median}]", "reduce.1.method", "listed twice"),
    ("[{method: quantile, q: [0.1, 0.5]}, {method: quantile, q: 0.5}]", "reduce.1.q", "quantile 0.5 is listed twice"),
    ("[{method: median, period: month}, {method: count, period: year}]", "reduce.1.period", "give period once"),
    ("[]", "reduce", "at least 1"),
])
def test_a_bad_list_is_refused_with_its_line(sample, tmp_path, reduce, field, words):
    from conftest import spec_text

    text = spec_text(sample, reduce=reduce)
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert field in result.output and words in result.output, result.output
    line = next(i for i, text_line in enumerate(text.splitlines(), start=1) if text_line.startswith("reduce:"))
    assert f"bad.yaml:{line}" in result.output, result.output


def test_time_chunked_with_a_list_is_refused_with_the_fix(sample):
    from conftest import spec_text

    with pytest.raises(Exception) as caught:
        load_spec_text(spec_text(sample, reduce="[{method: mean}, {method: count}]",
                                 chunks="{time: 2, y: 96, x: 96}"))
    assert "chunks.time: -1" in str(caught.value)


def test_several_statistics_per_month_with_solar_day_passes_to_tiles(two_tile_sample, tmp_path):
    """The combination: a list of statistics, a period, group_by: solar_day (each pass's two tiles mosaicked
    first) and a tiled COG output; every statistic of every month against NumPy over the mosaicked passes."""
    from conftest import spec_text
    from test_run_e2e import _mosaic_reference

    sample = two_tile_sample
    spec = tmp_path / "s.yaml"
    spec.write_text(spec_text(sample, output="out/t.tif", group_by="solar_day",
                              reduce="[{method: median, period: month}, {method: count}]",
                              chunks="{time: -1, y: 64, x: 64}") + "")
    text = spec.read_text().replace("output: {path: out/t.tif}", "output: {path: out/t.tif, tiling: {size: 128}}")
    spec.write_text(text)
    code, output = _run(spec)
    assert code == 0, output
    expected, dates = _mosaic_reference(sample)
    labels = np.array([d[:7] for d in dates])
    import rioxarray  # noqa: F401

    for month in sorted(set(labels)):
        vrt = tmp_path / "out" / f"t_{month}.vrt"
        with rasterio.open(vrt) as src:
            assert src.descriptions == ("ndvi_median", "ndvi_count")
            median, count = src.read(1), src.read(2)
        series = expected[labels == month]
        np.testing.assert_array_equal(count, (~np.isnan(series)).sum(axis=0))
        assert_same(median, reduce_reference(series, "median"))
    assert len(set(labels)) >= 2
