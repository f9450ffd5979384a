//! The agent's view, asked of the daemon on its control socket ([`policy::runtime`] holds the
//! messages), and whether a view still answers.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use policy::exit::{DENIED, FAILURE, UNAVAILABLE};
use policy::runtime::{CONTROL_REQUEST_MAX, ControlReply, ControlRequest};

use super::{Error, Result};

/// Sends one request to the daemon's control socket and returns its reply as it is.
pub fn request(control: &Path, req: &ControlRequest) -> std::io::Result<ControlReply> {
    let mut s = UnixStream::connect(control)?;
    let mut line = serde_json::to_string(req).map_err(std::io::Error::other)?;
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(s).take(CONTROL_REQUEST_MAX as u64).read_line(&mut reply)?;
    serde_json::from_str(&reply).map_err(std::io::Error::other)
}

/// Sends one request; a refusal is an error (13 for a permission refusal, else 1), and so is
/// a daemon that cannot be reached (69, 13 when the socket is not ours to reach).
pub fn call(control: &Path, req: &ControlRequest) -> Result<ControlReply> {
    let reply = request(control, req).map_err(|e| Error::View {
        code: if e.kind() == std::io::ErrorKind::PermissionDenied { DENIED } else { UNAVAILABLE },
        message: format!("cannot reach the daemon at {}: {e} (is `ctx mount` running?)", control.display()),
    })?;
    if !reply.ok {
        let message = reply.error.clone().unwrap_or_else(|| "unknown error".to_owned());
        return Err(Error::View { code: if reply.denied() { DENIED } else { FAILURE }, message });
    }
    Ok(reply)
}

/// Whether the view at `path` is still a mount its daemon answers on: a dead one gives
/// ENOTCONN, and one that a restarted daemon cleaned away is no FUSE mount any more.
pub fn answers(path: &Path) -> bool {
    const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
    rustix::fs::statfs(path).is_ok_and(|st| st.f_type == FUSE_SUPER_MAGIC)
}

/// Checks that the view at `path` is writable for the run of `agent` and `session`: a FUSE
/// mount, not read-only, whose daemon answers (its `status`) that it is that run's view and
/// read-write.
pub fn writable(path: &Path, agent: &str, session: &str) -> std::result::Result<(), String> {
    const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
    let st = rustix::fs::statfs(path).map_err(|e| format!("statfs: {e}"))?;
    if st.f_type != FUSE_SUPER_MAGIC {
        return Err(format!("not a FUSE mount (filesystem type {:#x})", st.f_type));
    }
    let vst = rustix::fs::statvfs(path).map_err(|e| format!("statvfs: {e}"))?;
    if vst.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) {
        return Err("mounted read-only".into());
    }
    let mut status = String::new();
    std::fs::File::open(path.join("status"))
        .and_then(|f| f.take(64 * 1024).read_to_string(&mut status))
        .map_err(|e| format!("its daemon does not answer: status: {e}"))?;
    let view = format!("agent {agent} session {session}");
    if policy::status::field(&status, "view") != Some(view.as_str()) {
        return Err(format!("its daemon says it is not the view of {view}"));
    }
    if policy::status::field(&status, "ctx") != Some("read-write") {
        return Err("its daemon does not say it is read-write".into());
    }
    Ok(())
}

/// Asks the daemon to remove the view at `path`; detaches it when its daemon is gone, and
/// removes its directory.
pub fn remove(control: &Path, path: &Path) {
    let _ = call(control, &ControlRequest::Rm { path: path.display().to_string() });
    // A view of a daemon that is gone is no one's to remove but ours.
    if matches!(rustix::fs::statfs(path), Err(rustix::io::Errno::NOTCONN | rustix::io::Errno::CONNABORTED)) {
        let _ = rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH);
    }
    let _ = std::fs::remove_dir(path);
}
