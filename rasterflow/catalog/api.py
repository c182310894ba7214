"""STAC API search through pystac-client: conformance checks, a POST ``/search``, one-line error reasons.

``pystac_client`` (and ``cql2`` for a filter) are imported lazily, inside :func:`search_api`.

Every request (landing page, conformance, each page of the search, GET or POST) goes through one requests session
whose adapter retries under the current :class:`~rasterflow.retry.RetryPolicy` (``source.retry``, made current by
the caller with :func:`rasterflow.retry.using`): the policy's statuses (5xx, 429, 408), connection resets and
timeouts, with exponential backoff and the server's ``Retry-After`` honoured (``urllib3.Retry``, given to
pystac-client's ``StacApiIO`` through its public ``max_retries``). pystac-client's default retries only
connection failures and GETs, so a single 503 on the POST search failed the run. A 4xx other than 408/429 is
answered at once, naming the status.
"""

from __future__ import annotations

import logging
import re
import warnings
from datetime import datetime
from typing import Any

from rasterflow.catalog.query import (
    BASIC_QUERY_OPS,
    StacQuery,
    check_query,
    query_interval_text,
    parse_filter,
    query_to_cql2,
)
from rasterflow.errors import CatalogError

__all__ = ["DEFAULT_PAGE_SIZE", "DEFAULT_TIMEOUT"]

log = logging.getLogger(__name__)

DEFAULT_PAGE_SIZE = 100
"""Items per page requested from a STAC API (the ``limit`` parameter)."""

DEFAULT_TIMEOUT = 60.0
"""Seconds to wait for a STAC API to connect or answer one request."""

_SORT_DESC = [
    {"field": "properties.datetime", "direction": "desc"},
    {"field": "id", "direction": "desc"},
]


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


def search_api(
    q: StacQuery,
    interval: tuple[datetime | None, datetime | None] | None,
    page_size: int,
    timeout: float,
) -> list[dict[str, Any]]:
    from pystac_client import Client
    from pystac_client.stac_api_io import StacApiIO
    from pystac_client.warnings import DoesNotConformTo

    from rasterflow import retry

    url = q.catalog
    if q.query:
        check_query(q.query)
    expr = parse_filter(q.filter) if q.filter is not None else None
    policy = retry.current()
    # the policy's timeout bounds one request (a stalled answer is a timeout, retried); the caller's bounds it too
    request_timeout = min(timeout, policy.timeout) if timeout else policy.timeout
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stac_io = StacApiIO(timeout=request_timeout, max_retries=retry.urllib3_retry(policy))
            client = Client.open(url, stac_io=stac_io, timeout=request_timeout)
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
        extended = any(op not in BASIC_QUERY_OPS for ops in query.values() for op in ops)
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
                f"operators beyond {', '.join(sorted(BASIC_QUERY_OPS))}; use only those"
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
    kwargs: dict[str, Any] = {
        "method": "POST",
        "collections": list(q.collections) or None,
        "bbox": list(q.bbox) if q.bbox is not None else None,
        "intersects": dict(q.intersects) if q.intersects is not None else None,
        "datetime": query_interval_text(interval),
        "query": query,
        "filter": filter_json,
        "filter_lang": "cql2-json" if filter_json is not None else None,
        "max_items": server_max,
        "limit": limit,
    }
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

