"""Per-asset resampling (issue 30, item 1): on a warped grid (another UTM zone) with ``grid.resampling: bilinear``
the SCL asset the mask reads is resampled nearest (its classes kept: every output value is a class of the source
files), the reflectances bilinear; ``plan`` says so; an interpolating method forced on SCL warns, naming it."""

from __future__ import annotations

import json
import re

import numpy as np
import rasterio
import xarray as xr
from click.testing import CliRunner

from rasterflow.cli import cli
from reference import load_items


def _warped_spec(sample, tmp_path, extra_overrides: str = "") -> str:
    from conftest import spec_text

    text = spec_text(sample, output="out/w.zarr", reduce="{method: max}",
                     bands='{ndvi: "(nir - red) / (nir + red)", scl_out: "scl * 1"}', mask='"scl in (3, 8, 9, 10)"',
                     chunks="{time: -1, y: 128, x: 128}")
    text = text.replace("crs: EPSG:32633", "crs: EPSG:32632").replace("resolution: 10",
                                                                       "resolution: 10\n  resampling: bilinear")
    text = re.sub(r"\n  bounds: \[[^\]]*\]", "", text)  # the grid from the bbox, in the other zone
    if extra_overrides:
        text = text.replace("  assets: {red: red, nir: nir, green: green, scl: scl}",
                            "  assets: {red: red, nir: nir, green: green, scl: scl}\n"
                            f"  overrides: {extra_overrides}")
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return str(path)


def _source_classes(sample) -> set[float]:
    classes: set[float] = set()
    for item in load_items(sample):
        with rasterio.open(item["assets"]["scl"]["href"]) as src:
            classes |= set(np.unique(src.read(1)).astype(float).tolist())
    return classes


def test_the_mask_asset_is_resampled_nearest_on_a_warped_grid(sample, tmp_path):
    spec = _warped_spec(sample, tmp_path)
    planned = CliRunner().invoke(cli, ["plan", "--json", spec])
    assert planned.exit_code == 0, planned.output
    assets = json.loads(planned.output)["assets"]
    assert any("resampling nearest (categorical: the mask reads it), not grid.resampling bilinear" in line
               for line in assets["scl"]["applied"]), assets["scl"]
    assert any("resampling bilinear (grid.resampling)" in line for line in assets["red"]["applied"])
    result = CliRunner().invoke(cli, ["run", spec], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with xr.open_zarr(tmp_path / "out" / "w.zarr") as ds:
        values = ds["scl_out"].values
        ndvi = ds["ndvi"].values
    seen = set(np.unique(values[np.isfinite(values)]).tolist())
    assert seen and seen <= _source_classes(sample), seen - _source_classes(sample)
    assert np.isfinite(ndvi).mean() > 0.2  # the tile inside the bbox grid of the other zone


def test_an_interpolating_method_forced_on_the_mask_asset_warns_and_makes_non_classes(sample, tmp_path):
    spec = _warped_spec(sample, tmp_path, "{scl: {resampling: bilinear}}")
    planned = CliRunner().invoke(cli, ["plan", spec])
    assert planned.exit_code == 0, planned.output
    assert "asset 'scl' is categorical" in planned.output and "resampling is bilinear" in planned.output
    result = CliRunner().invoke(cli, ["run", spec], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with xr.open_zarr(tmp_path / "out" / "w.zarr") as ds:
        values = ds["scl_out"].values
    seen = set(np.unique(values[np.isfinite(values)]).tolist())
    assert seen - _source_classes(sample)  # what nearest prevents: values that are no class
