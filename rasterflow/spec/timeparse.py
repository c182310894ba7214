"""Parse the spec's ``datetime`` window: an ISO 8601 interval, a single date, or a relative duration."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

__all__ = ["DatetimeWindow", "parse_datetime_window", "parse_duration"]

_DURATION = re.compile(
    r"^P(?!$)(?:(?P<years>\d+)Y)?(?:(?P<months>\d+)M)?(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+)S)?)?$"
)


@dataclass(frozen=True)
class DatetimeWindow:
    """A parsed ``datetime`` value: either absolute bounds (None = open) or a relative duration ending now."""

    start: dt.datetime | None
    end: dt.datetime | None
    relative: dt.timedelta | None = None

    def resolve(self, now: dt.datetime | None = None) -> tuple[dt.datetime | None, dt.datetime | None]:
        """Absolute (start, end) in UTC; a relative window ends at ``now``."""
        if self.relative is None:
            return self.start, self.end
        now = now or dt.datetime.now(dt.timezone.utc)
        return now - self.relative, now

    def to_stac(self, now: dt.datetime | None = None) -> str:
        """The window as a STAC API ``datetime`` parameter (RFC 3339, ``..`` for an open end)."""
        start, end = self.resolve(now)

        def fmt(value: dt.datetime | None) -> str:
            return ".." if value is None else value.strftime("%Y-%m-%dT%H:%M:%SZ")

        return f"{fmt(start)}/{fmt(end)}"


def parse_duration(text: str) -> dt.timedelta:
    """Parse an ISO 8601 duration such as ``P30D`` or ``P1Y2M``; a year counts 365 days and a month 30.

    Raises
    ------
    ValueError
        If the text is not a duration or is zero.
    """
    match = _DURATION.match(text.strip().upper())
    if not match:
        raise ValueError(f"{text!r} is not an ISO 8601 duration like P30D, P6M or P1Y")
    parts = {k: int(v) for k, v in match.groupdict().items() if v}
    delta = dt.timedelta(
        days=parts.get("years", 0) * 365 + parts.get("months", 0) * 30 + parts.get("weeks", 0) * 7 + parts.get("days", 0),
        hours=parts.get("hours", 0),
        minutes=parts.get("minutes", 0),
        seconds=parts.get("seconds", 0),
    )
    if delta.total_seconds() <= 0:
        raise ValueError(f"the duration {text!r} is empty; use e.g. P30D")
    return delta


def _parse_instant(text: str, *, end: bool) -> dt.datetime | None:
    text = text.strip()
    if text in ("", ".."):
        return None
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            day = dt.date.fromisoformat(text)
            value = dt.datetime.combine(day, dt.time.max if end else dt.time.min)
        else:
            value = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not a date or date-time; use ISO 8601 like 2024-06-01 or 2024-06-01T10:00:00Z"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc)


def parse_datetime_window(text: str) -> DatetimeWindow:
    """Parse ``"2024-06-01/2024-08-31"``, ``"2024-06-01/.."``, ``"2024-06-01"`` or ``"P30D"``.

    Raises
    ------
    ValueError
        With a message that says which form is expected.
    """
    text = text.strip()
    if text.upper().startswith("P"):
        return DatetimeWindow(None, None, parse_duration(text))
    if "/" in text:
        parts = text.split("/")
        if len(parts) != 2:
            raise ValueError(f"{text!r} has more than one '/'; an interval is START/END, e.g. 2024-06-01/2024-08-31")
        start, end = _parse_instant(parts[0], end=False), _parse_instant(parts[1], end=True)
        if start is None and end is None:
            raise ValueError("both ends of the interval are open ('../..'); give at least one date")
        if start is not None and end is not None and start > end:
            raise ValueError(f"the interval starts after it ends ({parts[0]} > {parts[1]}); swap them")
        return DatetimeWindow(start, end)
    day_start = _parse_instant(text, end=False)
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        return DatetimeWindow(day_start, _parse_instant(text, end=True))
    return DatetimeWindow(day_start, day_start)
