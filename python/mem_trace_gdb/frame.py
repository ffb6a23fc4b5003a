"""One source-level frame and the way a backtrace line shows it (pure: no gdb).

`symbolize` makes these from gdb's symbol tables; the answer texts only print them,
so they take any function from a return address to frames (a fake one in tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class Frame:
    """One source-level frame; an inlined call expands one pc into several."""

    pc: int
    function: Optional[str] = None
    inlined: bool = False
    file: Optional[str] = None
    line: int = 0
    # Without debug info: "symbol+0xoffset" (to the return address) and the file
    # name of the module it is in, or "module+0xoffset" (the return address as the
    # module's file states it, which `addr2line -e` takes) when no symbol holds it.
    symbol: Optional[str] = None
    module: Optional[str] = None

    def describe(self) -> str:
        """`0x... in fn (inlined) at file:line`, `0x... in sym+0xc from x.so`,
        `0x... in x.so+0x1678`: the way gdb's backtrace reads."""
        text = f"{self.pc:#x}"
        if self.function:
            text += f" in {self.function}"
            if self.inlined:
                text += " (inlined)"
        elif self.symbol:
            text += f" in {self.symbol}"
        if self.file:
            text += f" at {self.file}:{self.line}" if self.line else f" at {self.file}"
        elif self.module:
            text += f" from {self.module}"
        return text


def unsymbolized(pc: int) -> Tuple[Frame, ...]:
    """The symbolizer of `--raw`: the return address alone, no lookup."""
    return (Frame(pc),)
