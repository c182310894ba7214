"""Local item files (``.json`` ItemCollection or list of items, ``.ndjson``, stac-geoparquet ``.parquet``):
read whole, then filtered in-process with the same semantics as a STAC API search (see :mod:`rasterflow.catalog`).

``rustac`` (for ``.parquet``) and ``cql2`` (for a filter) are imported lazily, only when needed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from rasterflow.catalog.query import (
    StacQuery,
    bbox_intersects,
    check_query,
    item_bbox,
    matches_filter,
    parse_filter,
    item_datetime_range,
    match_query,
)
from rasterflow.errors import CatalogError, CatalogFileError
from rasterflow.sources import gc_paused

__all__ = ["SUPPORTED_SUFFIXES", "read_local_items"]

SUPPORTED_SUFFIXES = (".json", ".ndjson", ".parquet")
"""Local item files :func:`search_items` reads: ItemCollection (or list of items) JSON, NDJSON, stac-geoparquet."""


def is_url(catalog: str) -> bool:
    return bool(re.match(r"^https?://", catalog, re.IGNORECASE))


def local_path(catalog: str) -> Path:
    if catalog.lower().startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(catalog).path))
    if re.match(r"^[a-z][a-z0-9+.-]*://", catalog, re.IGNORECASE):
        raise CatalogError(
            f"unsupported catalog {catalog!r}: use an http(s) STAC API URL or a local item file "
            f"({', '.join(SUPPORTED_SUFFIXES)})"
        )
    return Path(catalog).expanduser()


def _items_from_value(value: Any, path: Path) -> list[dict[str, Any]]:
    if isinstance(value, list):
        items = value
    elif isinstance(value, dict) and value.get("type") == "Feature":
        items = [value]
    elif isinstance(value, dict) and isinstance(value.get("features"), list):
        items = value["features"]
    elif isinstance(value, dict) and value.get("type") in ("Catalog", "Collection"):
        raise CatalogError(
            f"{path} is a STAC {value['type']}, not a file of items: export its items to .ndjson or .parquet "
            "(e.g. with `rustac translate`), or serve them as a STAC API"
        )
    else:
        raise CatalogError(f"{path}: expected an ItemCollection (FeatureCollection), an item, or a list of items")
    return items


def _check_items(items: list[Any], path: Path, where: str = "item") -> list[dict[str, Any]]:
    for n, item in enumerate(items, 1):
        if not isinstance(item, dict) or item.get("type") != "Feature" or "id" not in item:
            raise CatalogError(f"{path}: {where} {n} is not a STAC item (a GeoJSON Feature with an id)")
    return items


def read_local_items(path: Path) -> list[dict[str, Any]]:
    """Every item in a local ``.json`` / ``.ndjson`` / ``.parquet`` file, as plain dicts."""
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise CatalogFileError(
            f"unsupported catalog file {path} ({suffix or 'no extension'}): supported are .json (an ItemCollection "
            "or a list of items), .ndjson (one item per line), .parquet (stac-geoparquet), or an http(s) STAC API URL"
        )
    if not path.is_file():
        # a run failure (exit 1), not an invalid spec: an upstream step may write the file later, and
        # `rasterflow retry` reruns failed runs (tests/test_batch.py's "late" catalog)
        raise CatalogError(f"catalog file not found: {path}" + (" (it is a directory)" if path.is_dir() else ""))
    if suffix == ".parquet":
        import rustac

        try:
            value = rustac.read_sync(str(path))
        except Exception as exc:  # noqa: BLE001 - any rustac failure is reported as a CatalogError
            raise CatalogError(f"cannot read {path} as stac-geoparquet: {exc}") from None
        return _check_items(_items_from_value(value, path), path)
    with gc_paused():  # parsed items are acyclic: collections during the parse only walk them (3x its time)
        if suffix == ".json":
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise CatalogError(f"cannot read {path}: {exc}") from None
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise CatalogError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
            return _check_items(_items_from_value(value, path), path)
        return _read_ndjson(path)


def _read_ndjson(path: Path) -> list[dict[str, Any]]:
    """One item per line, read line by line (the file's text is never held whole: 131 MB for 73,000 items)."""
    items = []
    try:
        with path.open(encoding="utf-8") as lines:
            for lineno, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CatalogError(f"{path}:{lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
                if not isinstance(item, dict) or item.get("type") != "Feature" or "id" not in item:
                    raise CatalogError(f"{path}:{lineno}: not a STAC item (a GeoJSON Feature with an id)")
                items.append(item)
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"cannot read {path}: {exc}") from None
    return items


def filter_local(
    items: Iterable[dict[str, Any]],
    q: StacQuery,
    interval: tuple[datetime | None, datetime | None] | None,
) -> list[dict[str, Any]]:
    collections = set(q.collections)
    if q.query:
        check_query(q.query)
    expr = parse_filter(q.filter) if q.filter is not None else None
    area = None
    if q.intersects is not None:
        from shapely.geometry import shape

        area = shape(q.intersects)
    out = []
    for item in items:
        if collections and item.get("collection") not in collections:
            continue
        if q.bbox is not None:
            ib = item_bbox(item)
            if ib is None or not bbox_intersects(ib, q.bbox):
                continue
        if area is not None and not _meets(item, area):
            continue
        if interval is not None:
            start, end = item_datetime_range(item)
            if start is None or end is None:
                continue
            if (interval[1] is not None and start > interval[1]) or (interval[0] is not None and end < interval[0]):
                continue
        if q.query and not match_query(item, q.query):
            continue
        if expr is not None and not matches_filter(expr, item):
            continue
        out.append(item)
    return out


def _meets(item: Mapping[str, Any], area: Any) -> bool:
    """An item's footprint (its geometry, else its bbox) meets the area of interest (a shapely geometry), as a STAC
    API's ``intersects`` decides."""
    from shapely.geometry import box, shape

    geometry = item.get("geometry")
    if isinstance(geometry, Mapping) and geometry.get("type"):
        try:
            return bool(shape(geometry).intersects(area))
        except Exception:  # a malformed footprint: judged by its bbox
            pass
    bbox = item_bbox(item)
    return bbox is not None and bool(box(*bbox).intersects(area))

