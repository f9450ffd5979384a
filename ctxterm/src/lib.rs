//! The CortexFS terminal owner.
//!
//! It will hold the PTY owner with its `watch`/`attach` session socket, the sandbox launch
//! (bubblewrap, pasta) and the launch profiles of hosted agent CLIs. It talks to `/ctx` as files
//! and sockets and never links the server. Depends on `policy` only.
