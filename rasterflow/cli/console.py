"""What the command line prints and how it exits: the global options' state, messages, errors to exit codes."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, NoReturn, ParamSpec, TypeVar

import click

from rasterflow.errors import ExitCode, RasterflowError, RunInterrupted


_P = ParamSpec("_P")
CommandFunction = TypeVar("CommandFunction", bound=Callable[..., Any])


BROKEN_PIPE = 141
"""Exit code when stdout is closed early (``rasterflow plan spec.yaml | head -3``): 128 + SIGPIPE, as ``yes | head``."""


class ConsoleState:
    debug = False
    verbosity = 0
    """-1 quiet, 0 normal, 1 and more verbose."""
    log_format = "text"


def json_logs() -> bool:
    return ConsoleState.log_format == "json"


def fail(message: str, spec: str | None = None, *, error: BaseException | None = None,
          exit_code: int | None = None) -> None:
    """An error line (red, stderr); in JSON log mode an ``error`` event with the structured fields of
    :func:`rasterflow.logs.error_fields` (type, exit_code, file, line, column, field, issues)."""
    if json_logs():
        from rasterflow.logs import error_fields, json_event

        json_event("error", spec, message=message, **error_fields(error, exit_code))
        return
    click.secho(message, fg="red", err=True)


def warn(message: str, spec: str | None = None) -> None:
    if ConsoleState.verbosity < 0:
        return
    if json_logs():
        from rasterflow.logs import json_event

        json_event("warning", spec, message=message)
        return
    click.secho(f"warning: {message}", fg="yellow", err=True)


def say(message: str = "", *, err: bool = False, min_verbosity: int = 0, **style: Any) -> None:
    """A human line (stdout unless ``err``); dropped with -q (or below ``min_verbosity``) and in JSON log mode."""
    if ConsoleState.verbosity < min_verbosity or json_logs():
        return
    click.secho(message, err=err, **style)


def _quiet_broken_pipe() -> None:
    """stdout was closed by the reader: point it at /dev/null so the interpreter's final flush stays silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (CliRunner)
        pass


def guarded(func: Callable[_P, int]) -> Callable[_P, NoReturn]:
    """Run a command body; map its return value and errors to the process exit code."""

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> NoReturn:
        try:
            code = func(*args, **kwargs)
        except BrokenPipeError:
            _quiet_broken_pipe()
            code = BROKEN_PIPE
        except RasterflowError as err:
            if ConsoleState.debug:
                raise
            fail(str(err), error=err)
            code = err.exit_code
        except RunInterrupted as err:
            fail(f"interrupted by {err.signal_name}", error=err)
            code = err.exit_code
        except KeyboardInterrupt as err:
            fail("interrupted", error=err, exit_code=130)
            code = 130
        except Exception as err:  # an internal error, not the user's: say so and keep the message
            if ConsoleState.debug:
                raise
            fail(f"internal error: {type(err).__name__}: {err}\n(rerun with --debug for the traceback)", error=err,
                  exit_code=int(ExitCode.RUN_FAILED))
            code = ExitCode.RUN_FAILED
        sys.exit(int(code or 0))

    return wrapper
