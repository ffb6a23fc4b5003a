"""What every command shares: argument parsing, expressions, error lines.

gdb conventions (as in pwndbg and GEF): arguments are gdb expressions, `-h`
prints help, and a failure is one `gdb.GdbError` line, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib

import gdb

from .. import memory
from ..layout import MemTraceError, Tracer

MASK64 = (1 << 64) - 1


class UsageError(Exception):
    """Bad command line; the message is shown after the command name."""


class _HelpShown(Exception):
    """argparse printed -h output and wants to exit: just return to gdb."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports through gdb instead of exiting gdb's process."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(f"{message} (see '{self.prog} -h')")

    def exit(self, status=0, message=None):
        if message:
            gdb.write(message)
        raise _HelpShown()


def help_text(parser: argparse.ArgumentParser) -> str:
    """Docstring for gdb's `help CMD`: the first line is the one `apropos` shows."""
    usage = parser.format_help().replace(f"{parser.description}\n\n", "", 1)
    return f"{parser.description}\n\n{usage}"


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
        takes_expression = any(not a.option_strings for a in parser._actions)
        tokens += ["--", rest] if takes_expression else [rest]
    return parser.parse_args(tokens)


_KIND = {
    gdb.TYPE_CODE_STRUCT: "a struct",
    gdb.TYPE_CODE_UNION: "a union",
    gdb.TYPE_CODE_FLT: "a float",
    gdb.TYPE_CODE_VOID: "void",
    gdb.TYPE_CODE_DECFLOAT: "a float",
    gdb.TYPE_CODE_COMPLEX: "a complex number",
    gdb.TYPE_CODE_STRING: "a string",
    gdb.TYPE_CODE_SET: "a set",
}

_INTEGRAL = (
    gdb.TYPE_CODE_INT,
    gdb.TYPE_CODE_CHAR,
    gdb.TYPE_CODE_BOOL,
    gdb.TYPE_CODE_ENUM,
    gdb.TYPE_CODE_RANGE,
)


def to_address(expression: str) -> int:
    """Evaluate a gdb expression (no call into the process) and make it an address.

    Pointers and integers are taken as they are; arrays decay to their first
    element, references to what they refer to, functions to their entry.
    """
    value = gdb.parse_and_eval(expression)
    for _ in range(8):  # references to references are possible; bound the walk
        type_ = value.type.strip_typedefs()
        code = type_.code
        if code in (gdb.TYPE_CODE_REF, gdb.TYPE_CODE_RVALUE_REF):
            value = value.referenced_value()
            continue
        if code == gdb.TYPE_CODE_PTR or code in _INTEGRAL:
            return int(value) & MASK64
        if code == gdb.TYPE_CODE_ARRAY:
            # Not `value.address`: for an array that is not in memory (a string
            # literal), gdb would allocate it in the inferior, i.e. call malloc
            # in the process. The first element's address never does that.
            low = type_.range()[0]
            element = value[low].address
            if element is None:
                raise UsageError(f"`{expression}` is not in the process's memory")
            return int(element) & MASK64
        if code == gdb.TYPE_CODE_FUNC:
            if value.address is None:
                raise UsageError(f"`{expression}` has no address")
            return int(value.address) & MASK64
        kind = _KIND.get(code, f"of type {type_}")
        raise UsageError(f"`{expression}` is {kind}, not an address")
    raise UsageError(f"`{expression}` is a chain of references")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@contextlib.contextmanager
def command_errors(name: str):
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


def address_and_tracer(expression: str) -> "tuple[int, Tracer]":
    """The address EXPR names and a decoder over the tracer's tables, for commands that
    explain an address.

    The process check comes first: without a process or a core, gdb cannot evaluate a
    local and would answer "No symbol", which hides the real problem.
    """
    memory.require_process()
    address = to_address(expression)
    return address, memory.open_tracer()
