"""The grid mapping written without rioxarray (``rasterflow.georef``): the same attributes rioxarray writes, read back
by rioxarray and GDAL, and pyproj loaded only after the compute in a one-process run (issue 13, step 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import dask.array as da
import numpy as np
import pytest
import rasterio
import rioxarray  # noqa: F401  (the reference: .rio)
import xarray as xr
from affine import Affine

from rasterflow.georef import (
    GRID_MAPPING,
    cf_grid_mapping,
    crs_of,
    needs_cf,
    transform_of,
    with_transform,
    write_georef,
)
from rasterflow.write import write_zarr

from conftest import spec_text

CRSES = ["EPSG:32633", "EPSG:4326", "EPSG:3035", "EPSG:3857", "EPSG:32760"]


def _dataset(transform: Affine, shape=(40, 56)) -> xr.Dataset:
    rows, cols = shape
    y = transform.f + transform.e * (np.arange(rows) + 0.5)
    x = transform.c + transform.a * (np.arange(cols) + 0.5)
    values = np.arange(rows * cols, dtype="float32").reshape(shape) / (rows * cols)
    return xr.Dataset({"ndvi": (("y", "x"), da.from_array(values, chunks=(16, 16)))}, coords={"y": y, "x": x})


@pytest.mark.parametrize("crs", CRSES)
def test_the_grid_mapping_is_rioxarrays(crs):
    transform = Affine(10.0, 0.0, 380000.0, 0.0, -10.0, 5830000.0)
    plain = _dataset(transform)
    ours = write_georef(plain, crs, tuple(transform)[:6])
    theirs = plain.rio.write_crs(crs).rio.write_transform(transform)
    # rioxarray writes the CF parameters at once; rasterflow adds them when a store is finished
    completed = {**cf_grid_mapping(ours[GRID_MAPPING].attrs["crs_wkt"]), **ours[GRID_MAPPING].attrs}
    assert completed == theirs[GRID_MAPPING].attrs
    assert needs_cf(dict(ours[GRID_MAPPING].attrs))
    # a CRS that CF has no grid mapping for (EPSG:3857 as rasterio writes it) keeps its WKT only, as rioxarray's
    assert not needs_cf(completed) or completed.keys() == ours[GRID_MAPPING].attrs.keys()
    assert int(ours[GRID_MAPPING].values) == 0 and ours["ndvi"].attrs["grid_mapping"] == GRID_MAPPING
    # read back, by rasterflow and by rioxarray, from either dataset
    for dataset in (ours, theirs):
        assert crs_of(dataset) == rasterio.crs.CRS.from_user_input(crs)
        assert transform_of(dataset) == transform
    assert ours.rio.crs == theirs.rio.crs and ours.rio.transform() == theirs.rio.transform()
    # a window of the grid: only the GeoTransform changes
    window = with_transform(ours.isel(y=slice(8, 24), x=slice(16, 40)), tuple(transform @ Affine.translation(16, 8))[:6])
    assert transform_of(window) == transform @ Affine.translation(16, 8)
    assert window.rio.transform() == window.rio.transform(recalc=True)
    assert crs_of(window) == crs_of(ours)


def test_a_dataset_georeferenced_another_way_is_read_with_rioxarray():
    transform = Affine(20.0, 0.0, 100.0, 0.0, -20.0, 900.0)
    plain = _dataset(transform)
    assert crs_of(plain) is None
    assert transform_of(plain) == transform  # from the x / y coordinates, as rioxarray computes it
    other = plain.rio.write_crs("EPSG:3035", grid_mapping_name="crs")
    other = other.assign_coords(crs=other["crs"].copy(data=np.int64(0)))
    other["crs"].attrs.pop("GeoTransform", None)
    assert crs_of(other) == rasterio.crs.CRS.from_epsg(3035)
    assert transform_of(other) == transform


def test_a_finished_zarr_store_has_rioxarrays_grid_mapping(tmp_path):
    transform = Affine(10.0, 0.0, 380000.0, 0.0, -10.0, 5830000.0)
    plain = _dataset(transform)
    path = str(tmp_path / "g.zarr")
    write_zarr(write_georef(plain, "EPSG:32633", tuple(transform)[:6]), path, fingerprint="fp")
    with open(os.path.join(path, GRID_MAPPING, ".zattrs")) as f:
        stored = json.load(f)
    stored.pop("_ARRAY_DIMENSIONS")
    assert stored == dict(plain.rio.write_crs("EPSG:32633").rio.write_transform(transform)[GRID_MAPPING].attrs)
    with open(os.path.join(path, ".zmetadata")) as f:  # consolidated after the CF parameters were added
        assert json.load(f)["metadata"][f"{GRID_MAPPING}/.zattrs"]["grid_mapping_name"] == "transverse_mercator"
    out = xr.open_zarr(path)
    assert out.rio.crs.to_epsg() == 32633 and out.rio.transform() == transform
    with rasterio.open(f'ZARR:"{path}":/ndvi') as src:
        assert src.crs.to_epsg() == 32633 and src.transform == transform
        np.testing.assert_array_equal(src.read(1), plain["ndvi"].values)


@pytest.mark.slow
def test_a_one_process_run_loads_pyproj_only_after_the_compute(sample, tmp_path):
    """The grid is given in the spec's CRS and the files are on it: nothing before the compute needs pyproj, so a
    one-process run holds it (12 MB) only afterwards, for the CF parameters and the STAC footprints."""
    spec = tmp_path / "one.yaml"
    spec.write_text(spec_text(sample, reduce="{method: median}", output="out/one.zarr",
                              cluster="{n_workers: 1, threads_per_worker: 2, processes: false}"))
    probe = textwrap.dedent(f"""
        import sys
        import rasterflow.write.submit as submit
        seen = []
        run_units = submit.run_units
        def watched(*args, **kwargs):
            seen.append(sorted(m for m in ("pyproj", "rioxarray") if m in sys.modules))
            return run_units(*args, **kwargs)
        submit.run_units = watched
        from rasterflow.cli import cli
        try:
            cli(["run", {str(spec)!r}], prog_name="rasterflow")
        except SystemExit as end:
            print("SEEN", seen, "AFTER", "pyproj" in sys.modules, "EXIT", end.code)
    """)
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "SEEN [[]] AFTER True EXIT 0" in done.stdout, done.stdout + done.stderr
    out = xr.open_zarr(tmp_path / "out" / "one.zarr")
    assert out.rio.crs.to_epsg() == 32633
    assert out[GRID_MAPPING].attrs["grid_mapping_name"] == "transverse_mercator"
