"""The periods of ``reduce.period``: one function from a datetime window and a period value to the ordered, complete
list of periods, and one that puts item datetimes into them.

Standard library only (the spec validator and the planner both use it; nothing here imports NumPy or the spec
package).

Period values
-------------
``month``
    Calendar months, labelled ``2024-06`` (as :func:`rasterflow.kernels.period_labels` does).
``season``
    Meteorological seasons DJF, MAM, JJA, SON, labelled ``2024-JJA``; a December belongs to the *next* year's DJF
    (2023-12-01 .. 2024-02-29 is ``2024-DJF``), as :func:`rasterflow.kernels.period_labels` does.
``year``
    Calendar years, labelled ``2024``.
``dekad``
    Three per month: days 1-10, 11-20 and 21 to the month's end (8 to 11 days), labelled ``2024-02-D1``,
    ``2024-02-D2``, ``2024-02-D3`` (openEO's ``aggregate_temporal_period`` dekads).
an ISO 8601 duration (``P16D``, ``P1W``, ``P1M``, ``P3M``, ``P1Y``, ``P1Y6M``, ``P2W3D``)
    Back-to-back periods of that length anchored at the window's start (``P1W`` is 7 days from the start, not ISO
    calendar weeks). Only whole days and weeks, or whole months and years: a duration mixing the two kinds
    (``P1M15D``) is refused, as are time-of-day parts (``PT12H``) and a zero length (``P0D``). A month duration's
    k-th period starts ``k x n`` calendar months after the anchor, the day clamped to the month's length and
    computed from the anchor each time (no drift): from Jan 31 with ``P1M`` the periods start Jan 31, Feb 29
    (leap year) or Feb 28, Mar 31, Apr 30, May 31 ... ; with ``P3M`` Jan 31, Apr 30, Jul 31, Oct 31, Jan 31.
    A period is labelled with its start: ``2024-01-05`` at midnight UTC, else ``2024-01-05T103000Z`` (no colons:
    labels become file names).
a list of explicit intervals
    Each ``[start, end]`` (a pair of dates / date-times, strings or ``datetime.date`` / ``datetime.datetime`` as
    YAML loads them) or one ``"START/END"`` string. Both ends are inclusive exactly as in ``source.stac.datetime``:
    a date stands for its whole day (``[2024-06-01, 2024-06-15]`` ends with June 15), a date-time is that instant.
    Intervals are put in time order; intervals that share any instant are refused (the message names both), gaps
    are allowed (items in a gap belong to no period). Every interval is a period of the output, even one outside
    the window (it is then empty). Labelled like duration periods, by their start.

Every period is half-open, ``[start, end)``, with timezone-aware UTC bounds. Calendar and duration periods are
whole (a window starting June 15 has the whole of June as its first month, not June 15-30); :meth:`Period.clip`
gives the part inside the window. The list covers the window completely: the period containing the window's first
instant, up to the one containing its last instant (``DatetimeWindow.resolve`` gives the last instant, e.g.
``2024-08-31T23:59:59.999999Z``), every one of them, whether or not an item falls in it.
"""

from __future__ import annotations

import bisect
import calendar
import datetime as dt
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Union

__all__ = [
    "CALENDAR_PERIODS",
    "Period",
    "PeriodRule",
    "PeriodValue",
    "assign_periods",
    "group_by_period",
    "label_of",
    "parse_period",
    "window_periods",
]

_UTC = dt.timezone.utc
_MICROSECOND = dt.timedelta(microseconds=1)

CALENDAR_PERIODS = ("month", "season", "year", "dekad")
"""The named periods, in the order the error messages list them."""

Instant = Union[str, dt.date, dt.datetime]
"""A date or date-time: ISO 8601 text, or a ``datetime.date`` / ``datetime.datetime`` (naive = UTC)."""

PeriodValue = Union[str, Sequence[Union[str, Sequence[Instant]]]]
"""What ``reduce.period`` holds after YAML loading: a name, a duration, or a list of intervals."""

_FORMS = ("use month, season, year, dekad, an ISO 8601 duration such as P16D, P1W, P1M or P3M, or a list of "
          "[start, end] intervals such as [[2024-06-01, 2024-06-15], [2024-06-16, 2024-06-30]]")
_LENGTHS = "use e.g. P16D, P1W, P1M"
_DURATION_RE = re.compile(
    r"^P(?!$)(?:(?P<years>\d+)Y)?(?:(?P<months>\d+)M)?(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?P<time>T.*)?$",
    re.IGNORECASE,
)
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_SEASONS = ("DJF", "MAM", "JJA", "SON")


# ----------------------------------------------------------------------------------------------------------------
# the period value


@dataclass(frozen=True)
class PeriodRule:
    """A parsed ``reduce.period`` value (see the module docstring); made by :func:`parse_period`."""

    kind: Literal["month", "season", "year", "dekad", "months", "days", "intervals"]
    """A calendar period; ``months`` / ``days`` for a duration of whole months / days; ``intervals``."""
    length: int = 0
    """For ``months`` / ``days``: the duration in calendar months (a year is 12) or days (a week is 7)."""
    intervals: tuple[tuple[dt.datetime, dt.datetime], ...] = ()
    """For ``intervals``: ``[start, end)`` in UTC, sorted, not overlapping."""
    text: str = ""
    """The value as written (for messages)."""


def _duration(text: str) -> PeriodRule:
    match = _DURATION_RE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a period: an ISO 8601 period length is P followed by whole numbers of "
                         f"years, months, weeks or days; {_LENGTHS}")
    if match["time"] is not None:
        raise ValueError(f"{text!r} has a time-of-day part ({match['time']}); periods are whole days, weeks, months "
                         f"or years: {_LENGTHS}")
    years, months, weeks, days = (int(match[k] or 0) for k in ("years", "months", "weeks", "days"))
    calendar_months, exact_days = years * 12 + months, weeks * 7 + days
    if calendar_months and exact_days:
        raise ValueError(f"{text!r} mixes calendar months/years with weeks/days; months have different lengths, so "
                         f"use one kind: e.g. P{calendar_months * 30 + exact_days}D or P{calendar_months}M")
    if not calendar_months and not exact_days:
        raise ValueError(f"{text} is not a period length; {_LENGTHS}")
    if calendar_months:
        return PeriodRule("months", length=calendar_months, text=text)
    return PeriodRule("days", length=exact_days, text=text)


def parse_period(value: PeriodValue | PeriodRule) -> PeriodRule:
    """Parse and check a ``reduce.period`` value (forms in the module docstring).

    Parameters
    ----------
    value : str or list
        ``"month"``, ``"season"``, ``"year"``, ``"dekad"``, an ISO 8601 duration (``"P16D"``), or a list of
        intervals (``[start, end]`` pairs or ``"START/END"`` strings). A :class:`PeriodRule` is returned as is.

    Returns
    -------
    PeriodRule

    Raises
    ------
    ValueError
        With a message saying what to change (``P0D is not a period length; use e.g. P16D, P1W, P1M``).
    """
    if isinstance(value, PeriodRule):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text in CALENDAR_PERIODS:
            return PeriodRule(text)  # type: ignore[arg-type]
        if text.lower() in CALENDAR_PERIODS:
            raise ValueError(f"{text!r} is not a period; write it in lower case: {text.lower()!r}")
        if text[:1] in ("P", "p"):
            return _duration(text)
        if "/" in text:
            raise ValueError(f"{text!r} is one interval; give a list of them, e.g. period: [{text}]")
        raise ValueError(f"{text!r} is not a period; {_FORMS}")
    if isinstance(value, (bytes, dict)) or not isinstance(value, Sequence):
        raise ValueError(f"a period must be a string or a list of intervals, not {type(value).__name__}; {_FORMS}")
    if not value:
        raise ValueError("period is an empty list; give at least one [start, end] interval, e.g. "
                         "[[2024-06-01, 2024-06-15]]")
    parsed = [(_interval(entry, index), index) for index, entry in enumerate(value, start=1)]
    parsed.sort(key=lambda pair: pair[0])
    for ((start_a, end_a), a), ((start_b, end_b), b) in zip(parsed, parsed[1:]):
        if start_b < end_a:
            first, second = sorted((a, b))
            raise ValueError(
                f"intervals {first} and {second} of period overlap ({_show(start_a, end_a)} and "
                f"{_show(start_b, end_b)}); an item belongs to one period: make them disjoint (both ends count, so "
                f"[2024-06-01, 2024-06-15] is followed by [2024-06-16, ...])"
            )
    return PeriodRule("intervals", intervals=tuple(bounds for bounds, _ in parsed), text=str(list(value)))


def _interval(entry: object, index: int) -> tuple[dt.datetime, dt.datetime]:
    """One explicit interval: ``[start, end]`` or ``"START/END"``, both ends inclusive -> ``[start, end)``."""
    where = f"interval {index} of period"
    if isinstance(entry, str):
        parts: Sequence[object] = entry.split("/")
        if len(parts) != 2:
            raise ValueError(f"{where} ({entry!r}) is not START/END; write e.g. 2024-06-01/2024-06-15 or "
                             "[2024-06-01, 2024-06-15]")
    elif isinstance(entry, Sequence) and not isinstance(entry, bytes):
        parts = entry
        if len(parts) != 2:
            raise ValueError(f"{where} has {len(parts)} values; an interval is [start, end], e.g. "
                             "[2024-06-01, 2024-06-15]")
    else:
        raise ValueError(f"{where} is {entry!r}; an interval is [start, end], e.g. "
                         "[2024-06-01, 2024-06-15]")
    try:
        start = _bound(parts[0], last=False)
        end = _bound(parts[1], last=True)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    if end <= start:
        raise ValueError(f"{where} ends before it starts ({_text(parts[0])} > {_text(parts[1])}); swap them")
    return start, end


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else str(value)


def _bound(value: object, *, last: bool) -> dt.datetime:
    """An interval end as a UTC instant: a date is its first instant (start) or the instant after it (end); a
    date-time is itself (start) or the microsecond after it (end), so that ``[start, end)`` holds both ends."""
    if isinstance(value, dt.datetime):
        instant = _utc(value)
        return instant + _MICROSECOND if last else instant
    if isinstance(value, dt.date):
        day = dt.datetime(value.year, value.month, value.day, tzinfo=_UTC)
        return day + dt.timedelta(days=1) if last else day
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a date or date-time; use YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ")
    text = value.strip()
    if text in ("", ".."):
        raise ValueError("an explicit interval needs both ends; give a date like 2024-06-30")
    if _DATE_RE.match(text):
        try:
            day = dt.datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=_UTC)
        except ValueError:
            raise ValueError(f"{text!r} is not a valid date; use YYYY-MM-DD") from None
        return day + dt.timedelta(days=1) if last else day
    instant = _parse_instant(text)
    return instant + _MICROSECOND if last else instant


def _parse_instant(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a date or date-time; use YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ") from None
    return _utc(value)


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=_UTC) if value.tzinfo is None else value.astimezone(_UTC)


def _instant(value: Instant) -> dt.datetime:
    """An item or window time as an aware UTC datetime (a date is its midnight)."""
    if isinstance(value, dt.datetime):
        return _utc(value)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=_UTC)
    if isinstance(value, str):
        return _parse_instant(value)
    raise TypeError(f"expected a datetime, a date or an ISO 8601 string, got {type(value).__name__}")


def _show(start: dt.datetime, end: dt.datetime) -> str:
    """``[start, end)`` as the user wrote it: inclusive ends, dates when whole days."""
    last = end - _MICROSECOND
    if start.time() == dt.time(0) and end.time() == dt.time(0):
        return f"{start.date().isoformat()}/{last.date().isoformat()}"
    return f"{_iso(start)}/{_iso(last)}"


def _iso(value: dt.datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


# ----------------------------------------------------------------------------------------------------------------
# periods


@dataclass(frozen=True)
class Period:
    """One period: ``[start, end)`` in UTC, and its label (unique within a list of periods, usable in file
    names)."""

    start: dt.datetime
    end: dt.datetime
    """Exclusive."""
    label: str

    def contains(self, instant: Instant) -> bool:
        """True when ``start <= instant < end``."""
        value = _instant(instant)
        return self.start <= value < self.end

    def clip(self, start: Instant, last: Instant) -> tuple[dt.datetime, dt.datetime]:
        """The part of the period inside a window ``[start, last]`` (``last`` inclusive, as the window's end is):
        ``(first instant, last instant)``, both inclusive (the form the STAC items' ``start_datetime`` /
        ``end_datetime`` take). Raises ``ValueError`` if the period lies outside the window."""
        first, final = max(self.start, _instant(start)), min(self.end - _MICROSECOND, _instant(last))
        if final < first:
            raise ValueError(f"the period {self.label} lies outside the window")
        return first, final


def _add_months(value: dt.datetime, months: int) -> dt.datetime:
    """``value`` moved forward ``months`` calendar months, the day clamped to the month's length."""
    total = value.year * 12 + (value.month - 1) + months
    year, month = divmod(total, 12)
    month += 1
    if not dt.MINYEAR <= year <= dt.MAXYEAR:
        raise OverflowError(f"year {year} is out of range")
    return value.replace(year=year, month=month, day=min(value.day, calendar.monthrange(year, month)[1]))


def _month_start(value: dt.datetime) -> dt.datetime:
    return dt.datetime(value.year, value.month, 1, tzinfo=_UTC)


def _calendar_period(kind: str, instant: dt.datetime) -> Period:
    """The calendar period of ``kind`` that contains ``instant``."""
    if kind == "month":
        start = _month_start(instant)
        return Period(start, _add_months(start, 1), f"{start.year:04d}-{start.month:02d}")
    if kind == "year":
        start = dt.datetime(instant.year, 1, 1, tzinfo=_UTC)
        return Period(start, _add_months(start, 12), f"{start.year:04d}")
    if kind == "season":
        # the season of month m starts at month m - (m % 12) % 3: Dec, Jan, Feb -> Dec; Mar, Apr, May -> Mar ...
        start = _add_months(_month_start(instant), -(instant.month % 12 % 3))
        end = _add_months(start, 3)
        label_year = end.year if start.month == 12 else start.year
        return Period(start, end, f"{label_year:04d}-{_SEASONS[start.month % 12 // 3]}")
    if kind == "dekad":
        month = _month_start(instant)
        number = min(3, (instant.day - 1) // 10 + 1)
        start = month.replace(day=10 * (number - 1) + 1)
        end = _add_months(month, 1) if number == 3 else month.replace(day=10 * number + 1)
        return Period(start, end, f"{month.year:04d}-{month.month:02d}-D{number}")
    raise ValueError(f"{kind!r} is not a calendar period; use one of {', '.join(CALENDAR_PERIODS)}")


def label_of(instant: Instant, period: str) -> str:
    """The label of the calendar period (``month``, ``season``, ``year``, ``dekad``) containing ``instant``: the
    labels :func:`rasterflow.kernels.period_labels` gives for month, season and year."""
    return _calendar_period(period, _instant(instant)).label


def _start_label(start: dt.datetime) -> str:
    if start.time() == dt.time(0):
        return start.date().isoformat()
    text = f"{start.date().isoformat()}T{start.hour:02d}{start.minute:02d}{start.second:02d}"
    return text + (f".{start.microsecond:06d}Z" if start.microsecond else "Z")


def window_periods(start: Instant | None, end: Instant | None, period: PeriodValue | PeriodRule) -> list[Period]:
    """Every period of a window, in time order.

    Parameters
    ----------
    start, end : datetime, date or ISO 8601 str
        The window's first and last instant, both inclusive (``DatetimeWindow.resolve()``; an open end replaced by
        the first / last item's time). Naive values are UTC. May be None for explicit intervals, which do not
        depend on the window.
    period : str, list or PeriodRule
        The ``reduce.period`` value (see :func:`parse_period`).

    Returns
    -------
    list of Period
        From the period containing ``start`` to the one containing ``end``, none left out; for explicit intervals,
        the intervals in time order.

    Raises
    ------
    ValueError
        If the period value does not parse, the window is open (calendar periods and durations need both ends) or
        ends before it starts.
    """
    rule = parse_period(period)
    if rule.kind == "intervals":
        return [Period(a, b, _start_label(a)) for a, b in rule.intervals]
    if start is None or end is None:
        raise ValueError(f"period {rule.text or rule.kind} needs a window with both ends; give source.stac.datetime "
                         "a start and an end (or pass the first and last item's time)")
    first, last = _instant(start), _instant(end)
    if last < first:
        raise ValueError(f"the window ends before it starts ({_iso(first)} > {_iso(last)})")
    periods: list[Period] = []
    try:
        if rule.kind in CALENDAR_PERIODS:
            current = _calendar_period(rule.kind, first)
            while current.start <= last:
                periods.append(current)
                current = _calendar_period(rule.kind, current.end)
        elif rule.kind == "months":
            k = 0
            while True:
                a = _add_months(first, k * rule.length)
                if a > last:
                    break
                periods.append(Period(a, _add_months(first, (k + 1) * rule.length), _start_label(a)))
                k += 1
        else:
            step = dt.timedelta(days=rule.length)
            a = first
            while a <= last:
                periods.append(Period(a, a + step, _start_label(a)))
                a += step
    except OverflowError:
        raise ValueError(f"the periods of {rule.text or rule.kind} reach beyond year 9999; use a window that "
                         "ends earlier") from None
    return periods


# ----------------------------------------------------------------------------------------------------------------
# items into periods


def assign_periods(times: Iterable[Instant], periods: Sequence[Period]) -> list[int | None]:
    """The index into ``periods`` of each time, None for a time in no period (outside the window, or in a gap
    between explicit intervals).

    Parameters
    ----------
    times : iterable of datetime, date or ISO 8601 str
        Item datetimes (naive = UTC; ``Z`` and offsets are understood).
    periods : sequence of Period
        In time order and disjoint, as :func:`window_periods` returns them.
    """
    starts = [p.start for p in periods]
    out: list[int | None] = []
    for value in times:
        instant = _instant(value)
        index = bisect.bisect_right(starts, instant) - 1
        out.append(index if index >= 0 and instant < periods[index].end else None)
    return out


def group_by_period(times: Iterable[Instant], periods: Sequence[Period]) -> tuple[tuple[int, ...], ...]:
    """Per period, the indices of the ``times`` in it (ascending): one entry per period, empty for a period
    without a time (the shape of :attr:`rasterflow.kernels.Program.groups`, with every period present)."""
    groups: list[list[int]] = [[] for _ in periods]
    for position, index in enumerate(assign_periods(times, periods)):
        if index is not None:
            groups[index].append(position)
    return tuple(tuple(g) for g in groups)
