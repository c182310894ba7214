"""Signing hrefs before they are opened (``source.sign``): a small, pluggable interface.

A signer is a callable ``href -> href`` (e.g. appending a SAS token); it runs in the worker right before a file is
opened, so a token never outlives the run in a plan, a report or an error message (those keep the unsigned href).

Built in: ``planetary-computer`` (the ``planetary-computer`` package's ``sign``, which caches its tokens). Other
signers come from packages that declare an entry point in the group ``rasterflow.signers``::

    [project.entry-points."rasterflow.signers"]
    my-catalog = "my_package.signing:sign"

Nothing in the spec is evaluated: a name picks a registered signer or is an error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from rasterflow.errors import RunFailedError

if TYPE_CHECKING:  # pragma: no cover
    from importlib.metadata import EntryPoint

__all__ = ["Signer", "BUILTIN_SIGNERS", "ENTRY_POINT_GROUP", "get_signer", "available_signers"]

Signer = Callable[[str], str]
ENTRY_POINT_GROUP = "rasterflow.signers"


def _planetary_computer() -> Signer:
    try:
        import planetary_computer
    except ImportError:
        raise RunFailedError(
            "source.sign: planetary-computer needs the `planetary-computer` package in the environment of the "
            "client and of every worker: pip install 'planetary-computer>=1,<2'"
        ) from None
    sign: Signer = planetary_computer.sign  # planetary-computer ships no annotations mypy reads
    return sign


BUILTIN_SIGNERS: dict[str, Callable[[], Signer]] = {"planetary-computer": _planetary_computer}
"""Name -> a factory of the signer (called on first use, so a missing package is an error only when asked for)."""


def _entry_points() -> dict[str, EntryPoint]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_signers() -> list[str]:
    """The names ``source.sign`` accepts here."""
    return sorted(set(BUILTIN_SIGNERS) | set(_entry_points()))


@functools.lru_cache(maxsize=None)
def get_signer(name: str) -> Signer:
    """The signer called ``name``; :class:`RunFailedError` naming the choices when there is none."""
    if name in BUILTIN_SIGNERS:
        return BUILTIN_SIGNERS[name]()
    entry = _entry_points().get(name)
    if entry is None:
        raise RunFailedError(f"source.sign: no signer called {name!r}; available: "
                             f"{', '.join(available_signers())} (more come from packages with a "
                             f"{ENTRY_POINT_GROUP!r} entry point)")
    signer: Signer = entry.load()  # what the entry point names; a signer by the entry point group's contract
    if not callable(signer):
        raise RunFailedError(f"source.sign: the {ENTRY_POINT_GROUP} entry point {name!r} is not callable")
    return signer
