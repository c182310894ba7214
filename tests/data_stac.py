"""A small, deterministic set of STAC items (metadata only) for catalog tests.

Twelve items over two collections, with varied datetimes, bboxes, ``eo:cloud_cover``, ``platform`` and CRS given
either as ``proj:epsg`` (STAC projection extension v1.x) or as ``proj:code`` (v2.x). Asset hrefs point at files
that do not exist: nothing here reads pixels.

``write_stac_files(dir)`` writes the same items as an ItemCollection ``.json``, ``.ndjson``, stac-geoparquet
``.parquet`` and one ``<collection>.json`` per collection, and returns their paths.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COLLECTIONS", "StacFiles", "make_collection", "make_items", "write_stac_files"]

COLLECTIONS = ("test-s2", "test-ls")

PROJ_V1 = "https://stac-extensions.github.io/projection/v1.1.0/schema.json"
PROJ_V2 = "https://stac-extensions.github.io/projection/v2.0.0/schema.json"
EO = "https://stac-extensions.github.io/eo/v1.1.0/schema.json"

# (id, collection, datetime, (west, south, east, north), cloud, platform, epsg, proj key)
_ROWS = [
    ("s2-a", "test-s2", "2024-01-10T10:00:00Z", (13.0, 52.3, 13.5, 52.6), 5.0, "sentinel-2a", 32633, "epsg"),
    ("s2-b", "test-s2", "2024-03-05T10:00:00Z", (13.4, 52.4, 13.9, 52.8), 55.5, "sentinel-2b", 32633, "code"),
    ("s2-c", "test-s2", "2024-05-20T10:00:00Z", (2.0, 48.5, 2.6, 49.0), 12.0, "sentinel-2a", 32631, "epsg"),
    ("s2-d", "test-s2", "2024-06-15T10:00:00Z", (13.1, 52.2, 13.6, 52.5), 39.9, "sentinel-2b", 32633, "code"),
    ("s2-e", "test-s2", "2024-07-01T10:00:00Z", (13.2, 52.3, 13.7, 52.7), 40.0, "sentinel-2a", 32633, "epsg"),
    ("s2-f", "test-s2", "2024-07-01T10:00:00Z", (12.0, 51.0, 12.5, 51.4), 80.0, "sentinel-2b", 32633, "code"),
    ("s2-g", "test-s2", "2024-08-30T10:00:00Z", (13.6, 52.6, 14.2, 53.0), 0.5, "sentinel-2c", 32633, "epsg"),
    ("s2-h", "test-s2", "2024-09-10T10:00:00Z", (-74.2, 40.5, -73.7, 40.9), 20.0, "sentinel-2a", 32618, "code"),
    ("ls-a", "test-ls", "2024-02-14T15:30:00Z", (13.0, 52.0, 14.0, 53.0), 30.0, "landsat-8", 32633, "epsg"),
    ("ls-b", "test-ls", "2024-06-30T15:30:00Z", (12.5, 51.5, 13.5, 52.5), 70.0, "landsat-9", 32633, "code"),
    ("ls-c", "test-ls", "2024-08-01T15:30:00Z", (2.2, 48.6, 3.0, 49.2), 15.0, "landsat-9", 32631, "epsg"),
    ("ls-d", "test-ls", "2024-09-01T15:30:00Z", (14.5, 53.2, 15.0, 53.6), 2.0, "landsat-8", 32633, "code"),
]


def make_items() -> list[dict]:
    """The twelve test items as plain STAC item dicts (a fresh copy every call)."""
    items = []
    for id_, coll, dt, (w, s, e, n), cloud, platform, epsg, key in _ROWS:
        proj = {"proj:epsg": epsg} if key == "epsg" else {"proj:code": f"EPSG:{epsg}"}
        assets = {
            band: {
                "href": f"./data/{id_}/{band}.tif",
                "type": "image/tiff; application=geotiff; profile=cloud-optimized",
                "roles": ["data"],
                **proj,
            }
            for band in ("red", "nir")
        }
        items.append(
            {
                "type": "Feature",
                "stac_version": "1.0.0",
                "stac_extensions": [EO, PROJ_V1 if key == "epsg" else PROJ_V2],
                "id": id_,
                "collection": coll,
                "geometry": {
                    "type": "Polygon",
                    "coordinates": [[[w, s], [e, s], [e, n], [w, n], [w, s]]],
                },
                "bbox": [w, s, e, n],
                "properties": {
                    "datetime": dt,
                    "eo:cloud_cover": cloud,
                    "platform": platform,
                    **proj,
                },
                "links": [],
                "assets": assets,
            }
        )
    return items


def make_collection(collection_id: str, items: list[dict]) -> dict:
    """A minimal valid STAC collection whose extent covers ``items``."""
    mine = [i for i in items if i["collection"] == collection_id]
    bboxes = [i["bbox"] for i in mine] or [[-180.0, -90.0, 180.0, 90.0]]
    dts = sorted(i["properties"]["datetime"] for i in mine) or [None]
    return {
        "type": "Collection",
        "stac_version": "1.0.0",
        "stac_extensions": [],
        "id": collection_id,
        "description": f"rasterflow test collection {collection_id}",
        "license": "CC0-1.0",
        "extent": {
            "spatial": {
                "bbox": [
                    [
                        min(b[0] for b in bboxes),
                        min(b[1] for b in bboxes),
                        max(b[2] for b in bboxes),
                        max(b[3] for b in bboxes),
                    ]
                ]
            },
            "temporal": {"interval": [[dts[0], dts[-1]]]},
        },
        "links": [],
    }


@dataclass(frozen=True)
class StacFiles:
    items: list[dict]
    json: Path  # ItemCollection
    ndjson: Path
    parquet: Path
    collections: tuple[Path, ...]  # one collection .json per collection id


def write_stac_files(directory: Path, items: list[dict] | None = None) -> StacFiles:
    """Write ``items`` (default: :func:`make_items`) in every supported format under ``directory``."""
    import rustac

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    items = make_items() if items is None else items
    json_path = directory / "items.json"
    json_path.write_text(json.dumps({"type": "FeatureCollection", "features": items}, indent=1))
    ndjson_path = directory / "items.ndjson"
    ndjson_path.write_text("".join(json.dumps(i) + "\n" for i in items))
    parquet_path = directory / "items.parquet"
    rustac.write_sync(str(parquet_path), items)
    colls = []
    for cid in sorted({i["collection"] for i in items}):
        p = directory / f"collection-{cid}.json"
        p.write_text(json.dumps(make_collection(cid, items), indent=1))
        colls.append(p)
    return StacFiles(items, json_path, ndjson_path, parquet_path, tuple(colls))
