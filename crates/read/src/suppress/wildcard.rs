//! The patterns of suppression files: valgrind's `*` (any run of characters) and `?` (any one
//! character), with `\` taking the next character as it is; LeakSanitizer's `*` alone.

/// Whether `pattern` (valgrind's wildcards) matches the whole of `s`.
pub fn wildcard(pattern: &str, s: &str) -> bool {
    matches(pattern.as_bytes(), s.as_bytes(), true)
}

/// Whether `pattern`, whose only wildcard is `*`, matches the whole of `s`.
pub(super) fn star_only(pattern: &str, s: &str) -> bool {
    matches(pattern.as_bytes(), s.as_bytes(), false)
}

/// The classic greedy match with one backtrack point (the last `*`): linear in practice, and
/// never exponential.
fn matches(p: &[u8], s: &[u8], valgrind: bool) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        let (token, len) = match p.get(pi) {
            Some(b'\\') if valgrind && pi + 1 < p.len() => (Some(Token::Byte(p[pi + 1])), 2),
            Some(b'*') => (Some(Token::Star), 1),
            Some(b'?') if valgrind => (Some(Token::One), 1),
            Some(&b) => (Some(Token::Byte(b)), 1),
            None => (None, 0),
        };
        match token {
            Some(Token::Star) => {
                star = Some((pi + 1, si));
                pi += 1;
                continue;
            }
            Some(Token::One) => {
                pi += len;
                si += 1;
                continue;
            }
            Some(Token::Byte(b)) if b == s[si] => {
                pi += len;
                si += 1;
                continue;
            }
            _ => {}
        }
        match star {
            Some((after, taken)) => {
                pi = after;
                si = taken + 1;
                star = Some((after, taken + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

enum Token {
    Star,
    One,
    Byte(u8),
}
