//! The exit codes every CortexFS command shares (spec §13).
//!
//! | code | meaning |
//! |---|---|
//! | 0 | ok |
//! | 1 | failure |
//! | 2 | usage or invalid input |
//! | 13 | permission denied |
//! | 69 | service unavailable |
//! | 70 | internal error |

/// Success.
pub const OK: u8 = 0;
/// A failure that is not one of the others.
pub const FAILURE: u8 = 1;
/// Usage error or invalid input.
pub const INVALID: u8 = 2;
/// Permission denied.
pub const DENIED: u8 = 13;
/// Service unavailable.
pub const UNAVAILABLE: u8 = 69;
/// Internal error.
pub const INTERNAL: u8 = 70;
