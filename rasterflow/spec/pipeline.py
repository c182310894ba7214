"""The top-level spec model: its sections and the checks across them, and what it derives for the plan."""

from __future__ import annotations

import functools
import math
from typing import Annotated, Any, Literal

from pydantic import Field, StrictStr, field_validator, model_validator

from rasterflow.composites import CompositeNames, geomedian_variables
from rasterflow.errors import ExpressionError
from rasterflow.spec.cluster import Budget, Cluster
from rasterflow.spec.common import check_identifier, LocatedError, SpecModel
from rasterflow.spec.grid import Chunks, Grid
from rasterflow.spec.mask import MaskStep, cleanup_halo
from rasterflow.spec.output import Output
from rasterflow.spec.reduce import COMPOSITE_METHODS, Reduce, check_composite, check_statistics, statistic_name
from rasterflow.spec.source import Source


class Spec(SpecModel):
    """A rasterflow pipeline spec, version 1."""

    version: Literal[1] = Field(description="The spec format version; 1.")
    name: StrictStr = Field(
        description="Pipeline name, [a-z0-9_-]+; used in logs, the run report and the lock file.",
        pattern=r"^[a-z0-9_-]+$",
        max_length=128,
    )
    description: StrictStr | None = Field(default=None, description="Free text.")
    tags: list[Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_.:-]+$")]] = Field(
        default_factory=list, description="Labels for selecting specs in a batch: rasterflow run DIR --select tag:X."
    )
    source: Source = Field(description="The STAC search and the assets to load.")
    grid: Grid = Field(description="The output grid.")
    chunks: Chunks = Field(default_factory=Chunks, description="Dask chunk layout; -1 = whole axis.")
    mask: StrictStr | None = Field(
        default=None, description="Boolean expression over assets; true = drop the pixel (set it to NaN)."
    )
    mask_cleanup: list[MaskStep] | None = Field(
        default=None,
        description="Morphology applied in order to each date's mask before it drops pixels, with disk-shaped "
        "structuring elements of the given radius in pixels (as odc-algo's mask_cleanup; Sentinel-2: "
        "[{opening: 2}, {dilation: 5}] removes speckle and grows cloud edges). Each chunk is read with a halo of the "
        "radii's sum, so the result does not depend on the chunk layout.",
    )
    bands: dict[StrictStr, StrictStr] = Field(
        description="Named expressions, evaluated in order; later ones may use earlier ones.", min_length=1
    )
    reduce: Reduce | Annotated[list[Reduce], Field(min_length=1)] | None = Field(
        default=None,
        description="Optional reduction; without it the time series is written. A list computes several statistics "
        "from one read (every one from the same loaded block, in the same task): each band's outputs are named "
        "{band}_{statistic} (ndvi_median, ndvi_q10, ndvi_count); a period, if any, is given once (on any entry).",
    )
    output: Output = Field(description="Where and how the result is written.")
    cluster: Cluster = Field(default_factory=Cluster, description="The Dask cluster.")
    budget: Budget = Field(default_factory=Budget, description="The static memory budget check.")

    @field_validator("bands")
    @classmethod
    def _check_band_names(cls, bands: dict[str, str]) -> dict[str, str]:
        for name in bands:
            check_identifier(name, "band name")
        return bands

    @model_validator(mode="after")
    def _check_expressions(self) -> Spec:
        from rasterflow.expr import parse_expression

        assets = list(self.source.assets)
        collisions = sorted(set(assets) & set(self.bands))
        if collisions:
            raise LocatedError(
                ("bands", collisions[0]),
                f"{collisions[0]!r} is both an asset and a band; rename the band (e.g. {collisions[0]}_out)",
            )
        if self.mask is not None:
            try:
                mask = parse_expression(self.mask, assets, what="mask")
            except ExpressionError as err:
                raise LocatedError(("mask",), str(err)) from None
            # The mask sees the raw source values: integers unless the spec says otherwise (plan checks again
            # with the data types the items declare).
            try:
                kind = mask.check_kinds({a: self.source.asset_kind(a) or "int" for a in mask.names})
            except ExpressionError as err:
                raise LocatedError(("mask",), str(err)) from None
            if not mask.is_boolean and not (kind == "int" and mask.is_bit_test):
                raise LocatedError(
                    ("mask",), f"must be a true/false expression such as \"scl in (3, 8, 9, 10)\" or an integer bit "
                    f"test such as \"(qa >> 3) & 1\" (nonzero = drop) (got {self.mask!r})"
                )
        known = list(assets)
        kinds: dict[str, str] = {a: "float" for a in assets}
        for name, text in self.bands.items():
            try:
                band = parse_expression(text, known, what=f"band {name!r}")
                # Bands see scaled values in the working dtype: every asset is a float there.
                kinds[name] = band.check_kinds(kinds)
            except ExpressionError as err:
                raise LocatedError(("bands", name), str(err)) from None
            known.append(name)
        if self.source.group_by == "solar_day" and self.chunks.time != -1:
            raise LocatedError(
                ("chunks", "time"),
                f"source.group_by: solar_day mosaics the tiles of each pass inside one task, so time must be whole; "
                f"set chunks.time: -1 (got {self.chunks.time})",
            )
        if self.output.tiling is not None:
            size = self.output.tiling.size
            for axis in ("y", "x"):
                chunk = getattr(self.chunks, axis)
                if chunk == -1:
                    raise LocatedError(("output", "tiling", "size"),
                                        f"tiles need chunks.{axis} to be a number of pixels, not -1 (the whole axis); "
                                        f"set chunks.{axis} to a divisor of {size}, e.g. {divisor_near(size, 1024)}")
                if size % chunk:
                    raise LocatedError(("output", "tiling", "size"),
                                        f"{size} is not a multiple of chunks.{axis} ({chunk}), so tiles would cut "
                                        f"chunks; use a multiple of {chunk} such as {max(chunk, size - size % chunk)} "
                                        f"or {size - size % chunk + chunk}, or change chunks.{axis}")
        if self.mask_cleanup is not None and self.mask is None:
            raise LocatedError(("mask_cleanup",), "mask_cleanup cleans the mask, but the spec has none; add mask "
                                                   "(e.g. mask: \"scl in (3, 8, 9, 10)\") or remove mask_cleanup")
        if isinstance(self.reduce, list):
            check_statistics(self.reduce, self.chunks.time)
        elif self.reduce is not None and self.reduce.method in COMPOSITE_METHODS:
            check_composite(self.reduce, list(assets), list(self.bands), self.chunks.time)
        if self.output.resolved_format == "cog" and self.reduce is None:
            raise LocatedError(
                ("output", "format"),
                "a COG holds 2-D bands, so a time series cannot be written to one; add a reduce section or write .zarr",
            )
        return self


    @property
    def reductions(self) -> tuple[Reduce, ...]:
        """The statistics asked for, in order (one for a single ``reduce``, none without)."""
        if self.reduce is None:
            return ()
        return tuple(self.reduce) if isinstance(self.reduce, list) else (self.reduce,)

    @property
    def cleanup_steps(self) -> tuple[tuple[str, int], ...]:
        """``mask_cleanup`` as ``(operation, radius)`` pairs, in order."""
        return tuple(step.operation for step in self.mask_cleanup or ())

    @property
    def cleanup_halo(self) -> int:
        """Pixels read around every task's window for ``mask_cleanup`` (:func:`cleanup_halo`)."""
        return cleanup_halo(self.cleanup_steps)

    @property
    def composite(self) -> CompositeNames | None:
        """A geomedian's or best-pixel composite's bands and variables (None for any other reduction): a geomedian
        reads its ``bands`` and writes them, its MADs and ``count``; a best-pixel composite reads and writes every
        band of ``bands``."""
        reduce = self.reduce if not isinstance(self.reduce, list) else None
        if reduce is None or reduce.method not in COMPOSITE_METHODS:
            return None
        if reduce.method == "geomedian":
            inputs = tuple(reduce.bands or ())
            return CompositeNames("geomedian", inputs, geomedian_variables(inputs, reduce.mads))
        outputs = tuple(self.bands)
        return CompositeNames(str(reduce.method), outputs, outputs)

    @property
    def program_bands(self) -> dict[str, str]:
        """The bands the tasks compute: ``bands``, and an asset a geomedian or best-pixel composite names (its
        masked values, as a band of the same name). A geomedian writes only its own bands: a band it does not
        read, directly or through another band, is not computed (:attr:`unused_bands`)."""
        out = dict(self.bands)
        reduce = self.reduce if not isinstance(self.reduce, list) else None
        if reduce is not None and reduce.method in COMPOSITE_METHODS:
            for name in [*(reduce.bands or ()), *([reduce.by] if reduce.by else [])]:
                if name not in out:
                    out[name] = name
        unused = self.unused_bands
        return {name: text for name, text in out.items() if name not in unused}

    @functools.cached_property
    def unused_bands(self) -> tuple[str, ...]:
        """Bands of ``bands`` that no output needs: with a geomedian, those it does not read (directly or through
        another band's expression); empty otherwise (every band is an output)."""
        reduce = self.reduce if not isinstance(self.reduce, list) else None
        if reduce is None or reduce.method != "geomedian" or not reduce.bands:
            return ()
        from rasterflow.expr import parse_expression

        assets = list(self.source.assets)
        reads: dict[str, frozenset[str]] = {}
        known = list(assets)
        for name, text in self.bands.items():
            try:
                reads[name] = frozenset(parse_expression(text, known, what=f"band {name!r}").names)
            except ExpressionError:  # validation reports it
                return ()
            known.append(name)
        needed: set[str] = set()
        pending = [b for b in reduce.bands if b in self.bands]
        while pending:
            name = pending.pop()
            if name in needed:
                continue
            needed.add(name)
            pending.extend(n for n in reads.get(name, ()) if n in self.bands)
        return tuple(name for name in self.bands if name not in needed)

    @property
    def reduce_period(self) -> Any:
        """``reduce.period`` (of whichever entry of a list gives it): a name, a duration or a list of intervals."""
        return next((r.period for r in self.reductions if r.period), None)

    @property
    def statistics(self) -> tuple[tuple[str, str, float | None], ...]:
        """For a list ``reduce``: per output statistic ``(name, method, q)`` in order (``("q10", "quantile",
        0.1)``), its variables named ``{band}_{name}``; empty for a single ``reduce`` (variables named as the
        bands, a ``quantile`` dimension for a list of ``q``)."""
        if not isinstance(self.reduce, list):
            return ()
        return tuple((statistic_name(r.method, q), r.method, q)
                     for r in self.reduce for q in (r.quantiles or (None,)))


def divisor_near(size: int, wanted: int) -> int:
    """The divisor of ``size`` closest to ``wanted`` (a chunk edge to suggest for a tile size)."""
    divisors = [d for d in range(1, int(math.isqrt(size)) + 1) if size % d == 0]
    divisors += [size // d for d in divisors]
    return min(divisors, key=lambda d: (abs(d - wanted), d))
