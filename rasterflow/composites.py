"""The variables of a composite reduction (a geomedian, a best-pixel composite), named once for the spec's
validation, the plan, the budget and the writers. No NumPy: ``validate`` and ``plan`` import it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MAD_NAMES", "CompositeNames", "geomedian_variables"]

MAD_NAMES = ("emad", "smad", "bcmad")
"""The MAD variables of a geomedian, in output order (after the bands, before ``count``)."""


def geomedian_variables(bands: Sequence[str], mads: bool = True) -> tuple[str, ...]:
    """The names of a geomedian's output planes, in order: the bands, ``emad``, ``smad``, ``bcmad`` (with
    ``mads``) and ``count``."""
    return (*bands, *(MAD_NAMES if mads else ()), "count")


@dataclass(frozen=True)
class CompositeNames:
    """A composite's method, the bands it reads per date (``inputs``) and the variables it writes (``outputs``, in
    the order of a task's result slots)."""

    method: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
