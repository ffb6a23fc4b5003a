//! The walk itself (`ThreadCache::walk`): from the capture's registers up the stack, by cached
//! CFI rules, taking over from the last walk or a kept one where the stack still matches.

use super::cache::ThreadCache;
use super::cfi::Kind;
use super::fp::fp_chain;
use super::frames::{record, How, Walk};
use super::kept::{find_kept, Checks, Kept, Shape, KEPT_SETS, KEPT_STEPS, KEPT_WAYS, SHAPE_SCORE};
use super::modules::ModuleSet;
use super::rules::{EMPTY, FIRST};
use super::stack::Stack;
use super::trail::*;
use super::tree;

impl ThreadCache {
    /// The last walk, to take over from.
    #[inline(always)]
    pub(super) fn last_view<'a>(
        last: &'a Trail,
        kept: &'a [Kept],
        last_kept: Option<usize>,
    ) -> View<'a> {
        match last_kept {
            Some(k) => View {
                steps: &kept[k].steps[..kept[k].len],
                ending: kept[k].ending,
                first: kept[k].first,
            },
            None => View {
                steps: &last.steps[..last.len],
                ending: last.ending,
                first: last.first,
            },
        }
    }

    /// The walk kept for the stack now at `(pc, sp, bp)`, taken over whole if the stack still
    /// holds every word it read; `None` otherwise.
    #[inline(always)]
    pub(super) fn take_kept(
        &mut self,
        stack: Stack,
        (pc, sp, bp): (u64, u64, u64),
        out: &mut [u64],
        want_id: bool,
    ) -> Option<Walk> {
        let shape = &self.shapes[Shape::index(sp)];
        if shape.sp != sp || shape.pc != pc {
            return None;
        }
        let k = find_kept(&self.kept[..], shape.key(stack))?;
        let kept = &self.kept[k];
        if kept.steps[0].sp != sp || kept.steps[0].pc != pc {
            return None;
        }
        if want_id && kept.stack_id != 0 && kept.id_len as usize == out.len() && kept.checks.n != 0
        {
            // Exactly what `take_over` checks for this walk from step 0 (see `Checks`).
            if !kept.checks.hold(stack, sp, bp) {
                return None;
            }
            let count = kept.checks.count as usize;
            let id = kept.stack_id;
            self.repeated(k, sp);
            return Some(Walk {
                frames: count.min(out.len()),
                outside: false,
                id,
                node: 0,
            });
        }
        let view = View {
            steps: &kept.steps[..kept.len],
            ending: kept.ending,
            first: kept.first,
        };
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
        self.repeated(k, sp);
        Some(walk)
    }

    /// Notes that a capture from `sp` repeated kept walk `k`, all of it (a walk no longer
    /// stops where the frame buffer fills, so a take-over of a kept walk is always whole).
    #[inline(always)]
    pub(super) fn repeated(&mut self, k: usize, sp: u64) {
        self.memo = Some(k);
        self.taken_over += 1;
        self.kept_hits += 1;
        let shape = &mut self.shapes[Shape::index(sp)];
        shape.score = (shape.score + 1).min(SHAPE_SCORE);
        self.kept_recent[k / KEPT_WAYS] = (k % KEPT_WAYS) as u8;
        self.last_kept = Some(k);
    }

    /// Keeps the whole walk now in `next` for later captures of the same stack (see [`Shape`]).
    pub(super) fn keep(&mut self, stack: Stack) {
        let next = &self.next;
        if next.len == 0 || next.len > KEPT_STEPS || next.ending == Ending::Other {
            return;
        }
        let steps = &next.steps[..next.len];
        let (pc, sp) = (steps[0].pc, steps[0].sp);
        let shape = &mut self.shapes[Shape::index(sp)];
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
        let k = find_kept(&self.kept[..], key)
            .unwrap_or(set * KEPT_WAYS + (usize::from(self.kept_recent[set]) + 1) % KEPT_WAYS);
        let kept = &mut self.kept[k];
        kept.key = key;
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
        How { own, fp, want_id }: How,
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
            if let Some(w) = self.take_kept(stack, (pc, sp, bp), out, want_id) {
                return w;
            }
        }
        let mut n = 0;
        let mut i = 0;
        // The first step recorded as a frame (MAX_STEPS: none yet).
        let mut first_recorded = MAX_STEPS;
        // Cursor into the last walk: its first step at or above the current sp, and the first
        // step a take-over may start from.
        let mut j = 1;
        let mut from = 1;
        let mut key = pc | FIRST;
        let ending = loop {
            if i > 0 {
                let last = Self::last_view(&self.last, &self.kept[..], self.last_kept);
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
                            // This walk becomes the last one: its own steps, then the old
                            // walk's from step j (valid for it: just checked).
                            let first = if n > 0 {
                                first_recorded
                            } else {
                                i + last.first - j
                            };
                            let known = if named { i } else { MAX_STEPS };
                            walk.node = self.complete(stack, first, (i + steps, i), ending, known);
                            return walk;
                        }
                        Taken::Resume { at, frames, first } => {
                            // The old walk's steps are this one's up to its last, from which
                            // this one walks on; nothing of the old walk is left above.
                            self.taken_over += 1;
                            let s = next.steps[at];
                            if first_recorded == MAX_STEPS && frames > 0 {
                                first_recorded = first;
                            }
                            (i, n) = (at, frames);
                            (pc, sp, bp) = (s.pc, s.sp, s.bp);
                            key = pc;
                            j = last.steps.len();
                        }
                        Taken::Retry(k) => from = k,
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
        let node = self.complete(stack, first_recorded.min(i), (i, i), ending, i);
        Walk {
            frames: n.min(out.len()),
            outside,
            id: 0,
            node,
        }
    }

    /// Makes the walk in `next` the last one: `len` steps, the first `fresh` of them walked
    /// by this capture, recording from step `first`, ended as `ending`. Ends it, names it in
    /// the call tree (its steps from `known` on named already), keeps it, and returns its
    /// node.
    fn complete(
        &mut self,
        stack: Stack,
        first: usize,
        (len, fresh): (usize, usize),
        ending: Ending,
        known: usize,
    ) -> u32 {
        self.next.first = first;
        self.next.finish(len, fresh, ending);
        let node = self.name(known);
        self.keep(stack);
        core::mem::swap(&mut self.last, &mut self.next);
        self.last_kept = None;
        node
    }

    /// Names the finished walk in `next` in the call tree, its steps from `known` on being
    /// named already (as taken over from an earlier walk): each recorded step below gets the
    /// node of its pc under the node of the step above. Returns the node of the first
    /// recorded step (the whole walk's name), 0 when it has no frames or the tree is full.
    fn name(&mut self, known: usize) -> u32 {
        let next = &mut self.next;
        let len = next.len;
        let recorded_last = match next.ending {
            Ending::Fixed {
                recorded: false, ..
            } => len.wrapping_sub(1),
            _ => len,
        };
        let first = next.first;
        if first >= recorded_last {
            return 0;
        }
        let (mut parent, top) = match known < recorded_last {
            true => (next.steps[known].node, known),
            false => (0, recorded_last),
        };
        // Naming stops at the first node the tree cannot give (out of ids or memory), or
        // below a taken-over step that was not named: the steps below stay unnamed.
        let mut named = top == recorded_last || parent != 0;
        for s in next.steps[first.min(top)..top].iter_mut().rev() {
            if named {
                parent = tree::child(&mut self.tree, parent, s.pc);
                named = parent != 0;
            }
            s.node = if named { parent } else { 0 };
        }
        next.steps[first].node
    }
}
