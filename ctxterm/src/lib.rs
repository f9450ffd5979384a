//! The CortexFS terminal owner (spec §7).
//!
//! `ctxterm` owns the PTY and the lifecycle of one child (tsh by default, or a given command),
//! and serves the session socket: a client sends one mode line, then raw PTY bytes flow.
//! `watch\n` receives output only; `attach\n` receives output and writes to the PTY. Up to 16
//! clients; a late client first gets a bounded scrollback. Window size and signals are forwarded
//! to the child; ctxterm exits with the child's status and leaves no process behind.
//!
//! - [`launch`]: the launcher: an agent's terminal in a bubblewrap sandbox, its supervisor and
//!   receipt server, and agent objects (one file per step, one error enum).
//! - [`ring`]: the bounded scrollback.
//! - [`term`]: the PTY, the child and the socket server.
//! - `sys`: the raw calls around `fork`.
//!
//! It talks to `/ctx` and the daemon as files and sockets and never links the server. Depends
//! on `policy` (L0) and `ringfs` (L1).

pub use ringfs::beneath;
pub mod launch;
pub mod ring;
mod sys;
pub mod term;
