"""The CRS and transform of a lazy result, as the attributes rioxarray and GDAL read, written without rioxarray.

A result carries them as rioxarray does: a scalar coordinate ``spatial_ref`` (the grid mapping) whose attributes
hold the WKT (``crs_wkt`` and ``spatial_ref``, rasterio's WKT as rioxarray writes it) and GDAL's ``GeoTransform``,
and each data variable names it in ``grid_mapping``. ``xr.open_zarr(path).rio.crs`` and GDAL's Zarr driver read the
stores written from it as before.

The CF grid-mapping parameters (``grid_mapping_name``, ``semi_major_axis``, ... from pyproj's ``CRS.to_cf``) are
added by the Zarr writer when it finishes a store (:func:`cf_grid_mapping`), not when the graph is built: pyproj and
PROJ's database stay resident once loaded (12 MB), and in a one-process run the tasks share that process, so
importing pyproj only after the compute keeps it out of the run's peak (issue 13, step 0; a plan that projects a
bbox or warps files loads it anyway). rioxarray itself is no longer imported to write or read these attributes; a
dataset georeferenced some other way (no ``GeoTransform``, a CRS rioxarray finds elsewhere) is read with rioxarray.

Light: rasterio, pyproj and rioxarray are imported inside the functions.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from affine import Affine
    from rasterio.crs import CRS

__all__ = ["GRID_MAPPING", "georef_attrs", "write_georef", "with_transform", "crs_of", "transform_of",
           "cf_grid_mapping", "needs_cf"]

#: The name of the grid-mapping coordinate (rioxarray's default).
GRID_MAPPING = "spatial_ref"


def georef_attrs(crs: str | int | Mapping[str, Any] | CRS, transform: Sequence[float]) -> dict[str, str]:
    """The grid mapping's attributes of ``crs`` (anything rasterio's ``CRS.from_user_input`` takes) and the affine
    ``transform`` ``(a, b, c, d, e, f)``: the WKT twice (CF's ``crs_wkt``, GDAL's ``spatial_ref``) and GDAL's
    ``GeoTransform`` string, as rioxarray's ``write_crs`` and ``write_transform`` write them."""
    from rasterio.crs import CRS

    wkt = CRS.from_user_input(crs).to_wkt()
    return {"crs_wkt": wkt, "spatial_ref": wkt, "GeoTransform": _geotransform(transform)}


def _geotransform(transform: Sequence[float]) -> str:
    a, b, c, d, e, f = (float(v) for v in tuple(transform)[:6])
    return " ".join(str(v) for v in (c, a, b, f, d, e))


def write_georef(dataset: xr.Dataset, crs: str | int | Mapping[str, Any] | CRS, transform: Sequence[float]) -> xr.Dataset:
    """``dataset`` with the grid mapping coordinate of ``crs`` and ``transform``, named by every data variable."""
    import numpy as np
    import xarray as xr

    mapping = xr.Variable((), np.int64(0), attrs=georef_attrs(crs, transform))
    out = dataset.assign_coords({GRID_MAPPING: mapping})
    for name in out.data_vars:
        out[name].attrs["grid_mapping"] = GRID_MAPPING
    return out


def with_transform(dataset: xr.Dataset, transform: Sequence[float]) -> xr.Dataset:
    """``dataset`` (with a grid mapping) whose ``GeoTransform`` is ``transform``: a window of a larger grid."""
    name = _mapping_name(dataset)
    if name is None:
        raise ValueError("the dataset has no grid mapping coordinate; write one with write_georef")
    mapping = dataset[name].variable.copy(deep=False)
    mapping.attrs = {**mapping.attrs, "GeoTransform": _geotransform(transform)}
    return dataset.assign_coords({name: mapping})


def _mapping_name(dataset: xr.Dataset) -> str | None:
    for var in dataset.data_vars.values():
        name = var.encoding.get("grid_mapping") or var.attrs.get("grid_mapping")
        if name:
            return str(name) if name in dataset.coords and dataset[name].ndim == 0 else None
    return GRID_MAPPING if GRID_MAPPING in dataset.coords and dataset[GRID_MAPPING].ndim == 0 else None


def _mapping_attrs(dataset: xr.Dataset) -> dict[str, Any]:
    name = _mapping_name(dataset)
    return dict(dataset[name].attrs) if name is not None else {}


def crs_of(dataset: xr.Dataset) -> CRS | None:
    """The dataset's CRS (rasterio's), from its grid mapping's WKT; otherwise what rioxarray finds, or None."""
    from rasterio.crs import CRS

    attrs = _mapping_attrs(dataset)
    wkt = attrs.get("crs_wkt") or attrs.get("spatial_ref")
    if wkt:
        return CRS.from_wkt(str(wkt))
    try:
        import rioxarray  # noqa: F401  (registers the .rio accessor)

        return dataset.rio.crs
    except Exception:  # no rioxarray, or nothing it recognises as a CRS
        return None


def transform_of(dataset: xr.Dataset) -> Affine:
    """The dataset's affine transform, from its grid mapping's ``GeoTransform``; otherwise rioxarray's (from the
    ``x``/``y`` coordinates)."""
    from affine import Affine

    text = _mapping_attrs(dataset).get("GeoTransform")
    if text:
        return Affine.from_gdal(*(float(v) for v in str(text).split()))
    import rioxarray  # noqa: F401  (registers the .rio accessor)

    transform: Affine = dataset.rio.transform()
    return transform


def needs_cf(attrs: dict[str, Any]) -> bool:
    """Whether a grid mapping's attributes lack the CF parameters (:func:`cf_grid_mapping` would add them)."""
    return bool(attrs.get("crs_wkt")) and not any(
        key in attrs for key in ("grid_mapping_name", "geographic_crs_name", "projected_crs_name"))


def cf_grid_mapping(crs_wkt: str) -> dict[str, Any]:
    """The CF grid-mapping parameters of a CRS (pyproj's ``CRS.to_cf``, which rioxarray writes too), without its
    ``crs_wkt`` (the grid mapping keeps rasterio's, as rioxarray does). A CRS CF has no grid mapping for gives only
    its names (pyproj warns and leaves the mapping out)."""
    from pyproj import CRS as ProjCRS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attrs = ProjCRS.from_wkt(crs_wkt).to_cf()
    attrs.pop("crs_wkt", None)
    return attrs
