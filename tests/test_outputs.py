"""Issue 12: outputs GIS tools open and catalogs index.

Real runs over the sample scenes (real COGs), then the outputs opened the way users open them: GDAL through
rasterio (``ZARR:"path":/band``), xarray/rioxarray, rio-cogeo's validator, the official STAC JSON schemas (offline,
see tests/stac_schemas.py), and a second rasterflow run whose catalog is the first run's STAC items. Every number is
checked against the NumPy reference of tests/reference.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import rasterio
import rioxarray  # noqa: F401  (registers .rio)
import xarray as xr
from affine import Affine
from click.testing import CliRunner
from rio_cogeo.cogeo import cog_validate

from rasterflow import __version__
from rasterflow.cli import cli
from reference import assert_same, load_items, masked_ndvi, reduce_reference
from stac_schemas import validate_stac

pytestmark = pytest.mark.slow

SCALE = 0.0001


def _invoke(spec: Path):
    """``rasterflow run SPEC`` from the spec's folder (the run's state directory lands there, not in the checkout)."""
    with contextlib.chdir(spec.parent):
        return CliRunner().invoke(cli, ["run", str(spec)])


def _run(spec: Path) -> str:
    result = _invoke(spec)
    assert result.exit_code == 0, result.output
    return result.output


def _quantize(values: np.ndarray, scale: float = SCALE) -> np.ndarray:
    """What an int16 encoding with ``scale`` stores, decoded: the reference for an encoded output."""
    return np.where(np.isnan(values), np.nan, np.rint(values.astype(np.float64) / scale) * scale)


def _grid(sample) -> tuple[Affine, str]:
    minx, _, _, maxy = sample.bounds
    return Affine(10.0, 0.0, minx, 0.0, -10.0, maxy), "EPSG:32633"


def _stac_docs(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith((".stac-item.json", ".stac-collection.json")))


@pytest.fixture(scope="module")
def median_job(tmp_path_factory, sample):
    """The same masked NDVI median written as Zarr (default v2) and as COG (float32)."""
    from conftest import spec_text

    root = tmp_path_factory.mktemp("median")
    for name, path in (("zarr", "out/median.zarr"), ("cog", "out/median.tif")):
        (root / f"{name}.yaml").write_text(spec_text(sample, output=path, reduce="{method: median}"))
        _run(root / f"{name}.yaml")
    expected = reduce_reference(masked_ndvi(load_items(sample)), "median")
    return root / "out", expected


@pytest.fixture(scope="module")
def encoded_job(tmp_path_factory, sample):
    """Monthly NDVI quantiles 0.1/0.9 stored as int16 (scale 0.0001), as COGs and as Zarr, with COG options."""
    from conftest import spec_text

    root = tmp_path_factory.mktemp("encoded")
    reduce = "{method: quantile, q: [0.1, 0.9], period: month}"
    encoding = "encoding: {dtype: int16, scale: 0.0001, nodata: -32768}"
    (root / "cog.yaml").write_text(spec_text(sample, reduce=reduce, output="out/monthly.tif").replace(
        "output: {path: out/monthly.tif}",
        "output: {path: out/monthly.tif, " + encoding
        + ", cog: {blocksize: 128, overview_resampling: nearest, predictor: standard}}"))
    (root / "zarr.yaml").write_text(spec_text(sample, reduce=reduce, output="out/monthly.zarr").replace(
        "output: {path: out/monthly.zarr}", "output: {path: out/monthly.zarr, " + encoding + "}"))
    _run(root / "cog.yaml")
    _run(root / "zarr.yaml")
    items = load_items(sample)
    series = masked_ndvi(items)
    months = np.array([item["properties"]["datetime"][:7] for item in items])
    expected = {}
    for month in dict.fromkeys(months):
        for q in (0.1, 0.9):
            expected[(month, q)] = reduce_reference(series[months == month], "quantile", q)
    return root / "out", expected, items


# --------------------------------------------------------------------------------------------------------------------
# Zarr: GDAL and xarray agree with the COG of the same job


def test_zarr_opens_in_gdal_and_xarray_like_the_cog(median_job, sample):
    out, expected = median_job
    transform, crs = _grid(sample)
    with rasterio.open(out / "median.tif") as cog:
        cog_values = cog.read(1)
        assert cog.crs == rasterio.crs.CRS.from_string(crs) and cog.transform == transform
    assert_same(cog_values, expected)
    zarr_path = out / "median.zarr"
    assert json.loads((zarr_path / ".zgroup").read_text())["zarr_format"] == 2  # the default GDAL opens
    with rasterio.open(f'ZARR:"{zarr_path}":/ndvi') as src:  # GDAL's Zarr driver inside the rasterio wheel
        assert src.driver == "Zarr"
        assert src.crs == rasterio.crs.CRS.from_string(crs)
        assert src.transform == transform
        assert np.isnan(src.nodata)
        gdal_values = src.read(1)
        assert src.tags()["long_name"] == "ndvi"
    np.testing.assert_array_equal(gdal_values, cog_values)
    with rasterio.open(f'ZARR:"{zarr_path}"') as group:  # band names: the subdatasets GDAL lists
        assert any(name.endswith(":/ndvi") for name in group.subdatasets)
    with rasterio.open(f'ZARR:"{zarr_path}":/ndvi') as src:
        assert src.tags()["rasterflow_expression"] == "(nir - red) / (nir + red)"

    ds = xr.open_zarr(zarr_path)
    assert list(ds.data_vars) == ["ndvi"]
    assert ds.rio.crs == rasterio.crs.CRS.from_string(crs)
    assert ds.rio.transform() == transform
    assert ds["ndvi"].attrs["grid_mapping"] == "spatial_ref" or ds["ndvi"].encoding.get("grid_mapping") == "spatial_ref"
    np.testing.assert_array_equal(ds["ndvi"].values, cog_values)
    assert ds.attrs["rasterflow_item_count"] == len(load_items(sample))
    assert ds.attrs["rasterflow_expressions"] == {"ndvi": "(nir - red) / (nir + red)"}


def test_encoded_outputs_decode_to_physical_values_in_every_reader(encoded_job):
    out, expected, _items = encoded_job
    ds = xr.open_zarr(out / "monthly.zarr")  # CF decoding: scale_factor, add_offset, _FillValue
    ds = ds.assign_coords(period=ds["period_label"].values)  # select by the labels the COG files are named by
    assert ds["ndvi"].encoding["dtype"] == np.int16 and ds["ndvi"].encoding["scale_factor"] == SCALE
    zarr_path = out / "monthly.zarr"
    with rasterio.open(f'ZARR:"{zarr_path}":/ndvi') as src:  # (period, quantile, y, x): one GDAL band per entry
        assert src.dtypes[0] == "int16" and src.nodata == -32768 and src.scales[0] == SCALE
        gdal_raw = src.read()
        band_tags = [src.tags(b) for b in range(1, src.count + 1)]
    for (month, q), reference in expected.items():
        physical = ds["ndvi"].sel(period=month, quantile=q).values
        assert_same(physical, _quantize(reference), atol=SCALE * 1.01, rtol=0)
        path = out / f"monthly_{month}_q{q:g}.tif"
        with rasterio.open(path) as cog:
            assert cog.dtypes == ("int16",) and cog.nodata == -32768
            assert cog.scales == (SCALE,) and cog.offsets == (0.0,)
            raw = cog.read(1)
            decoded = np.where(raw == cog.nodata, np.nan, raw * cog.scales[0] + cog.offsets[0])
        assert_same(decoded, _quantize(reference), atol=SCALE * 1.01, rtol=0)
        # GDAL's bands: period-major, then quantile (the period coordinate holds datetimes, GDAL shows their offsets)
        quantiles = sorted({k[1] for k in expected})
        band = list(ds["period"].values).index(month) * len(quantiles) + quantiles.index(q)
        assert float(band_tags[band]["DIM_quantile_VALUE"]) == q
        np.testing.assert_array_equal(gdal_raw[band], raw)  # GDAL reads the Zarr as the COG stores it


def test_encoding_that_cannot_hold_the_values_fails_the_run(tmp_path, sample):
    from conftest import spec_text

    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(sample, reduce="{method: median}", output="out/bad.tif").replace(
        "output: {path: out/bad.tif}", "output: {path: out/bad.tif, encoding: {dtype: uint8, scale: 0.01}}"))
    result = _invoke(spec)
    assert result.exit_code == 1
    assert "uint8" in result.output and "cannot hold" in result.output
    assert not (tmp_path / "out" / "bad.tif").exists()
    assert not (tmp_path / "out" / "bad.tif.stac-items.json").exists()


# --------------------------------------------------------------------------------------------------------------------
# COG: valid, encoded, described


def test_cogs_validate_and_carry_their_description(encoded_job, median_job):
    out, _expected, items = encoded_job
    months = {item["properties"]["datetime"][:7] for item in items}
    files = sorted(out.glob("monthly_*.tif"))
    assert [f.name for f in files] == sorted(f"monthly_{m}_q{q}.tif" for m in months for q in ("0.1", "0.9"))
    for path in files:
        valid, errors, warnings = cog_validate(str(path), strict=True)
        assert valid and not errors, (path, errors, warnings)
        with rasterio.open(path) as src:
            assert src.block_shapes == [(128, 128)]
            assert src.overviews(1) == [2]
            tags = src.tags()
            month = tags["period"]
            assert path.name.startswith(f"monthly_{month}_q")
            assert tags["rasterflow_method"] == "quantile"
            assert json.loads(tags["rasterflow_quantiles"]) == [0.1, 0.9]
            assert tags["rasterflow_version"] == __version__
            assert json.loads(tags["rasterflow_expressions"]) == {"ndvi": "(nir - red) / (nir + red)"}
            assert int(tags["rasterflow_item_count"]) == sum(i["properties"]["datetime"][:7] == month for i in items)
            assert tags["rasterflow_start_datetime"].startswith(max(f"{month}-01", "2024-06-01"))
            assert tags["rasterflow_end_datetime"][:7] == month
            assert src.tags(1)["rasterflow_expression"] == "(nir - red) / (nir + red)"
            assert src.descriptions == ("ndvi",)
    median_out, _ = median_job
    valid, errors, _ = cog_validate(str(median_out / "median.tif"), strict=True)
    assert valid and not errors
    with rasterio.open(median_out / "median.tif") as src:
        assert src.dtypes == ("float32",) and np.isnan(src.nodata)
        assert src.tags()["rasterflow_start_datetime"] == "2024-06-01T00:00:00Z"
        assert src.tags()["rasterflow_end_datetime"].startswith("2024-08-31T23:59:59")


# --------------------------------------------------------------------------------------------------------------------
# STAC


def test_stac_documents_validate_and_describe_the_files(encoded_job, median_job):
    out, _expected, items = encoded_job
    docs = _stac_docs(out)
    months = {item["properties"]["datetime"][:7] for item in items}
    assert len(docs) == 2 * len(months) + 1 + 2  # an item per COG, one for the Zarr, a collection for each run
    for doc in docs:
        validate_stac(json.loads(doc.read_text()))
    for doc in _stac_docs(median_job[0]):
        validate_stac(json.loads(doc.read_text()))

    collection = json.loads((out / "monthly.tif.stac-collection.json").read_text())
    item_links = [link["href"] for link in collection["links"] if link["rel"] == "item"]
    assert sorted(item_links) == sorted(str(p.resolve()) + ".stac-item.json" for p in out.glob("monthly_*.tif"))
    feature_collection = json.loads((out / "monthly.tif.stac-items.json").read_text())
    input_ids = {item["id"] for item in items}
    for path in sorted(out.glob("monthly_*.tif")):
        item = json.loads(path.with_name(path.name + ".stac-item.json").read_text())
        assert item["collection"] == "test-run"
        props = item["properties"]
        with rasterio.open(path) as src:
            assert props["proj:code"] == "EPSG:32633"
            assert props["proj:shape"] == [src.height, src.width]
            assert Affine(*props["proj:transform"]) == src.transform
            raw = src.read(1)
        asset = item["assets"]["data"]
        assert asset["href"] == str(path.resolve())
        data = path.read_bytes()
        assert asset["file:size"] == len(data)
        assert asset["file:checksum"] == "1220" + hashlib.sha256(data).hexdigest()
        (band,) = asset["raster:bands"]
        assert band["data_type"] == "int16" and band["nodata"] == -32768 and band["scale"] == SCALE
        valid = raw[raw != -32768].astype(np.float64)
        stats = band["statistics"]
        assert stats["minimum"] == valid.min() and stats["maximum"] == valid.max()
        assert stats["mean"] == pytest.approx(valid.mean(), rel=1e-9)
        assert stats["stddev"] == pytest.approx(valid.std(), rel=1e-6)
        assert stats["valid_percent"] == pytest.approx(100 * valid.size / raw.size)
        month = props["rasterflow:period"]
        assert props["start_datetime"][:7] == month == props["end_datetime"][:7]
        assert props["rasterflow:item_count"] == sum(i["properties"]["datetime"][:7] == month for i in items)
        assert props["processing:software"]["rasterflow"] == __version__
        assert props["processing:software"]["gdal"] == rasterio.__gdal_version__
        derived = [link for link in item["links"] if link["rel"] == "derived_from"]
        assert {link["title"] for link in derived} == input_ids
        assert item["id"] in {f["id"] for f in feature_collection["features"]}
    zarr_item = json.loads((out / "monthly.zarr.stac-item.json").read_text())
    assert zarr_item["assets"]["data"]["type"] == "application/vnd+zarr"
    assert zarr_item["assets"]["data"]["raster:bands"][0]["scale"] == SCALE


def test_stac_items_are_the_catalog_of_a_second_run(tmp_path, encoded_job):
    """Chain: the monthly 0.9-quantile COGs (int16, scaled) -> the mean over the months, against NumPy."""
    out, expected, items = encoded_job
    first = json.loads((out / "monthly.tif.stac-items.json").read_text())
    transform_values = first["features"][0]["properties"]["proj:transform"]
    height, width = first["features"][0]["properties"]["proj:shape"]
    minx, maxy = transform_values[2], transform_values[5]
    bbox = first["features"][0]["bbox"]
    spec = tmp_path / "chain.yaml"
    spec.write_text(f"""version: 1
name: chained
source:
  stac:
    catalog: {out / 'monthly.tif.stac-items.json'}
    collections: [test-run]
    bbox: {bbox}
    datetime: 2024-06-01/2024-08-31
    query: {{"rasterflow:quantile": {{eq: 0.9}}}}
  assets: {{p90: data}}
grid:
  crs: EPSG:32633
  resolution: 10
  bounds: [{minx}, {maxy - 10 * height}, {minx + 10 * width}, {maxy}]
chunks: {{time: -1, y: 128, x: 128}}
bands:
  p90_mean: "p90"
reduce: {{method: mean}}
output: {{path: out/p90_mean.tif}}
cluster: {{n_workers: 1, threads_per_worker: 1, memory_limit: 2GB}}
""")
    _run(spec)
    months = list(dict.fromkeys(item["properties"]["datetime"][:7] for item in items))
    stack = np.stack([_quantize(expected[(m, 0.9)]) for m in months]).astype(np.float32)
    reference = reduce_reference(stack, "mean")
    with rasterio.open(tmp_path / "out" / "p90_mean.tif") as src:
        result = src.read(1)
    # a median exactly between two stored steps may round either way (float32 in the run, float64 here): one
    # month off by one step moves the mean by SCALE / months; nearly every pixel agrees to float32 precision
    assert_same(result, reference, atol=SCALE / len(months) * 1.01, rtol=0)
    close = np.isclose(result, reference, atol=1e-6, rtol=1e-6) | np.isnan(reference)
    assert close.mean() > 0.999
    chained = json.loads((tmp_path / "out" / "p90_mean.tif.stac-item.json").read_text())
    validate_stac(chained)
    derived = {link["href"] for link in chained["links"] if link["rel"] == "derived_from"}
    assert derived == {str((out / f"monthly_{m}_q0.9.tif.stac-item.json").resolve()) for m in months}
    assert chained["properties"]["rasterflow:item_count"] == len(months)


def test_report_has_the_permissions_of_the_outputs(median_job):
    out, _ = median_job
    report = out / "median.tif.report.json"
    umask = os.umask(0)
    os.umask(umask)
    expected = 0o666 & ~umask
    assert (report.stat().st_mode & 0o777) == expected
    assert ((out / "median.tif").stat().st_mode & 0o777) == expected
    assert ((out / "median.tif.stac-item.json").stat().st_mode & 0o777) == expected


def test_the_stac_validator_rejects_broken_documents(median_job):
    """The offline validation is real (the official schemas, tests/schemas): each broken or misspelt field fails,
    and so does an extension without a schema."""
    import copy

    from pystac.errors import STACValidationError

    out, _ = median_job
    item = json.loads((out / "median.tif.stac-item.json").read_text())
    used = validate_stac(item)
    assert set(item["stac_extensions"]) <= set(used) and len(item["stac_extensions"]) == 4  # every extension checked
    breakages = {
        "proj:shape": lambda d: d["properties"].update({"proj:shape": ["256", 256]}),
        "misspelt proj:epgs": lambda d: d["properties"].update({"proj:epgs": 32633}),
        "misspelt asset raster:band": lambda d: d["assets"]["data"].update({"raster:band": [{"nodata": 0}]}),
        "raster nodata": lambda d: d["assets"]["data"]["raster:bands"][0].update({"nodata": "none"}),
        "valid_percent": lambda d: d["assets"]["data"]["raster:bands"][0]["statistics"].update(
            {"valid_percent": "99%"}),  # raster v1.1.0 sets no range (120 passes), only a number
        "file:checksum": lambda d: d["assets"]["data"].update({"file:checksum": "sha256:xyz"}),
        "processing:software": lambda d: d["properties"].update({"processing:software": {"gdal": 3}}),
        "collection link": lambda d: d.update({"links": [lk for lk in d["links"] if lk["rel"] != "collection"]}),
        "datetime": lambda d: d["properties"].update({"datetime": "yesterday"}),
    }
    for what, breakage in breakages.items():
        broken = copy.deepcopy(item)
        breakage(broken)
        with pytest.raises(STACValidationError):
            validate_stac(broken)
            pytest.fail(f"{what}: accepted")
    unknown = copy.deepcopy(item)
    unknown["stac_extensions"].append("https://stac-extensions.github.io/eo/v2.0.0/schema.json")
    with pytest.raises(AssertionError, match="no offline schema"):
        validate_stac(unknown)
