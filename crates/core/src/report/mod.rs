//! What the tracer prints by itself: reports of double and invalid frees ([`errors`]), and the
//! symbolized stacks they and `print_trace` show ([`frames`]).

mod errors;
pub mod frames;

pub use errors::By;
pub(crate) use errors::{double_free, double_free_racing, invalid_free, Op, Why};
