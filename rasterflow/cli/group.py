"""The click group: the global options and the options shared by the subcommands, spec selection, the entry point."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import click

from rasterflow import __version__
from rasterflow.cli.console import CommandFunction, ConsoleState, warn
from rasterflow.errors import ExitCode, SpecError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.spec import LoadedSpec


# --------------------------------------------------------------------------------------------------------------------
# global options: accepted by the group and by every subcommand


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ConsoleState.debug = True


def _set_verbose(ctx: click.Context, param: click.Parameter, value: int) -> None:
    if value:
        ConsoleState.verbosity = max(ConsoleState.verbosity, 0) + value


def _set_quiet(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ConsoleState.verbosity = -1


def _set_log_format(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:
        ConsoleState.log_format = value


def global_options(func: CommandFunction) -> CommandFunction:
    options = [
        click.option("--debug", is_flag=True, expose_value=False, callback=_set_debug,
                     help="Show tracebacks for errors."),
        click.option("-v", "--verbose", count=True, expose_value=False, callback=_set_verbose,
                     help="Say more (repeat for more)."),
        click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_set_quiet,
                     help="Only errors and the final status."),
        click.option("--log-format", type=click.Choice(["text", "json"]), default=None, expose_value=False,
                     callback=_set_log_format, help="json: one JSON event per line on stderr, for log collectors."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def parse_vars(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--var {value!r}: write --var KEY=VALUE")
        out[key.strip()] = val
    return out


var_option = click.option("--var", "variables", multiple=True, metavar="KEY=VALUE",
                           help="Set ${KEY} in the specs (over the environment); repeatable.")
select_option = click.option("--select", "select", multiple=True, metavar="NAME|tag:TAG",
                              help="Only specs with this name (glob allowed) or tag; repeatable.")
exclude_option = click.option("--exclude", "exclude", multiple=True, metavar="NAME|tag:TAG",
                               help="Leave out specs with this name or tag; repeatable.")
specs_argument = click.argument("specs", nargs=-1, required=True)


class _Group(click.Group):
    """Usage errors exit 64 (not click's 2, which is rasterflow's "invalid spec")."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as err:
            if not standalone_mode:
                raise
            err.show()
            sys.exit(int(ExitCode.USAGE))
        except click.ClickException as err:
            if not standalone_mode:
                raise
            err.show()
            sys.exit(err.exit_code)
        except click.Abort:
            if not standalone_mode:
                raise
            click.echo("Aborted!", err=True)
            sys.exit(130)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rasterflow")
@global_options
def cli() -> None:
    """rasterflow: declarative raster pipelines on Dask, checked against memory before a pixel is read."""


# --------------------------------------------------------------------------------------------------------------------
# loading several specs


def load_selected(specs: tuple[str, ...], variables: dict[str, str], select: tuple[str, ...],
                   exclude: tuple[str, ...]) -> tuple[list[LoadedSpec], list[tuple[Path, SpecError]]]:
    """The selected loaded specs, and the specs that failed to load (and are not clearly deselected)."""
    from rasterflow.batch import expand_spec_paths, matches
    from rasterflow.spec import load_spec

    loaded_specs, broken = [], []
    for path in expand_spec_paths(specs):
        try:
            loaded = load_spec(path, variables=variables)
        except SpecError as err:
            if ConsoleState.debug:
                raise
            # an unreadable spec has no name or tags: judge by the file's stem, and never drop it silently
            if (select and not matches(path.stem, (), path.stem, select)) or \
                    (exclude and matches(path.stem, (), path.stem, exclude)):
                warn(f"{path} is not valid and was not selected: {str(err).splitlines()[0]}")
                continue
            broken.append((path, err))
            continue
        name, tags = loaded.spec.name, loaded.spec.tags
        if select and not matches(name, tags, path.stem, select):
            continue
        if exclude and matches(name, tags, path.stem, exclude):
            continue
        loaded_specs.append(loaded)
    if not loaded_specs and not broken:
        what = " ".join([*(f"--select {s}" for s in select), *(f"--exclude {s}" for s in exclude)])
        raise UsageError(f"no spec left to process{' after ' + what if what else ''}")
    return loaded_specs, broken


def _register_stack_dump() -> None:
    """``kill -USR1 <pid>`` prints every thread's Python stack to stderr: how to see where a cron run hangs
    without stopping it (the run goes on). Registered only by the console entry points, never for an API caller.

    A Python-level handler, not ``faulthandler.register``: that one walks the other threads' frames from the C
    signal handler while they run, and a run of the tests died of it (SIGSEGV while the event loop thread was
    creating a task). Here the dump runs in the main thread holding the GIL, so no thread changes its frames
    meanwhile; the main thread waits on the workers in interruptible waits, so the dump comes at once."""
    import signal

    usr1 = getattr(signal, "SIGUSR1", None)
    if usr1 is not None:
        signal.signal(usr1, _dump_stacks)


def _dump_stacks(signum: int, frame: object) -> None:
    import faulthandler

    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def main() -> None:
    """Console-script entry point."""
    _register_stack_dump()
    cli(prog_name="rasterflow")
