//! Compact unwind rules, and how one is computed from a module's `.eh_frame` on a cache miss.
//!
//! Almost every row of x86-64 CFI has one shape: the canonical frame address (CFA) is `rsp` or
//! `rbp` plus a constant, the return address is saved at `CFA-8`, and `rbp` is either untouched
//! or saved at a constant offset from the CFA. A [`Rule`] holds exactly that, in 8 bytes, so the
//! unwinder executes a frame with two loads and no parsing. Rows of any other shape (a DWARF
//! expression, the return address elsewhere, a CFA based on another register — glibc's
//! `__restore_rt`, PLT entries, hand-written assembly) become [`Kind::Framehop`]: that frame is
//! unwound by framehop, which evaluates them in full.
//!
//! The translation follows framehop's own (`translate_into_unwind_rule` in framehop 0.16) so
//! that both unwinders give the same stacks; it only accepts more `rbp`-based shapes, which
//! framehop evaluates uncached with the same result.

use super::modules::ModuleInfo;
use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};

/// What a rule tells the unwinder to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// `repr(u8)` pins tag 0 to `CfaRsp`: the rule cache starts as zeroed memory.
#[repr(u8)]
pub enum Kind {
    /// CFA = rsp + `cfa_offset`.
    CfaRsp,
    /// CFA = rbp + `cfa_offset`.
    CfaRbp,
    /// The return address is undefined: the outermost frame (`_start`, `clone3`).
    End,
    /// A shape a [`Rule`] cannot hold, or no CFI found: unwind this frame with framehop.
    Framehop,
    /// The address lies outside every known module: record it and stop there.
    Outside,
}

impl Kind {
    /// Whether the rule computes a CFA (the kinds the walk executes itself).
    #[inline(always)]
    pub fn is_cfa(self) -> bool {
        (self as u8) <= Kind::CfaRbp as u8
    }
}

/// One frame's unwind rule. The return address is always at `CFA-8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub cfa_offset: i32,
    /// Where the caller's rbp is saved, relative to the CFA; meaningful if `restores_bp`.
    pub bp_offset: i16,
    pub restores_bp: bool,
    pub kind: Kind,
}

impl Rule {
    pub const FRAMEHOP: Rule = Rule::of(Kind::Framehop);
    pub const OUTSIDE: Rule = Rule::of(Kind::Outside);
    pub const END: Rule = Rule::of(Kind::End);

    const fn of(kind: Kind) -> Rule {
        Rule {
            cfa_offset: 0,
            bp_offset: 0,
            restores_bp: false,
            kind,
        }
    }
}

/// The gimli state a miss needs, made once per thread: evaluating a row allocates nothing.
pub type Context = UnwindContext<usize, SmallRows>;

/// Room for 32 register rules per CFI row and 4 remembered states. gimli's default keeps 192
/// rules per row, and `next_row` holds rows on the stack (~12 KiB), more than a thread with a
/// small stack, or a signal handler, can spare; x86-64 CFI names at most 17 registers, and a
/// row with more rules fails to evaluate and goes to framehop like any other shape.
pub struct SmallRows;

impl gimli::UnwindContextStorage<usize> for SmallRows {
    type Rules = [(gimli::Register, RegisterRule<usize>); 32];
    type Stack = [gimli::UnwindTableRow<usize, Self>; 4];
}

/// The rule for the CFI row covering `lookup` (the instruction pointer of the first frame,
/// return address − 1 for the others) in module `m`. Never fails: whatever cannot be expressed
/// — including a missing FDE, which framehop treats as "frame-pointer frame" — is
/// [`Rule::FRAMEHOP`].
pub fn rule_for(m: &ModuleInfo, ctx: &mut Context, lookup: u64) -> Rule {
    if m.eh_frame_hdr.is_empty() {
        return Rule::FRAMEHOP;
    }
    // The sections are read where they are mapped, so their own addresses are the bases that
    // pc-relative and data-relative pointers in them are relative to, and FDE addresses come
    // out as run-time addresses.
    let bases = BaseAddresses::default()
        .set_eh_frame_hdr(m.eh_frame_hdr.as_ptr() as u64)
        .set_eh_frame(m.eh_frame.as_ptr() as u64);
    let Ok(hdr) = EhFrameHdr::new(m.eh_frame_hdr, LittleEndian).parse(&bases, 8) else {
        return Rule::FRAMEHOP;
    };
    let Some(table) = hdr.table() else {
        return Rule::FRAMEHOP;
    };
    let mut eh_frame = EhFrame::new(m.eh_frame, LittleEndian);
    eh_frame.set_address_size(8);
    match table.unwind_info_for_address(&eh_frame, &bases, ctx, lookup, EhFrame::cie_from_offset) {
        Ok(row) => translate(
            row.cfa(),
            row.register(X86_64::RBP).as_ref(),
            row.register(X86_64::RA).as_ref(),
        ),
        Err(_) => Rule::FRAMEHOP,
    }
}

/// A CFI row as a [`Rule`], if it has the simple shape.
pub fn translate(
    cfa: &CfaRule<usize>,
    bp: Option<&RegisterRule<usize>>,
    ra: Option<&RegisterRule<usize>>,
) -> Rule {
    match ra {
        None | Some(RegisterRule::Undefined) => return Rule::END,
        Some(RegisterRule::Offset(-8)) => {}
        Some(_) => return Rule::FRAMEHOP,
    }
    let CfaRule::RegisterAndOffset { register, offset } = *cfa else {
        return Rule::FRAMEHOP;
    };
    let bp_offset = match bp {
        None | Some(RegisterRule::Undefined) | Some(RegisterRule::SameValue) => None,
        Some(&RegisterRule::Offset(o)) => match i16::try_from(o) {
            Ok(o) => Some(o),
            Err(_) => return Rule::FRAMEHOP,
        },
        Some(_) => return Rule::FRAMEHOP,
    };
    let Ok(cfa_offset) = i32::try_from(offset) else {
        return Rule::FRAMEHOP;
    };
    let kind = match register {
        // framehop keeps rsp offsets in units of 8 (truncating others) and a non-negative
        // range: leave anything else to it, so both agree.
        X86_64::RSP
            if cfa_offset >= 8
                && cfa_offset % 8 == 0
                && bp_offset.is_none_or(|o| (offset + i64::from(o)) % 8 == 0) =>
        {
            Kind::CfaRsp
        }
        // A CFA on rbp means rbp was saved: without its slot the caller's rbp is unknown.
        X86_64::RBP if bp_offset.is_some() => Kind::CfaRbp,
        _ => return Rule::FRAMEHOP,
    };
    Rule {
        cfa_offset,
        bp_offset: bp_offset.unwrap_or(0),
        restores_bp: bp_offset.is_some(),
        kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfa(register: gimli::Register, offset: i64) -> CfaRule<usize> {
        CfaRule::RegisterAndOffset { register, offset }
    }

    #[test]
    fn translates_the_common_shapes() {
        let ra = RegisterRule::Offset(-8);
        let r = translate(&cfa(X86_64::RSP, 8), None, Some(&ra));
        assert_eq!(
            (r.kind, r.cfa_offset, r.restores_bp),
            (Kind::CfaRsp, 8, false)
        );
        let r = translate(
            &cfa(X86_64::RSP, 48),
            Some(&RegisterRule::Offset(-16)),
            Some(&ra),
        );
        assert_eq!((r.kind, r.cfa_offset, r.bp_offset), (Kind::CfaRsp, 48, -16));
        assert!(r.restores_bp);
        let r = translate(
            &cfa(X86_64::RBP, 16),
            Some(&RegisterRule::Offset(-16)),
            Some(&ra),
        );
        assert_eq!((r.kind, r.cfa_offset, r.bp_offset), (Kind::CfaRbp, 16, -16));
    }

    #[test]
    fn leaves_other_shapes_to_framehop() {
        let ra = RegisterRule::Offset(-8);
        assert_eq!(translate(&cfa(X86_64::RSP, 8), None, None), Rule::END);
        let odd_ra = RegisterRule::Offset(-16);
        assert_eq!(
            translate(&cfa(X86_64::RSP, 8), None, Some(&odd_ra)),
            Rule::FRAMEHOP
        );
        // Unaligned and negative rsp offsets, a CFA on rbx, rbp-based without a saved rbp.
        assert_eq!(
            translate(&cfa(X86_64::RSP, 12), None, Some(&ra)),
            Rule::FRAMEHOP
        );
        assert_eq!(
            translate(&cfa(X86_64::RSP, -8), None, Some(&ra)),
            Rule::FRAMEHOP
        );
        assert_eq!(
            translate(&cfa(X86_64::RBX, 8), None, Some(&ra)),
            Rule::FRAMEHOP
        );
        assert_eq!(
            translate(&cfa(X86_64::RBP, 16), None, Some(&ra)),
            Rule::FRAMEHOP
        );
    }
}
