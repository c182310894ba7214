"""rasterflow.periods: every period of a window, against hand-computed cases."""

from __future__ import annotations

import datetime as dt

import pytest

from rasterflow.periods import (
    Period,
    assign_periods,
    group_by_period,
    label_of,
    parse_period,
    window_periods,
)

UTC = dt.timezone.utc


def d(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def last_of(year: int, month: int, day: int) -> dt.datetime:
    """The last instant of a day, as DatetimeWindow.resolve gives a date end."""
    return d(year, month, day) + dt.timedelta(days=1) - dt.timedelta(microseconds=1)


def spans(periods: list[Period]) -> list[tuple[dt.datetime, dt.datetime, str]]:
    return [(p.start, p.end, p.label) for p in periods]


# ------------------------------------------------------------------------------------------------------------------
# calendar periods


def test_dekads_of_february_in_a_leap_year():
    periods = window_periods(d(2024, 2, 1), last_of(2024, 2, 29), "dekad")
    assert spans(periods) == [
        (d(2024, 2, 1), d(2024, 2, 11), "2024-02-D1"),
        (d(2024, 2, 11), d(2024, 2, 21), "2024-02-D2"),
        (d(2024, 2, 21), d(2024, 3, 1), "2024-02-D3"),  # 9 days
    ]
    assert [(p.end - p.start).days for p in window_periods(d(2023, 2, 1), last_of(2023, 2, 28), "dekad")] == [10, 10, 8]


def test_dekads_of_a_31_day_month_and_a_window_starting_mid_dekad():
    periods = window_periods(d(2024, 1, 15, 10), last_of(2024, 2, 3), "dekad")
    assert spans(periods) == [
        (d(2024, 1, 11), d(2024, 1, 21), "2024-01-D2"),   # whole, though the window starts on the 15th
        (d(2024, 1, 21), d(2024, 2, 1), "2024-01-D3"),    # 11 days
        (d(2024, 2, 1), d(2024, 2, 11), "2024-02-D1"),
    ]


def test_a_year_of_dekads_has_36():
    periods = window_periods(d(2024, 1, 1), last_of(2024, 12, 31), "dekad")
    assert len(periods) == 36
    assert periods[0].start == d(2024, 1, 1) and periods[-1].end == d(2025, 1, 1)
    assert all(a.end == b.start for a, b in zip(periods, periods[1:]))


def test_months_cover_the_window_including_empty_ones_and_edges():
    periods = window_periods(d(2024, 6, 15), last_of(2024, 8, 31), "month")
    assert spans(periods) == [
        (d(2024, 6, 1), d(2024, 7, 1), "2024-06"),
        (d(2024, 7, 1), d(2024, 8, 1), "2024-07"),
        (d(2024, 8, 1), d(2024, 9, 1), "2024-08"),
    ]
    # a window ending exactly at midnight of a month's first day reaches into that month (both ends inclusive)
    assert [p.label for p in window_periods(d(2024, 6, 1), d(2024, 7, 1), "month")] == ["2024-06", "2024-07"]
    # one microsecond earlier it does not
    assert [p.label for p in window_periods(d(2024, 6, 1), d(2024, 7, 1) - dt.timedelta(microseconds=1),
                                            "month")] == ["2024-06"]
    # a one-instant window has one period
    assert [p.label for p in window_periods(d(2024, 6, 5, 10), d(2024, 6, 5, 10), "year")] == ["2024"]


def test_seasons_december_belongs_to_next_years_djf():
    periods = window_periods(d(2023, 11, 20), last_of(2024, 6, 1), "season")
    assert spans(periods) == [
        (d(2023, 9, 1), d(2023, 12, 1), "2023-SON"),
        (d(2023, 12, 1), d(2024, 3, 1), "2024-DJF"),
        (d(2024, 3, 1), d(2024, 6, 1), "2024-MAM"),
        (d(2024, 6, 1), d(2024, 9, 1), "2024-JJA"),
    ]


def test_years_across_a_boundary():
    assert spans(window_periods("2023-12-31T23:00:00Z", "2024-01-01", "year")) == [
        (d(2023, 1, 1), d(2024, 1, 1), "2023"), (d(2024, 1, 1), d(2025, 1, 1), "2024")]


def test_calendar_labels():
    stamps = [d(2023, 12, 31, 23, 59), d(2024, 1, 1), d(2024, 2, 29, 12), d(2024, 3, 1), d(2024, 5, 31),
              d(2024, 6, 1), d(2024, 8, 31, 23), d(2024, 9, 1), d(2024, 11, 30), d(2024, 12, 1), d(2025, 2, 28)]
    assert [label_of(s, "month") for s in stamps] == [
        "2023-12", "2024-01", "2024-02", "2024-03", "2024-05", "2024-06", "2024-08", "2024-09", "2024-11", "2024-12",
        "2025-02"]
    assert [label_of(s, "season") for s in stamps] == [
        "2024-DJF", "2024-DJF", "2024-DJF", "2024-MAM", "2024-MAM", "2024-JJA", "2024-JJA", "2024-SON", "2024-SON",
        "2025-DJF", "2025-DJF"]
    assert [label_of(s, "year") for s in stamps] == ["2023"] + ["2024"] * 9 + ["2025"]


def test_calendar_periods_are_contiguous_and_label_unique():
    for kind in ("month", "season", "year", "dekad"):
        periods = window_periods(d(2019, 3, 17), last_of(2024, 10, 2), kind)
        assert all(a.end == b.start for a, b in zip(periods, periods[1:])), kind
        assert len({p.label for p in periods}) == len(periods), kind
        assert periods[0].contains(d(2019, 3, 17)) and periods[-1].contains(last_of(2024, 10, 2)), kind


# ------------------------------------------------------------------------------------------------------------------
# durations


def test_p16d_across_a_year_boundary():
    periods = window_periods(d(2024, 12, 20), last_of(2025, 1, 31), "P16D")
    assert spans(periods) == [
        (d(2024, 12, 20), d(2025, 1, 5), "2024-12-20"),
        (d(2025, 1, 5), d(2025, 1, 21), "2025-01-05"),
        (d(2025, 1, 21), d(2025, 2, 6), "2025-01-21"),  # whole: the last period reaches past the window
    ]


def test_p16d_leap_day_counts():
    periods = window_periods(d(2024, 2, 20), last_of(2024, 3, 10), "P16D")
    assert [p.start for p in periods] == [d(2024, 2, 20), d(2024, 3, 7)]  # 20 Feb + 16 days = 7 Mar in a leap year


def test_p1w_is_seven_days_from_the_start_not_iso_weeks():
    periods = window_periods(d(2024, 6, 5), last_of(2024, 6, 20), "P1W")  # a Wednesday
    assert [p.start for p in periods] == [d(2024, 6, 5), d(2024, 6, 12), d(2024, 6, 19)]
    assert all(p.end - p.start == dt.timedelta(days=7) for p in periods)
    assert parse_period("P2W3D") == parse_period("P17D").__class__("days", length=17, text="P2W3D")


def test_p3m_from_january_31_clamps_each_month_from_the_anchor():
    periods = window_periods(d(2024, 1, 31), last_of(2025, 2, 15), "P3M")
    assert spans(periods) == [
        (d(2024, 1, 31), d(2024, 4, 30), "2024-01-31"),
        (d(2024, 4, 30), d(2024, 7, 31), "2024-04-30"),   # computed from Jan 31, so back to the 31st: no drift
        (d(2024, 7, 31), d(2024, 10, 31), "2024-07-31"),
        (d(2024, 10, 31), d(2025, 1, 31), "2024-10-31"),
        (d(2025, 1, 31), d(2025, 4, 30), "2025-01-31"),
    ]


def test_p1m_from_january_31_goes_through_the_leap_day():
    periods = window_periods(d(2024, 1, 31), last_of(2024, 5, 1), "P1M")
    assert [p.start for p in periods] == [d(2024, 1, 31), d(2024, 2, 29), d(2024, 3, 31), d(2024, 4, 30)]
    assert periods[-1].end == d(2024, 5, 31)
    assert [p.start for p in window_periods(d(2023, 1, 31), last_of(2023, 3, 1), "P1M")] == [
        d(2023, 1, 31), d(2023, 2, 28)]


def test_p1y_from_a_leap_day():
    periods = window_periods(d(2024, 2, 29), last_of(2028, 3, 1), "P1Y")
    assert [p.start for p in periods] == [d(2024, 2, 29), d(2025, 2, 28), d(2026, 2, 28), d(2027, 2, 28),
                                          d(2028, 2, 29)]
    assert parse_period("P1Y6M") == parse_period("P18M").__class__("months", length=18, text="P1Y6M")


def test_duration_anchored_at_a_non_midnight_start_labels_with_the_time():
    periods = window_periods(d(2024, 6, 1, 10, 30), d(2024, 6, 3, 12), "P1D")
    assert [p.label for p in periods] == ["2024-06-01T103000Z", "2024-06-02T103000Z", "2024-06-03T103000Z"]
    assert all(":" not in p.label for p in periods)


def test_lowercase_duration_accepted():
    assert parse_period("p16d") == parse_period("P16D").__class__("days", length=16, text="p16d")


# ------------------------------------------------------------------------------------------------------------------
# explicit intervals


def test_explicit_intervals_sorted_ends_inclusive():
    periods = window_periods(None, None, [["2024-07-01", "2024-07-31"], [dt.date(2024, 6, 1), dt.date(2024, 6, 15)],
                                          "2024-06-16/2024-06-30"])
    assert spans(periods) == [
        (d(2024, 6, 1), d(2024, 6, 16), "2024-06-01"),
        (d(2024, 6, 16), d(2024, 7, 1), "2024-06-16"),
        (d(2024, 7, 1), d(2024, 8, 1), "2024-07-01"),
    ]


def test_explicit_intervals_with_datetimes_and_gaps():
    periods = window_periods(d(2024, 1, 1), last_of(2024, 12, 31), [
        ["2024-06-01T00:00:00Z", "2024-06-10T12:00:00Z"], [dt.datetime(2024, 6, 20, 6), "2024-06-21"]])
    assert periods[0].start == d(2024, 6, 1) and periods[0].end == d(2024, 6, 10, 12) + dt.timedelta(microseconds=1)
    assert periods[1].start == d(2024, 6, 20, 6) and periods[1].end == d(2024, 6, 22)
    assert [p.label for p in periods] == ["2024-06-01", "2024-06-20T060000Z"]
    index = assign_periods(["2024-06-10T12:00:00Z", "2024-06-10T12:00:01Z", "2024-06-15", "2024-06-21T23:59:59Z"],
                           periods)
    assert index == [0, None, None, 1]  # an end instant is inside; gaps belong to no period


def test_explicit_intervals_outside_the_window_are_kept():
    periods = window_periods(d(2024, 6, 1), last_of(2024, 6, 30), [["2025-01-01", "2025-01-31"]])
    assert [p.label for p in periods] == ["2025-01-01"]


@pytest.mark.parametrize("value, message", [
    ([["2024-06-01", "2024-06-15"], ["2024-06-15", "2024-06-30"]], "intervals 1 and 2 of period overlap"),
    ([["2024-06-10", "2024-06-30"], ["2024-07-01", "2024-07-05"], ["2024-06-01", "2024-06-10"]],
     "intervals 1 and 3 of period overlap (2024-06-01/2024-06-10 and 2024-06-10/2024-06-30)"),
    ([["2024-06-15", "2024-06-01"]], "interval 1 of period ends before it starts (2024-06-15 > 2024-06-01); swap"),
    ([["2024-06-01"]], "interval 1 of period has 1 values; an interval is [start, end]"),
    ([["2024-06-01", ".."]], "needs both ends"),
    ([["2024-02-30", "2024-03-01"]], "'2024-02-30' is not a valid date"),
    (["2024-06-01/2024-06-15/2024-06-30"], "is not START/END"),
    ([["June", "July"]], "'June' is not a date or date-time"),
    ([], "period is an empty list"),
    ([3], "interval 1 of period is 3; an interval is [start, end]"),
])
def test_bad_intervals(value, message):
    with pytest.raises(ValueError) as info:
        parse_period(value)
    assert message in str(info.value)


# ------------------------------------------------------------------------------------------------------------------
# bad values


@pytest.mark.parametrize("value, message", [
    ("P0D", "P0D is not a period length; use e.g. P16D, P1W, P1M"),
    ("P0Y0M", "P0Y0M is not a period length"),
    ("PT12H", "'PT12H' has a time-of-day part (T12H); periods are whole days, weeks, months or years"),
    ("P1DT12H", "has a time-of-day part"),
    ("P1M15D", "'P1M15D' mixes calendar months/years with weeks/days; months have different lengths, so use one "
               "kind: e.g. P45D or P1M"),
    ("P1.5M", "is not a period: an ISO 8601 period length"),
    ("P", "is not a period"),
    ("P16", "is not a period"),
    ("fortnight", "'fortnight' is not a period; use month, season, year, dekad, an ISO 8601 duration"),
    ("Month", "write it in lower case: 'month'"),
    ("2024-06-01/2024-06-15", "is one interval; give a list of them"),
    ({"start": "2024-06-01"}, "a period must be a string or a list of intervals, not dict"),
    (16, "not int"),
])
def test_bad_values_say_what_to_change(value, message):
    with pytest.raises(ValueError) as info:
        parse_period(value)
    assert message in str(info.value)


def test_open_window_refused_for_calendar_periods():
    with pytest.raises(ValueError, match="needs a window with both ends"):
        window_periods(None, d(2024, 1, 1), "month")
    with pytest.raises(ValueError, match="ends before it starts"):
        window_periods(d(2024, 2, 1), d(2024, 1, 1), "month")


# ------------------------------------------------------------------------------------------------------------------
# assignment


def test_assign_and_group_items_including_empty_periods_and_outside_items():
    periods = window_periods(d(2024, 6, 1), last_of(2024, 8, 31), "month")
    times = ["2024-05-31T23:59:59Z", "2024-06-03T10:00:00Z", "2024-06-30T23:59:59.999999+00:00",
             "2024-08-01T00:00:00+02:00",  # 2024-07-31T22:00Z: July
             dt.datetime(2024, 8, 31, 23, 59), "2024-09-01T00:00:00Z"]
    assert assign_periods(times, periods) == [None, 0, 0, 1, 2, None]
    assert group_by_period(times, periods) == ((1, 2), (3,), (4,))
    assert group_by_period([], periods) == ((), (), ())  # every period present, empty ones too


def test_group_dekads_with_empty_middle_period():
    periods = window_periods("2024-02-01", "2024-02-29T23:59:59Z", "dekad")
    assert group_by_period([dt.date(2024, 2, 1), "2024-02-10T23:59:59Z", "2024-02-29T12:00:00Z"], periods) == (
        (0, 1), (), (2,))


def test_clip_to_the_window():
    period = window_periods(d(2024, 6, 15), last_of(2024, 6, 20), "month")[0]
    assert period.clip(d(2024, 6, 15), last_of(2024, 6, 20)) == (d(2024, 6, 15), last_of(2024, 6, 20))
    assert period.clip(d(2024, 5, 1), last_of(2024, 8, 1)) == (d(2024, 6, 1), last_of(2024, 6, 30))
    with pytest.raises(ValueError, match="outside the window"):
        period.clip(d(2024, 7, 1), last_of(2024, 7, 5))


def test_light_import():
    """The module imports only the standard library (the spec layer uses it)."""
    import ast
    import sys
    from pathlib import Path

    import rasterflow.periods as module

    tree = ast.parse(Path(module.__file__).read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert names - {"__future__"} <= set(sys.stdlib_module_names)
