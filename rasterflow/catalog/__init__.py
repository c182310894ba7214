"""STAC search, metadata only: a STAC API through pystac-client, or a local file of items filtered in-process.

Both paths take the same :class:`StacQuery` and are meant to return the same items for the same catalog content:

* **API** (``http://`` / ``https://``): ``pystac_client.Client.open(url).search(method="POST", ...)``, pages
  collected with ``items_as_dicts()`` (plain dicts: pystac would rewrite ``proj:epsg`` to ``proj:code``). A
  cql2-text ``filter`` is converted to cql2-json first (stac-fastapi-pgstac accepts only cql2-json over POST).
* **Local file** (``.json`` ItemCollection or list of items, ``.ndjson``, stac-geoparquet ``.parquet``): read
  whole (parquet with ``rustac.read_sync``; no DuckDB, which needs a download), then filtered here.

Semantics shared by both paths
------------------------------
* ``collections``: item ``collection`` in the list (empty = any).
* ``bbox``: WGS84 ``(west, south, east, north)``; west > east crosses the antimeridian. Locally an item matches
  when its ``bbox`` (or the bounds of its geometry) intersects the query bbox, edges included. An API intersects
  the geometry itself, so a footprint that misses the bbox while its bounding box touches it is kept locally only.
* ``datetime``: a closed interval. Date-only bounds cover whole days (``2024-08-31`` as an end means up to
  ``23:59:59.999999Z``); ``YYYY`` and ``YYYY-MM`` cover the whole year / month; ``..`` or empty is open; a single
  value is an instant (full timestamp) or that whole period (partial date). Relative windows (``P30D``, ``P1Y``,
  ``PT12H``, ``P1Y2M10DT2H30M``, ``P2W``) end *now* and are resolved once, at search time (:func:`resolve_datetime`).
  The interval is normalised here and sent to an API as explicit UTC timestamps, so both paths apply the same
  bounds. An item matches when ``[start_datetime or datetime, end_datetime or datetime]`` overlaps the interval.
* ``query`` (STAC query extension): ``{"prop": {"op": value, ...}, ...}``, all conditions ANDed, ops ``eq``, ``neq``,
  ``lt``, ``lte``, ``gt``, ``gte``, ``startsWith``, ``endsWith``, ``contains``, ``in``. A missing or null property
  never matches (SQL semantics). An API gets it as ``query`` only when it uses just ``eq``/``neq``/``lt``/``lte``/
  ``gt``/``gte`` and there is no ``filter``; otherwise, when the API supports ``filter``, the query is translated
  to CQL2 (:func:`query_to_cql2`) and ANDed into the filter (measured on stac-fastapi-pgstac 7.2: the other ops
  get HTTP 400, and ``query`` together with ``filter`` gets HTTP 400 "Query extension is not available when
  using pgstac with cql2").
* ``filter`` (CQL2, text or JSON): evaluated locally with ``cql2.Expr(...).matches(item)``; an item on which the
  expression cannot be evaluated (e.g. a property it lacks) does not match, as in SQL.
* An API that does not declare the query / filter conformance class gets a :class:`CatalogError` rather than
  silently wrong results (``rustac serve`` ignores both).

Ordering and ``max_items``
--------------------------
The result is always sorted ascending by ``(datetime, id)`` (``datetime`` falls back to ``start_datetime``).
``max_items = N`` keeps the **N most recent** matches: the first N in the order ``(datetime desc, id desc)``,
which is pgstac's default order (measured: stac-fastapi-pgstac 7.2 / pgstac 0.10 return ties on datetime by
id descending). On the API path that order is requested explicitly with ``sortby`` when the API declares the
sort extension and pystac-client stops after N items; when it does not (``rustac serve``'s memory backend returns
items grouped by collection in load order and ignores ``sortby``), every match is fetched and the N most recent
are kept here. The local path applies the same rule, so both give the same set.

Every returned item dict carries ``proj:epsg`` wherever it carried ``proj:code`` ``"EPSG:nnnn"`` (in
``properties`` and in each asset): stackstac 0.5.1 reads only ``proj:epsg``.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime
from typing import Any

from rasterflow.catalog.api import DEFAULT_PAGE_SIZE, DEFAULT_TIMEOUT, search_api
from rasterflow.catalog.local import (
    SUPPORTED_SUFFIXES,
    filter_local,
    is_url,
    local_path,
    read_local_items,
)
from rasterflow.catalog.probe import source_header, source_tile_shape, undeclared_headers
from rasterflow.catalog.query import (
    QUERY_OPS,
    StacQuery,
    bbox_intersects,
    item_bbox,
    parse_interval,
    sort_key,
    item_datetime_range,
    match_query,
    query_to_cql2,
    resolve_datetime,
    restore_proj_epsg,
)
from rasterflow.errors import NoItemsFoundError
from rasterflow.sources import gc_paused
from rasterflow.spec.timeparse import format_interval

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_TIMEOUT",
    "QUERY_OPS",
    "SUPPORTED_SUFFIXES",
    "StacQuery",
    "item_datetime_range",
    "match_query",
    "query_to_cql2",
    "read_local_items",
    "resolve_datetime",
    "restore_proj_epsg",
    "search_items",
    "source_header",
    "source_tile_shape",
    "undeclared_headers",
]

# ----------------------------------------------------------------------------------------------------------------
# entry point


def _describe(q: StacQuery, interval_text: str | None) -> list[str]:
    lines = [f"  catalog:     {q.catalog}"]
    lines.append(f"  collections: {', '.join(q.collections) if q.collections else '(any)'}")
    lines.append(f"  bbox:        {list(q.bbox) if q.bbox is not None else '(anywhere)'}")
    if q.datetime and interval_text and q.datetime.strip() != interval_text:
        lines.append(f"  datetime:    {q.datetime} = {interval_text}")
    else:
        lines.append(f"  datetime:    {interval_text or '(any time)'}")
    if q.query:
        lines.append(f"  query:       {json.dumps(q.query)}")
    if q.filter is not None:
        lines.append(f"  filter:      {q.filter if isinstance(q.filter, str) else json.dumps(q.filter)}")
    return lines


def _items_extent(items: list[dict[str, Any]], collections: tuple[str, ...] | list[str] | None) -> tuple[float, float, float, float] | None:
    """The union of the items' bboxes (of the searched collections), or None when none has one."""
    boxes = [box for item in items if not collections or item.get("collection") in collections
             for box in [item_bbox(item)] if box is not None]
    if not boxes:
        return None
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def _no_items_message(q: StacQuery, interval_text: str | None, local: list[dict[str, Any]] | None) -> str:
    lines = ["the STAC search matched no items:", *_describe(q, interval_text)]
    if local is not None:
        present = sorted({str(i.get("collection")) for i in local})
        lines.append(
            f"  (the file holds {len(local)} item{'s' if len(local) != 1 else ''}"
            + (f" in collection{'s' if len(present) != 1 else ''} {', '.join(present)})" if local else ")")
        )
    swapped = False
    extent = _items_extent(local, q.collections) if local else None
    if extent is not None:
        lines.append(f"  the items' extent (WGS84 lon/lat): [{', '.join(f'{v:.4f}' for v in extent)}]")
        if q.bbox is not None and not bbox_intersects(tuple(q.bbox), extent):
            west, south, east, north = q.bbox
            swapped = bbox_intersects((south, west, north, east), extent)
            lines.append("  the bbox does not meet it" + (
                f"; the bbox looks like lat/lon: swapped, [{south}, {west}, {north}, {east}] meets it "
                f"(write west, south, east, north: longitude first)" if swapped else ""))
    hints = ["swap the bbox to west, south, east, north"] if swapped else []
    if q.collections:
        hints.append("check the collection ids")
    if q.bbox is not None:
        hints.append("enlarge bbox (WGS84 lon/lat: west, south, east, north)")
    if interval_text:
        hints.append("widen datetime")
    if q.query:
        hints.append("relax query")
    if q.filter is not None:
        hints.append("relax filter")
    lines.append("To find items: " + ("; ".join(hints) if hints else "check the catalog") + ".")
    return "\n".join(lines)


def search_items(
    q: StacQuery,
    *,
    now: datetime | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[dict[str, Any]]:
    """Search ``q.catalog`` and return the matching items as plain dicts, sorted by ``(datetime, id)``.

    ``now`` anchors relative datetime windows (default: the current time). ``page_size`` is the ``limit`` asked of
    a STAC API per page, ``timeout`` the seconds to wait for one of its answers. Raises :class:`CatalogError` when the catalog cannot be read or searched, and
    :class:`NoItemsFoundError` (a ``CatalogError``) when nothing matched; its message repeats the search.
    """
    interval = parse_interval(q.datetime, now)
    # = query.query_interval_text; timeparse is imported here directly (tests/test_timeparse.py::test_layering)
    interval_text = None if interval is None else format_interval(*interval)
    catalog = str(q.catalog).strip()
    # A local file's parsed items, filters and sort keys are acyclic: collections would only walk them (3 s of a
    # 73,000-item plan). An API search keeps the collector: its HTTP clients do make cycles.
    with contextlib.nullcontext() if is_url(catalog) else gc_paused():
        return _search(q, interval, interval_text, catalog, page_size, timeout)


def _search(q: StacQuery, interval: tuple[datetime | None, datetime | None] | None, interval_text: str | None,
            catalog: str, page_size: int, timeout: float) -> list[dict[str, Any]]:
    local_all: list[dict[str, Any]] | None = None
    if is_url(catalog):
        items = search_api(q, interval, page_size, timeout)
    else:
        local_all = read_local_items(local_path(catalog))
        items = filter_local(local_all, q, interval)

    # One order for both paths; max_items keeps the N most recent = the first N of (datetime desc, id desc).
    unique: dict[tuple[object, object], dict[str, Any]] = {}
    for item in items:
        unique.setdefault((item.get("collection"), item.get("id")), item)
    items = sorted(unique.values(), key=sort_key)
    if q.max_items is not None:
        items = items[-q.max_items:]
    if not items:
        error = NoItemsFoundError(_no_items_message(q, interval_text, local_all))
        extent = _items_extent(local_all, q.collections) if local_all else None
        # where in the spec to point: the bbox when it misses every item of the file, else the search as a whole
        error.field = ("bbox" if extent is not None and q.bbox is not None
                       and not bbox_intersects(tuple(q.bbox), extent) else "")
        raise error
    return [restore_proj_epsg(i) for i in items]

