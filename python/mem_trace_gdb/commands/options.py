"""Options several commands share: how many frames and stacks to show, raw addresses.

One definition each, so that `-f 0`, `-n -1` and `-r` mean the same in every command and
fail with the same words.
"""

from __future__ import annotations

import argparse


DEFAULT_FRAMES = 8
"""Frames per stack when the user does not say."""


class FrameCount(argparse.Action):
    """`-n N` / `-f N`: a number of frames, 0 for all; a negative one is a usage error."""

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


def add_frames(parser: argparse.ArgumentParser, *flags: str) -> None:
    """The frames-per-stack option, spelled ``flags`` (``-f``/``--frames`` or ``-n``/...)."""
    parser.add_argument(*flags, type=int, action=FrameCount, default=DEFAULT_FRAMES,
                        metavar="N", help="frames per stack (default %(default)s; 0: all)")


def add_raw(parser: argparse.ArgumentParser) -> None:
    """``-r``: return addresses as they are, without symbolizing them."""
    parser.add_argument("-r", "--raw", action="store_true",
                        help="print return addresses without symbolizing them")
