"""Specs run end to end on real STAC items (tests/data/stac, see SOURCES.md) whose hrefs point at local COGs of
exactly the declared geometry (tests/real_items.py), compared pixel by pixel with an independent reference: every
asset warped onto the output grid by rasterio's ``WarpedVRT`` (nearest), nodata -> NaN, the catalog's scale/offset
as this test knows them, the mask and the band math in NumPy.

Covers: Earth Search v1 with ``earthsearch:boa_offset_applied`` (the offset is applied once, i.e. not at all), a
CDSE STAC 1.1 item with raster v2 fields (the offset is applied), 10 m reflectance with the 20 m SCL, SCL class 0
over valid reflectance, Planetary Computer tiles in two UTM zones mosaicked per pixel onto one grid and reduced on
a grid in a third zone, Landsat C2 L2 with a QA_PIXEL bit mask, and one spec through ``rasterflow run`` on a real
LocalCluster, read back from the written Zarr.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine
from rasterio.enums import Resampling
from rasterio.vrt import WarpedVRT
from rasterio.warp import transform_bounds
from real_items import load_item, materialize

from reference import assert_same


# --- building a job over materialized items ------------------------------------------------------------------------


class Grid:
    """An output grid: CRS, pixel size, bounds (minx, miny, maxx, maxy)."""

    def __init__(self, crs: str, resolution: float, origin: tuple[float, float], shape: tuple[int, int]):
        self.crs, self.resolution, self.shape = crs, resolution, shape
        x0, y1 = origin  # upper-left corner
        self.bounds = (x0, y1 - resolution * shape[0], x0 + resolution * shape[1], y1)
        self.transform = Affine(resolution, 0, x0, 0, -resolution, y1)


def _grid_around(crs: str, lon: float, lat: float, resolution: float, size: int) -> Grid:
    """A ``size``² grid in ``crs`` centred near (lon, lat), its corner snapped to the resolution."""
    from pyproj import Transformer

    x, y = Transformer.from_crs("EPSG:4326", crs, always_xy=True).transform(lon, lat)
    half = resolution * size / 2
    x0 = np.floor((x - half) / resolution) * resolution
    y1 = np.ceil((y + half) / resolution) * resolution
    return Grid(crs, resolution, (float(x0), float(y1)), (size, size))


def _materialize(name: str, assets: tuple[str, ...], grid: Grid, directory: Path, margin: float = 300.0) -> dict:
    """The item ``name`` with ``assets`` written where they cover ``grid`` (plus a margin), in the item's own CRS."""
    item = load_item(name)
    props = item["properties"]
    crs = props.get("proj:code") or (f"EPSG:{props['proj:epsg']}" if "proj:epsg" in props else None)
    crs = crs or item["assets"][assets[0]]["proj:code"]
    minx, miny, maxx, maxy = transform_bounds(grid.crs, crs, *grid.bounds, densify_pts=21)
    region = (minx - margin, miny - margin, maxx + margin, maxy + margin)
    return materialize(item, directory, assets, region)


def _write_job(tmp_path: Path, items: list[dict], assets: dict[str, str], grid: Grid, *, mask: str | None,
               bands: dict[str, str], reduce: str | None = None, group_by: str | None = None,
               chunks: str = "{time: -1, y: 64, x: 64}", output: str = "out/result.zarr",
               extra: str = "", source: str = "") -> Path:
    items_path = tmp_path / "items.json"
    items_path.write_text(json.dumps({"type": "FeatureCollection", "features": items}))
    west, south, east, north = transform_bounds(grid.crs, "EPSG:4326", *grid.bounds, densify_pts=21)
    days = sorted(item["properties"]["datetime"][:10] for item in items)
    lines = [
        "version: 1",
        "name: real-items",
        "source:",
        "  stac:",
        f"    catalog: {items_path}",
        f"    collections: [{', '.join(sorted({item['collection'] for item in items}))}]",
        f"    bbox: [{west - 0.001}, {south - 0.001}, {east + 0.001}, {north + 0.001}]",
        f"    datetime: {days[0]}/{days[-1]}",
        "  assets: {" + ", ".join(f"{alias}: {key}" for alias, key in assets.items()) + "}",
        *([f"  group_by: {group_by}"] if group_by else []),
        *([f"  {source}"] if source else []),
        "grid:",
        f"  crs: {grid.crs}",
        f"  resolution: {grid.resolution}",
        f"  bounds: {list(grid.bounds)}",
        f"chunks: {chunks}",
        *([f'mask: "{mask}"'] if mask else []),
        "bands:",
        *[f'  {name}: "{expression}"' for name, expression in bands.items()],
        *([f"reduce: {reduce}"] if reduce else []),
        f"output: {{path: {tmp_path / output}}}",
        "cluster: {n_workers: 1, threads_per_worker: 2, memory_limit: 2GB}",
    ]
    spec = tmp_path / "spec.yaml"
    spec.write_text("\n".join(lines) + "\n" + extra)
    return spec


def _plan(spec: Path):
    from rasterflow.planning import local_layout
    from rasterflow.commands import plan_with_items, search
    from rasterflow.spec import load_spec

    loaded = load_spec(spec)
    return plan_with_items(loaded, search(loaded), local_layout(loaded.spec))


def _compute(plan):
    import dask

    from rasterflow import graph

    with dask.config.set(scheduler="threads", num_workers=2):
        return graph.build_dataset(plan).compute()


# --- the independent reference ---------------------------------------------------------------------------------


def _warped_raw(href: str, grid: Grid) -> tuple[np.ndarray, float | None]:
    """The file's first band on ``grid`` (nearest) and its nodata, read by rasterio's WarpedVRT."""
    with rasterio.open(href) as src, WarpedVRT(
        src, crs=grid.crs, transform=grid.transform, width=grid.shape[1], height=grid.shape[0],
        resampling=Resampling.nearest, nodata=src.nodata,
    ) as vrt:
        return vrt.read(1), src.nodata


def _physical(raw: np.ndarray, nodata: float | None, scale: float = 1.0, offset: float = 0.0) -> np.ndarray:
    values = raw.astype(np.float32)
    if nodata is not None:
        values[raw == nodata] = np.nan
    if scale != 1:
        values = values * np.float32(scale)
    if offset != 0:
        values = values + np.float32(offset)
    return values


def _ndvi(nir: np.ndarray, red: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return ((nir - red) / (nir + red)).astype(np.float32)


# --- Earth Search v1 and CDSE STAC 1.1: 10 m reflectance with the 20 m SCL, offset semantics, SCL class 0 -----

S2_MASK = "scl in (0, 3, 8, 9, 10)"
S2_BANDS = {"reflectance": "red", "ndvi": "(nir - red) / (nir + red)"}


def _s2_reference(item: dict, keys: dict[str, str], grid: Grid, scale: float, offset: float):
    red_raw, red_nd = _warped_raw(item["assets"][keys["red"]]["href"], grid)
    nir_raw, nir_nd = _warped_raw(item["assets"][keys["nir"]]["href"], grid)
    scl_raw, _ = _warped_raw(item["assets"][keys["scl"]]["href"], grid)
    drop = np.isin(scl_raw, (0, 3, 8, 9, 10))  # on the raw classes: 0 is SCL's own "no data"
    red = np.where(drop, np.nan, _physical(red_raw, red_nd, scale, offset))
    nir = np.where(drop, np.nan, _physical(nir_raw, nir_nd, scale, offset))
    return {"reflectance": red, "ndvi": _ndvi(nir, red)}, red_raw, scl_raw


@pytest.mark.parametrize(
    ("name", "keys", "crs", "offset"),
    [
        # earthsearch:boa_offset_applied: true -> the declared -0.1 is already in the pixels
        ("earthsearch_s2_l2a", {"red": "red", "nir": "nir", "scl": "scl"}, "EPSG:32639", 0.0),
        # raster v2 fields on the asset (raster:scale, raster:offset, nodata, data_type): the offset applies
        ("stac11_raster_v2", {"red": "B04_10m", "nir": "B08_10m", "scl": "SCL_20m"}, "EPSG:32655", -0.1),
    ],
)
def test_sentinel2_spec_matches_a_warpedvrt_reference(name, keys, crs, offset, tmp_path):
    item = load_item(name)
    lon, lat = (item["bbox"][0] + item["bbox"][2]) / 2, (item["bbox"][1] + item["bbox"][3]) / 2
    # an odd origin: the 10 m grid is aligned with the 10 m assets but half of the SCL pixels straddle chunk edges
    grid = _grid_around(crs, lon, lat, 10.0, 150)
    written = _materialize(name, tuple(keys.values()), grid, tmp_path / "cogs")
    spec = _write_job(tmp_path, [written], keys, grid, mask=S2_MASK, bands=S2_BANDS, reduce="{method: median}")
    plan = _plan(spec)
    loads = {asset.name: asset.load_dtype for asset in plan.sources.assets}
    assert loads == {"red": "uint16", "nir": "uint16", "scl": "uint8"}  # the source integers, not float32
    result = _compute(plan)

    expected, red_raw, scl_raw = _s2_reference(written, keys, grid, 0.0001, offset)
    assert_same(result["reflectance"].values, expected["reflectance"])
    assert_same(result["ndvi"].values, expected["ndvi"])

    refl = result["reflectance"].values
    finite = np.isfinite(refl)
    assert 0.5 < finite.mean() < 0.95
    # DN 1000..6000: reflectance 0.1..0.6 when the offset is already in the pixels, 0.0..0.5 when it applies here
    assert refl[finite].min() >= 0.1 + offset - 1e-6 and refl[finite].max() <= 0.6 + offset + 1e-6
    # SCL 0 over valid reflectance (the generator puts it on ~1.5 % of the ground) is dropped by `scl in (0, ...)`
    scl_zero_over_valid = (scl_raw == 0) & (red_raw != 0)
    assert scl_zero_over_valid.sum() > 20
    assert np.isnan(refl[scl_zero_over_valid]).all()


# --- Planetary Computer: two UTM zones, one grid ------------------------------------------------------------------

PC = ("pc_s2_l2a_a", "pc_s2_l2a_b")  # T47XML (EPSG:32647) and T46XER (EPSG:32646), the same datatake
PC_KEYS = {"red": "B04", "nir": "B08", "scl": "SCL"}


def _pc_items(grid: Grid, directory: Path) -> list[dict]:
    return [_materialize(name, tuple(PC_KEYS.values()), grid, directory / name) for name in PC]


def _pc_reference(items: list[dict], grid: Grid) -> list[dict[str, np.ndarray]]:
    """Per tile, in rasterflow's item order (datetime, then id): red, nir (masked by SCL, as DN: PC declares no
    scale and no offset) on ``grid``."""
    tiles = []
    for item in sorted(items, key=lambda it: (it["properties"]["datetime"], it["id"])):
        scl_raw, _ = _warped_raw(item["assets"]["SCL"]["href"], grid)
        drop = np.isin(scl_raw, (0, 3, 8, 9, 10))
        planes = {}
        for alias in ("red", "nir"):
            raw, nodata = _warped_raw(item["assets"][PC_KEYS[alias]]["href"], grid)
            planes[alias] = np.where(drop, np.nan, _physical(raw, nodata))
        tiles.append(planes)
    return tiles


def test_planetary_computer_tiles_in_two_zones_mosaic_per_pixel_onto_one_grid(tmp_path):
    # in zone 47 (tile a's own CRS, read directly) near 96°E, where tile b (zone 46) overlaps it: b is warped
    grid = _grid_around("EPSG:32647", 96.0, 81.45, 10.0, 160)
    items = _pc_items(grid, tmp_path / "cogs")
    spec = _write_job(tmp_path, items, PC_KEYS, grid, mask=S2_MASK, group_by="solar_day",
                      bands={"red_dn": "red", "ndvi": "(nir - red) / (nir + red)"})
    plan = _plan(spec)
    assert len(plan.times) == 1  # one pass: both tiles are one date
    assert any("04.00" in warning for warning in plan.report.warnings)  # PC baseline >= 04.00, no offset declared
    result = _compute(plan)

    first, second = _pc_reference(items, grid)
    valid_first = np.isfinite(first["red"]) & np.isfinite(first["nir"])
    take_second = ~valid_first & np.isfinite(second["red"]) & np.isfinite(second["nir"])
    red = np.where(take_second, second["red"], first["red"])  # every asset of a pixel from one tile
    nir = np.where(take_second, second["nir"], first["nir"])
    assert valid_first.mean() > 0.5 and take_second.sum() > 50  # both tiles contribute
    assert_same(result["red_dn"].values[0], red)
    assert_same(result["ndvi"].values[0], _ndvi(nir, red))


def test_planetary_computer_two_zones_median_on_a_grid_in_a_third_zone(tmp_path):
    grid = _grid_around("EPSG:32648", 96.0, 81.45, 10.0, 128)  # neither tile's zone: both are warped
    items = _pc_items(grid, tmp_path / "cogs")
    spec = _write_job(tmp_path, items, PC_KEYS, grid, mask=S2_MASK, reduce="{method: median}",
                      bands={"ndvi": "(nir - red) / (nir + red)"}, chunks="{time: -1, y: 50, x: 50}")
    result = _compute(_plan(spec))

    series = np.stack([_ndvi(tile["nir"], tile["red"]) for tile in _pc_reference(items, grid)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = np.nanmedian(series, axis=0)
    assert np.isfinite(expected).mean() > 0.5
    assert_same(result["ndvi"].values, expected)


# --- Landsat C2 L2: a QA_PIXEL bit mask on the source integers -------------------------------------------------


def test_landsat_qa_pixel_bit_mask_matches_the_reference(tmp_path):
    keys = {"red": "red", "nir": "nir08", "qa": "qa_pixel"}
    item = load_item("landsat_c2_l2")
    lon, lat = (item["bbox"][0] + item["bbox"][2]) / 2, (item["bbox"][1] + item["bbox"][3]) / 2
    grid = _grid_around("EPSG:32655", lon, lat, 30.0, 120)
    grid = Grid(grid.crs, 30.0, (grid.bounds[0] + 15.0, grid.bounds[3] - 15.0), grid.shape)  # Landsat's 15 m origin
    written = _materialize("landsat_c2_l2", tuple(keys.values()), grid, tmp_path / "cogs")
    spec = _write_job(tmp_path, [written], keys, grid, mask="(qa >> 3) & 1 | (qa >> 4) & 1",
                      bands={"sr_red": "red", "ndvi": "(nir - red) / (nir + red)"})
    result = _compute(_plan(spec))

    qa_raw, qa_nodata = _warped_raw(written["assets"]["qa_pixel"]["href"], grid)
    assert qa_nodata == 1
    drop = (((qa_raw >> 3) & 1) | ((qa_raw >> 4) & 1)) != 0
    planes = {}
    for alias in ("red", "nir"):
        raw, nodata = _warped_raw(written["assets"][keys[alias]]["href"], grid)
        planes[alias] = np.where(drop, np.nan, _physical(raw, nodata, 2.75e-05, -0.2))
    assert 0.1 < drop.mean() < 0.3
    assert_same(result["sr_red"].values[0], planes["red"])
    assert_same(result["ndvi"].values[0], _ndvi(planes["nir"], planes["red"]))
    assert np.isnan(result["sr_red"].values[0][drop]).all()


# --- the same through `rasterflow run` on a real LocalCluster ------------------------------------------------------


@pytest.mark.slow
def test_run_writes_the_earth_search_result_that_the_reference_computes(tmp_path):
    import xarray as xr
    from click.testing import CliRunner

    from rasterflow.cli import cli

    keys = {"red": "red", "nir": "nir", "scl": "scl"}
    item = load_item("earthsearch_s2_l2a")
    grid = _grid_around("EPSG:32639", 48.7, 18.5, 10.0, 200)
    written = _materialize("earthsearch_s2_l2a", tuple(keys.values()), grid, tmp_path / "cogs")
    spec = _write_job(tmp_path, [written], keys, grid, mask=S2_MASK, bands=S2_BANDS, reduce="{method: median}",
                      chunks="{time: -1, y: 128, x: 128}")
    result = CliRunner().invoke(cli, ["run", str(spec)])
    assert result.exit_code == 0, result.output

    expected, _, _ = _s2_reference(written, keys, grid, 0.0001, 0.0)
    with xr.open_zarr(tmp_path / "out" / "result.zarr") as ds:
        assert_same(ds["reflectance"].values, expected["reflectance"])
        assert_same(ds["ndvi"].values, expected["ndvi"])
    assert item["properties"]["earthsearch:boa_offset_applied"] is True


# --- items that declare no raster metadata (Planetary Computer) ------------------------------------------------


def test_planetary_computer_assets_load_the_source_integers_the_file_headers_declare(tmp_path):
    grid = _grid_around("EPSG:32647", 96.0, 81.45, 10.0, 64)
    items = _pc_items(grid, tmp_path / "cogs")
    spec = _write_job(tmp_path, items, PC_KEYS, grid, mask="(scl >> 3) & 1", bands={"d": "nir - red"})
    plan = _plan(spec)  # a bit test on SCL is accepted: the header says uint8
    assert {a.name: a.load_dtype for a in plan.sources.assets} == {"red": "uint16", "nir": "uint16", "scl": "uint8"}
    assert all("file header" in line for asset in plan.sources.assets for line in asset.applied
               if not line.startswith("resampling "))
    assert {read.nodata for row in plan.sources.reads for read in row} == {0.0}


def test_without_headers_the_files_nodata_still_holds_and_the_mask_sees_raw_values(tmp_path):
    from rasterflow.planning import local_layout, make_plan
    from rasterflow.commands import search
    from rasterflow.spec import load_spec

    grid = _grid_around("EPSG:32647", 96.0, 81.45, 10.0, 96)
    items = _pc_items(grid, tmp_path / "cogs")
    spec = _write_job(tmp_path, items, PC_KEYS, grid, mask=S2_MASK, bands={"r": "red"})
    loaded = load_spec(spec)
    plan = make_plan(loaded.spec, items=search(loaded), layout=local_layout(loaded.spec))  # no header probe
    assert {a.load_dtype for a in plan.sources.assets} == {"float32"}
    result = _compute(plan)
    for t, tile in enumerate(_pc_reference(items, grid)):  # tile a is read directly, tile b through a warp
        assert_same(result["r"].values[t], tile["red"])


def test_headers_of_remote_files_are_read_with_the_runs_retries(tmp_path):
    from http_faults import Fault, fault_server

    grid = _grid_around("EPSG:32647", 96.0, 81.45, 10.0, 64)
    items = _pc_items(grid, tmp_path / "cogs")
    root = tmp_path / "cogs"
    # every file's first request answers 503: the plan-time header read must retry it as the reader would
    with fault_server(root, faults=[Fault("status", path="*.tif", status=503, nth={1})]) as server:
        for item in items:
            for key in PC_KEYS.values():
                href = Path(item["assets"][key]["href"])
                item["assets"][key]["href"] = f"{server.url}/{href.relative_to(root).as_posix()}"
        spec = _write_job(tmp_path, items, PC_KEYS, grid, mask=S2_MASK, bands={"d": "nir - red"},
                          source="retry: {attempts: 3, backoff: 0.05, max_delay: 0.5, timeout: 5}")
        plan = _plan(spec)
        assert {a.name: a.load_dtype for a in plan.sources.assets} == {"red": "uint16", "nir": "uint16",
                                                                        "scl": "uint8"}
        assert server.statuses("*.tif")[503] >= 3  # one per probed asset key, each retried past
