"""The ``netdiag`` command line: thin click commands over one pipeline call.

Exit status: 0 every capture read to its end; 1 input error (one line on stderr), or
the reader of standard output went away (``| head``; nothing on stderr, as click, rich
and Python exit on a broken pipe);
2 usage error; 3 a capture is damaged or truncated (everything before the damage
is reported); 4 internal error (a bug: set NETDIAG_DEBUG=1 for the traceback);
130 interrupted.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback

import click

from netdiag import __version__
from netdiag.errors import NetdiagError

EXIT_TRUNCATED = 3
EXIT_INTERNAL = 4


COMMANDS = {
    "report": "netdiag.commands.report:report",
    "lab": "netdiag.commands.lab:lab",
    "capture": "netdiag.commands.capture:capture",
    "probe": "netdiag.commands.probe:probe",
    "dns": "netdiag.commands.dns:dns",
    "paths": "netdiag.commands.paths:paths",
    "trace": "netdiag.commands.trace:trace",
    "diff": "netdiag.commands.diff:diff",
    "verify": "netdiag.commands.verify:verify",
}
"""Subcommand name -> ``module:attribute``; imported only when the command runs."""


class LazyGroup(click.Group):
    """A group whose subcommands live in their own modules, imported on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, target in COMMANDS.items()
                      if importlib.util.find_spec(target.partition(":")[0]) is not None)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None or importlib.util.find_spec(target.partition(":")[0]) is None:
            return None
        module, _, attr = target.partition(":")
        cmd: click.Command = getattr(importlib.import_module(module), attr)
        return cmd


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: the version and which core runs (imported only when asked)."""
    if not value or ctx.resilient_parsing:
        return
    from netdiag._core import version_label

    click.echo(f"netdiag {__version__} (core: {version_label()})")
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_show_version,
              help="Show the version and which core runs (compiled or pure Python), and exit.")
def cli() -> None:
    """Where the time goes between a client and an HTTPS API, from packets."""


def main() -> None:
    """Console-script entry point: maps errors to exit codes, never a traceback for bad input."""
    from netdiag import quick_exit

    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("netdiag: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except NetdiagError as e:
        click.echo(f"netdiag: error: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("netdiag: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:  # the reader of stdout went away (``| head``): as click does
        sys.stderr.close()
        sys.exit(1)
    except SystemExit as e:
        if isinstance(e.code, int):
            quick_exit.leave(e.code)
        raise
    except Exception as e:
        if os.environ.get("NETDIAG_DEBUG"):
            traceback.print_exc()
        click.echo(f"netdiag: internal error: {type(e).__name__}: {e} "
                   "(set NETDIAG_DEBUG=1 for details; please report it)", err=True)
        sys.exit(EXIT_INTERNAL)
    quick_exit.leave(0)
