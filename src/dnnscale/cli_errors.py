"""Command-line parse errors as one line: ``error: --flag: problem``, exit code 2.

typer (click) reports a bad flag with the usage text and a framed box over several lines; the
house rule for bad input is one line on stderr naming the field. `OneLineErrors` is the root
command group of the CLI (``typer.Typer(cls=OneLineErrors)``), so the rule holds for every
command and sub-command, under the installed script and under typer's CliRunner alike.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer import _click  # typer vendors click; these are the exceptions it raises
from typer.core import TyperGroup

from dnnscale.errors import MAX_VALUE_CHARS, clip_line

USAGE_EXIT_CODE = 2


def _field(exc: Any) -> str:
    """The flag or argument a usage error is about, as the user typed it (or a general word)."""
    param = getattr(exc, "param", None)
    if param is not None:
        opts = [o for o in getattr(param, "opts", []) if o.startswith("--")] or \
            list(getattr(param, "opts", []))
        if opts and getattr(param, "param_type_name", "") == "option":
            return opts[0]
        return str(getattr(param, "human_readable_name", None) or param.name).lower()
    hint = getattr(exc, "param_hint", None)
    if hint:
        return str(hint if isinstance(hint, str) else hint[0]).strip("'\"")
    option = getattr(exc, "option_name", None)
    if option:
        return _long_name(exc, str(option))
    text = str(getattr(exc, "message", ""))
    if text.startswith("No such command"):
        return "command"
    if "argument" in text:
        return "arguments"
    return "command line"


def _long_name(exc: Any, option: str) -> str:
    """`-c` -> `--cluster`: the long form of an option the user typed short (as typed if the
    command has no such option)."""
    command = getattr(getattr(exc, "ctx", None), "command", None) or \
        getattr(exc, "dnnscale_command", None)
    for param in getattr(command, "params", []):
        opts = list(getattr(param, "opts", [])) + list(getattr(param, "secondary_opts", []))
        if option in opts:
            return next((o for o in opts if o.startswith("--")), option)
    return option


def _problem(exc: Any) -> str:
    if isinstance(exc, _click.exceptions.MissingParameter):
        return "missing"
    if isinstance(exc, _click.exceptions.NoSuchOption):
        text = "no such option"
        if exc.possibilities:
            text += f" (did you mean {', '.join(sorted(exc.possibilities))}?)"
        return text
    message = exc.message if isinstance(exc, _click.exceptions.BadParameter) \
        else exc.format_message()
    text = " ".join(str(message).split()).rstrip(".")
    if isinstance(exc, _click.exceptions.BadOptionUsage) and "requires an argument" in text:
        return "needs a value"
    return text[:1].lower() + text[1:] if text else "invalid"


def one_line(exc: Any) -> str:
    """The one-line message for a click usage error (a huge value cut: errors.clip_line)."""
    return clip_line(f"error: {clip_line(_field(exc), MAX_VALUE_CHARS)}: {_problem(exc)}")


def _command_for(group: Any, args: list[str]) -> Any:
    """The (sub-)command that `args` name, as far as they name one."""
    command = group
    for token in args:
        commands = getattr(command, "commands", None)
        if not commands or token not in commands:
            if token.startswith("-"):
                continue
            break
        command = commands[token]
    return command


class OneLineErrors(TyperGroup):
    """The CLI's root group: usage errors become one line and exit 2; everything else (help,
    typer.Exit codes, Ctrl-C as 130) behaves as typer's own."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except _click.exceptions.NoArgsIsHelpError as exc:
            print(exc.format_message(), file=sys.stderr)
            sys.exit(USAGE_EXIT_CODE)
        except _click.exceptions.UsageError as exc:
            if getattr(exc, "ctx", None) is None:  # raised by the parser: find the command
                exc.dnnscale_command = _command_for(self, sys.argv[1:] if args is None
                                                    else list(args))  # type: ignore[attr-defined]
            print(one_line(exc), file=sys.stderr)
            sys.exit(USAGE_EXIT_CODE)
        except _click.exceptions.ClickException as exc:
            print(clip_line(f"error: {exc.format_message()}"), file=sys.stderr)
            sys.exit(exc.exit_code)
        except typer.Abort:
            print("error: aborted", file=sys.stderr)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)
