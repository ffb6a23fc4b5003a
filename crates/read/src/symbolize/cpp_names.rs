//! gdb's name for a C++ function that has no linkage name: `main`, and the `extern "C"`
//! functions a C++ file defines. gdb names every function of a C++ unit with its parameter
//! types (`main()`, `start(int, char**)`), the mangled ones from their demangled linkage name
//! and these from their DWARF; the answers name them as gdb does, so that a frame reads the
//! same in `mtrace-why`, `mem-trace why` and gdb's own `backtrace`.

use super::types::Slice;
use addr2line::gimli;
use gimli::{constants, AttributeValue, DebuggingInformationEntry, UnitOffset, UnitRef};

/// Type links followed at most, through pointers, qualifiers and typedefs, for one parameter.
const MAX_TYPE_DEPTH: usize = 16;

/// `name` with its parameter list, from the subprogram named `name` (without a linkage name)
/// in `unit`; `None` when there is none or a parameter's type cannot be written out.
pub(super) fn with_parameters(unit: UnitRef<'_, Slice>, name: &str) -> Option<String> {
    let mut entries = unit.entries();
    while let Ok(Some(entry)) = entries.next_dfs() {
        if entry.tag() != constants::DW_TAG_subprogram
            || entry.attr_value(constants::DW_AT_linkage_name).is_some()
            || entry
                .attr_value(constants::DW_AT_MIPS_linkage_name)
                .is_some()
            || !name_is(unit, entry, name)
        {
            continue;
        }
        // A declaration's definition elsewhere points back at it: either lists the parameters.
        return parameters(unit, entry.offset()).map(|p| format!("{name}({p})"));
    }
    None
}

fn name_is(unit: UnitRef<'_, Slice>, entry: &DebuggingInformationEntry<Slice>, name: &str) -> bool {
    entry
        .attr_value(constants::DW_AT_name)
        .and_then(|v| unit.attr_string(v).ok())
        .is_some_and(|s| s.slice() == name.as_bytes())
}

/// The parameter types of the subprogram at `offset`, joined by ", " (`...` for a variadic
/// one); artificial parameters (`this`) are not written, as gdb does not.
fn parameters(unit: UnitRef<'_, Slice>, offset: UnitOffset) -> Option<String> {
    let mut tree = unit.entries_tree(Some(offset)).ok()?;
    let root = tree.root().ok()?;
    let mut children = root.children();
    let mut out = Vec::new();
    while let Ok(Some(child)) = children.next() {
        let e = child.entry();
        match e.tag() {
            constants::DW_TAG_formal_parameter => {
                if e.attr_value(constants::DW_AT_artificial)
                    .is_some_and(|v| v == AttributeValue::Flag(true))
                {
                    continue;
                }
                out.push(type_name(unit, e.attr_value(constants::DW_AT_type), 0)?);
            }
            constants::DW_TAG_unspecified_parameters => out.push("...".to_string()),
            _ => {}
        }
    }
    Some(out.join(", "))
}

/// The C++ spelling gdb gives the type `at` refers to (absent: `void`).
fn type_name(
    unit: UnitRef<'_, Slice>,
    at: Option<AttributeValue<Slice>>,
    depth: usize,
) -> Option<String> {
    let Some(at) = at else {
        return Some("void".to_string());
    };
    if depth > MAX_TYPE_DEPTH {
        return None;
    }
    let AttributeValue::UnitRef(offset) = at else {
        return None;
    };
    let e = unit.entry(offset).ok()?;
    let inner = || type_name(unit, e.attr_value(constants::DW_AT_type), depth + 1);
    Some(match e.tag() {
        constants::DW_TAG_base_type
        | constants::DW_TAG_typedef
        | constants::DW_TAG_structure_type
        | constants::DW_TAG_class_type
        | constants::DW_TAG_union_type
        | constants::DW_TAG_enumeration_type => {
            let name = unit
                .attr_string(e.attr_value(constants::DW_AT_name)?)
                .ok()?;
            String::from_utf8(name.slice().to_vec()).ok()?
        }
        constants::DW_TAG_pointer_type => format!("{}*", inner()?),
        constants::DW_TAG_reference_type => format!("{}&", inner()?),
        constants::DW_TAG_rvalue_reference_type => format!("{}&&", inner()?),
        constants::DW_TAG_const_type => format!("{} const", inner()?),
        constants::DW_TAG_volatile_type => format!("{} volatile", inner()?),
        _ => return None,
    })
}
