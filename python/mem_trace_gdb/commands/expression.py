"""A gdb expression to the address it names, without calling into the process."""

from __future__ import annotations

import gdb

from .. import target
from .errors import UsageError

MASK64 = (1 << 64) - 1

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


def address_of(expression: str) -> int:
    """The address ``expression`` names in the selected process or core.

    The process check comes first: without a process or a core, gdb cannot
    evaluate a local and would answer "No symbol", which hides the real problem.
    """
    target.require_process()
    return to_address(expression)


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
