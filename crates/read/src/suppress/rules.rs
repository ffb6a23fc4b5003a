//! What a suppression file says, as read: the leak kinds, a leak's frames, and each
//! suppression's rule.

/// How a block was lost, as memcheck's `match-leak-kinds` names the kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeakKind {
    /// Definitely lost, pointed to by nothing (`definite`).
    Definite,
    /// Definitely lost, pointed to only from other lost blocks (`indirect`).
    Indirect,
    /// Pointed to only into its interior (`possible`).
    Possible,
    /// Still pointed to (`reachable`).
    Reachable,
}

impl LeakKind {
    pub(crate) const ALL: [LeakKind; 4] = [
        LeakKind::Definite,
        LeakKind::Indirect,
        LeakKind::Possible,
        LeakKind::Reachable,
    ];

    /// memcheck's name.
    pub fn name(self) -> &'static str {
        match self {
            LeakKind::Definite => "definite",
            LeakKind::Indirect => "indirect",
            LeakKind::Possible => "possible",
            LeakKind::Reachable => "reachable",
        }
    }
}

/// One frame of a leak's stack, as much as symbolizing told: inlined functions are frames of
/// their own (memcheck lists them so), innermost first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The function, demangled (`name+0x1f` from a symbol table is taken as `name`).
    pub function: Option<&'a str>,
    /// The path of the module holding it.
    pub object: Option<&'a str>,
    /// Its source file.
    pub file: Option<&'a str>,
}

impl<'a> Frame<'a> {
    /// The function's name without a symbol table's `+0x...` offset.
    pub(crate) fn name(&self) -> Option<&'a str> {
        self.function
            .map(|f| f.rsplit_once("+0x").map_or(f, |(name, _)| name))
    }
}

/// What one suppression matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rule {
    /// valgrind's: the kinds (all when the file names none) and the frames' patterns.
    Valgrind {
        kinds: Vec<LeakKind>,
        frames: Vec<FramePattern>,
    },
    /// LeakSanitizer's `leak:PATTERN`.
    Lsan(String),
}

/// One line of a valgrind suppression's stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FramePattern {
    Fun(String),
    Obj(String),
    /// `...`: any number of frames, none included.
    Any,
}

/// One suppression, named by its file and line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suppression {
    /// Its name (valgrind's first line; LSan's pattern).
    pub name: String,
    /// Where it was read: `FILE:LINE`.
    pub source: String,
    pub(crate) rule: Rule,
}
