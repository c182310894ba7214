"""The spec's mask_cleanup steps and the halo they need."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import Field, StrictInt, model_validator

from rasterflow.spec.common import SpecModel


class MaskStep(SpecModel):
    """One morphological step of ``mask_cleanup``: exactly one of the operations, with a disk radius in pixels."""

    opening: Annotated[StrictInt, Field(gt=0)] | None = Field(
        default=None, description="Radius of an opening (erosion then dilation): removes specks of the mask "
        "smaller than the disk.")
    closing: Annotated[StrictInt, Field(gt=0)] | None = Field(
        default=None, description="Radius of a closing (dilation then erosion): fills holes smaller than the disk.")
    dilation: Annotated[StrictInt, Field(gt=0)] | None = Field(
        default=None, description="Radius of a dilation: grows the mask (cloud edges, shadows) by the disk.")
    erosion: Annotated[StrictInt, Field(gt=0)] | None = Field(
        default=None, description="Radius of an erosion: shrinks the mask by the disk.")

    @model_validator(mode="after")
    def _one(self) -> MaskStep:
        given = [k for k in ("opening", "closing", "dilation", "erosion") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("each step is one of opening, closing, dilation or erosion with a radius, e.g. "
                             "{opening: 2}" + (f" (got {', '.join(given)})" if given else ""))
        return self

    @property
    def operation(self) -> tuple[str, int]:
        """``(operation, radius)``."""
        for key in ("opening", "closing", "dilation", "erosion"):
            value = getattr(self, key)
            if value is not None:
                return key, int(value)
        raise AssertionError("validated: one operation")



def cleanup_halo(steps: Sequence[tuple[str, int]]) -> int:
    """Pixels around a window that ``mask_cleanup``'s steps look at: the sum of their reach (an opening or a closing
    is two passes of its radius, a dilation or an erosion one), so that the cleaned mask inside the window does not
    depend on where the window ends. The one rule for the tasks' reads (the plan's ``Program.halo``) and the budget.
    """
    return sum((2 if operation in ("opening", "closing") else 1) * radius for operation, radius in steps)
