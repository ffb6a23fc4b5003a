//! A process named by its command line in `run`'s summary: `git upload-pack '/tmp/x'`, not
//! just a PID (every git subprocess is `git`). From the `argv` its report carried
//! (`/proc/self/cmdline`, read by the library at exit), shortened to a line's worth.

/// An argument longer than this is cut in its middle.
const ARG_MAX: usize = 40;
/// A command line longer than this is cut, `...` at the end.
const LINE_MAX: usize = 80;

/// `argv` as a shell would take it back, the program by its file name, shortened; `None`
/// for an empty `argv`.
pub fn command_line(argv: &[Vec<u8>]) -> Option<String> {
    let (program, args) = argv.split_first()?;
    // A process that wrote a title over its arguments (redis's `redis-server *:6379`,
    // PostgreSQL's `postgres: checkpointer`, as `setproctitle` does) leaves one string with
    // spaces in it, then the NULs of the rest of the area: shown as the title, as `ps` does.
    if program.contains(&b' ') && args.iter().all(|a| a.is_empty()) {
        return Some(title(program));
    }
    let base = program.rsplit(|&c| c == b'/').next().unwrap_or(program);
    let mut line = quoted(base);
    for a in args {
        let q = quoted(a);
        if line.chars().count() + 1 + q.chars().count() > LINE_MAX {
            line.push_str(" ...");
            break;
        }
        line.push(' ');
        line.push_str(&q);
    }
    Some(line)
}

/// A process title, control characters escaped, cut past [`LINE_MAX`] characters.
fn title(text: &[u8]) -> String {
    let text = String::from_utf8_lossy(text);
    let mut line: String = text
        .trim_end()
        .chars()
        .flat_map(|c| match c.is_control() {
            true => c.escape_default().collect::<Vec<_>>(),
            false => vec![c],
        })
        .collect();
    if line.chars().count() > LINE_MAX {
        line = line.chars().take(LINE_MAX).collect::<String>() + " ...";
    }
    line
}

/// One argument, quoted when a shell would need it, control characters escaped, and cut in
/// its middle past [`ARG_MAX`] characters.
fn quoted(arg: &[u8]) -> String {
    let text = String::from_utf8_lossy(arg);
    let mut chars: Vec<char> = text.chars().collect();
    if chars.len() > ARG_MAX {
        let keep = (ARG_MAX - 3) / 2;
        let tail = chars.split_off(chars.len() - keep);
        chars.truncate(keep);
        chars.extend("...".chars());
        chars.extend(tail);
    }
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./:=,+@%-".contains(c);
    let body: String = chars
        .iter()
        .flat_map(|c| match c {
            c if c.is_control() => c.escape_default().collect::<Vec<_>>(),
            '\'' => "'\\''".chars().collect(),
            c => vec![*c],
        })
        .collect();
    if !chars.is_empty() && chars.iter().all(|&c| plain(c)) {
        body
    } else {
        format!("'{body}'")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<Vec<u8>> {
        args.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    #[test]
    fn programs_by_file_name_arguments_quoted_long_lines_cut() {
        assert_eq!(command_line(&[]), None);
        assert_eq!(
            command_line(&argv(&["/usr/lib/git-core/git", "upload-pack", "/tmp/a b"])).unwrap(),
            "git upload-pack '/tmp/a b'"
        );
        assert_eq!(command_line(&argv(&["wc", "-c"])).unwrap(), "wc -c");
        assert_eq!(
            command_line(&argv(&["sh", "-c", "echo 'x'\n"])).unwrap(),
            "sh -c 'echo '\\''x'\\''\\n'"
        );
        assert_eq!(command_line(&argv(&["x", ""])).unwrap(), "x ''");
        // A title written over the arguments, the rest of them left empty.
        assert_eq!(
            command_line(&argv(&["redis-server 127.0.0.1:6391", "", "", ""])).unwrap(),
            "redis-server 127.0.0.1:6391"
        );
        assert_eq!(
            command_line(&argv(&["postgres: checkpointer "])).unwrap(),
            "postgres: checkpointer"
        );
        let long = "a".repeat(100);
        let line = command_line(&argv(&["cat", &long, &long, &long])).unwrap();
        assert!(line.chars().count() <= LINE_MAX + 4, "{line}");
        assert_eq!(line, "cat aaaaaaaaaaaaaaaaaa...aaaaaaaaaaaaaaaaaa ...");
        let short = "b".repeat(30);
        let line = command_line(&argv(&["cat", &short, &short, &short])).unwrap();
        assert_eq!(line, format!("cat {short} {short} ..."));
    }
}
