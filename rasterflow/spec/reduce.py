"""The spec's reduce section: the methods, one reduction, the checks of a list of statistics and of a composite."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator, model_validator

from rasterflow.spec.common import LocatedError, SpecModel


ReduceMethod = Literal["mean", "median", "min", "max", "std", "sum", "count", "quantile", "geomedian", "best"]
REDUCE_METHODS: tuple[str, ...] = get_args(ReduceMethod)
COMPOSITE_METHODS = ("geomedian", "best")
"""Methods over several bands at once: alone in ``reduce`` (not in a list), time whole."""
CUBE_DIMS = ("time", "band", "y", "x")


class Reduce(SpecModel):
    """An optional reduction; without it the time series itself is written."""

    over: StrictStr = Field(default="time", description="The dimension reduced; rasterflow reduces over time.")
    method: ReduceMethod = Field(
        description="mean | median | min | max | std | sum | count | quantile | geomedian (the geometric median "
        "of several bands, with MADs) | best (every band from the date that maximises or minimises `by`)."
    )
    q: Annotated[StrictFloat, Field(ge=0, le=1)] | list[Annotated[StrictFloat, Field(ge=0, le=1)]] | None = Field(
        default=None, description="Quantile(s) in 0..1; required for method quantile, and only for it."
    )
    bands: list[StrictStr] | None = Field(
        default=None, description="geomedian only: the bands (assets or bands of `bands`) of the geometric "
        "median, at least two, e.g. [red, green, nir, swir16]; each is an output variable, named as the band."
    )
    mads: StrictBool = Field(
        default=True, description="geomedian only: also write emad, smad and bcmad (the median Euclidean, cosine "
        "and Bray-Curtis distances to the geomedian); count is always written."
    )
    maxiters: Annotated[StrictInt, Field(ge=1)] = Field(
        default=1000, description="geomedian only: most iterations per pixel (odc-algo's default)."
    )
    eps: Annotated[StrictFloat, Field(gt=0)] = Field(
        default=1e-4, description="geomedian only: convergence tolerance in band units (reflectance: 1e-4; raw "
        "digital numbers: about 0.1-1)."
    )
    by: StrictStr | None = Field(
        default=None, description="best only: the band or asset whose largest (order: max) or smallest (min) value "
        "picks the date of every output band at a pixel, e.g. ndvi."
    )
    order: Literal["max", "min"] = Field(default="max", description="best only: max or min of `by`.")
    period: StrictStr | list[StrictStr | list[StrictStr | date | datetime]] | None = Field(
        default=None,
        description="null = the whole window; else one result per period, every period of the window in the output "
        "(one without data is NaN, count 0): month | season | year | dekad (days 1-10, 11-20, 21-end of each "
        "month) | an ISO 8601 duration anchored at the window's start (P16D, P1W, P3M) | a list of [start, end] "
        "intervals (inclusive dates, as source.stac.datetime).",
    )

    @field_validator("period")
    @classmethod
    def _check_period(cls, period: Any) -> Any:
        from rasterflow.periods import parse_period

        if period is not None:
            parse_period(period)  # a ValueError says what to change
        return period

    @field_validator("over")
    @classmethod
    def _check_over(cls, over: str) -> str:
        if over != "time":
            existing = ", ".join(CUBE_DIMS)
            raise ValueError(f"{over!r} cannot be reduced; the cube has dimensions {existing}, and only time reduces")
        return over

    @model_validator(mode="after")
    def _check_q(self) -> Reduce:
        if self.method == "quantile" and self.q is None:
            raise LocatedError(("method",), "method quantile needs q (a number in 0..1, or a list of them), e.g. q: 0.9")
        if self.method != "quantile" and self.q is not None:
            raise LocatedError(("q",), f"q is only used with method: quantile (method is {self.method!r}); remove q")
        if isinstance(self.q, list) and not self.q:
            raise LocatedError(("q",), "q is an empty list; give at least one quantile")
        if self.method == "geomedian":
            if not self.bands or len(self.bands) < 2:
                raise LocatedError(("bands",), "a geomedian is over at least two bands, e.g. bands: [red, green, "
                                                "nir, swir16]")
            if len(set(self.bands)) < len(self.bands):
                raise LocatedError(("bands",), "a band is listed twice; list each once")
        elif self.bands is not None:
            raise LocatedError(("bands",), f"bands is only used with method: geomedian (method is "
                                            f"{self.method!r}); remove it")
        if self.method == "best" and not self.by:
            raise LocatedError(("method",), "method best needs by: the band or asset whose maximum (or minimum, "
                                             "order: min) picks the date, e.g. by: ndvi")
        if self.method != "best" and self.by is not None:
            raise LocatedError(("by",), f"by is only used with method: best (method is {self.method!r}); remove it")
        return self

    @property
    def quantiles(self) -> tuple[float, ...]:
        """The quantiles as a tuple (empty unless method is quantile)."""
        if self.q is None:
            return ()
        return tuple(self.q) if isinstance(self.q, list) else (self.q,)


def statistic_name(method: str, q: float | None = None) -> str:
    """The suffix of a statistic's variables: the method (``median``), or ``q`` and the percentage for a quantile
    (0.1 -> ``q10``, 0.9 -> ``q90``, 0.025 -> ``q2_5``: a dot is not allowed in a variable name everywhere)."""
    if q is None:
        return method
    percent = f"{q * 100:.6f}".rstrip("0").rstrip(".")
    return "q" + percent.replace(".", "_")


def check_composite(reduce: Reduce, assets: list[str], bands: list[str], chunk_time: int) -> None:
    """A geomedian's bands and a best-pixel's ``by`` name assets or bands; time is whole (every date of a pixel
    is looked at together)."""
    known = assets + bands
    if reduce.method == "geomedian":
        for index, name in enumerate(reduce.bands or ()):
            if name not in known:
                raise LocatedError(("reduce", "bands", index),
                                    f"{name!r} is neither an asset nor a band; use one of {', '.join(known)}")
    elif reduce.by not in known:
        raise LocatedError(("reduce", "by"), f"by: {reduce.by!r} names nothing; use an asset or a band: "
                                              f"{', '.join(known)}")
    if chunk_time != -1:
        raise LocatedError(("chunks", "time"),
                            f"a {reduce.method} looks at every date of a pixel at once, so time must be whole; set "
                            f"chunks.time: -1 (got {chunk_time})")


def check_statistics(entries: list[Reduce], chunk_time: int) -> None:
    """A list ``reduce``: each statistic once, one period, time whole (the statistics share the task's series)."""
    seen: dict[str, int] = {}
    periods = {str(r.period) for r in entries if r.period}
    first_period = next((r.period for r in entries if r.period), None)
    for index, entry in enumerate(entries):
        if entry.method in COMPOSITE_METHODS:
            raise LocatedError(("reduce", index, "method"),
                                f"a {entry.method} makes variables of its own and is not combined with other "
                                f"statistics; give it alone: reduce: {{method: {entry.method}, ...}}")
        for q in entry.quantiles or (None,):
            name = statistic_name(entry.method, q)
            if name in seen:
                what = f"quantile {q:g}" if q is not None else entry.method
                raise LocatedError(("reduce", index, "method" if q is None else "q"),
                                    f"{what} is listed twice (entries {seen[name]} and {index}); remove one")
            seen[name] = index
        if len(periods) > 1 and entry.period and str(entry.period) != str(first_period):
            raise LocatedError(("reduce", index, "period"),
                                f"the statistics of one run share one period; entries ask for "
                                f"{' and '.join(sorted(periods))}: give period once")
    if chunk_time != -1:
        raise LocatedError(("chunks", "time"),
                            f"several statistics are computed from one read of every date of a chunk, so time must be "
                            f"whole; set chunks.time: -1 (got {chunk_time})")
