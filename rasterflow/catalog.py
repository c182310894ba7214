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

import json
import logging
import math
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rasterflow.errors import CatalogError, NoItemsFoundError
from rasterflow.spec.timeparse import DatetimeWindow, format_interval, parse_datetime_window, parse_instant

__all__ = [
    "source_tile_shape",
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_TIMEOUT",
    "QUERY_OPS",
    "SUPPORTED_SUFFIXES",
    "StacQuery",
    "item_datetime_range",
    "match_query",
    "query_to_cql2",
    "resolve_datetime",
    "restore_proj_epsg",
    "search_items",
]

log = logging.getLogger(__name__)

SUPPORTED_SUFFIXES = (".json", ".ndjson", ".parquet")
"""Local item files :func:`search_items` reads: ItemCollection (or list of items) JSON, NDJSON, stac-geoparquet."""

QUERY_OPS = ("eq", "neq", "lt", "lte", "gt", "gte", "startsWith", "endsWith", "contains", "in")
"""Operators of the STAC query extension that are supported."""

_BASIC_QUERY_OPS = frozenset({"eq", "neq", "lt", "lte", "gt", "gte"})  # what every query-extension API accepts

DEFAULT_PAGE_SIZE = 100
"""Items per page requested from a STAC API (the ``limit`` parameter)."""

DEFAULT_TIMEOUT = 60.0
"""Seconds to wait for a STAC API to connect or answer one request."""

_SORT_DESC = [
    {"field": "properties.datetime", "direction": "desc"},
    {"field": "id", "direction": "desc"},
]


@dataclass(frozen=True)
class StacQuery:
    """One STAC search, as resolved from ``source.stac`` of a spec."""

    catalog: str
    """An http(s) URL of a STAC API root, or the path of a local ``.json`` / ``.ndjson`` / ``.parquet`` item file."""
    collections: tuple[str, ...] = ()
    """Collection ids; empty means any collection."""
    bbox: tuple[float, float, float, float] | None = None
    """WGS84 ``(west, south, east, north)``; ``None`` means anywhere."""
    datetime: str | None = None
    """ISO 8601 interval (``2024-06-01/2024-08-31``, open ends ``..``) or a relative window ending now (``P30D``)."""
    query: Mapping[str, Any] | None = None
    """STAC query extension, e.g. ``{"eo:cloud_cover": {"lt": 40}}``."""
    filter: Mapping[str, Any] | str | None = None
    """CQL2 filter: cql2-json (a mapping) or cql2-text (a string)."""
    max_items: int | None = None
    """Keep at most this many items: the most recent ones (see the module docstring)."""

    def __post_init__(self) -> None:
        if isinstance(self.collections, str):
            object.__setattr__(self, "collections", (self.collections,))
        else:
            object.__setattr__(self, "collections", tuple(self.collections or ()))
        if self.bbox is not None:
            bbox = tuple(float(v) for v in self.bbox)
            if len(bbox) != 4:
                raise CatalogError(f"bbox must have 4 numbers (west, south, east, north), got {len(bbox)}")
            _, south, _, north = bbox
            if not all(math.isfinite(v) for v in bbox) or south > north or not (-90 <= south and north <= 90):
                raise CatalogError(
                    f"invalid bbox {list(bbox)}: expected WGS84 lon/lat (west, south, east, north) with "
                    "-90 <= south <= north <= 90"
                )
            object.__setattr__(self, "bbox", bbox)
        if self.max_items is not None:
            if isinstance(self.max_items, bool) or int(self.max_items) != self.max_items or self.max_items < 1:
                raise CatalogError(f"max_items must be a positive integer, got {self.max_items!r}")
            object.__setattr__(self, "max_items", int(self.max_items))


# ----------------------------------------------------------------------------------------------------------------
# datetime


def _parse_instant(value: Any) -> datetime:
    """An item timestamp (RFC 3339 date-time, or a bare date as its midnight) in UTC; see
    :func:`rasterflow.spec.timeparse.parse_instant`. Raises ``ValueError`` / ``TypeError``."""
    return parse_instant(value)


def resolve_datetime(value: str | None, now: datetime | None = None) -> str | None:
    """Turn a relative window (``P30D``, ``P1Y``, ``PT12H``...) into an explicit ``start/end`` interval ending at
    ``now`` (default: the current UTC time; a naive ``now`` is taken as UTC). Anything else is returned stripped
    and otherwise unchanged; ``None`` and empty text give ``None``. Parsing is
    :func:`rasterflow.spec.timeparse.parse_datetime_window`, the spec validator's own.

    >>> resolve_datetime("P30D", now=datetime(2024, 9, 15, tzinfo=timezone.utc))
    '2024-08-16T00:00:00Z/2024-09-15T00:00:00Z'
    """
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        return None
    if text[0] not in "Pp" or "/" in text:
        return text
    return _parse_window(text).to_stac(now)


def _parse_window(text: str) -> DatetimeWindow:
    try:
        return parse_datetime_window(text)
    except ValueError as exc:
        raise CatalogError(f"invalid datetime {text.strip()!r}: {exc}") from None


def _parse_interval(
    text: str | None, now: datetime | None = None
) -> tuple[datetime | None, datetime | None] | None:
    """UTC ``(start, end)`` (either may be open) of a ``datetime`` value, a relative one ending at ``now``;
    ``None`` when there is no constraint (``None``, empty, or ``../..``). Raises :class:`CatalogError`."""
    if text is None or not str(text).strip():
        return None
    window = _parse_window(str(text))
    if window.unbounded:
        return None
    try:
        return window.resolve(now)
    except ValueError as exc:
        raise CatalogError(f"invalid datetime {str(text).strip()!r}: {exc}") from None


def _interval_text(interval: tuple[datetime | None, datetime | None] | None) -> str | None:
    return None if interval is None else format_interval(*interval)


def item_datetime_range(item: Mapping[str, Any]) -> tuple[datetime | None, datetime | None]:
    """``(start, end)`` of an item: ``start_datetime``/``end_datetime`` when present, else ``datetime`` for both."""
    props = item.get("properties") or {}
    dt = props.get("datetime")
    start = props.get("start_datetime") or dt
    end = props.get("end_datetime") or dt
    try:
        return (_parse_instant(start) if start else None, _parse_instant(end) if end else None)
    except (TypeError, ValueError):
        raise CatalogError(
            f"item {item.get('id')!r} has an invalid datetime: {dt or start or end!r}"
        ) from None


_MIN_DT = datetime.min.replace(tzinfo=timezone.utc)


def _sort_key(item: Mapping[str, Any]) -> tuple[datetime, str]:
    props = item.get("properties") or {}
    value = props.get("datetime") or props.get("start_datetime")
    try:
        dt = _parse_instant(value) if value else _MIN_DT
    except (TypeError, ValueError):
        dt = _MIN_DT
    return dt, str(item.get("id", ""))


# ----------------------------------------------------------------------------------------------------------------
# in-process filters


def _item_bbox(item: Mapping[str, Any]) -> tuple[float, float, float, float] | None:
    bbox = item.get("bbox")
    if bbox and len(bbox) in (4, 6):
        if len(bbox) == 6:
            return bbox[0], bbox[1], bbox[3], bbox[4]
        return tuple(bbox)  # type: ignore[return-value]
    geom = item.get("geometry")
    if not geom:
        return None
    xs: list[float] = []
    ys: list[float] = []

    def walk(c: Any) -> None:
        if isinstance(c, (list, tuple)) and c and isinstance(c[0], (int, float)):
            xs.append(c[0])
            ys.append(c[1])
        elif isinstance(c, (list, tuple)):
            for sub in c:
                walk(sub)

    if geom.get("type") == "GeometryCollection":
        for g in geom.get("geometries", []):
            walk(g.get("coordinates"))
    else:
        walk(geom.get("coordinates"))
    if not xs:
        return None
    return min(xs), min(ys), max(xs), max(ys)


def _lon_ranges(west: float, east: float) -> list[tuple[float, float]]:
    return [(west, east)] if west <= east else [(west, 180.0), (-180.0, east)]


def _bbox_intersects(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    if a[1] > b[3] or b[1] > a[3]:
        return False
    return any(
        lo1 <= hi2 and lo2 <= hi1 for lo1, hi1 in _lon_ranges(a[0], a[2]) for lo2, hi2 in _lon_ranges(b[0], b[2])
    )


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _comparable(a: Any, b: Any) -> bool:
    return (_is_number(a) and _is_number(b)) or (isinstance(a, str) and isinstance(b, str))


def _check_query(query: Mapping[str, Any]) -> None:
    for prop, ops in query.items():
        if not isinstance(ops, Mapping) or not ops:
            raise CatalogError(
                f"query: {prop!r} must map operators to values, e.g. {{{prop!r}: {{'lt': 40}}}}; got {ops!r}"
            )
        for op, operand in ops.items():
            if op not in QUERY_OPS:
                raise CatalogError(
                    f"query: unknown operator {op!r} for {prop!r}; supported: {', '.join(QUERY_OPS)}"
                )
            if op == "in" and not isinstance(operand, (list, tuple)):
                raise CatalogError(f"query: 'in' for {prop!r} needs a list of values, got {operand!r}")
            if op in ("startsWith", "endsWith") and not isinstance(operand, str):
                raise CatalogError(f"query: {op!r} for {prop!r} needs a string, got {operand!r}")


def _query_op(value: Any, op: str, operand: Any) -> bool:
    if value is None:
        return False
    if op == "eq":
        return _comparable(value, operand) and value == operand
    if op == "neq":
        return not (_comparable(value, operand) and value == operand)
    if op in ("lt", "lte", "gt", "gte"):
        if not _comparable(value, operand):
            return False
        return {"lt": value < operand, "lte": value <= operand, "gt": value > operand, "gte": value >= operand}[op]
    if op == "startsWith":
        return isinstance(value, str) and value.startswith(operand)
    if op == "endsWith":
        return isinstance(value, str) and value.endswith(operand)
    if op == "contains":
        if isinstance(value, str):
            return isinstance(operand, str) and operand in value
        if isinstance(value, list):
            return operand in value
        return False
    if op == "in":
        return any(_comparable(value, o) and value == o for o in operand)
    raise CatalogError(f"query: unknown operator {op!r}; supported: {', '.join(QUERY_OPS)}")


def _property(item: Mapping[str, Any], name: str) -> Any:
    props = item.get("properties") or {}
    if name in props:
        return props[name]
    if name.startswith("properties."):
        return props.get(name[len("properties."):])
    if name in ("id", "collection"):
        return item.get(name)
    return None


def match_query(item: Mapping[str, Any], query: Mapping[str, Any] | None) -> bool:
    """Whether ``item`` satisfies a STAC query-extension mapping (all conditions ANDed; missing = no match)."""
    if not query:
        return True
    _check_query(query)
    return all(_query_op(_property(item, prop), op, v) for prop, ops in query.items() for op, v in ops.items())


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def query_to_cql2(query: Mapping[str, Any]) -> dict[str, Any]:
    """The CQL2 (JSON) equivalent of a STAC query-extension mapping.

    >>> query_to_cql2({"eo:cloud_cover": {"lt": 40}})
    {'op': '<', 'args': [{'property': 'eo:cloud_cover'}, 40]}
    """
    _check_query(query)
    simple = {"eq": "=", "neq": "<>", "lt": "<", "lte": "<=", "gt": ">", "gte": ">="}
    args: list[dict[str, Any]] = []
    for prop, ops in query.items():
        ref = {"property": prop}
        for op, v in ops.items():
            if op in simple:
                args.append({"op": simple[op], "args": [ref, v]})
            elif op == "in":
                args.append({"op": "in", "args": [ref, list(v)]})
            elif op == "startsWith":
                args.append({"op": "like", "args": [ref, _like_escape(v) + "%"]})
            elif op == "endsWith":
                args.append({"op": "like", "args": [ref, "%" + _like_escape(v)]})
            elif op == "contains":
                args.append({"op": "like", "args": [ref, "%" + _like_escape(str(v)) + "%"]})
    return args[0] if len(args) == 1 else {"op": "and", "args": args}


def _parse_filter(value: Mapping[str, Any] | str):
    """A ``cql2.Expr`` from cql2-text or cql2-json, or a :class:`CatalogError` saying what is wrong."""
    import cql2

    try:
        if isinstance(value, str):
            return cql2.Expr(value)
        return cql2.Expr(json.loads(json.dumps(dict(value))))
    except Exception as exc:  # cql2.ParseError, ValueError, TypeError...
        kind = "cql2-text" if isinstance(value, str) else "cql2-json"
        raise CatalogError(f"filter: invalid {kind} {value!r}: {exc}") from None


def _matches_filter(expr, item: Mapping[str, Any]) -> bool:
    try:
        return bool(expr.matches(dict(item)))
    except Exception:  # e.g. "Could not reduce expression to boolean" for a property the item lacks
        return False


# ----------------------------------------------------------------------------------------------------------------
# proj:epsg


_EPSG_CODE_RE = re.compile(r"^\s*EPSG:(\d+)\s*$", re.IGNORECASE)


def _restore(d: dict[str, Any]) -> None:
    if d.get("proj:epsg") is not None:
        return
    code = d.get("proj:code")
    if isinstance(code, str):
        m = _EPSG_CODE_RE.match(code)
        if m:
            d["proj:epsg"] = int(m[1])


def restore_proj_epsg(item: dict[str, Any]) -> dict[str, Any]:
    """Add ``proj:epsg`` next to every ``proj:code`` ``"EPSG:nnnn"`` (properties and assets); in place, returned."""
    props = item.get("properties")
    if isinstance(props, dict):
        _restore(props)
    for asset in (item.get("assets") or {}).values():
        if isinstance(asset, dict):
            _restore(asset)
    return item


# ----------------------------------------------------------------------------------------------------------------
# local files


def _is_url(catalog: str) -> bool:
    return bool(re.match(r"^https?://", catalog, re.IGNORECASE))


def _local_path(catalog: str) -> Path:
    if catalog.lower().startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(catalog).path))
    if re.match(r"^[a-z][a-z0-9+.-]*://", catalog, re.IGNORECASE):
        raise CatalogError(
            f"unsupported catalog {catalog!r}: use an http(s) STAC API URL or a local item file "
            f"({', '.join(SUPPORTED_SUFFIXES)})"
        )
    return Path(catalog).expanduser()


def _items_from_value(value: Any, path: Path) -> list[dict]:
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


def _check_items(items: list, path: Path, where: str = "item") -> list[dict]:
    for n, item in enumerate(items, 1):
        if not isinstance(item, dict) or item.get("type") != "Feature" or "id" not in item:
            raise CatalogError(f"{path}: {where} {n} is not a STAC item (a GeoJSON Feature with an id)")
    return items


def read_local_items(path: Path) -> list[dict]:
    """Every item in a local ``.json`` / ``.ndjson`` / ``.parquet`` file, as plain dicts."""
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise CatalogError(
            f"unsupported catalog file {path} ({suffix or 'no extension'}): supported are .json (an ItemCollection "
            "or a list of items), .ndjson (one item per line), .parquet (stac-geoparquet), or an http(s) STAC API URL"
        )
    if not path.is_file():
        raise CatalogError(f"catalog file not found: {path}" + (" (it is a directory)" if path.is_dir() else ""))
    if suffix == ".parquet":
        import rustac

        try:
            value = rustac.read_sync(str(path))
        except Exception as exc:
            raise CatalogError(f"cannot read {path} as stac-geoparquet: {exc}") from None
        return _check_items(_items_from_value(value, path), path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"cannot read {path}: {exc}") from None
    if suffix == ".json":
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CatalogError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
        return _check_items(_items_from_value(value, path), path)
    items = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CatalogError(f"{path}:{lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
        if not isinstance(item, dict) or item.get("type") != "Feature" or "id" not in item:
            raise CatalogError(f"{path}:{lineno}: not a STAC item (a GeoJSON Feature with an id)")
        items.append(item)
    return items


def _filter_local(
    items: Iterable[dict],
    q: StacQuery,
    interval: tuple[datetime | None, datetime | None] | None,
) -> list[dict]:
    collections = set(q.collections)
    if q.query:
        _check_query(q.query)
    expr = _parse_filter(q.filter) if q.filter is not None else None
    out = []
    for item in items:
        if collections and item.get("collection") not in collections:
            continue
        if q.bbox is not None:
            ib = _item_bbox(item)
            if ib is None or not _bbox_intersects(ib, q.bbox):
                continue
        if interval is not None:
            start, end = item_datetime_range(item)
            if start is None or end is None:
                continue
            if (interval[1] is not None and start > interval[1]) or (interval[0] is not None and end < interval[0]):
                continue
        if q.query and not match_query(item, q.query):
            continue
        if expr is not None and not _matches_filter(expr, item):
            continue
        out.append(item)
    return out


# ----------------------------------------------------------------------------------------------------------------
# STAC API


def _reason(exc: BaseException) -> str:
    """A one-line reason from a requests / pystac-client exception, without the wrapping noise."""
    status = getattr(exc, "status_code", None)
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\] ([^'\"\)\]]+)", text)
    if m:
        return m.group(1).strip()
    if re.search(r"timed? ?out", text, re.IGNORECASE):
        return "timed out"
    text = " ".join(text.split())
    if len(text) > 400:
        text = text[:400] + "..."
    if status:
        return f"HTTP {status}: {text}" if text else f"HTTP {status}"
    return text or type(exc).__name__


def _conforms(conforms_to: list[str], fragment: str) -> bool:
    pattern = re.compile(r"^https://api\.stacspec\.org/v1\.[^/]*" + re.escape(fragment) + "$")
    return any(pattern.match(c) for c in conforms_to)


def _search_api(
    q: StacQuery,
    interval: tuple[datetime | None, datetime | None] | None,
    page_size: int,
    timeout: float,
) -> list[dict]:
    from pystac_client import Client
    from pystac_client.warnings import DoesNotConformTo

    url = q.catalog
    if q.query:
        _check_query(q.query)
    expr = _parse_filter(q.filter) if q.filter is not None else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            client = Client.open(url, timeout=timeout)
    except Exception as exc:
        raise CatalogError(f"cannot open the STAC API at {url}: {_reason(exc)}") from exc
    conforms_to = list(client.get_conforms_to() or [])
    if not _conforms(conforms_to, "/item-search"):
        raise CatalogError(
            f"{url} is not a STAC API with item search (it does not declare the item-search conformance class); "
            "for a static catalog, export its items to .ndjson or .parquet and point `catalog` at that file"
        )
    has_filter = _conforms(conforms_to, "/item-search#filter")
    has_query = _conforms(conforms_to, "/item-search#query")
    has_sort = _conforms(conforms_to, "/item-search#sort")

    query = dict(q.query) if q.query else None
    filter_json = expr.to_json() if expr is not None else None
    if query is not None:
        extended = any(op not in _BASIC_QUERY_OPS for ops in query.values() for op in ops)
        if has_query and not extended and filter_json is None:
            pass  # sent as the query extension
        elif has_filter:
            # stac-fastapi-pgstac rejects startsWith/endsWith/contains/in in `query`, and `query` together with
            # `filter` in one request: send the query as CQL2, ANDed into the filter
            translated = query_to_cql2(query)
            filter_json = translated if filter_json is None else {"op": "and", "args": [filter_json, translated]}
            query = None
        elif has_query and extended:
            raise CatalogError(
                f"the STAC API at {url} supports the query extension but not filter (CQL2), and query uses "
                f"operators beyond {', '.join(sorted(_BASIC_QUERY_OPS))}; use only those"
            )
        elif has_query:
            pass  # with a filter the API cannot take: refused just below
        else:
            raise CatalogError(
                f"the STAC API at {url} supports neither the query nor the filter extension, so `query` cannot "
                "be applied (it would be silently ignored); remove it, or search a local item file instead"
            )
    if filter_json is not None and not has_filter:
        raise CatalogError(
            f"the STAC API at {url} does not support the filter extension (CQL2), so `filter` cannot be applied "
            "(it would be silently ignored); remove it, or search a local item file instead"
        )

    server_max = q.max_items if (q.max_items is not None and has_sort) else None
    if q.max_items is not None and not has_sort:
        log.info("%s does not declare the sort extension: fetching every match to keep the %d most recent",
                 url, q.max_items)
    limit = max(1, min(page_size, server_max) if server_max else page_size)
    kwargs: dict[str, Any] = dict(
        method="POST",
        collections=list(q.collections) or None,
        bbox=list(q.bbox) if q.bbox is not None else None,
        datetime=_interval_text(interval),
        query=query,
        filter=filter_json,
        filter_lang="cql2-json" if filter_json is not None else None,
        max_items=server_max,
        limit=limit,
    )
    if server_max is not None:
        kwargs["sortby"] = _SORT_DESC
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DoesNotConformTo)
            search = client.search(**{k: v for k, v in kwargs.items() if v is not None})
            items = list(search.items_as_dicts())
    except CatalogError:
        raise
    except Exception as exc:
        raise CatalogError(f"the search at {url} failed: {_reason(exc)}") from exc
    return [i for i in items if isinstance(i, dict)]


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


def _no_items_message(q: StacQuery, interval_text: str | None, local: list[dict] | None) -> str:
    lines = ["the STAC search matched no items:", *_describe(q, interval_text)]
    if local is not None:
        present = sorted({str(i.get("collection")) for i in local})
        lines.append(
            f"  (the file holds {len(local)} item{'s' if len(local) != 1 else ''}"
            + (f" in collection{'s' if len(present) != 1 else ''} {', '.join(present)})" if local else ")")
        )
    hints = []
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
) -> list[dict]:
    """Search ``q.catalog`` and return the matching items as plain dicts, sorted by ``(datetime, id)``.

    ``now`` anchors relative datetime windows (default: the current time). ``page_size`` is the ``limit`` asked of
    a STAC API per page, ``timeout`` the seconds to wait for one of its answers. Raises :class:`CatalogError` when the catalog cannot be read or searched, and
    :class:`NoItemsFoundError` (a ``CatalogError``) when nothing matched; its message repeats the search.
    """
    interval = _parse_interval(q.datetime, now)
    interval_text = _interval_text(interval)
    catalog = str(q.catalog).strip()
    local_all: list[dict] | None = None
    if _is_url(catalog):
        items = _search_api(q, interval, page_size, timeout)
    else:
        local_all = read_local_items(_local_path(catalog))
        items = _filter_local(local_all, q, interval)

    # One order for both paths; max_items keeps the N most recent = the first N of (datetime desc, id desc).
    unique = {}
    for item in items:
        unique.setdefault((item.get("collection"), item.get("id")), item)
    items = sorted(unique.values(), key=_sort_key)
    if q.max_items is not None:
        items = items[-q.max_items:]
    if not items:
        raise NoItemsFoundError(_no_items_message(q, interval_text, local_all))
    return [restore_proj_epsg(i) for i in items]



def source_tile_shape(items: Sequence[Mapping[str, Any]], asset_key: str) -> tuple[int, int] | None:
    """The internal tile shape of the first item's ``asset_key`` file (its header only; no pixels), or None.

    ``plan`` uses it to warn when chunks cut through source tiles. Unreadable or untiled files give None: this is
    advice, never a reason to fail.
    """
    for item in items[:1]:
        href = (item.get("assets", {}).get(asset_key) or {}).get("href")
        if not href:
            return None
        try:
            import rasterio

            with rasterio.Env(GDAL_DISABLE_READDIR_ON_OPEN="EMPTY_DIR"), rasterio.open(href) as src:
                if not src.profile.get("tiled", False):
                    return None
                return tuple(src.block_shapes[0])  # type: ignore[return-value]
        except Exception:  # any failure to read a header only costs the advice
            return None
    return None
