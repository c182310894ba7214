"""Synthetic Sentinel-2 L2A-like scenes and STAC items for the demo, the tests and the benchmarks.

Nothing binary is committed: :func:`generate_sample` writes everything, deterministically from a seed, into a
directory::

    DIR/
      sample.json                  manifest with the parameters, written last (its presence = a complete sample)
      collection.json              STAC Collection ``sentinel-2-l2a-sample``
      items.json                   ItemCollection (GeoJSON FeatureCollection) of all items
      items.ndjson                 the same items, one per line
      S2A_33UUU_20240603_0_L2A/    one directory per item (date x tile)
        red.tif green.tif nir.tif swir16.tif scl.tif     one COG per asset

The scenes
----------
* Grid: EPSG:32633 (UTM 33N), 10 m pixels, ``size`` x ``size`` pixels per tile, tiles side by side
  (``tiles=(rows, cols)``), the top-left corner at x=380000, y=5830000 (just north-west of central Berlin,
  about lon 13.23, lat 52.61). Tile ``(r, c)`` has its top-left corner at
  ``(380000 + c * size * 10, 5830000 - r * size * 10)``.
* Assets: ``red`` (B04), ``green`` (B03), ``nir`` (B08), ``swir16`` (B11, kept at 10 m here) as uint16 with the
  processing-baseline >= 04.00 convention ``reflectance = DN * 0.0001 - 0.1`` (``raster:bands`` scale 0.0001,
  offset -0.1, nodata 0); ``scl`` as uint8 scene classification (nodata 0). As in the real Earth Search COGs, the
  scale and offset live only in the STAC metadata, not in the GeoTIFFs.
* SCL classes used: 0 nodata, 3 cloud shadow, 4 vegetation, 5 bare soil / not vegetated, 6 water,
  8 cloud (medium probability), 9 cloud (high probability), 10 thin cirrus.
* Content: a smooth landscape (forest, an agricultural patchwork of parcels, built-up / bare areas, a lake per
  tile and a river across the mosaic) built from sums of low-frequency sinusoids with NumPy only. Features are
  sized relative to the tile, so a 256-pixel test tile looks like a shrunk 1024-pixel one. Vegetation follows a
  seasonal curve over the *series* (not the calendar): NDVI rises to a peak about 40 % into the series and falls
  again (some cereal parcels are harvested late in the series). Clouds are smooth blobs, different on every date
  (SCL 8/9, bright in all bands), optionally with thin cirrus streaks (SCL 10); their shadows (SCL 3, dark) are
  the opaque clouds shifted to the north-north-west, as the sun is in the south-south-east at 10:05 UTC. Every
  third date (index 1, 4, 7, ...) lies at a swath edge: a diagonal cut on the west side of the mosaic where all
  bands and SCL are 0.
* ``eo:cloud_cover`` is the percentage of *valid* pixels (SCL != 0) that are SCL 8, 9 or 10, rounded to 2
  decimals (0 if an item has no valid pixel). Cloud amounts are drawn per date so that about a quarter of the
  dates (at least one, when there are two or more dates) are 60-85 % cloudy over the mosaic and the rest 0-28 %
  (single tiles of a multi-tile mosaic vary around that).
* Items also carry ``platform`` (sentinel-2a on even date indices, sentinel-2b on odd ones), ``constellation``,
  ``s2:mgrs_tile`` (e.g. ``33UUU``), the ``s2:*_percentage`` statistics of Earth Search, ``proj:epsg`` (what
  stackstac 0.5.1 reads) and ``proj:code``, ``proj:shape``, ``proj:transform``, ``proj:bbox`` (item and asset
  level). The geometry is the valid-data footprint in WGS84 (the tile minus the swath-edge cut), the bbox its
  bounds. Asset hrefs are absolute file paths.

Determinism: the same parameters and seed give byte-identical pixel data on the same platform. (NumPy's
transcendental functions may differ in the last bit between CPUs, which can rarely flip a DN by one elsewhere.)

Only NumPy is imported at module level; rasterio, pyproj and filelock are imported when a sample is generated.

The package, by job: :mod:`.grid` (constants, parameters, which items a sample has), :mod:`.scene` (the synthetic
surfaces, clouds and SCL), :mod:`.items` (the STAC item and collection JSON), :mod:`.files` (manifest, reuse, lock,
COG and JSON writing), :mod:`.generate` (:func:`generate_sample`), :mod:`.demo` (the demo spec), :mod:`.cli`
(``python -m rasterflow.sample``).
"""

from __future__ import annotations

from rasterflow.sample.cli import main
from rasterflow.sample.demo import DEMO_FOLDER, demo_spec_text, write_demo_spec
from rasterflow.sample.files import SampleCatalog
from rasterflow.sample.generate import generate_sample
from rasterflow.sample.grid import ASSETS, COLLECTION_ID, CRS, EPSG, SCL_CLASSES

# The other public constants of the module before its split, still reachable as rasterflow.sample.NAME (outside
# __all__, as they were). The lint this package is held to is E, F, W: these grouped redundant aliases are kept so.
from rasterflow.sample.files import LOCKFILE as LOCKFILE, MANIFEST as MANIFEST
from rasterflow.sample.grid import (
    ACQUISITION_TIME as ACQUISITION_TIME,
    CLOUD_CLASSES as CLOUD_CLASSES,
    GENERATOR_VERSION as GENERATOR_VERSION,
    OFFSET as OFFSET,
    REFLECTANCE_ASSETS as REFLECTANCE_ASSETS,
    RESOLUTION as RESOLUTION,
    SCALE as SCALE,
    UTM_ZONE as UTM_ZONE,
    X0 as X0,
    Y0 as Y0,
)
from rasterflow.sample.items import (
    COG_MEDIA_TYPE as COG_MEDIA_TYPE,
    EXT_EO as EXT_EO,
    EXT_PROJ as EXT_PROJ,
    EXT_RASTER as EXT_RASTER,
    STAC_EXTENSIONS as STAC_EXTENSIONS,
    STAC_VERSION as STAC_VERSION,
)

__all__ = [
    "ASSETS",
    "COLLECTION_ID",
    "CRS",
    "DEMO_FOLDER",
    "EPSG",
    "SCL_CLASSES",
    "SampleCatalog",
    "demo_spec_text",
    "generate_sample",
    "main",
    "write_demo_spec",
]
