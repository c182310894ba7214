"""Checks of ``grid`` that need PROJ: the CRS exists, and the grid it makes is one a job can have.

Run by the loader after the models validated (so ``validate`` catches them with the spec's file:line, exit 2),
before anything is planned: the size is computed from the bounds and the resolution alone, nothing is allocated
per pixel or per task. A typo in ``resolution`` (0.001 where 10 was meant) would otherwise make a grid millions of
pixels wide whose task list the budget cannot even hold.

rasterio (GDAL's PROJ) is imported inside the functions, not pyproj: a run loads pyproj only after the compute
(``rasterflow.georef``, issue 13), and rasterio is what every run loads anyway.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.spec.models import Spec

__all__ = ["grid_problems", "MAX_GRID_PIXELS", "MAX_GRID_SIDE", "MAX_SPEC_TASKS"]

MAX_GRID_SIDE = 2**31 - 1
"""Pixels along one axis: GDAL's (and a COG's) limit, far beyond any Earth grid (a 1 m grid round the equator is
40 million pixels)."""

MAX_GRID_PIXELS = 10**13
"""Pixels of the whole grid: twice the Earth's surface at 10 m (5.1e12); beyond it is a typo, not a job."""

MAX_SPEC_TASKS = 60_000_000
"""Spatial tasks at the spec's chunks: ten times what the budget refuses with a chunk-size fix (``budget.MAX_TASKS``,
exit 3); beyond it the budget could not even list the tasks, so the spec is refused here (exit 2)."""


def _known_crs(code: str) -> tuple[Any, str | None]:
    """rasterio's CRS, or None and why not."""
    import rasterio
    from rasterio.crs import CRS
    from rasterio.errors import CRSError

    try:
        with rasterio.Env():  # GDAL's messages go to Python's logging, not to stderr
            return CRS.from_user_input(code), None
    except CRSError as err:
        return None, str(err)


def _units(crs: Any) -> str:
    try:
        unit = crs.units_factor[0]
    except Exception:  # pragma: no cover - a CRS without units
        return "CRS units"
    return {"metre": "metres", "degree": "degrees", "US survey foot": "US survey feet", "foot": "feet"}.get(
        unit, unit or "CRS units")


def _count(text: float) -> str:
    return f"{text:,.0f}" if text < 1e15 else f"{text:.3g}"


def grid_problems(spec: Spec) -> list[tuple[tuple[str, ...], str]]:
    """The problems of ``spec.grid``, each as (the spec location to point at, what is wrong and what to change).

    Empty when the CRS is known to PROJ and the grid is a sane size. Nothing is allocated per pixel or task.
    """
    code = spec.grid.crs
    crs, why = _known_crs(code)
    if crs is None:
        return [(("grid", "crs"), f"{code} is not a coordinate reference system PROJ knows ({_proj_reason(why)}); "
                                  f"check the code (UTM zones are EPSG:326NN north and EPSG:327NN south, e.g. "
                                  f"EPSG:32633; WGS84 lon/lat is EPSG:4326)")]
    resolution = float(spec.grid.resolution)
    if spec.grid.bounds is not None:
        minx, miny, maxx, maxy = (float(v) for v in spec.grid.bounds)
        where: tuple[str, ...] = ("grid", "bounds")
    else:
        import rasterio
        from rasterio.warp import transform_bounds

        where = ("source", "stac", "bbox" if spec.source.stac.bbox is not None else "intersects")
        try:
            with rasterio.Env():
                minx, miny, maxx, maxy = transform_bounds("EPSG:4326", crs, *spec.source.stac.search_bbox,
                                                          densify_pts=21)
        except Exception as err:  # GDAL's CPLE errors: the bbox is outside the CRS's area
            return [(where, f"cannot project the bbox into {code}: {err}; check the bbox (west, south, east, "
                            f"north in degrees) or set grid.bounds in {code}")]
        if not all(math.isfinite(v) for v in (minx, miny, maxx, maxy)):
            return [(where, f"the bbox does not project into {code} (outside the CRS's area of use); check the "
                            f"bbox (west, south, east, north in degrees) or set grid.bounds in {code}")]
    extent_x, extent_y = maxx - minx, maxy - miny
    units = _units(crs)
    width = extent_x / resolution
    height = extent_y / resolution
    box = f"{extent_x:,.6g} × {extent_y:,.6g} {units}"
    if resolution > 10 * max(extent_x, extent_y):
        return [(("grid", "resolution"),
                 f"{spec.grid.resolution:g} {units} per pixel is more than the whole area ({box}): the grid would "
                 f"be one pixel; grid.resolution is the pixel size in {code}'s units ({units})")]
    chunk_y = spec.chunks.y if spec.chunks.y > 0 else height
    chunk_x = spec.chunks.x if spec.chunks.x > 0 else width
    tasks = math.ceil(max(1.0, height) / chunk_y) * math.ceil(max(1.0, width) / chunk_x)
    pixels = max(1.0, width) * max(1.0, height)
    if max(width, height) > MAX_GRID_SIDE or pixels > MAX_GRID_PIXELS or tasks > MAX_SPEC_TASKS:
        likely = _likely_resolution(resolution, extent_x, extent_y, units)
        return [(("grid", "resolution"),
                 f"{spec.grid.resolution:g} {units} per pixel over {box} makes a grid of {_count(width)} × "
                 f"{_count(height)} pixels ({_count(pixels)} px, about {_count(tasks)} tasks of "
                 f"{spec.chunks.y} × {spec.chunks.x}): far beyond any job; grid.resolution is the pixel size in "
                 f"{units}{likely}")]
    return []


def _likely_resolution(resolution: float, extent_x: float, extent_y: float, units: str) -> str:
    """A hint: the resolution that gives a grid of a sane size (a power of ten times the one given)."""
    for factor in (10**k for k in range(1, 13)):
        candidate = resolution * factor
        if (extent_x / candidate) * (extent_y / candidate) <= 10**8:  # a 10,000² grid: an ordinary job
            return f" (did you mean {candidate:g}? that gives {_count(extent_x / candidate)} × " \
                   f"{_count(extent_y / candidate)} px)"
    return ""


def _proj_reason(why: str | None) -> str:
    text = (why or "").strip()
    if "crs not found" in text or "unknown" in text.lower():
        return "no such code in the EPSG database"
    return text.split(". PROJ:")[0] if text else "unknown"
