"""What a run computed, decided by the plan: the pipeline, the reduction, the time window and periods, the band
expressions, the input items. The COG tags, the Zarr attributes and the STAC documents all record it.

Standard library at import time; numpy, the kernels and the spec's time parser load inside the functions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rasterflow.write.naming import cog_entries

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.planning import JobPlan

__all__ = ["PeriodInfo", "RunDescription", "describe_run", "leading_coords", "cog_file_metadata", "rfc3339"]


@dataclasses.dataclass(frozen=True)
class PeriodInfo:
    """The time range and the inputs of one period (or of the whole window)."""

    start: dt.datetime
    end: dt.datetime
    n_items: int


@dataclasses.dataclass(frozen=True)
class RunDescription:
    """What produced the outputs, decided by the plan (nothing here reads pixels)."""

    name: str
    method: str | None
    """The reduction (``median``...), None for a time series."""
    quantiles: tuple[float, ...]
    period: str | None
    """``month`` | ``season`` | ``year``, None for the whole window."""
    window: PeriodInfo
    periods: Mapping[str, PeriodInfo]
    """Per period label ("2024-06"): its range, clipped to the window, and how many items fall in it."""
    expressions: tuple[tuple[str, str], ...]
    mask: str | None
    version: str
    item_ids: tuple[str, ...]

    def range_of(self, labels: Mapping[str, Any]) -> PeriodInfo:
        """The time range of one output entry (its period's, else the window's)."""
        label = labels.get("period")
        if label is not None and str(label) in self.periods:
            return self.periods[str(label)]
        return self.window

    def attrs(self) -> dict[str, Any]:
        """JSON-valued attributes (Zarr group attributes; COG tags as text)."""
        out: dict[str, Any] = {
            "rasterflow_version": self.version,
            "rasterflow_pipeline": self.name,
            "rasterflow_method": self.method or "none",
            "rasterflow_start_datetime": rfc3339(self.window.start),
            "rasterflow_end_datetime": rfc3339(self.window.end),
            "rasterflow_item_count": self.window.n_items,
            "rasterflow_expressions": dict(self.expressions),
        }
        if self.quantiles:
            out["rasterflow_quantiles"] = list(self.quantiles)
        if self.period:
            out["rasterflow_period"] = self.period
        if self.mask:
            out["rasterflow_mask"] = self.mask
        return out

    def entry_attrs(self, labels: Mapping[str, Any]) -> dict[str, Any]:
        """What differs for one file of a per-period output: its own range and item count."""
        if labels.get("period") is None:
            return {}
        info = self.range_of(labels)
        return {"rasterflow_start_datetime": rfc3339(info.start), "rasterflow_end_datetime": rfc3339(info.end),
                "rasterflow_item_count": info.n_items}


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def rfc3339(value: dt.datetime) -> str:
    """An instant as STAC writes it (``2024-06-01T10:00:00Z``, in UTC; naive values are taken as UTC).

    Parameters
    ----------
    value : datetime.datetime

    Returns
    -------
    str
        :func:`rasterflow.spec.timeparse.format_rfc3339` (imported on first use: the spec package is not light).
    """
    from rasterflow.spec.timeparse import format_rfc3339

    return format_rfc3339(value)


def describe_run(plan: JobPlan, *, window: tuple[dt.datetime | None, dt.datetime | None], period: Any = None,
                 mask: str | None = None, version: str | None = None) -> RunDescription:
    """The description of a planned run.

    Parameters
    ----------
    plan : rasterflow.planning.JobPlan
        A plan made with the searched items.
    window : (start, end)
        The search window (``DatetimeWindow.resolve()``); an open end is replaced by the first / last item's time.
    period : str, optional
        ``reduce.period``.
    mask : str, optional
        The spec's mask expression.
    version : str, optional
        rasterflow's version; default: the installed one.

    Returns
    -------
    RunDescription
    """
    from rasterflow.spec.timeparse import parse_instant

    if version is None:
        from rasterflow import __version__ as version
    times = sorted(_utc(parse_instant(item["properties"].get("datetime") or item["properties"]["start_datetime"]))
                   for item in plan.items)
    start, end = window
    start = _utc(start) if start is not None else (times[0] if times else dt.datetime.now(dt.timezone.utc))
    end = _utc(end) if end is not None else (times[-1] if times else start)
    periods: dict[str, PeriodInfo] = {}
    last_instant = dt.timedelta(microseconds=1)
    for label, (first_text, end_text) in zip(plan.period_labels, plan.period_bounds):
        # every period of the window (the plan's, rasterflow.periods): its part inside the window, its items
        first, after = _utc(dt.datetime.fromisoformat(first_text)), _utc(dt.datetime.fromisoformat(end_text))
        count = sum(1 for t in times if first <= t < after)
        periods[label] = PeriodInfo(max(first, start), max(max(first, start), min(after - last_instant, end)), count)
    program = plan.program
    return RunDescription(
        name=plan.name, method=program.reduce_method if program is not None else None,
        quantiles=tuple(program.quantiles) if program is not None else (),
        period=None if period is None else period if isinstance(period, str) else "intervals",
        window=PeriodInfo(start, end, len(plan.items)), periods=periods, expressions=tuple(plan.expressions),
        mask=mask, version=str(version), item_ids=tuple(str(item.get("id")) for item in plan.items),
    )


def leading_coords(plan: JobPlan) -> dict[str, list[str] | list[float]]:
    """The output's leading dimensions (period, quantile) as the writers name them.

    Parameters
    ----------
    plan : rasterflow.planning.JobPlan

    Returns
    -------
    dict
        ``{"period": [labels], "quantile": [q, ...]}``, each only when the output has that dimension.
    """
    coords: dict[str, list[str] | list[float]] = {}
    if plan.period_labels:
        coords["period"] = list(plan.period_labels)
    if plan.quantile_dim and plan.program is not None:
        coords["quantile"] = list(plan.program.quantiles)
    return coords


def cog_file_metadata(description: RunDescription, output_path: str, plan: JobPlan) -> dict[str, dict[str, Any]]:
    """Per COG file: the tags that differ from the run's (its period's range and item count).

    Parameters
    ----------
    description : RunDescription
    output_path : str
        The output as the spec names it.
    plan : rasterflow.planning.JobPlan

    Returns
    -------
    dict
        ``{file path: {tag: value}}`` for every file of the output (empty tags for a file without a period).
    """
    return {path: description.entry_attrs(labels)
            for _pos, labels, path in cog_entries(output_path, leading_coords(plan))}
