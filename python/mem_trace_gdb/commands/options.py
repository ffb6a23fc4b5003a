"""Options several commands share: how many frames and stacks to show, raw addresses.

One definition each, so that `-f 0`, `-n 0` and `-r` mean the same in every command and
fail with the same words, and one spelling each, the `mem-trace` command's too: frames per
stack `-f/--frames`, how many entries `-n/--count`. A spelling a command once had instead
(`mtrace-why -n/--max-frames`, `mtrace-history -n`) still parses, out of the help, so that
scripts written against it keep working.
"""

from __future__ import annotations

import argparse


DEFAULT_FRAMES = 8
"""Frames per stack when the user does not say."""


class FrameCount(argparse.Action):
    """`-f N`: a number of frames, 0 for all; a negative one is a usage error."""

    def __call__(self, parser, namespace, value, option_string=None):
        if value < 0:
            # Through the parser, which adds where to look, as for every other usage error.
            parser.error(f"{option_string} {value}: the number of frames cannot be negative")
        setattr(namespace, self.dest, value)


def _count_at_least(minimum: int, below: str):
    """An argparse ``type``: an integer (any base gdb users type) of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text} {below}")
        return value

    return parse


positive = _count_at_least(1, "is not a positive number")
"""A count of at least 1."""
non_negative = _count_at_least(0, "is negative")
"""A count, 0 meaning "all"."""


def add_frames(parser: argparse.ArgumentParser, default: int = DEFAULT_FRAMES,
               help: str = "frames per stack (default %(default)s; 0: all)",
               old: tuple = ()) -> None:
    """``-f``/``--frames N``, frames per stack; ``old`` are the command's former spellings,
    still taken but not shown."""
    parser.add_argument("-f", "--frames", type=int, action=FrameCount, default=default,
                        metavar="N", help=help)
    if old:
        # Its own default is SUPPRESS, so that it never overwrites the one above.
        parser.add_argument(*old, dest="frames", type=int, action=FrameCount,
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def add_raw(parser: argparse.ArgumentParser) -> None:
    """``-r``: return addresses as they are, without symbolizing them."""
    parser.add_argument("-r", "--raw", action="store_true",
                        help="print return addresses without symbolizing them")
