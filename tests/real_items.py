"""Real STAC items from public catalogs (``tests/data/stac/*.json``, see SOURCES.md) and small local rasters for them.

``load_item(name)`` returns one of the stored items. ``asset_geometry(item, key)`` reads what the item declares for
an asset: CRS, grid, dtype, nodata, scale/offset. ``materialize(item, dir, assets, region)`` writes, per asset, a
tiled, compressed, *sparse* GeoTIFF with exactly that geometry, where only the blocks that intersect ``region`` hold
data (so a 10980² Sentinel-2 band is a few tens of kB and takes milliseconds to write), and returns a copy of the
item whose asset hrefs point at those files. ``expected_pixels`` recomputes the values ``materialize`` writes.
``truncate(path)`` cuts a written file short, for "broken COG" tests.

Pixel values inside the region are deterministic (``seed``) and plausible:

* Sentinel-2 reflectance: DN 1000..6000; 0 (= nodata) on ~1 % of the ground.
* Sentinel-2 SCL (``scl``/``SCL``/``SCL_20m``...): classes 1..11, 0 where the reflectance is nodata *and*, on purpose,
  on another ~1.5 % of the ground where the reflectance is valid (a mask must come from SCL, not from nodata).
* Landsat C2 L2 surface reflectance: DN 7273..43636 (reflectance 0..1 with scale 2.75e-5, offset -0.2); 0 on ~1 %.
* Landsat ``qa_pixel``: 21824 (clear land), with bit 3 (cloud) on ~12 % and bit 4 (cloud shadow) on ~8 % of the pixels,
  and the declared nodata (1 = fill) exactly where the surface reflectance is 0.

Which ground is "nodata" is decided per ground cell of 20 m (Sentinel-2) or 30 m (Landsat) from a hash of the cell and
``seed``, not per raster, so the 10 m, 20 m and 60 m assets of one item agree with each other. All other pixel values
come from ``numpy.random.default_rng([seed, crc32(asset key)])``.
"""

from __future__ import annotations

import copy
import json
import math
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
import rasterio.errors
from affine import Affine
from rasterio.crs import CRS
from rasterio.warp import transform_bounds
from rasterio.windows import Window

__all__ = [
    "DATA",
    "FIXTURES",
    "AssetGeometry",
    "asset_geometry",
    "asset_kind",
    "center_region",
    "expected_pixels",
    "load_item",
    "materialize",
    "region_window",
    "truncate",
]

DATA = Path(__file__).parent / "data" / "stac"
FIXTURES = ("earthsearch_s2_l2a", "pc_s2_l2a_a", "pc_s2_l2a_b", "stac11_raster_v2", "landsat_c2_l2")


def load_item(name: str) -> dict:
    """The STAC item stored as ``tests/data/stac/<name>.json`` (a fresh dict every call)."""
    return json.loads((DATA / f"{name}.json").read_text())


@dataclass(frozen=True)
class AssetGeometry:
    """What an item declares about one raster asset."""

    crs: str  # "EPSG:32633"
    transform: Affine
    shape: tuple[int, int]  # (height, width)
    dtype: str  # numpy dtype name
    nodata: int | float | None
    scale: float = 1.0
    offset: float = 0.0
    count: int = 1  # bands in the file

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """(minx, miny, maxx, maxy) of the grid, in ``crs``."""
        t, (h, w) = self.transform, self.shape
        xs, ys = (t.c, t.c + w * t.a), (t.f, t.f + h * t.e)
        return min(xs), min(ys), max(xs), max(ys)


# ---------------------------------------------------------------------------------------------------------------------
# reading the declared geometry

# Documented native resolutions, used only when an item declares no proj:shape/proj:transform for an asset (nor in its
# properties) and no gsd / spatial_resolution either: Sentinel-2 MSI bands by asset key (ESA Sentinel-2 User Handbook,
# L2A product: 10 m B02/B03/B04/B08/TCI/AOT/WVP, 20 m B05/B06/B07/B8A/B11/B12/SCL, 60 m B01/B09), Landsat 30 m.
_S2_RES = {
    10: {"b02", "b03", "b04", "b08", "blue", "green", "red", "nir", "visual", "tci", "aot", "wvp"},
    20: {"b05", "b06", "b07", "b8a", "b11", "b12", "scl", "rededge1", "rededge2", "rededge3", "nir08", "swir16",
         "swir22"},
    60: {"b01", "b09", "coastal", "nir09"},
}

# Documented data types, used only when an item says nothing about dtype/nodata for an asset (Planetary Computer's
# sentinel-2-l2a items carry no raster:bands): Sentinel-2 L2A COGs are uint16 with nodata 0, SCL uint8 nodata 0,
# the true-colour image uint8 (3 bands) nodata 0.
_S2_DEFAULT_RASTER = {"scl": ("uint8", 0), "visual": ("uint8", 0), "tci": ("uint8", 0)}


def _is_landsat(item: dict) -> bool:
    text = f"{item.get('collection', '')} {item.get('id', '')} {item.get('properties', {}).get('platform', '')}"
    return "landsat" in text.lower() or item.get("id", "")[:4] in ("LC08", "LC09", "LE07", "LT05", "LT04")


def _base_key(key: str) -> str:
    """'B04_10m' -> 'b04', 'scl-jp2' -> 'scl', 'SR_B4.TIF' -> 'sr_b4'."""
    k = key.lower()
    for sep in ("-jp2", ".tif"):
        k = k.removesuffix(sep)
    if "_" in k and k.rsplit("_", 1)[1].endswith("m") and k.rsplit("_", 1)[1][:-1].isdigit():
        k = k.rsplit("_", 1)[0]
    return k


def _crs_of(asset: dict, props: dict) -> str:
    for src in (asset, props):
        if src.get("proj:code"):
            return str(src["proj:code"])
        if src.get("proj:epsg") is not None:
            return f"EPSG:{int(src['proj:epsg'])}"
    raise ValueError("the item declares no proj:epsg / proj:code")


def _band_info(asset: dict) -> tuple[dict, int]:
    """Merged raster fields for the asset's first band (raster ext. v1 ``raster:bands`` or STAC 1.1 asset/``bands``)."""
    if asset.get("raster:bands"):
        rb = asset["raster:bands"][0]
        return {"data_type": rb.get("data_type"), "nodata": rb.get("nodata"), "scale": rb.get("scale"),
                "offset": rb.get("offset"), "res": rb.get("spatial_resolution")}, len(asset["raster:bands"])
    bands = asset.get("bands") or []
    b0 = bands[0] if bands else {}

    def pick(name: str):
        return b0[name] if name in b0 else asset.get(name)

    info = {"data_type": pick("data_type"), "nodata": pick("nodata"), "scale": pick("raster:scale"),
            "offset": pick("raster:offset"), "res": pick("raster:spatial_resolution")}
    count = len(bands) if bands else len(asset.get("eo:bands") or []) or 1
    return info, count


def _derived_grid(item: dict, key: str, crs: str, res: float | None) -> tuple[Affine, tuple[int, int]]:
    """Grid from the item's bbox when the item declares none (see _S2_RES); snapped outward to the resolution."""
    if res is None:
        if _is_landsat(item):
            res = 30.0
        else:
            base = _base_key(key)
            res = next((float(r) for r, keys in _S2_RES.items() if base in keys), None)
        if res is None:
            raise ValueError(f"asset {key!r}: no proj:shape/proj:transform and no known resolution")
    minx, miny, maxx, maxy = transform_bounds("EPSG:4326", crs, *item["bbox"][:2], *item["bbox"][-2:])
    minx, miny = math.floor(minx / res) * res, math.floor(miny / res) * res
    maxx, maxy = math.ceil(maxx / res) * res, math.ceil(maxy / res) * res
    shape = (round((maxy - miny) / res), round((maxx - minx) / res))
    return Affine(res, 0.0, minx, 0.0, -res, maxy), shape


def asset_geometry(item: dict, key: str) -> AssetGeometry:
    """CRS, grid, dtype, nodata, scale and offset that ``item`` declares for asset ``key``.

    Grid: ``proj:shape``/``proj:transform`` of the asset, else of the item properties, else derived from the bbox
    (``_derived_grid``). CRS: ``proj:code`` or ``proj:epsg`` of the asset, else of the properties. Raster fields:
    ``raster:bands[0]``, else STAC 1.1 ``bands[0]`` / asset-level ``data_type``, ``nodata``, ``raster:scale``,
    ``raster:offset``, else documented Sentinel-2 defaults (``_S2_DEFAULT_RASTER``).
    """
    props = item.get("properties", {})
    asset = item["assets"][key]
    crs = _crs_of(asset, props)
    info, count = _band_info(asset)

    shape = asset.get("proj:shape") or props.get("proj:shape")
    tr = asset.get("proj:transform") or props.get("proj:transform")
    if shape and tr:
        transform, shape = Affine(*tr[:6]), (int(shape[0]), int(shape[1]))
    else:
        res = info["res"] or asset.get("gsd")
        transform, shape = _derived_grid(item, key, crs, float(res) if res else None)

    dtype, nodata = info["data_type"], info["nodata"]
    if dtype is None:
        if _is_landsat(item):
            raise ValueError(f"asset {key!r}: no data_type declared")
        dtype, default_nodata = _S2_DEFAULT_RASTER.get(_base_key(key), ("uint16", 0))
        nodata = default_nodata if nodata is None else nodata
        if _base_key(key) in ("visual", "tci"):
            count = max(count, 3)
    return AssetGeometry(
        crs=crs, transform=transform, shape=shape, dtype=np.dtype(dtype).name, nodata=nodata,
        scale=1.0 if info["scale"] is None else float(info["scale"]),
        offset=0.0 if info["offset"] is None else float(info["offset"]), count=count,
    )


# ---------------------------------------------------------------------------------------------------------------------
# pixel values

def asset_kind(item: dict, key: str) -> str:
    """'scl', 'qa_pixel', 'landsat_sr', 's2_reflectance' or 'generic': decides how pixel values look."""
    base = _base_key(key)
    landsat = _is_landsat(item)
    if base == "scl":
        return "scl"
    if landsat and base in ("qa_pixel", "qa"):  # PC: qa_pixel; USGS: QA_PIXEL.TIF -> "qa_pixel"
        return "qa_pixel" if base == "qa_pixel" else "generic"
    if landsat and base in ("coastal", "blue", "green", "red", "nir08", "swir16", "swir22", "sr_b1", "sr_b2", "sr_b3",
                            "sr_b4", "sr_b5", "sr_b6", "sr_b7"):
        return "landsat_sr"
    if not landsat and (base in set().union(*_S2_RES.values()) or base.startswith("b")) and base not in (
            "visual", "tci", "aot", "wvp"):
        return "s2_reflectance"
    return "generic"


def region_window(geom: AssetGeometry, region: tuple[float, float, float, float]) -> Window:
    """The pixel window covering ``region`` (minx, miny, maxx, maxy in the asset's CRS), snapped outward, clipped."""
    t = geom.transform
    if t.b or t.d or t.a <= 0 or t.e >= 0:
        raise ValueError("only north-up grids are supported")
    minx, miny, maxx, maxy = region
    h, w = geom.shape
    c0 = max(0, math.floor((minx - t.c) / t.a + 1e-9))
    c1 = min(w, math.ceil((maxx - t.c) / t.a - 1e-9))
    r0 = max(0, math.floor((t.f - maxy) / -t.e + 1e-9))
    r1 = min(h, math.ceil((t.f - miny) / -t.e - 1e-9))
    if c1 <= c0 or r1 <= r0:
        raise ValueError(f"region {region} does not intersect the asset grid {geom.bounds}")
    return Window(c0, r0, c1 - c0, r1 - r0)


def center_region(geom: AssetGeometry, size: float = 1000.0) -> tuple[float, float, float, float]:
    """A ``size`` × ``size`` square (CRS units) at the centre of the asset grid."""
    minx, miny, maxx, maxy = geom.bounds
    cx, cy = (minx + maxx) / 2, (miny + maxy) / 2
    return cx - size / 2, cy - size / 2, cx + size / 2, cy + size / 2


def _cell_uniform(xs: np.ndarray, ys: np.ndarray, cell: float, seed: int) -> np.ndarray:
    """A deterministic uniform [0, 1) per ground cell (splitmix64 of the cell indices and the seed)."""
    cx = np.floor(xs / cell + 1e-9).astype(np.int64).astype(np.uint64)
    cy = np.floor(ys / cell + 1e-9).astype(np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        z = cx * np.uint64(0x9E3779B97F4A7C15) ^ cy * np.uint64(0xC2B2AE3D27D4EB4F) ^ np.uint64(seed & (2**64 - 1))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(2**53)


def _cast(values: np.ndarray, dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.clip(values, info.min, info.max).astype(dt)
    return values.astype(dt)


def _file_nodata(geom: AssetGeometry, dtype: str):
    """The declared nodata if the file's dtype can hold it, else None."""
    if geom.nodata is None:
        return None
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return geom.nodata if float(geom.nodata).is_integer() and info.min <= geom.nodata <= info.max else None
    return geom.nodata


def expected_pixels(item: dict, key: str, region: tuple[float, float, float, float], *, seed: int = 0,
                    dtype_override: dict[str, str] | None = None) -> tuple[Window, np.ndarray]:
    """The window of ``region`` in asset ``key`` and the (count, rows, cols) values ``materialize`` writes there."""
    geom = asset_geometry(item, key)
    dtype = (dtype_override or {}).get(key, geom.dtype)
    win = region_window(geom, region)
    t = geom.transform
    cols = np.arange(win.col_off, win.col_off + win.width)
    rows = np.arange(win.row_off, win.row_off + win.height)
    xs = t.c + (cols + 0.5) * t.a
    ys = t.f + (rows + 0.5) * t.e
    gx, gy = np.meshgrid(xs, ys)
    landsat = _is_landsat(item)
    u = _cell_uniform(gx, gy, 30.0 if landsat else 20.0, seed)
    no_ground = u < 0.01  # ~1 % of the ground has no data in every asset of the item
    rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
    shape = (geom.count, win.height, win.width)
    nodata = geom.nodata if geom.nodata is not None else 0
    kind = asset_kind(item, key)

    if kind == "s2_reflectance":
        vals = rng.integers(1000, 6001, size=shape).astype(np.float64)
        vals[:, no_ground] = nodata
    elif kind == "landsat_sr":
        vals = rng.integers(7273, 43637, size=shape).astype(np.float64)
        vals[:, no_ground] = nodata
    elif kind == "scl":
        classes = np.arange(1, 12)
        weights = np.array([1, 3, 8, 30, 12, 8, 3, 8, 8, 4, 3], dtype=float)
        vals = rng.choice(classes, size=shape, p=weights / weights.sum()).astype(np.float64)
        # 0 where there is no data, and deliberately on ~1.5 % of the ground where the reflectance is valid
        vals[:, no_ground | ((u >= 0.01) & (u < 0.025))] = 0
    elif kind == "qa_pixel":
        v = rng.random(size=shape)
        vals = np.full(shape, 21824, dtype=np.float64)  # clear, low cloud / cirrus / snow confidence
        vals[v < 0.12] = 22280  # bit 3 cloud (+ high cloud confidence bits 8-9)
        vals[(v >= 0.12) & (v < 0.20)] = 23888  # bit 4 cloud shadow (+ shadow confidence bits 10-11)
        vals[:, no_ground] = geom.nodata if geom.nodata is not None else 1
    else:
        dt = np.dtype(geom.dtype)  # AOT, WVP, TCI/visual, Landsat thermal and atmosphere bands, ...
        if dt.kind == "f":
            vals = rng.random(size=shape) * 1000.0
        else:
            vals = rng.integers(1, (250 if dt.itemsize == 1 else 10000) + 1, size=shape).astype(np.float64)
        if geom.nodata is not None:
            vals[:, no_ground] = geom.nodata
    return win, _cast(vals, dtype)


# ---------------------------------------------------------------------------------------------------------------------
# writing files

_COMPRESSION: str | None = None


def _compression() -> str:
    """ZSTD if this GDAL build writes it, else DEFLATE (checked once, on a 16² file)."""
    global _COMPRESSION
    if _COMPRESSION is None:
        import tempfile

        _COMPRESSION = "DEFLATE"
        with tempfile.TemporaryDirectory() as d:
            try:
                with rasterio.open(Path(d) / "z.tif", "w", driver="GTiff", width=16, height=16, count=1,
                                   dtype="uint8", compress="ZSTD", crs="EPSG:32633",
                                   transform=Affine(10, 0, 0, 0, -10, 0)) as dst:
                    dst.write(np.zeros((1, 16, 16), np.uint8))
                with rasterio.open(Path(d) / "z.tif") as src:
                    if src.compression is not None and "zstd" in str(src.compression).lower():
                        _COMPRESSION = "ZSTD"
            except (rasterio.errors.RasterioError, OSError):  # this GDAL cannot write ZSTD
                _COMPRESSION = "DEFLATE"
    return _COMPRESSION


def materialize(item: dict, directory: Path, assets: Sequence[str], region: tuple[float, float, float, float], *,
                seed: int = 0, dtype_override: dict[str, str] | None = None) -> dict:
    """Write ``<directory>/<item id>_<asset>.tif`` for each asset and return a copy of ``item`` pointing at them.

    Each file has exactly the asset's declared CRS, transform, shape, dtype (unless ``dtype_override[asset]`` says
    otherwise) and nodata (dropped if the override dtype cannot hold it); it is a tiled (512², or 256² when the raster
    is smaller than 2048 px), ZSTD- (else DEFLATE-) compressed GeoTIFF with SPARSE_OK, and only the pixels in
    ``region`` (minx, miny, maxx, maxy in the asset's CRS) are written, so every block that does not meet the region
    is absent from the file and reads as nodata (or 0). Other assets keep their hrefs.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = copy.deepcopy(item)
    compress = _compression()
    for key in assets:
        geom = asset_geometry(item, key)
        dtype = (dtype_override or {}).get(key, geom.dtype)
        win, values = expected_pixels(item, key, region, seed=seed, dtype_override=dtype_override)
        h, w = geom.shape
        block = 512 if max(h, w) >= 2048 else 256
        path = (directory / f"{item['id']}_{key}.tif").resolve()
        profile = {
            "driver": "GTiff", "width": w, "height": h, "count": geom.count, "dtype": dtype,
            "crs": CRS.from_user_input(geom.crs), "transform": geom.transform, "nodata": _file_nodata(geom, dtype),
            "tiled": True, "blockxsize": block, "blockysize": block, "compress": compress,
            "sparse_ok": True, "interleave": "band" if geom.count == 1 else "pixel", "bigtiff": "IF_SAFER",
        }
        if compress == "DEFLATE" or np.dtype(dtype).kind in "iu":
            profile["predictor"] = 2
        with rasterio.open(path, "w", **profile) as dst:
            dst.write(values, window=win)
        out["assets"][key]["href"] = str(path)
    return out


def truncate(path: Path, keep_fraction: float = 0.5) -> None:
    """Cut the file at ``path`` to ``keep_fraction`` of its size (a "truncated COG": its tile data ends early)."""
    size = os.path.getsize(path)
    os.truncate(path, int(size * keep_fraction))
