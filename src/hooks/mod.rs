//! The exported malloc family, and the other entry points the tracer needs to see
//! (`pthread_create` for stack bounds, `dlclose` for module unloads, `dlopen` in an attached
//! process for the modules it loads (`dlopen`, not exported), and the calls the profiler's
//! thread must not be there for: the credential changes, and `unshare`, `setns` and `clone`
//! into new namespaces). Nothing else lives here.
//!
//! Each hook is the same few lines: enter the reentrancy guard, call glibc, record if this was
//! the outermost entry (`malloc` and `calloc` first try a block the quarantine recycles, see
//! `quarantine::reuse`). Recording happens after the real allocation returns; forgetting
//! happens before the real free (see `record::freed`). Semantics — return values, `errno`,
//! alignment, `realloc(NULL, n)`, `realloc(p, 0)` — are glibc's own, because glibc does the
//! work.
//!
//! The symbols are `#[no_mangle]` only outside unit tests, so the test binary keeps glibc's.

// In unit tests the symbols are not exported (the test binary keeps glibc's), so nothing
// calls them.
#![cfg_attr(test, allow(dead_code))]

mod aligned;
mod alloc;
mod credentials;
mod dlclose;
mod dlopen;
mod exit;
mod namespaces;
mod threads;

mod local;

pub(crate) use local::redirected;
