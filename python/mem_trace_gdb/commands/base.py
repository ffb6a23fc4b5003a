"""One base for every command: a gdb.Command built from an argparse parser.

The pattern of pwndbg's ArgparsedCommand. Each command module declares its
`ArgumentParser` right above its `ArgparsedCommand` subclass, which only says
what to answer: `run(args)` returns the lines to print. The base gives every
command gdb's conventions:

* `help CMD` and `CMD -h` both come from the parser; `-h` prints and returns;
* the options are parsed by argparse, the rest of the line is one gdb expression
  (spaces and all), and an argument declared ``type=Expression`` is evaluated to
  an address once the whole line has parsed; a command that takes no expression
  but plain words (``mtrace-top 5 --by blocks``) sets ``words = True``, and its
  line is split like gdb splits arguments (`gdb.string_to_argv`), options anywhere;
* a failure is one `gdb.GdbError` line, `NAME: ...`, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import ClassVar, List, Optional

import gdb

from ..errors import MemTraceError
from .errors import UsageError
from .expression import address_of


class _HelpShown(Exception):
    """argparse printed -h output and wants to exit: just return to gdb."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports through gdb instead of exiting gdb's process."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def print_help(self, file=None):
        # Through gdb, not sys.stdout: `gdb.execute(..., to_string=True)` and
        # gdb's pager then see the help like any other output.
        if file is None:
            gdb.write(self.format_help())
        else:
            super().print_help(file)

    def error(self, message):
        raise UsageError(f"{message} (see '{self.prog} -h')")

    def exit(self, status=0, message=None):
        if message:
            gdb.write(message)
        raise _HelpShown()


class Expression(str):
    """An argparse ``type``: this argument is a gdb expression naming an address.

    Parsing keeps the text; the command receives the address (an int), evaluated
    after the whole line parsed, so a bad option is reported before anything is
    evaluated.
    """


def help_text(parser: argparse.ArgumentParser) -> str:
    """Docstring for gdb's `help CMD`: the first line is the one `apropos` shows."""
    usage = parser.format_help().replace(f"{parser.description}\n\n", "", 1)
    return f"{parser.description}\n\n{usage}"


def takes_expression(parser: argparse.ArgumentParser) -> bool:
    """The command has a positional argument (the expression ending the line)."""
    return any(not action.option_strings for action in parser._actions)


def parse(parser: argparse.ArgumentParser, arg: str) -> argparse.Namespace:
    """Leading options through argparse; the rest of the line is one raw expression.

    gdb expressions contain spaces, quotes and backslashes (`p + 4`, `'a.c'::v`,
    `(char *) s`), which a shell-style split would mangle, so only the options
    are tokenised. `--` ends the options; a token that is not a known option
    (such as `-x` or `-1`) starts the expression, as it would for `print`.
    """
    rest = arg.strip()
    tokens = []
    known = parser._option_string_actions  # stable since argparse exists
    while rest.startswith("-"):
        token, _, tail = rest.partition(" ")
        if token == "--":
            rest = tail.strip()
            break
        name = token.split("=", 1)[0]
        action = known.get(name)
        if action is None:
            if token.startswith("--"):
                tokens.append(token)  # let argparse name the unknown option
                rest = tail.strip()
                continue
            break
        tokens.append(token)
        rest = tail.strip()
        if action.nargs != 0 and "=" not in token:
            value, _, tail = rest.partition(" ")
            tokens.append(value)
            rest = tail.strip()
    if rest:
        # "--" keeps an expression such as "-1" from being taken for an option;
        # without positionals it would only clutter argparse's error message.
        tokens += ["--", rest] if takes_expression(parser) else [rest]
    return parser.parse_args(tokens)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@contextlib.contextmanager
def one_line_errors(name: str):
    """Turn every failure inside a command into one `NAME: ...` gdb error line."""
    try:
        yield
    except _HelpShown:
        pass
    except gdb.GdbError as e:
        message = _first_line(e)
        if not message.startswith(f"{name}: "):
            message = f"{name}: {message}"
        raise gdb.GdbError(message) from None
    except (MemTraceError, UsageError, gdb.error) as e:
        raise gdb.GdbError(f"{name}: {_first_line(e)}") from None
    except KeyboardInterrupt:
        raise
    except Exception as e:
        if gdb.parameter("python print-stack") == "full":
            raise
        raise gdb.GdbError(
            f"{name}: internal error: {type(e).__name__}: {_first_line(e)} "
            "(`set python print-stack full` shows the traceback; please report it)"
        ) from None


class ArgparsedCommand(gdb.Command):
    """A gdb command whose syntax, help and errors come from ``parser``.

    Subclasses set ``parser`` and ``command_class`` and implement ``run``.
    """

    parser: ClassVar[argparse.ArgumentParser]
    command_class: ClassVar[int] = gdb.COMMAND_DATA
    # The line is words (numbers, names), not an expression: split it, options anywhere.
    words: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # gdb reads the class's docstring when the command is created.
        cls.__doc__ = help_text(cls.parser)

    def __init__(self):
        expression = takes_expression(self.parser) and not self.words
        completer = gdb.COMPLETE_EXPRESSION if expression else gdb.COMPLETE_NONE
        super().__init__(self.parser.prog, self.command_class, completer)

    def invoke(self, argument: str, from_tty: bool) -> None:
        # Repeating on a bare Enter would print the same answer again.
        self.dont_repeat()
        with one_line_errors(self.parser.prog):
            if self.words:
                args = self.parser.parse_args(gdb.string_to_argv(argument))
            else:
                args = parse(self.parser, argument)
            for name, value in vars(args).items():
                if isinstance(value, Expression):
                    setattr(args, name, address_of(value))
            lines = self.run(args)
            if lines:
                gdb.write("\n".join(lines) + "\n")

    def run(self, args: argparse.Namespace) -> Optional[List[str]]:
        """The answer's lines; raise MemTraceError, UsageError or gdb.error to fail."""
        raise NotImplementedError
