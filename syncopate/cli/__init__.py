"""The `syncopate` command line.

Every command has `--help`. Errors print one line on stderr, `syncopate: error: …`, and exit with
code 2 where a value given is invalid (an option, a config, a shape: as for a usage error) and 1
where something else stops the command (a database that cannot be used, no GPU, an unreachable Ray
cluster); nothing is written by a command that fails that way.
"""

from __future__ import annotations

import signal
import sys
import threading

import typer

from syncopate.errors import SyncopateError, Terminated

__all__ = ["app", "console", "main"]

app = typer.Typer(
    name="syncopate",
    help="Schedule-search autotuner for fine-grained compute-communication overlap on multi-GPU machines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
db_app = typer.Typer(help="Manage the results database.", no_args_is_help=True)


def _print_version(value: bool) -> None:
    if value:
        from syncopate.version import __version__

        print(f"syncopate {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
    ),
) -> None:
    """Schedule-search autotuner for fine-grained compute-communication overlap on multi-GPU machines."""


app.add_typer(db_app, name="db")


def _register() -> None:
    from syncopate.cli import commands  # noqa: F401  (registers the commands on `app`)


def console(*, stderr: bool = False):
    """A rich console for a command's output: on a terminal (as rich tells one, so TTY_COMPATIBLE
    and COLUMNS count), its width; piped or redirected, wide and never wrapping a line (a URL or a
    table row stays whole for grep and cut; tables print one plain line per row there)."""
    from rich.console import Console

    terminal = Console(stderr=stderr)
    if terminal.is_terminal:
        return terminal
    return Console(stderr=stderr, width=240, soft_wrap=True)


def _click_error_kind(e: BaseException) -> str | None:
    """Classify an exception raised by the CLI framework (click, or the copy typer carries)."""
    names = {cls.__name__ for cls in type(e).__mro__}
    for kind in ("NoArgsIsHelpError", "UsageError", "Abort", "Exit", "ClickException"):
        if kind in names:
            return kind
    return None


_signals: list[int] = []
"""SIGTERMs received by this process's command (the framework may hand the interrupt back as a
plain exit code, its type lost)."""


def _terminate(signum: int, frame: object) -> None:
    _signals.append(signum)
    raise Terminated()


def _stopped() -> int:
    """Say that the command was stopped by a signal; its exit code (128 + the signal)."""
    if _signals:
        print("syncopate: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    print("syncopate: interrupted", file=sys.stderr)
    return 128 + signal.SIGINT


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `syncopate` script. SIGTERM stops a command as Ctrl-C does (what it
    stores is closed properly) and exits with 143."""
    _register()
    command = typer.main.get_command(app)
    previous = None
    _signals.clear()
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _run(command, argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run(command, argv: list[str] | None) -> int:
    try:
        code = command.main(args=argv, prog_name="syncopate", standalone_mode=False)
    except SyncopateError as e:
        print(f"syncopate: error: {e}", file=sys.stderr)
        return e.exit_code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except KeyboardInterrupt:
        return _stopped()
    except Exception as e:
        kind = _click_error_kind(e)
        if kind is None:
            raise
        if kind == "NoArgsIsHelpError":
            ctx = getattr(e, "ctx", None)
            print(ctx.get_help() if ctx else str(e))
            return 0
        if kind == "Abort":
            if isinstance(e.__cause__, KeyboardInterrupt):
                return _stopped()
            print("syncopate: aborted", file=sys.stderr)
            return 130
        if kind == "Exit":
            return int(getattr(e, "exit_code", 0) or 0)
        ctx = getattr(e, "ctx", None)
        path = getattr(ctx, "command_path", "") or ""
        hint = f"see '{path} --help'" if " " in path else "see 'syncopate --help'"
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        print(f"syncopate: error: {message} ({hint})", file=sys.stderr)
        return int(getattr(e, "exit_code", 2) or 2)
    # Without standalone mode the framework returns the code of an `Exit` instead of exiting; it
    # turns Ctrl-C into Exit(130).
    if code == 130:
        return _stopped()
    return code if isinstance(code, int) else 0
