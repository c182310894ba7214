"""The one ``datetime`` parser (rasterflow.spec.timeparse), shared by the spec validator and the STAC search."""

from __future__ import annotations

import ast
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from rasterflow import catalog
from rasterflow.catalog import resolve_datetime
from rasterflow.errors import CatalogError, SpecError
from rasterflow.spec import load_spec
from rasterflow.spec.timeparse import (
    DatetimeWindow,
    Duration,
    format_interval,
    format_rfc3339,
    parse_datetime_window,
    parse_duration,
    parse_instant,
)

UTC = timezone.utc
NOW = datetime(2024, 9, 15, 12, 0, tzinfo=UTC)
LAST_US = timedelta(microseconds=1)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def bounds(text: str, now: datetime = NOW) -> tuple[datetime | None, datetime | None]:
    return parse_datetime_window(text).resolve(now)


# ---------------------------------------------------------------------------------------------------------------
# accepted forms


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        # full intervals; a date end covers its whole day
        ("2024-06-01/2024-08-31", utc(2024, 6, 1), utc(2024, 9, 1) - LAST_US),
        (" 2024-06-01 / 2024-08-31 ", utc(2024, 6, 1), utc(2024, 9, 1) - LAST_US),
        ("2024-06-01T10:00:00Z/2024-06-01T11:30:00Z", utc(2024, 6, 1, 10), utc(2024, 6, 1, 11, 30)),
        ("2024-06-01/2024-06-01", utc(2024, 6, 1), utc(2024, 6, 2) - LAST_US),
        # open ends
        ("2024-06-01/..", utc(2024, 6, 1), None),
        ("2024-06-01/", utc(2024, 6, 1), None),
        ("../2024-08-31", None, utc(2024, 9, 1) - LAST_US),
        ("/2024-02-14T15:30:00Z", None, utc(2024, 2, 14, 15, 30)),
        ("../..", None, None),
        # partial dates, in intervals and alone
        ("2024-06/2024-08", utc(2024, 6, 1), utc(2024, 9, 1) - LAST_US),
        ("2023/2024", utc(2023, 1, 1), utc(2025, 1, 1) - LAST_US),
        ("2024-06-15/2024-06", utc(2024, 6, 15), utc(2024, 7, 1) - LAST_US),
        ("2024-02", utc(2024, 2, 1), utc(2024, 3, 1) - LAST_US),
        ("2023-02", utc(2023, 2, 1), utc(2023, 3, 1) - LAST_US),
        ("2024", utc(2024, 1, 1), utc(2025, 1, 1) - LAST_US),
        ("2024-12", utc(2024, 12, 1), utc(2025, 1, 1) - LAST_US),
        ("2024-02-29", utc(2024, 2, 29), utc(2024, 3, 1) - LAST_US),
        ("9999", utc(9999, 1, 1), datetime.max.replace(tzinfo=UTC)),
        # date-times: Z, offsets, fractions, naive = UTC, lowercase t/z, no seconds
        ("2024-07-01T10:00:00Z", utc(2024, 7, 1, 10), utc(2024, 7, 1, 10)),
        ("2024-07-01T12:00:00+02:00", utc(2024, 7, 1, 10), utc(2024, 7, 1, 10)),
        ("2024-07-01T05:30:00-0430", utc(2024, 7, 1, 10), utc(2024, 7, 1, 10)),
        ("2024-07-01T12:00+02", utc(2024, 7, 1, 10), utc(2024, 7, 1, 10)),
        ("2024-07-01T10:00:00", utc(2024, 7, 1, 10), utc(2024, 7, 1, 10)),
        ("2024-07-01t10:00:00z", utc(2024, 7, 1, 10), utc(2024, 7, 1, 10)),
        ("2024-07-01 10:00", utc(2024, 7, 1, 10), utc(2024, 7, 1, 10)),
        ("2024-07-01T10:00:00.5Z", utc(2024, 7, 1, 10, 0, 0, 500000), utc(2024, 7, 1, 10, 0, 0, 500000)),
        ("2024-07-01T10:00:00.123456789Z", utc(2024, 7, 1, 10, 0, 0, 123456), utc(2024, 7, 1, 10, 0, 0, 123456)),
        ("2024-01-01T00:30:00+01:00/2024-01-01", utc(2023, 12, 31, 23, 30), utc(2024, 1, 2) - LAST_US),
        # relative windows ending at NOW = 2024-09-15T12:00Z
        ("P30D", utc(2024, 8, 16, 12), NOW),
        ("p30d", utc(2024, 8, 16, 12), NOW),
        ("P2W", utc(2024, 9, 1, 12), NOW),
        ("P1M", utc(2024, 8, 15, 12), NOW),
        ("P1Y", utc(2023, 9, 15, 12), NOW),
        ("PT12H", utc(2024, 9, 15), NOW),
        ("PT90M", utc(2024, 9, 15, 10, 30), NOW),
        ("PT1.5S", utc(2024, 9, 15, 11, 59, 58, 500000), NOW),
        ("P1Y2M10DT2H", utc(2023, 7, 5, 10), NOW),
    ],
)
def test_accepted(text, start, end):
    assert bounds(text) == (start, end)


def test_window_fields():
    window = parse_datetime_window("2024-06-01/..")
    assert window == DatetimeWindow(utc(2024, 6, 1), None)
    assert window.relative is None and not window.unbounded
    assert parse_datetime_window("../..").unbounded
    relative = parse_datetime_window("P1Y2M10DT2H")
    assert relative.start is None and relative.end is None and not relative.unbounded
    assert relative.relative == Duration(months=14, delta=timedelta(days=10, hours=2))
    with pytest.raises(AttributeError):
        window.start = None  # frozen


@pytest.mark.parametrize(
    ("text", "now", "start"),
    [
        ("P1M", utc(2024, 3, 31), utc(2024, 2, 29)),  # clamped to the shorter month (leap year)
        ("P1M", utc(2023, 3, 31), utc(2023, 2, 28)),
        ("P1M", utc(2024, 1, 31, 6), utc(2023, 12, 31, 6)),  # across a year
        ("P3M", utc(2024, 5, 31), utc(2024, 2, 29)),
        ("P1Y", utc(2024, 2, 29), utc(2023, 2, 28)),
        ("P4Y", utc(2024, 2, 29), utc(2020, 2, 29)),
        ("P12M", utc(2024, 2, 29), utc(2023, 2, 28)),  # 12 months == 1 year
        ("P1M1D", utc(2024, 3, 31), utc(2024, 2, 28)),  # months first, then days
        ("P30D", utc(2024, 3, 31), utc(2024, 3, 1)),  # days are exact, not calendar months
        ("P1D", datetime(2024, 3, 1), utc(2024, 2, 29)),  # a naive now is UTC
        ("PT1H", datetime(2024, 3, 1, 2, tzinfo=timezone(timedelta(hours=2))), utc(2024, 2, 29, 23)),
    ],
)
def test_calendar_arithmetic(text, now, start):
    got_start, got_end = parse_datetime_window(text).resolve(now)
    assert (got_start, got_end) == (start, now.replace(tzinfo=now.tzinfo or UTC).astimezone(UTC))


def test_relative_default_now_is_current_time():
    start, end = parse_datetime_window("P1D").resolve()
    assert abs((end - datetime.now(UTC)).total_seconds()) < 60
    assert end - start == timedelta(days=1)


def test_to_stac():
    assert parse_datetime_window("2024-06-01/2024-08-31").to_stac() == "2024-06-01T00:00:00Z/2024-08-31T23:59:59.999999Z"
    assert parse_datetime_window("2024-06/..").to_stac() == "2024-06-01T00:00:00Z/.."
    assert parse_datetime_window("../2024").to_stac() == "../2024-12-31T23:59:59.999999Z"
    assert parse_datetime_window("../..").to_stac() == "../.."
    assert parse_datetime_window("2024-07-01T12:00:00+02:00").to_stac() == "2024-07-01T10:00:00Z"
    assert parse_datetime_window("2024-07-01T10:00:00.25Z").to_stac() == "2024-07-01T10:00:00.250000Z"
    assert parse_datetime_window("P30D").to_stac(NOW) == "2024-08-16T12:00:00Z/2024-09-15T12:00:00Z"
    assert parse_datetime_window("P1M").to_stac(datetime(2024, 3, 31)) == "2024-02-29T00:00:00Z/2024-03-31T00:00:00Z"


def test_formatting_helpers():
    assert format_rfc3339(datetime(2024, 6, 1, 10)) == "2024-06-01T10:00:00Z"
    assert format_rfc3339(datetime(5, 1, 2, tzinfo=UTC)) == "0005-01-02T00:00:00Z"  # four-digit year always
    assert format_rfc3339(utc(2024, 6, 1, 10, 0, 0, 7)) == "2024-06-01T10:00:00.000007Z"
    assert format_interval(None, utc(2024, 6, 1)) == "../2024-06-01T00:00:00Z"
    assert format_interval(utc(2024, 6, 1), utc(2024, 6, 1)) == "2024-06-01T00:00:00Z"


def test_parse_duration_and_instant():
    assert parse_duration("P1Y2M") == Duration(months=14)
    assert parse_duration("P2W3D") == Duration(delta=timedelta(days=17))
    assert parse_duration("PT0,5S") == Duration(delta=timedelta(milliseconds=500))
    assert str(parse_duration("P1Y2M10DT2H30M")) == "P1Y2M10DT2H30M"
    assert parse_instant("2024-06-01T10:00:00+00:00") == utc(2024, 6, 1, 10)
    assert parse_instant("2024-06-01") == utc(2024, 6, 1)  # an item's bare date: its midnight
    assert parse_instant(datetime(2024, 6, 1)) == utc(2024, 6, 1)
    with pytest.raises(ValueError, match="not a date-time"):
        parse_instant("2024-06")
    with pytest.raises(TypeError):
        parse_instant(20240601)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# rejected forms


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the datetime is empty; use an ISO 8601 interval like 2024-06-01/2024-08-31"),
        ("   ", "'../..' means any time"),
        ("last summer", "'last summer' is not a datetime window; use an ISO 8601 interval like 2024-06-01/2024-08-31"),
        ("..", "'..' is not a datetime window"),
        ("20240601", "is not a datetime window"),  # basic (compact) format
        ("2024-6-1", "is not a datetime window"),
        ("2024-13", "'2024-13' is not a valid date: month 13 is not in 01..12"),
        ("2024-02-30", "'2024-02-30' is not a valid date: day 30 is not in 01..29 for 2024-02"),
        ("2023-02-29", "day 29 is not in 01..28 for 2023-02"),
        ("0000", "year 0000 is not in 0001..9999"),
        ("2024-13-01/2024-08-31", "the interval's start '2024-13-01' is not a valid date: month 13 is not in 01..12"),
        ("2024-06-01/2024-06-31", "the interval's end '2024-06-31' is not a valid date: day 31 is not in 01..30"),
        ("2024-06-01/soon", "the interval's end 'soon' is not a date or date-time; use YYYY, YYYY-MM, YYYY-MM-DD"),
        ("2024-08-31/2024-06-01", r"the start is after the end \(2024-08-31 > 2024-06-01\); swap them"),
        ("2024-07/2024-06-15", "the start is after the end"),
        ("2024-06-01T10:00:01Z/2024-06-01T10:00:00Z", "the start is after the end"),
        ("2024-06-01/2024-07-01/2024-08-01", "has 2 '/'; an interval is START/END"),
        ("2024-06-01T24:00:00Z", "hour 24 is not in 00..23"),
        ("2024-06-01T10:60Z", "minute 60 is not in 00..59"),
        ("2024-06-01T10:00:60Z", "second 60 is not in 00..59"),
        ("2024-06-01T10:00:00+25:00", "the UTC offset must be within ±23:59"),
        ("0001-01-01T00:30:00+01:00", "outside years 0001..9999 in UTC"),
        ("P30X", "'P30X' is not an ISO 8601 duration; use e.g. P30D, P2W, P6M, P1Y, PT12H"),
        ("P", "'P' is not an ISO 8601 duration"),
        ("PT", "'PT' is not an ISO 8601 duration"),
        ("P1DT", "'P1DT' is not an ISO 8601 duration"),
        ("P1.5D", "is not an ISO 8601 duration"),
        ("P-1D", "is not an ISO 8601 duration"),
        ("P0D", "the duration 'P0D' is empty"),
        ("PT0.0000001S", "is empty"),
        ("P5000Y", "reaches back before year 1"),
        ("P99999999999D", "'P99999999999D' is too long"),
        ("2024-06-01/P1M", "the interval's end 'P1M' is a duration; durations inside an interval are not supported"),
        ("P30D/2024-06-01", "the interval's start 'P30D' is a duration"),
    ],
)
def test_rejected(text, message):
    with pytest.raises(ValueError, match=message):
        parse_datetime_window(text)


def test_relative_window_reaching_before_year_one_at_resolve_time():
    window = parse_datetime_window("P10Y")
    with pytest.raises(ValueError, match="P10Y reaches back before year 1"):
        window.resolve(utc(5, 1, 1))


# ---------------------------------------------------------------------------------------------------------------
# one implementation: the spec validator and the catalog agree


AGREEMENT = [
    "2024-06-01/2024-08-31", "2024-06/2024-08", "2024/..", "../2024-02", "../..", "/", "2024-07", "2024",
    "2024-07-01T10:00:00Z", "2024-07-01T12:00:00+02:00", "2024-07-01T10:00:00.123456789Z/..", "2024-07-01T10:00",
    "P30D", "p1m", "P1Y", "PT12H", "P1Y2M10DT2H", "P2W", "PT0.5S",
    "2024-13-01/2024-08-31", "2024-08-31/2024-06-01", "P30X", "P0D", "last summer", "..", "a/b/c", "2024-02-30",
    "20240601", "2024-06-01/P1M", "2024-06-01T25:00Z", "2024-06-01T10:00:00+25:00",
]


@pytest.mark.parametrize("now", [NOW, utc(2024, 3, 31), utc(2024, 2, 29, 23, 59, 59, 999999)])
@pytest.mark.parametrize("text", AGREEMENT)
def test_validator_and_catalog_agree(text, now):
    try:
        window = parse_datetime_window(text)
    except ValueError as exc:
        spec: object = ("rejected", str(exc))
    else:
        spec = ("accepted", window.resolve(now))

    def catalog_side(parse) -> object:
        try:
            interval = parse()
        except CatalogError as exc:
            return ("rejected", str(exc))
        return ("accepted", interval if interval is not None else (None, None))

    for got in (
        catalog_side(lambda: catalog.parse_interval(text, now)),  # what search_items does
        catalog_side(lambda: catalog.parse_interval(resolve_datetime(text, now))),  # the public wrapper first
    ):
        assert got[0] == spec[0], (text, spec, got)
        if spec[0] == "accepted":
            assert got[1] == spec[1], text
        else:  # the same reason, with the value in front
            assert got[1] == f"invalid datetime {text.strip()!r}: {spec[1]}"


def test_catalog_wrapper_and_search(tmp_path):
    assert resolve_datetime("P1M", datetime(2024, 3, 31)) == "2024-02-29T00:00:00Z/2024-03-31T00:00:00Z"
    assert resolve_datetime(" 2024-06/2024-08 ") == "2024-06/2024-08"  # absolute: returned as written
    assert resolve_datetime(None) is None and resolve_datetime("  ") is None
    with pytest.raises(CatalogError, match="invalid datetime 'P30X': 'P30X' is not an ISO 8601 duration"):
        resolve_datetime("P30X")
    # A month interval covers whole days: what a STAC API is sent (the same text the local filter uses, below)
    assert parse_datetime_window("2024-06/2024-08").to_stac() == "2024-06-01T00:00:00Z/2024-08-31T23:59:59.999999Z"
    items = [
        {"type": "Feature", "stac_version": "1.0.0", "id": f"i{n}", "collection": "c", "bbox": [0, 0, 1, 1],
         "geometry": None, "properties": {"datetime": stamp}, "assets": {}, "links": []}
        for n, stamp in enumerate(["2024-05-31T23:59:59.999999Z", "2024-06-01T00:00:00Z", "2024-08-31T23:59:59Z",
                                   "2024-09-01T00:00:00Z"])
    ]
    path = tmp_path / "items.json"
    path.write_text(__import__("json").dumps({"type": "FeatureCollection", "features": items}))
    got = catalog.search_items(catalog.StacQuery(str(path), datetime="2024-06/2024-08"))
    assert [i["id"] for i in got] == ["i1", "i2"]
    got = catalog.search_items(catalog.StacQuery(str(path), datetime="P3M"), now=datetime(2024, 8, 31, 23, 59, 59))
    assert [i["id"] for i in got] == ["i0", "i1", "i2"]  # 2024-05-31T23:59:59Z .. 2024-08-31T23:59:59Z, inclusive
    for no_constraint in (None, "", "../.."):  # no datetime is no constraint for a search (a spec must say "../..")
        assert len(catalog.search_items(catalog.StacQuery(str(path), datetime=no_constraint))) == 4


SPEC = textwrap.dedent(
    """\
    version: 1
    name: test-ndvi
    source:
      stac:
        catalog: items.json
        collections: [sentinel-2-l2a]
        bbox: [13.0, 52.3, 13.8, 52.7]
        datetime: {datetime}
      assets: {{red: red, nir: nir}}
    grid:
      crs: EPSG:32633
      resolution: 10
      bounds: [380000, 5819760, 390240, 5830000]
      dtype: float32
    bands:
      ndvi: "(nir - red) / (nir + red)"
    output:
      path: out/ndvi.zarr
    """
)


@pytest.mark.parametrize("value", ["2024-06/2024-08", "'2024'", "P1M", "2024-06-01T10:00:00.5+02:00/..", "'../..'"])
def test_spec_accepts_catalog_forms(tmp_path, value):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(datetime=value))
    load_spec(path)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("2024-13-01/2024-08-31", "source.stac.datetime: the interval's start '2024-13-01' is not a valid date: "
                                  "month 13 is not in 01..12"),
        ("2024-08-31/2024-06-01", "source.stac.datetime: the start is after the end (2024-08-31 > 2024-06-01)"),
        ("P30X", "source.stac.datetime: 'P30X' is not an ISO 8601 duration; use e.g. P30D"),
        ("''", "source.stac.datetime: the datetime is empty"),
    ],
)
def test_spec_error_messages(tmp_path, value, message):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(datetime=value))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert f"{path}:8:" in str(info.value)
    assert message in str(info.value)


def _imports(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            modules.add(node.module or "")
    return modules


def test_layering():
    """timeparse imports only the standard library; the spec layer never imports the catalog; the catalog package
    takes its time rules from timeparse (one rule for both) and never imports the runtime layers."""
    import rasterflow.spec.timeparse as timeparse

    assert _imports(Path(timeparse.__file__)) <= {"__future__", "calendar", "datetime", "re", "dataclasses"}
    for module in Path(timeparse.__file__).parent.glob("*.py"):
        assert not any(name.startswith("rasterflow.catalog") for name in _imports(module)), module
    package = sorted(Path(catalog.__file__).parent.glob("*.py"))
    assert {p.name for p in package} >= {"__init__.py", "query.py", "local.py", "api.py", "probe.py"}
    imported = {path.name: _imports(path) for path in package}
    assert "rasterflow.spec.timeparse" in imported["query.py"]
    runtime = ("rasterflow.commands", "rasterflow.graph", "rasterflow.cli", "rasterflow.write", "rasterflow.kernels")
    for name, modules in imported.items():
        assert not any(m.startswith(runtime) for m in modules), name
