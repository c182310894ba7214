"""What the commands give back and how they talk to their caller: the results, the emit callback, the state folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from rasterflow.planning import JobPlan

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.spec import LoadedSpec


REPO_ROOT = Path(__file__).resolve().parent.parent.parent  # rasterflow/commands/results.py -> the repository


DEFAULT_STATE_DIR = ".rasterflow"
"""Where a run keeps what is not beside its output (relative to the working directory, like dbt's ``target/``):
``run_results.json`` and ``reports/`` of runs that do not own their output (refused, up to date, lost the lock)."""

Emit = Callable[[str, dict[str, Any]], None]
"""``emit(kind, fields)``: what the run tells its caller; kinds: start, warning, plan, dashboard, resumed, took_over,
up_to_date, memory_plot, done."""


def no_emit(kind: str, fields: dict[str, Any]) -> None:
    return None


class TextSink(Protocol):
    """Where block progress lines go: a text stream (``sys.stdout``) or :class:`rasterflow.logs.ProgressEvents`."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...

    def isatty(self) -> bool: ...


@dataclass(frozen=True)
class RunResult:
    """The outcome of one spec's run.

    Attributes
    ----------
    spec_path : str
    name : str
        The spec's ``name``.
    status : str
        ``ok`` | ``up_to_date`` | ``failed`` | ``invalid`` | ``over_budget`` | ``locked`` | ``interrupted``.
    exit_code : int
        What the CLI exits with for this spec (see README, exit codes).
    outputs : tuple of str
        The files or stores written (or found up to date).
    report_path : str or None
        Where the run report was written.
    report : dict or None
        The report's content.
    error : str or None
        The error message, when the run did not succeed.
    exception : BaseException or None
        The error itself (the API raises it).
    seconds : float
        Wall time of the run.
    left : str
        For an interrupted run: what is left and how a rerun continues.
    """

    spec_path: str
    name: str
    status: str
    exit_code: int
    outputs: tuple[str, ...] = ()
    report_path: str | None = None
    report: dict[str, Any] | None = field(default=None, repr=False)
    error: str | None = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    seconds: float = 0.0
    left: str = ""

    @property
    def ok(self) -> bool:
        """True for ``ok`` and ``up_to_date``."""
        return self.exit_code == 0

    def to_dict(self) -> dict[str, Any]:
        """A results-file entry (JSON-ready)."""
        return {"spec": self.spec_path, "name": self.name, "status": self.status, "exit_code": self.exit_code,
                "outputs": list(self.outputs), "report": self.report_path, "error": self.error,
                "seconds": round(self.seconds, 3), "left": self.left or None}


@dataclass(frozen=True)
class PlanResult:
    """What ``rasterflow plan`` shows: the resolved plan and its JSON form; ``exit_code`` 3 when the budget refuses."""

    loaded: LoadedSpec
    plan: JobPlan
    payload: dict[str, Any]
    exit_code: int


class NullStream:
    """A text stream that drops what is written (no progress display)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False
