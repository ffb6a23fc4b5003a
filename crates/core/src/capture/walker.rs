//! The walk itself (`ThreadCache::walk`): from the capture's registers up the stack, by cached
//! CFI rules, taking over from the last walk or a kept one where the stack still matches.
//!
//! The last walk is held outermost first (the record): a capture that joins it at step `d`
//! checks only the words that reach the frames it keeps, leaves the record's steps `..=d`
//! in place, and writes only the steps it walked above them. An interpreter 40-80 frames
//! deep (two steps a level) used to check and copy its whole walk, ~90 steps of 32 bytes, on
//! every capture.

use super::cache::ThreadCache;
use super::cfi::Kind;
use super::fp::fp_chain;
use super::frames::{record, How, Looked, Walk};
use super::kept::{find_kept, Checks, Kept, Shape, KEPT_SETS, KEPT_STEPS, KEPT_WAYS, SHAPE_SCORE};
use super::modules::ModuleSet;
use super::rules::{EMPTY, FIRST};
use super::stack::Stack;
use super::trail::*;
use super::tree;

impl ThreadCache {
    /// Kept walk `k`, to take over from.
    #[inline(always)]
    fn kept_view(kept: &Kept) -> View<'_> {
        View {
            steps: &kept.steps[..kept.len],
            ending: kept.ending,
            first: kept.first,
        }
    }

    /// The outermost step of the last walk (`None`: there is none).
    pub(super) fn outermost(&self) -> Option<Step> {
        match self.last_kept {
            Some(k) => self.kept[k].steps[..self.kept[k].len].last().copied(),
            None => self.last.steps[..self.last.len].first().copied(),
        }
    }

    /// The kept walk the last capture repeated, when this one starts where that one did: a
    /// loop that allocates or frees at one call site (the `live` workload's frees) then
    /// skips the shape's key, a hash of several stack words. Only a candidate: one call
    /// site reached by many paths (churn's) starts at the same place with another stack.
    #[inline(always)]
    pub(super) fn last_for(&self, pc: u64, sp: u64) -> Option<usize> {
        self.last_kept.filter(|&k| self.kept_starts_at(k, pc, sp))
    }

    /// The kept walk for the stack now at `(pc, sp)`: one whose key the words at its shape's
    /// slots give, and which started there. Only a candidate: the caller checks its words.
    #[inline(always)]
    pub(super) fn kept_for(&self, stack: Stack, pc: u64, sp: u64) -> Option<usize> {
        let shape = &self.shapes[Shape::index(pc, sp)];
        if shape.sp != sp || shape.pc != pc {
            return None;
        }
        find_kept(&self.kept_keys, shape.key(stack)).filter(|&k| self.kept_starts_at(k, pc, sp))
    }

    /// Whether kept walk `k` started at `(pc, sp)`.
    #[inline(always)]
    fn kept_starts_at(&self, k: usize, pc: u64, sp: u64) -> bool {
        let first = &self.kept[k].steps[0];
        first.sp == sp && first.pc == pc
    }

    /// Kept walk `k` repeated by its flat checks alone (see `Checks`), for a capture into a
    /// buffer of `len` frames that wants its stack id: `None` when that cannot tell (the
    /// id is not known for such a buffer, or the walk has no flat checks), else whether the
    /// stack still holds every checked word: the repeat, or `Some(None)`.
    #[inline(always)]
    pub(super) fn repeat_flat(
        &mut self,
        k: usize,
        stack: Stack,
        (pc, sp, bp): (u64, u64, u64),
        len: usize,
    ) -> Option<Option<Walk>> {
        let kept = &self.kept[k];
        if kept.stack_id == 0 || kept.id_len as usize != len || kept.checks.n == 0 {
            return None;
        }
        // Exactly what `take_over` checks for this walk from step 0 (see `Checks`).
        if !kept.checks.hold(stack, sp, bp) {
            return Some(None);
        }
        let walk = Walk {
            frames: (kept.checks.count as usize).min(len),
            outside: false,
            id: kept.stack_id,
            node: 0,
        };
        self.repeated(k, (pc, sp));
        Some(Some(walk))
    }

    /// Kept walk `k` (see [`Self::kept_for`]), taken over whole if the stack still holds
    /// every word it read; `None` otherwise.
    #[inline(always)]
    fn take_kept(
        &mut self,
        k: usize,
        stack: Stack,
        (pc, sp, bp): (u64, u64, u64),
        out: &mut [u64],
        want_id: bool,
    ) -> Option<Walk> {
        if want_id {
            if let Some(repeat) = self.repeat_flat(k, stack, (pc, sp, bp), out.len()) {
                return repeat;
            }
        }
        let kept = &self.kept[k];
        let view = Self::kept_view(kept);
        // Its frames are those interned as `stack_id` when the buffer is as long.
        let id = match want_id && kept.id_len as usize == out.len() {
            true => kept.stack_id,
            false => 0,
        };
        let taken = match id {
            0 => take_over::<false, true>(view, &mut [], (0, 0), stack, bp, out, 0),
            _ => take_over::<false, false>(view, &mut [], (0, 0), stack, bp, out, 0),
        };
        let Taken::Done { mut walk, .. } = taken else {
            return None;
        };
        walk.id = id;
        walk.node = kept.steps.get(kept.first).map_or(0, |s| s.node);
        self.repeated(k, (pc, sp));
        Some(walk)
    }

    /// Notes that a capture from `sp` repeated kept walk `k`, all of it (a walk no longer
    /// stops where the frame buffer fills, so a take-over of a kept walk is always whole).
    #[inline(always)]
    pub(super) fn repeated(&mut self, k: usize, (pc, sp): (u64, u64)) {
        self.memo = Some(k);
        self.taken_over += 1;
        self.kept_hits += 1;
        let shape = &mut self.shapes[Shape::index(pc, sp)];
        shape.score = (shape.score + 1).min(SHAPE_SCORE);
        self.kept_recent[k / KEPT_WAYS] = (k % KEPT_WAYS) as u8;
        self.last_kept = Some(k);
    }

    /// Keeps the whole walk, innermost first in `next`, for later captures of the same stack
    /// (see [`Shape`]).
    fn keep(&mut self, stack: Stack) {
        let next = &self.next;
        if next.len == 0 || next.len > KEPT_STEPS || next.ending == Ending::Other {
            return;
        }
        let steps = &next.steps[..next.len];
        let (pc, sp) = (steps[0].pc, steps[0].sp);
        let shape = &mut self.shapes[Shape::index(pc, sp)];
        if shape.sp != sp || shape.pc != pc || shape.slots == 0 {
            // Another start, or none yet: replace it once it stops serving.
            shape.score = shape.score.saturating_sub(1);
            if shape.score > 0 {
                return;
            }
            *shape = Shape::of(steps);
            shape.score = SHAPE_SCORE / 2;
        } else {
            let mine = Shape::of(steps);
            if !mine.same_layout(shape) {
                shape.score = shape.score.saturating_sub(1);
                if shape.score == 0 {
                    *shape = mine;
                    shape.score = SHAPE_SCORE / 2;
                }
            }
        }
        let key = shape.key(stack);
        let set = (key >> (64 - KEPT_SETS.trailing_zeros())) as usize;
        let k = find_kept(&self.kept_keys, key)
            .unwrap_or(set * KEPT_WAYS + (usize::from(self.kept_recent[set]) + 1) % KEPT_WAYS);
        self.kept_keys[k] = key;
        let kept = &mut self.kept[k];
        kept.stack_id = 0;
        kept.len = next.len;
        kept.ending = next.ending;
        kept.first = next.first;
        kept.steps[..next.len].copy_from_slice(steps);
        kept.checks = Checks::of(steps, next.ending, next.first);
        self.kept_recent[set] = (k % KEPT_WAYS) as u8;
        self.memo = Some(k);
    }

    /// Walks the stack from `(pc, sp, bp)`; with `fp`, only the tracer's own frames use CFI
    /// and the program's frames follow the rbp chain.
    pub(super) fn walk(
        &mut self,
        set: &ModuleSet,
        stack: Stack,
        (mut pc, mut sp, mut bp): (u64, u64, u64),
        out: &mut [u64],
        How {
            own,
            fp,
            want_id,
            at_return,
            kept,
        }: How,
    ) -> Walk {
        if !core::ptr::eq(self.set, set) {
            // A fresh cache is empty already: emptying it again would touch, and so make the
            // kernel back, every page of its ~300 KiB (measured: 360 KiB of RSS per thread).
            if !self.set.is_null() {
                self.sets.fill(EMPTY);
                self.forget();
            }
            self.set = set;
        }
        self.memo = None;
        if !fp {
            let k = match kept {
                Looked::Not => self.kept_for(stack, pc, sp),
                Looked::Missing => None,
                Looked::At(k) => Some(k),
            };
            if let Some(w) = k.and_then(|k| self.take_kept(k, stack, (pc, sp, bp), out, want_id)) {
                return w;
            }
        }
        let mut n = 0;
        let mut i = 0;
        // The first step recorded as a frame (MAX_STEPS: none yet).
        let mut first_recorded = MAX_STEPS;
        // Cursor into a kept last walk (innermost first): its first step at or above the
        // current sp, and the first step a take-over may start from. Never its step 0, the
        // capture's own first frame.
        let mut j = 1;
        let mut from = 1;
        // Cursor into the record (outermost first): steps `..above` are at or above the
        // current sp, and a take-over may start only below `below`. Never at its innermost
        // step, for the same reason.
        let mut above = self.last.len;
        let mut below = self.last.len.saturating_sub(1);
        let mut key = if at_return { pc } else { pc | FIRST };
        let ending = loop {
            if i > 0 {
                if let Some(k) = self.last_kept {
                    let last = Self::kept_view(&self.kept[k]);
                    while j < last.steps.len() && last.steps[j].sp < sp {
                        j += 1;
                    }
                    if j >= from
                        && j < last.steps.len()
                        && last.steps[j].sp == sp
                        && last.steps[j].pc == pc
                    {
                        let next = &mut self.next;
                        match take_over::<true, true>(
                            last,
                            &mut next.steps[..],
                            (i, j),
                            stack,
                            bp,
                            out,
                            n,
                        ) {
                            Taken::Done {
                                mut walk,
                                steps,
                                ending,
                                named,
                            } => {
                                self.taken_over += 1;
                                // This walk becomes the last one: its own steps, then the
                                // kept walk's from step j (valid for it: just checked).
                                let first = if n > 0 {
                                    first_recorded
                                } else {
                                    i + last.first - j
                                };
                                let known = if named { i } else { MAX_STEPS };
                                self.next.first = first;
                                self.next.len = i + steps;
                                self.next.ending = ending;
                                walk.node = self.commit(stack, None, (i, known), 0);
                                return walk;
                            }
                            Taken::Retry(k) => from = k,
                        }
                    }
                } else {
                    let rec = &self.last;
                    while above > 0 && rec.steps[above - 1].sp < sp {
                        above -= 1;
                    }
                    if let Some(d) = above.checked_sub(1) {
                        let s = rec.steps[d];
                        if d < below && s.sp == sp && s.pc == pc && i + d < MAX_STEPS {
                            match take_over_record(rec, d, stack, bp, out, n) {
                                FromRecord::Done(mut walk, outer, unchecked) => {
                                    self.taken_over += 1;
                                    let first = if n > 0 {
                                        first_recorded
                                    } else {
                                        i + rec.first - (rec.len - 1 - d)
                                    };
                                    self.next.first = first;
                                    walk.node = self.commit(stack, Some(d), (i, i), unchecked);
                                    // The caller needs the frames only to intern a stack
                                    // the call tree has not named yet.
                                    if !want_id || tree::stack_of(walk.node) == 0 {
                                        write_outer(&self.last, outer, out, n);
                                    }
                                    return walk;
                                }
                                FromRecord::Retry(k) => below = below.min(k),
                            }
                        }
                    }
                }
            }
            if i == MAX_STEPS {
                break Ending::Full;
            }
            self.next.steps[i] = Step {
                pc,
                sp,
                bp,
                bp_offset: 0,
                flags: if n > 0 { AFTER_OWN } else { 0 },
                node: 0,
            };
            i += 1;
            let recorded_before = n;
            if !record(set, own, pc, out, &mut n) {
                break Ending::Fixed {
                    outside: false,
                    recorded: false,
                };
            }
            if recorded_before == 0 && n > 0 {
                first_recorded = i - 1;
            }
            if fp && n > 0 {
                return fp_chain(set, stack, (pc, sp, bp), out, n.min(out.len()));
            }
            let rule = self.rule(set, key);
            let first = key & FIRST != 0;
            if !rule.kind.is_cfa() {
                // The rare kinds, out of the way of the common path (which a jump table on
                // the kind made slower: the kind is loaded on the walk's critical path).
                match self.uncommon(set, rule.kind, first, stack, (pc, sp, bp)) {
                    Ok((regs, caller_key)) => {
                        self.next.steps[i - 1].flags |= OPAQUE;
                        (pc, sp, bp) = regs;
                        key = caller_key;
                        continue;
                    }
                    Err(ending) => break ending,
                }
            }
            let uses_bp = rule.kind == Kind::CfaRbp;
            let base = if uses_bp { bp } else { sp };
            let cfa = base.wrapping_add(rule.cfa_offset as i64 as u64);
            // A frame-pointer rule with rbp = 0 is the outermost frame; a CFA that does not
            // move up the stack is a wrong rule (framehop's checks, kept so stacks agree).
            if uses_bp && (base == 0 || cfa <= sp) {
                break Ending::Other;
            }
            let Some(ra) = stack.read(cfa.wrapping_sub(8)) else {
                break Ending::Other;
            };
            let step = &mut self.next.steps[i - 1];
            if uses_bp {
                step.flags |= USES_BP;
            }
            if rule.restores_bp {
                let at = cfa.wrapping_add(rule.bp_offset as i64 as u64);
                match stack.read(at) {
                    Some(v) => bp = v,
                    // An epilogue may describe a slot already popped (below sp): framehop
                    // keeps rbp then, in the first frame only.
                    None if first && at < sp => {}
                    None => break Ending::Other,
                }
                step.flags |= RESTORES_BP;
                step.bp_offset = rule.bp_offset;
            }
            if ra == 0 || (cfa == sp && ra == pc) {
                break Ending::Other;
            }
            (pc, sp) = (ra, cfa);
            key = pc;
        };
        // An address outside every module past the frames kept changes nothing they show.
        let outside = matches!(ending, Ending::Fixed { outside: true, .. }) && n <= out.len();
        self.next.first = first_recorded.min(i);
        self.next.len = i;
        self.next.ending = ending;
        let node = self.commit(stack, None, (i, i), 0);
        Walk {
            frames: n.min(out.len()),
            outside,
            id: 0,
            node,
        }
    }

    /// Makes the finished walk the last one, names it in the call tree and keeps it; returns
    /// its node. Either the record's steps `..=d` are its outer part and `next` holds the
    /// `fresh` steps walked above them (innermost first, `next.first` set), or (`d` None)
    /// `next` holds the whole walk (`first`, `len`, `ending` set), of which the first `fresh`
    /// steps were walked and those from `known` on were named already. The record's pairs of
    /// steps below `unchecked` were not checked by this capture (see `take_over_record`).
    fn commit(
        &mut self,
        stack: Stack,
        d: Option<usize>,
        (fresh, known): (usize, usize),
        unchecked: usize,
    ) -> u32 {
        let len = match d {
            Some(d) => {
                reverse_into(&mut self.last.steps[d + 1..], &self.next.steps[..fresh]);
                d + 1 + fresh
            }
            None => {
                let len = self.next.len;
                reverse_into(&mut self.last.steps[..], &self.next.steps[..len]);
                self.last.ending = self.next.ending;
                len
            }
        };
        let first = self.next.first;
        self.last.first = first;
        // Pairs are counted again from the first one with a new step; all of them when the
        // whole record is new (its outer steps may come from a kept walk).
        let pairs = d.unwrap_or_default();
        self.last.finish_record(len, len - fresh, pairs);
        self.last_kept = None;
        // Path hashes are kept with the record's steps `..=d`; a record made anew holds
        // steps from a kept walk, whose hashes it has not.
        let Some(node) = self.name(
            stack,
            len.saturating_sub(known),
            d.map_or(0, |d| d + 1),
            unchecked,
        ) else {
            // Its outer part no longer holds: the next capture walks the stack anew.
            self.last.len = 0;
            return 0;
        };
        if len <= KEPT_STEPS && self.last.ending != Ending::Other {
            // Kept walks are innermost first.
            reverse_into(&mut self.next.steps[..], &self.last.steps[..len]);
            self.next.len = len;
            self.next.ending = self.last.ending;
            self.next.first = first;
            self.keep(stack);
        }
        node
    }

    /// Names the record's recorded steps from index `start` inwards (those below are named
    /// already): each gets the node of its pc under the node of the step below it. Returns
    /// the node of the innermost recorded step (the whole walk's name), 0 when it has no
    /// frames or the tree is full. The record's path hashes below `hashed` are its steps'.
    ///
    /// A node is made only under steps this capture checked: the pairs below `unchecked`
    /// are checked first (`outer_holds`), and `None` says they no longer hold. Named from
    /// them, a record whose outer part is stale would make a node for every pairing of an old
    /// outer part with a new inner one: with 8 frames kept on the `deep` benchmark, 1.4M
    /// nodes instead of 43k, and 3x the time.
    fn name(&mut self, stack: Stack, start: usize, hashed: usize, unchecked: usize) -> Option<u32> {
        let rec = &mut self.last;
        // The outermost step is no frame when the walk ended on our own trampoline.
        let lowest = match rec.ending {
            Ending::Fixed {
                recorded: false, ..
            } => 1,
            _ => 0,
        };
        // The innermost recorded step: the tracer's own steps are above it.
        let Some(top) = rec.len.checked_sub(rec.first + 1).filter(|&t| t >= lowest) else {
            return Some(0);
        };
        let start = start.max(lowest);
        if start > top {
            // Nothing new to name: the new steps are all the tracer's own.
            return Some(rec.steps[top].node);
        }
        let (mut parent, mut named) = match start > lowest {
            true => (rec.steps[start - 1].node, rec.steps[start - 1].node != 0),
            false => (0, true),
        };
        // Every new step's path hash first, each starting the load of its cache entry (see
        // `tree::path_hash`); the hashes the record lacks below `start` are made again.
        let from = hashed.clamp(lowest, start);
        let mut path = match from > lowest {
            true => rec.paths[from - 1],
            false => tree::ROOT_PATH,
        };
        for (s, p) in rec.steps[from..=top].iter().zip(&mut rec.paths[from..=top]) {
            path = tree::path_hash(path, s.pc);
            *p = path;
        }
        for &p in &rec.paths[start..=top] {
            tree::prefetch(&self.tree, p);
        }
        // Naming stops at the first node the tree cannot give (out of ids or memory), or
        // above a step that was not named: the steps above stay unnamed.
        let mut checked = unchecked == 0;
        // The unchecked steps are below the junction, so below `start`.
        let (outer, new) = rec.steps[..=top].split_at_mut(start);
        for (s, &p) in new.iter_mut().zip(&rec.paths[start..=top]) {
            if named {
                let mut id = tree::child(&mut self.tree, p, parent, s.pc, checked);
                if id == 0 && !checked && tree::growing() {
                    if !outer
                        .get(..=unchecked)
                        .is_some_and(|o| outer_holds(o, stack))
                    {
                        return None;
                    }
                    checked = true;
                    id = tree::child(&mut self.tree, p, parent, s.pc, true);
                }
                parent = id;
                named = parent != 0;
            }
            s.node = if named { parent } else { 0 };
        }
        Some(rec.steps[top].node)
    }
}

/// Copies `from` into the start of `to` in reverse order: between a walk innermost first and
/// the record outermost first.
#[inline(always)]
fn reverse_into(to: &mut [Step], from: &[Step]) {
    for (t, f) in to.iter_mut().zip(from.iter().rev()) {
        *t = *f;
    }
}
