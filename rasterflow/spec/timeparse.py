"""The one parser of the spec's ``source.stac.datetime`` window, shared by the spec validator and the STAC search.

Accepted forms (surrounding whitespace is ignored):

* **Interval** ``START/END``: each end is a date, a date-time or open (``..`` or empty). A date stands for its
  whole period: as a start its first microsecond, as an end its last one (``2024-08-31`` ends at
  ``2024-08-31T23:59:59.999999Z``). ``../..`` (or ``/``) is unbounded: any time.
* **Dates** ``YYYY``, ``YYYY-MM``, ``YYYY-MM-DD``; alone, a date is its whole year / month / day.
* **Date-times** ``YYYY-MM-DDTHH:MM[:SS[.fraction]][Z|±HH[:MM]]`` (``t``, ``z`` or a space also accepted);
  without an offset it is UTC; fractions beyond microseconds are truncated. Alone, a date-time is an instant.
* **Relative windows** ``P[nY][nM][nW][nD][T[nH][nM][n[.f]S]]`` (``P30D``, ``P2W``, ``P1M``, ``P1Y``, ``PT12H``,
  ``P1Y2M10DT2H30M``) ending *now*. Years and months are calendar arithmetic, applied first and clamped to the
  month's last day (``P1M`` before 2024-03-31 is 2024-02-29; ``P1Y`` before 2024-02-29 is 2023-02-28); weeks,
  days, hours, minutes and seconds are then subtracted as exact durations.

Every bound is a timezone-aware UTC :class:`datetime.datetime`. Errors are :class:`ValueError` whose message
names the expected form. Standard library only: the spec layer must not import :mod:`rasterflow.catalog`.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
from dataclasses import dataclass

__all__ = [
    "DatetimeWindow",
    "Duration",
    "format_interval",
    "format_rfc3339",
    "parse_datetime_window",
    "parse_duration",
    "parse_instant",
]

_UTC = dt.timezone.utc

_FORMS = (
    "use an ISO 8601 interval like 2024-06-01/2024-08-31 (open ends '..'), a date like 2024, 2024-06 or "
    "2024-06-01, a date-time like 2024-06-01T10:00:00Z, or a relative window like P30D, P1M, P1Y or PT12H"
)
_POINT_FORMS = "use YYYY, YYYY-MM, YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS[.ffffff][Z|±HH:MM]"
_DURATION_FORMS = "use e.g. P30D, P2W, P6M, P1Y, PT12H or P1Y2M10DT2H"

_DURATION_RE = re.compile(
    r"^P(?!$)(?:(?P<years>\d+)Y)?(?:(?P<months>\d+)M)?(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:[.,]\d+)?)S)?)?$",
    re.IGNORECASE,
)
_PARTIAL_DATE_RE = re.compile(r"^(?P<year>\d{4})(?:-(?P<month>\d{2})(?:-(?P<day>\d{2}))?)?$")
_DATETIME_RE = re.compile(
    r"^(?P<year>\d{4})-(?P<month>\d{2})-(?P<day>\d{2})[Tt ](?P<hour>\d{2}):(?P<minute>\d{2})"
    r"(?::(?P<second>\d{2})(?:[.,](?P<fraction>\d+))?)?"
    r"(?P<tz>[Zz]|(?P<sign>[+-])(?P<tzh>\d{2})(?::?(?P<tzm>\d{2}))?)?$"
)


# ----------------------------------------------------------------------------------------------------------------
# formatting


def _utc(value: dt.datetime) -> dt.datetime:
    """``value`` in UTC; a naive value is taken as UTC."""
    return value.replace(tzinfo=_UTC) if value.tzinfo is None else value.astimezone(_UTC)


def format_rfc3339(value: dt.datetime) -> str:
    """RFC 3339 in UTC with a ``Z``; microseconds only when there are some (a naive value is taken as UTC).

    >>> format_rfc3339(dt.datetime(2024, 6, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2))))
    '2024-06-01T10:00:00Z'
    """
    value = _utc(value)
    text = f"{value.year:04d}-{value.month:02d}-{value.day:02d}T{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
    if value.microsecond:
        text += f".{value.microsecond:06d}"
    return text + "Z"


def format_interval(start: dt.datetime | None, end: dt.datetime | None) -> str:
    """A STAC API ``datetime`` parameter: ``start/end`` with ``..`` for an open end, or one instant when equal."""
    if start is not None and start == end:
        return format_rfc3339(start)
    return f"{format_rfc3339(start) if start else '..'}/{format_rfc3339(end) if end else '..'}"


# ----------------------------------------------------------------------------------------------------------------
# durations


def _minus_months(value: dt.datetime, months: int) -> dt.datetime:
    """``value`` moved back ``months`` calendar months (forward when negative), the day clamped to the month."""
    total = value.year * 12 + (value.month - 1) - months
    year, month = divmod(total, 12)
    month += 1
    if not dt.MINYEAR <= year <= dt.MAXYEAR:
        raise OverflowError(f"year {year} is out of range")
    return value.replace(year=year, month=month, day=min(value.day, calendar.monthrange(year, month)[1]))


@dataclass(frozen=True)
class Duration:
    """A relative window's length: calendar ``months`` (a year is 12), then an exact ``delta``."""

    months: int = 0
    delta: dt.timedelta = dt.timedelta(0)

    def before(self, end: dt.datetime) -> dt.datetime:
        """The start of the window of this length that ends at ``end``: months first, then ``delta``.

        Raises
        ------
        ValueError
            If the start falls before year 1.
        """
        try:
            return _minus_months(_utc(end), self.months) - self.delta
        except (OverflowError, ValueError):
            raise ValueError(f"the relative window {self} reaches back before year 1; use a shorter one") from None

    def __str__(self) -> str:
        years, months = divmod(self.months, 12)
        seconds = self.delta.seconds + self.delta.microseconds / 1e6
        hours, rest = divmod(seconds, 3600)
        minutes, seconds = divmod(rest, 60)
        date = "".join(f"{n}{u}" for n, u in ((years, "Y"), (months, "M"), (self.delta.days, "D")) if n)
        time = "".join(f"{n:g}{u}" for n, u in ((hours, "H"), (minutes, "M"), (seconds, "S")) if n)
        return "P" + date + ("T" + time if time else "") if date or time else "PT0S"


def parse_duration(text: str) -> Duration:
    """Parse an ISO 8601 duration such as ``P30D``, ``P1M``, ``PT12H`` or ``P1Y2M10DT2H`` (case-insensitive).

    Raises
    ------
    ValueError
        If the text is not a duration, or is zero or too long.
    """
    text = text.strip()
    match = _DURATION_RE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not an ISO 8601 duration; {_DURATION_FORMS}")
    parts = match.groupdict()

    def number(key: str) -> int:
        return int(parts[key] or 0)

    try:
        duration = Duration(
            months=number("years") * 12 + number("months"),
            delta=dt.timedelta(
                weeks=number("weeks"), days=number("days"), hours=number("hours"), minutes=number("minutes"),
                seconds=float((parts["seconds"] or "0").replace(",", ".")),
            ),
        )
    except OverflowError:
        raise ValueError(f"the duration {text!r} is too long; {_DURATION_FORMS}") from None
    if duration.months == 0 and duration.delta <= dt.timedelta(0):
        raise ValueError(f"the duration {text!r} is empty; {_DURATION_FORMS}")
    duration.before(dt.datetime.now(_UTC))  # reject a window reaching before year 1 now, not at search time
    return duration


# ----------------------------------------------------------------------------------------------------------------
# dates and date-times


def _check_date(text: str, kind: str, year: int, month: int, day: int) -> None:
    if not dt.MINYEAR <= year:
        raise ValueError(f"{text!r} is not a valid {kind}: year {year:04d} is not in 0001..9999")
    if not 1 <= month <= 12:
        raise ValueError(f"{text!r} is not a valid {kind}: month {month:02d} is not in 01..12")
    last = calendar.monthrange(year, month)[1]
    if not 1 <= day <= last:
        raise ValueError(f"{text!r} is not a valid {kind}: day {day:02d} is not in 01..{last} for {year:04d}-{month:02d}")


def _parse_datetime(text: str) -> dt.datetime | None:
    """A full date-time, or None when ``text`` does not have the shape of one."""
    m = _DATETIME_RE.match(text)
    if not m:
        return None
    year, month, day = int(m["year"]), int(m["month"]), int(m["day"])
    _check_date(text, "date-time", year, month, day)
    hour, minute, second = int(m["hour"]), int(m["minute"]), int(m["second"] or 0)
    for name, value, top in (("hour", hour, 23), ("minute", minute, 59), ("second", second, 59)):
        if value > top:
            raise ValueError(f"{text!r} is not a valid date-time: {name} {value:02d} is not in 00..{top}")
    tz = _UTC
    if m["sign"]:
        tzh, tzm = int(m["tzh"]), int(m["tzm"] or 0)
        if tzh > 23 or tzm > 59:
            raise ValueError(f"{text!r} is not a valid date-time: the UTC offset must be within ±23:59")
        offset = dt.timedelta(hours=tzh, minutes=tzm)
        tz = dt.timezone(-offset if m["sign"] == "-" else offset)
    micro = int((m["fraction"] or "0")[:6].ljust(6, "0"))
    local = dt.datetime(year, month, day, hour, minute, second, micro, tzinfo=tz)
    try:
        return local.astimezone(_UTC)
    except OverflowError:
        raise ValueError(f"{text!r} is not a valid date-time: it lies outside years 0001..9999 in UTC") from None


def parse_instant(value: str | dt.datetime) -> dt.datetime:
    """One point in time in UTC: a date-time (see the module docstring) or a date ``YYYY-MM-DD`` (its midnight).

    A :class:`~datetime.datetime` is converted to UTC (naive means UTC). Used for item timestamps.

    Raises
    ------
    ValueError
        If the text is neither. ``TypeError`` if ``value`` is not a string or a datetime.
    """
    if isinstance(value, dt.datetime):
        return _utc(value)
    if not isinstance(value, str):
        raise TypeError(f"expected a date-time string, got {type(value).__name__}")
    text = value.strip()
    instant = _parse_datetime(text)
    if instant is not None:
        return instant
    m = _PARTIAL_DATE_RE.match(text)
    if m and m["day"]:
        return _period(text, m)[0]
    raise ValueError(f"{text!r} is not a date-time; use YYYY-MM-DDTHH:MM:SS[.ffffff][Z|±HH:MM]")


def _period(text: str, m: re.Match[str]) -> tuple[dt.datetime, dt.datetime]:
    """First and last microsecond (UTC) of the year, month or day a partial date names."""
    year, month, day = int(m["year"]), int(m["month"] or 1), int(m["day"] or 1)
    _check_date(text, "date", year, month, day)
    first = dt.datetime(year, month, day, tzinfo=_UTC)
    try:
        if m["day"]:
            after = first + dt.timedelta(days=1)
        elif m["month"]:
            after = _minus_months(first, -1)
        else:
            after = first.replace(year=year + 1)
    except (OverflowError, ValueError):  # the period ends with year 9999
        return first, dt.datetime.max.replace(tzinfo=_UTC)
    return first, after - dt.timedelta(microseconds=1)


def _parse_point(text: str) -> tuple[dt.datetime, dt.datetime]:
    """A date (its whole period) or a date-time (start = end)."""
    m = _PARTIAL_DATE_RE.match(text)
    if m:
        return _period(text, m)
    instant = _parse_datetime(text)
    if instant is None:
        raise ValueError(f"{text!r} is not a date or date-time; {_POINT_FORMS}")
    return instant, instant


# ----------------------------------------------------------------------------------------------------------------
# windows


@dataclass(frozen=True)
class DatetimeWindow:
    """A parsed ``datetime`` value: absolute UTC bounds (None = open), or a ``relative`` length ending now."""

    start: dt.datetime | None
    end: dt.datetime | None
    relative: Duration | None = None

    @property
    def unbounded(self) -> bool:
        """True for ``../..``: any time."""
        return self.relative is None and self.start is None and self.end is None

    def resolve(self, now: dt.datetime | None = None) -> tuple[dt.datetime | None, dt.datetime | None]:
        """Absolute ``(start, end)`` in UTC; a relative window ends at ``now`` (default: the current time; naive
        means UTC)."""
        if self.relative is None:
            return self.start, self.end
        end = _utc(now) if now is not None else dt.datetime.now(_UTC)
        return self.relative.before(end), end

    def to_stac(self, now: dt.datetime | None = None) -> str:
        """The window as a STAC API ``datetime`` parameter: RFC 3339 ``start/end`` with ``..`` for an open end, or
        a single instant when start and end coincide."""
        return format_interval(*self.resolve(now))


def parse_datetime_window(text: str) -> DatetimeWindow:
    """Parse a ``datetime`` value: ``2024-06-01/2024-08-31``, ``2024-06/..``, ``2024``, ``2024-06-01T10:00:00Z``,
    ``P30D``... (forms in the module docstring).

    Raises
    ------
    ValueError
        With a message that names the offending part and the expected form.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a string; {_FORMS}")
    text = text.strip()
    if not text:
        raise ValueError(f"the datetime is empty; {_FORMS} ('../..' means any time)")
    if text[0] in "Pp" and "/" not in text:
        return DatetimeWindow(None, None, parse_duration(text))
    if "/" not in text:
        try:
            return DatetimeWindow(*_parse_point(text))
        except ValueError as exc:
            if _PARTIAL_DATE_RE.match(text) or _DATETIME_RE.match(text):
                raise  # a date-shaped value with a bad field: the message says which
            raise ValueError(f"{text!r} is not a datetime window; {_FORMS}") from exc
    parts = text.split("/")
    if len(parts) != 2:
        raise ValueError(
            f"{text!r} has {len(parts) - 1} '/'; an interval is START/END, e.g. 2024-06-01/2024-08-31"
        )
    bounds: list[dt.datetime | None] = []
    for which, part in zip(("start", "end"), parts):
        part = part.strip()
        if part in ("", ".."):
            bounds.append(None)
            continue
        if part[0] in "Pp":
            raise ValueError(
                f"the interval's {which} {part!r} is a duration; durations inside an interval are not supported: "
                "give two dates (2024-06-01/2024-08-31) or a relative window alone (P30D, ending now)"
            )
        try:
            first, last = _parse_point(part)
        except ValueError as exc:
            raise ValueError(f"the interval's {which} {exc}") from None
        bounds.append(first if which == "start" else last)
    start, end = bounds
    if start is not None and end is not None and start > end:
        raise ValueError(
            f"the start is after the end ({parts[0].strip()} > {parts[1].strip()}); swap them"
        )
    return DatetimeWindow(start, end)
