"""The command line: ``rasterflow validate | plan | run | retry | profile | schema | demo``.

This is the only module that prints and the only one that turns errors into exit codes (README, "Exit codes"):
0 ok (or up to date), 1 run failed, 2 invalid spec, 3 over budget, 64 usage error, 75 output locked by another run,
128 + N stopped by signal N (130 SIGINT, 143 SIGTERM, 129 SIGHUP), 141 stdout closed (``| head``). User mistakes print
a message and no traceback (``--debug`` shows it); anything unexpected is a failed run (exit 1) with a pointer to
``--debug``. The global options (``--debug``, ``-v``, ``-q``, ``--log-format``) work before or after the subcommand.

The package is split by job: :mod:`~rasterflow.cli.console` (printing and exit codes), :mod:`~rasterflow.cli.group`
(the click group, its shared options and the entry point), :mod:`~rasterflow.cli.check` (``validate``, ``plan``),
:mod:`~rasterflow.cli.running` (``run``, ``retry``) and :mod:`~rasterflow.cli.tools` (``profile``, ``schema``,
``demo``). Importing the package registers every subcommand on :data:`cli`; the console script is
``rasterflow.cli:main``.
"""

from __future__ import annotations

from rasterflow.cli.console import BROKEN_PIPE as BROKEN_PIPE
from rasterflow.cli.console import ConsoleState as ConsoleState
from rasterflow.cli.group import cli as cli
from rasterflow.cli.group import main as main
from rasterflow.cli.check import plan as plan
from rasterflow.cli.check import validate as validate
from rasterflow.cli.running import retry as retry
from rasterflow.cli.running import run as run
from rasterflow.cli.tools import demo as demo
from rasterflow.cli.tools import profile as profile
from rasterflow.cli.tools import schema as schema

__all__ = ["main", "cli"]
