"""What the spec's models share: the frozen base model, byte sizes, resampling names and the located error."""

from __future__ import annotations

import keyword
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr



RESAMPLING_METHODS = (
    "nearest", "bilinear", "cubic", "cubic_spline", "lanczos", "average", "mode", "max", "min", "med", "q1", "q3",
)


IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def function_names() -> frozenset[str]:
    from rasterflow.expr import ALLOWED_FUNCTIONS

    return frozenset(ALLOWED_FUNCTIONS)


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


PositiveFloat = Annotated[StrictFloat, Field(gt=0)]
Size = Annotated[StrictStr | StrictInt, Field(description="A byte size: '4GB', '512MiB', or a number of bytes.")]


class LocatedError(ValueError):
    """A cross-field error that knows which field it is about (the loader maps it to a line)."""

    def __init__(self, loc: tuple[str | int, ...], message: str):
        self.loc = loc
        super().__init__(message)

    def __reduce__(self) -> tuple[type[LocatedError], tuple[Any, str]]:  # pydantic deep-copies ctx; keep it picklable
        return (LocatedError, (self.loc, str(self)))


def check_identifier(name: str, what: str) -> None:
    if not IDENTIFIER.match(name) or keyword.iskeyword(name):
        raise ValueError(f"{what} {name!r} must be an identifier (letters, digits, _; not starting with a digit)")
    if name.startswith("__"):
        raise ValueError(f"{what} {name!r} must not start with '__'")
    if name in function_names() or name in ("and", "or", "not", "in"):
        raise ValueError(f"{what} {name!r} is a function of the expression language; choose another name")
