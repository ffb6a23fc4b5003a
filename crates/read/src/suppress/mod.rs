//! Suppressions the user already has, for the leak check: valgrind's files (`{ name
//! Memcheck:Leak match-leak-kinds: ... fun:... obj:... ... }`, which many C and C++ projects
//! keep, CPython among them) and LeakSanitizer's (`leak:PATTERN`), matched as memcheck and LSan
//! match them, and valgrind's format written for a leak (`--gen-suppressions`).
//!
//! A leak's stack is matched as memcheck sees it: innermost first, starting with the
//! allocation function. The tracer records the stack from the allocation function's caller
//! and not which function it was, so that first frame is a stand-in for all of them: a `fun:`
//! pattern matches it when it matches any allocation function's name (`malloc`, `calloc`,
//! `operator new` ...), an `obj:` pattern when it matches a preloaded allocator's path. A
//! suppression naming `fun:calloc` so suppresses a leak from `malloc` too.

mod parse;
mod rules;
mod wildcard;

pub use parse::{parse, ParseError};
pub use rules::{Frame, LeakKind, Suppression};
use rules::{FramePattern, Rule};
pub use wildcard::wildcard;

/// The names memcheck gives the allocation functions whose frame starts a leak's stack.
const ALLOCATORS: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "operator new(unsigned long)",
    "operator new[](unsigned long)",
    "operator new(unsigned long, std::align_val_t)",
    "operator new[](unsigned long, std::align_val_t)",
    "operator new(unsigned long, std::nothrow_t const&)",
    "operator new[](unsigned long, std::nothrow_t const&)",
    "_Znwm",
    "_Znam",
];

/// Paths of the preloaded allocators memcheck's first frame is in.
const ALLOCATOR_OBJECTS: &[&str] = &[
    "/usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so",
    "/usr/lib/x86_64-linux-gnu/valgrind/vgpreload_memcheck-amd64-linux.so",
    "libmem_trace.so",
];

impl Suppression {
    /// Whether it suppresses a leak of `kind` whose stack, from the allocation function's
    /// caller out, is `frames`.
    pub fn matches(&self, kind: LeakKind, frames: &[Frame<'_>]) -> bool {
        match &self.rule {
            Rule::Valgrind { kinds, frames: p } => {
                kinds.contains(&kind) && matches_from(p, frames, true)
            }
            Rule::Lsan(pattern) => frames.iter().any(|f| {
                [f.name(), f.file, f.object]
                    .into_iter()
                    .flatten()
                    .any(|s| lsan_match(pattern, s))
            }),
        }
    }
}

/// Whether `patterns` match a prefix of the stack: the allocation function's stand-in
/// (while `allocator`), then `frames`. `...` takes as many frames as leave the rest matching.
fn matches_from(patterns: &[FramePattern], frames: &[Frame<'_>], allocator: bool) -> bool {
    let Some((first, rest)) = patterns.split_first() else {
        return true;
    };
    if *first == FramePattern::Any {
        return (0..=frames.len() + usize::from(allocator)).any(|skip| {
            let skipped_allocator = allocator && skip > 0;
            let skip = skip - usize::from(skipped_allocator);
            matches_from(rest, &frames[skip..], allocator && !skipped_allocator)
        });
    }
    if allocator {
        let matched = match first {
            FramePattern::Fun(p) => ALLOCATORS.iter().any(|a| wildcard(p, a)),
            FramePattern::Obj(p) => ALLOCATOR_OBJECTS.iter().any(|o| wildcard(p, o)),
            FramePattern::Any => unreachable!(),
        };
        return matched && matches_from(rest, frames, false);
    }
    let Some((frame, deeper)) = frames.split_first() else {
        return false;
    };
    let matched = match first {
        FramePattern::Fun(p) => frame.name().is_some_and(|n| wildcard(p, n)),
        FramePattern::Obj(p) => frame.object.is_some_and(|o| wildcard(p, o)),
        FramePattern::Any => unreachable!(),
    };
    matched && matches_from(rest, deeper, false)
}

/// LeakSanitizer's match: `*` any run of characters, `^` and `$` anchor at the start and the
/// end; unanchored, the pattern may match anywhere in `s`.
fn lsan_match(pattern: &str, s: &str) -> bool {
    let (start, p) = match pattern.strip_prefix('^') {
        Some(p) => (true, p),
        None => (false, pattern),
    };
    let (end, p) = match p.strip_suffix('$') {
        Some(p) => (true, p),
        None => (false, p),
    };
    let p = format!(
        "{}{p}{}",
        if start { "" } else { "*" },
        if end { "" } else { "*" }
    );
    // LSan's `?` is literal.
    wildcard::star_only(&p, s)
}

/// The suppressions of several files, with how many leaks and bytes each one suppressed.
#[derive(Debug, Clone, Default)]
pub struct Suppressions {
    list: Vec<Suppression>,
    used: Vec<Used>,
}

/// What one suppression suppressed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Used {
    /// Leak groups (stacks).
    pub leaks: u64,
    pub bytes: u64,
    pub blocks: u64,
}

impl Suppressions {
    /// The suppressions of `files`, each as `(name, text)`: valgrind's or LSan's format,
    /// told apart by their content.
    pub fn read(files: &[(String, String)]) -> Result<Self, ParseError> {
        let mut list = Vec::new();
        for (name, text) in files {
            list.extend(parse(name, text)?);
        }
        let used = vec![Used::default(); list.len()];
        Ok(Suppressions { list, used })
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The first suppression that matches a leak group of `kind` (`bytes` in `blocks`) with
    /// `frames`, counted as used; `None` when none does.
    pub fn suppress(
        &mut self,
        kind: LeakKind,
        frames: &[Frame<'_>],
        bytes: u64,
        blocks: u64,
    ) -> Option<&Suppression> {
        let i = self.list.iter().position(|s| s.matches(kind, frames))?;
        let u = &mut self.used[i];
        u.leaks += 1;
        u.bytes += bytes;
        u.blocks += blocks;
        Some(&self.list[i])
    }

    /// Each suppression with what it suppressed so far.
    pub fn each(&self) -> impl Iterator<Item = (&Suppression, Used)> {
        self.list.iter().zip(self.used.iter().copied())
    }
}

/// valgrind's suppression for a leak of `kind` with `frames`, as `--gen-suppressions` writes
/// it: the allocation function as `fun:*` (the tracer does not know which one was called),
/// then each frame by its function, or its module where it has no name.
pub fn generate(name: &str, kind: LeakKind, frames: &[Frame<'_>]) -> String {
    let mut out = format!(
        "{{\n   {name}\n   Memcheck:Leak\n   match-leak-kinds: {}\n   fun:*\n",
        kind.name()
    );
    for f in frames {
        match (f.name(), f.object) {
            // A name's own `*` or `?` matches itself too.
            (Some(n), _) => out += &format!("   fun:{n}\n"),
            (None, Some(o)) => out += &format!("   obj:{o}\n"),
            (None, None) => out += "   obj:*\n",
        }
    }
    out + "}\n"
}

#[cfg(test)]
mod tests;
