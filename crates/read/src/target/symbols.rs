//! Return addresses of a target → functions and `file:line`, through the one symbolizer
//! ([`crate::symbolize`]) over the target's modules and the files chosen for them when the
//! target was opened (checked against the loaded build id; see `modules`).

use super::types::{Module, Target};
use crate::addr_map::AddrMap;
use crate::symbolize::{ModuleRef, SymError, SymFrame, Symbolizer};
use std::os::unix::ffi::OsStrExt as _;

/// A symbolizer over one target's modules, caching each address's answer.
pub struct Symbols<'t> {
    target: &'t Target,
    symbolizer: Symbolizer,
    cache: AddrMap<Result<Vec<SymFrame>, SymError>>,
}

impl<'t> Symbols<'t> {
    /// A symbolizer over `target`; files are opened on first use.
    pub fn new(target: &'t Target) -> Self {
        Symbols {
            target,
            symbolizer: Symbolizer::new(),
            cache: AddrMap::default(),
        }
    }

    /// The frames of a return address from a stored stack: inlined functions innermost
    /// first, then the function that holds the call (the call instruction, `return_address -
    /// 1`, is what is looked up).
    pub fn frames(&mut self, return_address: u64) -> Result<Vec<SymFrame>, SymError> {
        if let Some(known) = self.cache.get(&return_address) {
            return known.clone();
        }
        let answer = self.lookup(return_address.wrapping_sub(1));
        self.cache.insert(return_address, answer.clone());
        answer
    }

    fn lookup(&mut self, probe: u64) -> Result<Vec<SymFrame>, SymError> {
        let module = self.target.module_of(probe).ok_or(SymError::NotInModule)?;
        let file = module.file.as_ref().ok_or(SymError::FileChanged)?;
        let module = ModuleRef {
            path: file.as_os_str().as_bytes(),
            bias: module.bias,
            start: module.start,
            end: module.end,
        };
        let mut frames = Vec::new();
        self.symbolizer.symbolize(&module, probe, &mut frames)?;
        Ok(frames)
    }

    /// The target it symbolizes for.
    pub fn target(&self) -> &'t Target {
        self.target
    }

    /// The module that holds `addr`, to name an address no symbol covers
    /// (`module+0xoffset`).
    pub fn module_of(&self, addr: u64) -> Option<&'t Module> {
        self.target.module_of(addr)
    }
}
