"""The pure, network-free part of a STAC search: :class:`StacQuery`, datetime intervals, in-process filters.

Everything here works on plain item dicts and is shared by the local-file path (:mod:`rasterflow.catalog.local`)
and the STAC API path (:mod:`rasterflow.catalog.api`); the semantics are documented in :mod:`rasterflow.catalog`.
Only ``cql2`` is needed, and only when a filter is parsed (imported lazily).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import cql2

from rasterflow.errors import CatalogError
from rasterflow.spec.timeparse import (
    DatetimeWindow,
    format_interval,
    parse_datetime_window,
    parse_instant,
)

__all__ = [
    "QUERY_OPS",
    "StacQuery",
    "item_datetime_range",
    "match_query",
    "query_to_cql2",
    "resolve_datetime",
    "restore_proj_epsg",
]

QUERY_OPS = ("eq", "neq", "lt", "lte", "gt", "gte", "startsWith", "endsWith", "contains", "in")
"""Operators of the STAC query extension that are supported."""

BASIC_QUERY_OPS = frozenset({"eq", "neq", "lt", "lte", "gt", "gte"})  # what every query-extension API accepts


@dataclass(frozen=True)
class StacQuery:
    """One STAC search, as resolved from ``source.stac`` of a spec."""

    catalog: str
    """An http(s) URL of a STAC API root, or the path of a local ``.json`` / ``.ndjson`` / ``.parquet`` item file."""
    collections: tuple[str, ...] = ()
    """Collection ids; empty means any collection."""
    bbox: tuple[float, float, float, float] | None = None
    """WGS84 ``(west, south, east, north)``; ``None`` means anywhere."""
    intersects: Mapping[str, Any] | None = None
    """A WGS84 GeoJSON Polygon / MultiPolygon the items' footprints must meet (instead of ``bbox``)."""
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

    >>> resolve_datetime("P30D", now=datetime(2024, 9, 15, tzinfo=UTC))
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


def parse_interval(
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


def query_interval_text(interval: tuple[datetime | None, datetime | None] | None) -> str | None:
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


_MIN_DT = datetime.min.replace(tzinfo=UTC)


def sort_key(item: Mapping[str, Any]) -> tuple[datetime, str]:
    props = item.get("properties") or {}
    value = props.get("datetime") or props.get("start_datetime")
    try:
        dt = _parse_instant(value) if value else _MIN_DT
    except (TypeError, ValueError):
        dt = _MIN_DT
    return dt, str(item.get("id", ""))


# ----------------------------------------------------------------------------------------------------------------
# in-process filters


def item_bbox(item: Mapping[str, Any]) -> tuple[float, float, float, float] | None:
    bbox = item.get("bbox")
    if bbox and len(bbox) in (4, 6):
        if len(bbox) == 6:
            return bbox[0], bbox[1], bbox[3], bbox[4]
        return tuple(bbox)
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


def bbox_intersects(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    if a[1] > b[3] or b[1] > a[3]:
        return False
    return any(
        lo1 <= hi2 and lo2 <= hi1 for lo1, hi1 in _lon_ranges(a[0], a[2]) for lo2, hi2 in _lon_ranges(b[0], b[2])
    )


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _comparable(a: Any, b: Any) -> bool:
    return (_is_number(a) and _is_number(b)) or (isinstance(a, str) and isinstance(b, str))


def check_query(query: Mapping[str, Any]) -> None:
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
        compared: dict[str, bool] = {"lt": value < operand, "lte": value <= operand, "gt": value > operand,
                                     "gte": value >= operand}
        return compared[op]
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
    check_query(query)
    return all(_query_op(_property(item, prop), op, v) for prop, ops in query.items() for op, v in ops.items())


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def query_to_cql2(query: Mapping[str, Any]) -> dict[str, Any]:
    """The CQL2 (JSON) equivalent of a STAC query-extension mapping.

    >>> query_to_cql2({"eo:cloud_cover": {"lt": 40}})
    {'op': '<', 'args': [{'property': 'eo:cloud_cover'}, 40]}
    """
    check_query(query)
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


def parse_filter(value: Mapping[str, Any] | str) -> cql2.Expr:
    """A ``cql2.Expr`` from cql2-text or cql2-json, or a :class:`CatalogError` saying what is wrong."""
    import cql2

    try:
        if isinstance(value, str):
            return cql2.Expr(value)
        return cql2.Expr(json.loads(json.dumps(dict(value))))
    except Exception as exc:  # noqa: BLE001 - cql2.ParseError, ValueError, TypeError...
        kind = "cql2-text" if isinstance(value, str) else "cql2-json"
        raise CatalogError(f"filter: invalid {kind} {value!r}: {exc}") from None


def matches_filter(expr: cql2.Expr, item: Mapping[str, Any]) -> bool:
    try:
        return bool(expr.matches(dict(item)))
    except Exception:  # noqa: BLE001 - e.g. "Could not reduce expression to boolean" for a property the item lacks
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

