//! CPython under `run`: its small-object allocator (pymalloc) takes objects of up to 512 bytes
//! from arenas of its own, without `malloc`, so that most of a Python program's heap would be
//! missing from the reports (a dict-building script peaked at 12 MB instead of 162 MB). `run`
//! sets `PYTHONMALLOC=malloc` for the program unless the user set it, and says so when the
//! program is a CPython (a Python script, or the interpreter itself); the variable reaches
//! Pythons that other programs of the run start, too.

use std::ffi::OsString;
use std::io::Read;
use std::path::Path;

/// What `run` sets, and what it says (the program is a CPython) or `None` (nothing to set: the
/// user chose).
pub fn pythonmalloc(user: Option<OsString>, program: &Path) -> Option<(OsString, Option<String>)> {
    if user.is_some() {
        return None;
    }
    let said = is_cpython(program).then(|| {
        "mem-trace: run: PYTHONMALLOC=malloc for the program, so that CPython's small objects \
         go through malloc and are counted (set PYTHONMALLOC yourself to choose otherwise)"
            .to_string()
    });
    Some(("malloc".into(), said))
}

/// Whether `path` is a Python script (its `#!` line names python) or a CPython interpreter (an
/// ELF file whose dynamic symbols name `_PyRuntime` or `Py_BytesMain`).
fn is_cpython(path: &Path) -> bool {
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let mut head = [0u8; 256];
    let n = file.read(&mut head).unwrap_or(0);
    let head = &head[..n];
    if let Some(line) = head.strip_prefix(b"#!") {
        let line = line.split(|&b| b == b'\n').next().unwrap_or(&[]);
        return line.windows(6).any(|w| w == b"python");
    }
    if !head.starts_with(b"\x7fELF") {
        return false;
    }
    let Ok(data) = std::fs::read(path) else {
        return false;
    };
    use object::{Object, ObjectSymbol};
    let Ok(elf) = object::File::parse(&*data) else {
        return false;
    };
    // Defined by a static interpreter; `Py_BytesMain` imported by one linking libpython.
    elf.dynamic_symbols().any(|s| {
        s.name_bytes()
            .is_ok_and(|n| n == b"_PyRuntime" || n == b"Py_BytesMain")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_unless_the_user_chose_and_said_for_python() {
        let dir = std::env::temp_dir().join(format!("mem-trace-pyrun-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("s.py");
        std::fs::write(&script, "#!/usr/bin/env python3\nprint(1)\n").unwrap();
        let shell = dir.join("s.sh");
        std::fs::write(&shell, "#!/bin/sh\necho 1\n").unwrap();
        assert_eq!(pythonmalloc(Some("pymalloc".into()), &script), None);
        let (value, said) = pythonmalloc(None, &script).unwrap();
        assert_eq!(value, "malloc");
        assert!(said.unwrap().contains("PYTHONMALLOC=malloc"));
        let (value, said) = pythonmalloc(None, &shell).unwrap();
        assert_eq!((value.as_os_str(), said), ("malloc".as_ref(), None));
        if Path::new("/usr/bin/python3.11").exists() {
            assert!(is_cpython(Path::new("/usr/bin/python3.11")));
        }
        assert!(!is_cpython(Path::new("/bin/sh")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
