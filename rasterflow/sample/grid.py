"""The sample's grid and parameters: where the tiles lie, the assets and SCL classes, which items a sample has.

Constants shared by the scene model (:mod:`.scene`), the STAC documents (:mod:`.items`) and the files
(:mod:`.files`); the parameter check and the item plan (ids, dates, tiles). NumPy only.
"""

from __future__ import annotations

import datetime as _dt
import math
from typing import NotRequired, TypedDict

import numpy as np
import numpy.typing as npt

COLLECTION_ID = "sentinel-2-l2a-sample"
EPSG = 32633
CRS = f"EPSG:{EPSG}"
RESOLUTION = 10.0
X0 = 380_000.0
Y0 = 5_830_000.0
UTM_ZONE = 33
ACQUISITION_TIME = "10:05:00"

#: Bump when the generated content changes, so that cached samples are regenerated.
GENERATOR_VERSION = 1

SCALE = 0.0001
OFFSET = -0.1

#: SCL class values and their names (the subset the sample uses).
SCL_CLASSES: dict[int, str] = {
    0: "no_data",
    3: "cloud_shadows",
    4: "vegetation",
    5: "not_vegetated",
    6: "water",
    8: "cloud_medium_probability",
    9: "cloud_high_probability",
    10: "thin_cirrus",
}
CLOUD_CLASSES = (8, 9, 10)

# asset key -> (band name, centre wavelength µm, FWHM µm, title)
ASSETS: dict[str, tuple[str, float | None, float | None, str]] = {
    "red": ("B04", 0.665, 0.038, "Red (band 4) - 10m"),
    "green": ("B03", 0.560, 0.045, "Green (band 3) - 10m"),
    "nir": ("B08", 0.842, 0.145, "NIR 1 (band 8) - 10m"),
    "swir16": ("B11", 1.610, 0.143, "SWIR 1 (band 11) - 10m (20 m in real data)"),
    "scl": ("SCL", None, None, "Scene classification map (SCL)"),
}
REFLECTANCE_ASSETS = ("red", "green", "nir", "swir16")


class SampleParams(TypedDict):
    """A sample's checked parameters, as its manifest records them (JSON values: ``tiles`` is a list)."""

    generator_version: int
    size: int
    n_dates: int
    tiles: list[int]
    start: str
    """ISO ``YYYY-MM-DD``."""
    every_days: int
    seed: int
    blocksize: int
    compress: NotRequired[str]
    """The COGs' codec, upper case; only when chosen (samples made before the option still match)."""


# --------------------------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------------------------


def check_params(size: int, n_dates: int, tiles: tuple[int, int], start: str | _dt.date, every_days: int,
                  seed: int, blocksize: int) -> SampleParams:
    """The parameters checked (a Python caller may pass anything: each is checked at run time too)."""

    def _int(name: str, value: object, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        return int(value)

    size = _int("size", size, 16)
    n_dates = _int("n_dates", n_dates, 1)
    every_days = _int("every_days", every_days, 1)
    seed = _int("seed", seed, 0)
    blocksize = _int("blocksize", blocksize, 16)
    if blocksize % 16:
        raise ValueError(f"blocksize must be a multiple of 16 (a GeoTIFF tile constraint), got {blocksize}")
    try:
        rows, cols = (int(t) for t in tiles)
    except (TypeError, ValueError):
        raise ValueError(f"tiles must be (rows, cols), got {tiles!r}") from None
    if rows < 1 or cols < 1:
        raise ValueError(f"tiles must be (rows, cols) with both >= 1, got {tiles!r}")
    if isinstance(start, (_dt.date, _dt.datetime)):
        start_date = start if not isinstance(start, _dt.datetime) else start.date()
    else:
        try:
            start_date = _dt.date.fromisoformat(str(start))
        except ValueError:
            raise ValueError(f"start must be an ISO date like 2024-06-03, got {start!r}") from None
    return {
        "generator_version": GENERATOR_VERSION,
        "size": size,
        "n_dates": n_dates,
        "tiles": [rows, cols],
        "start": start_date.isoformat(),
        "every_days": every_days,
        "seed": seed,
        "blocksize": blocksize,
    }


# --------------------------------------------------------------------------------------------------------------
# Items: ids, dates, tiles
# --------------------------------------------------------------------------------------------------------------


def _dates(params: SampleParams) -> list[_dt.date]:
    start = _dt.date.fromisoformat(params["start"])
    return [start + _dt.timedelta(days=i * params["every_days"]) for i in range(params["n_dates"])]


def platform_for_date(date_index: int) -> str:
    return "sentinel-2a" if date_index % 2 == 0 else "sentinel-2b"


def has_swath_edge(date_index: int) -> bool:
    return date_index % 3 == 1


def tile_bounds(params: SampleParams, row: int, col: int) -> tuple[float, float, float, float]:
    extent = params["size"] * RESOLUTION
    minx = X0 + col * extent
    maxy = Y0 - row * extent
    return (minx, maxy - extent, minx + extent, maxy)


def _mgrs_tile(easting: float, northing: float, lat: float, zone: int = UTM_ZONE) -> str:
    """MGRS grid square (zone, latitude band, 100 km square) of a UTM north position."""
    band = "CDEFGHJKLMNPQRSTUVWXX"[max(0, min(20, int(math.floor((lat + 80.0) / 8.0))))]
    col_sets = ("ABCDEFGH", "JKLMNPQR", "STUVWXYZ")
    col_letter = col_sets[(zone - 1) % 3][max(0, min(7, int(easting // 100_000) - 1))]
    row_letters = "ABCDEFGHJKLMNPQRSTUV"
    row_letter = row_letters[(int(northing // 100_000) + (5 if zone % 2 == 0 else 0)) % 20]
    return f"{zone}{band}{col_letter}{row_letter}"


def item_plan(params: SampleParams) -> list[tuple[str, int, _dt.date, int, int, str]]:
    """(item_id, date_index, date, row, col, mgrs) for every item, sorted by date then tile."""
    rows, cols = params["tiles"]
    plan = []
    for d, date in enumerate(_dates(params)):
        for r in range(rows):
            for c in range(cols):
                minx, miny, maxx, maxy = tile_bounds(params, r, c)
                # the sample sits at about lat 52.5 (band U); no pyproj needed for the MGRS name
                mgrs = _mgrs_tile((minx + maxx) / 2, (miny + maxy) / 2, 52.5)
                plat = "S2A" if platform_for_date(d) == "sentinel-2a" else "S2B"
                item_id = f"{plat}_{mgrs}_{date:%Y%m%d}_{r * cols + c}_L2A"
                plan.append((item_id, d, date, r, c, mgrs))
    return plan


def cut_col(params: SampleParams, global_rows: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Column (global, in pixels, fractional) of the swath edge at the given global row positions.

    Pixels whose centre lies west of it are nodata on swath-edge dates. The cut runs from 35 % of a tile width at
    the top of the mosaic to 5 % at its bottom, so it only touches the westernmost tile column.
    """
    size = params["size"]
    total_rows = params["tiles"][0] * size
    return size * (0.35 - 0.30 * (np.asarray(global_rows, dtype=np.float64) / total_rows))
