//! Test helper: `powerloss-fs MOUNTPOINT [SEED]`, an in-memory FUSE filesystem that can simulate
//! power loss, for crash tests of code that claims durability.
//!
//! Every inode has a *current* state (what reads see) and a *durable* state (what survives power
//! loss):
//! - writes, truncates, xattr changes, creates, unlinks, renames and mkdirs change only the
//!   current state;
//! - `fsync` of a file makes its data, size and xattrs durable; `fdatasync` makes data and size
//!   durable but not xattrs (ext4 does not promise them either); `O_SYNC` and `O_DSYNC` writes
//!   sync like `fsync` and `fdatasync` after each write;
//! - a directory's entries become durable only when that directory is fsynced.
//!
//! Signals drive it:
//! - `SIGUSR1`: power loss. Every inode's current state is reset to its durable state
//!   (directory contents included). Open handles stay valid and see the durable state.
//! - `SIGUSR2`: torn power loss. As `SIGUSR1`, except that the unsynced tail appended to a file
//!   may have partly reached the disk: a random prefix of it survives, sometimes with a run of
//!   zeros inside (size extended, data not written), and each file's unsynced xattrs survive or
//!   not by a coin toss. Directory entries still need a directory fsync.
//! - `SIGTERM`, `SIGINT`: unmount and exit 0. The parent's death sends `SIGTERM` too.
//!
//! It prints `ready` on stdout once mounted and `dropped` after each simulated power loss.
//!
//! Faults are injected by commands on stdin, one a line, each answered by one line on stdout once
//! it is in effect (so a test that waits for the answer drives them synchronously). A *sync* is
//! an `fsync` or `fdatasync` of a file or directory, or an `O_SYNC` or `O_DSYNC` write.
//! - `eio on`, `eio off` (answer: the same words): while on, every sync fails with EIO and
//!   makes nothing durable; an `O_SYNC`/`O_DSYNC` write still changes the current state, as a
//!   buffered write whose writeback failed does. Nothing else fails.
//! - `after N` (answer `armed N`, N >= 1): the Nth successful sync from now completes, then the
//!   power is cut at once (as `SIGUSR1`) and the filesystem is *down*: every operation fails with
//!   EIO until `restart` (but releasing a handle, which no caller waits for, and `statfs`). The
//!   caller sees its sync succeed and then nothing else work, as if it had died with the machine.
//! - `disarm` (answer `disarmed`): forgets an armed count that has not run out.
//! - `restart` (answer `restarted`): clears the down state, like a reboot after the cut.
//! - `status` (answer `status syncs=S armed=A down=D eio=E`): S successful syncs since mounting,
//!   A syncs left before an armed cut (0 when not armed), D and E 1 or 0.
//! - `ghosts on`, `ghosts off` (answer: the same words): while on, a file renamed away from a
//!   name leaves a ghost there, as a network filesystem's client that another client's move
//!   has not reached yet (GlusterFS): the first LOOKUP of the old name answers the moved file,
//!   the next ones ENOENT, and no listing shows it. A name made there again lays the ghost.
//!
//! Anything else is answered `error: ...`. End of input ends the commands, not the filesystem.
//!
//! Entry and attribute timeouts are zero and every open uses `FOPEN_DIRECT_IO`, so the kernel
//! caches nothing that a power loss could make stale. Only regular files and directories exist;
//! mode, owner and times are not part of the simulation (they change at once and never revert).
//! Inodes are never freed: this is a test filesystem that lives for one test.
//!
//! Exit codes: 0 after a clean unmount, 1 when mounting fails, 2 on bad usage.

use std::collections::{BTreeMap, HashMap};
use std::ffi::CStr;
use std::io::{self, BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{Attr, CreateIn, stat64};
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileSystem, FsOptions, GetxattrReply, ListxattrReply, OpenOptions, ROOT_ID,
    SetattrValid, ZeroCopyReader, ZeroCopyWriter,
};
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{FuseChannel, FuseSession};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Threads serving /dev/fuse.
const SERVER_THREADS: usize = 4;

/// Largest file: everything lives in memory.
const MAX_FILE: usize = 1 << 32;

/// Size of the copy-on-write blocks of file data.
const BLOCK: usize = 64 * 1024;

/// File bytes in copy-on-write blocks, so that making a large file durable (cloning it) is cheap
/// and a write copies only the blocks it shares with the durable state. Bytes past `len` in the
/// last block are always zero.
#[derive(Clone, Debug, Default)]
struct Data {
    blocks: Vec<Arc<Vec<u8>>>,
    len: usize,
}

impl Data {
    fn len(&self) -> usize {
        self.len
    }

    fn read(&self, from: usize, to: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(to.saturating_sub(from));
        let mut at = from;
        while at < to.min(self.len) {
            let (b, o) = (at / BLOCK, at % BLOCK);
            let n = (BLOCK - o).min(to.min(self.len) - at);
            out.extend_from_slice(&self.blocks[b][o..o + n]);
            at += n;
        }
        out
    }

    fn write(&mut self, at: usize, bytes: &[u8]) {
        let end = at + bytes.len();
        if end > self.len {
            self.blocks.resize_with(end.div_ceil(BLOCK), || Arc::new(vec![0; BLOCK]));
            self.len = end;
        }
        let mut done = 0;
        while done < bytes.len() {
            let (b, o) = ((at + done) / BLOCK, (at + done) % BLOCK);
            let n = (BLOCK - o).min(bytes.len() - done);
            Arc::make_mut(&mut self.blocks[b])[o..o + n].copy_from_slice(&bytes[done..done + n]);
            done += n;
        }
    }

    fn set_len(&mut self, len: usize) {
        if len > self.len {
            self.blocks.resize_with(len.div_ceil(BLOCK), || Arc::new(vec![0; BLOCK]));
        } else {
            self.blocks.truncate(len.div_ceil(BLOCK));
            if !len.is_multiple_of(BLOCK) && len < self.len {
                Arc::make_mut(&mut self.blocks[len / BLOCK])[len % BLOCK..].fill(0);
            }
        }
        self.len = len;
    }

    /// Whether `self` begins with all of `prefix`.
    fn starts_with(&self, prefix: &Data) -> bool {
        if prefix.len > self.len {
            return false;
        }
        prefix.blocks.iter().zip(&self.blocks).enumerate().all(|(i, (p, s))| {
            let n = (prefix.len - i * BLOCK).min(BLOCK);
            Arc::ptr_eq(p, s) || p[..n] == s[..n]
        })
    }
}

/// Everything that power loss can revert.
#[derive(Clone, Debug, Default)]
struct Content {
    /// File bytes (empty for directories).
    data: Data,
    /// Directory entries: name to inode (empty for files).
    entries: BTreeMap<Vec<u8>, u64>,
    /// Extended attributes.
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

#[derive(Debug)]
struct Node {
    dir: bool,
    perm: u32,
    uid: u32,
    gid: u32,
    cur: Content,
    dur: Content,
}

/// Fault injection, set by the commands on stdin.
#[derive(Debug, Default)]
struct Faults {
    /// Every sync fails with EIO and makes nothing durable.
    eio: bool,
    /// Successful syncs left until the power is cut, right after the last of them; 0 when
    /// not armed.
    armed: u64,
    /// The power was cut: every operation fails with EIO until `restart`.
    down: bool,
    /// Successful syncs since mounting.
    syncs: u64,
    /// Renames leave ghosts.
    ghosts: bool,
}

#[derive(Debug)]
struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    rng: StdRng,
    faults: Faults,
    /// Old names of moved files, by directory and name: the file each still answers once.
    ghosts: HashMap<(u64, Vec<u8>), u64>,
}

/// The filesystem: one lock around all state.
#[derive(Debug)]
struct PowerlossFs {
    state: Mutex<State>,
}

fn err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

impl Node {
    fn new(dir: bool, perm: u32, uid: u32, gid: u32) -> Node {
        Node { dir, perm: perm & 0o7777, uid, gid, cur: Content::default(), dur: Content::default() }
    }

    fn attr(&self, ino: u64) -> stat64 {
        let size = if self.dir { 4096 } else { self.cur.data.len() as u64 };
        Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            mode: self.perm | if self.dir { libc::S_IFDIR } else { libc::S_IFREG },
            nlink: if self.dir { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            blksize: 4096,
            ..Attr::default()
        }
        .into()
    }

    fn entry(&self, ino: u64) -> Entry {
        Entry {
            inode: ino,
            generation: 0,
            attr: self.attr(ino),
            attr_flags: 0,
            attr_timeout: Duration::ZERO,
            entry_timeout: Duration::ZERO,
        }
    }

    fn sync(&mut self, with_xattrs: bool) {
        self.dur.data.clone_from(&self.cur.data);
        self.dur.entries.clone_from(&self.cur.entries);
        if with_xattrs {
            self.dur.xattrs.clone_from(&self.cur.xattrs);
        }
    }

    /// Power loss: the current state becomes the durable one. When `torn`, part of an unsynced
    /// append and maybe the unsynced xattrs survive, as if written back before the power failed.
    fn lose_power(&mut self, torn: bool, rng: &mut StdRng) {
        let mut next = self.dur.clone();
        if torn && !self.dir {
            let (dur, cur) = (&self.dur.data, &self.cur.data);
            if cur.len() > dur.len() && cur.starts_with(dur) {
                let keep = rng.random_range(dur.len()..=cur.len());
                next.data = cur.clone();
                next.data.set_len(keep);
                if keep > dur.len() && rng.random_bool(0.25) {
                    let a = rng.random_range(dur.len()..keep);
                    let b = rng.random_range(a..=keep);
                    next.data.write(a, &vec![0; b - a]);
                }
            }
            if rng.random_bool(0.5) {
                next.xattrs.clone_from(&self.cur.xattrs);
            }
        }
        self.cur = next.clone();
        self.dur = next;
    }
}

impl State {
    fn node(&self, ino: u64) -> io::Result<&Node> {
        self.nodes.get(&ino).ok_or_else(|| err(libc::ENOENT))
    }

    fn node_mut(&mut self, ino: u64) -> io::Result<&mut Node> {
        self.nodes.get_mut(&ino).ok_or_else(|| err(libc::ENOENT))
    }

    fn dir(&self, ino: u64) -> io::Result<&Node> {
        let n = self.node(ino)?;
        if n.dir { Ok(n) } else { Err(err(libc::ENOTDIR)) }
    }

    fn dir_mut(&mut self, ino: u64) -> io::Result<&mut Node> {
        let n = self.node_mut(ino)?;
        if n.dir { Ok(n) } else { Err(err(libc::ENOTDIR)) }
    }

    fn file_mut(&mut self, ino: u64) -> io::Result<&mut Node> {
        let n = self.node_mut(ino)?;
        if n.dir { Err(err(libc::EISDIR)) } else { Ok(n) }
    }

    fn child(&self, parent: u64, name: &CStr) -> io::Result<u64> {
        self.dir(parent)?.cur.entries.get(name.to_bytes()).copied().ok_or_else(|| err(libc::ENOENT))
    }

    /// Creates a node named `name` in `parent` (current state only).
    fn make(&mut self, ctx: &Context, parent: u64, name: &CStr, dir: bool, mode: u32) -> io::Result<Entry> {
        let name = name.to_bytes();
        if self.dir(parent)?.cur.entries.contains_key(name) {
            return Err(err(libc::EEXIST));
        }
        self.ghosts.remove(&(parent, name.to_vec()));
        let ino = self.next_ino;
        self.next_ino += 1;
        let node = Node::new(dir, mode, ctx.uid, ctx.gid);
        let entry = node.entry(ino);
        self.nodes.insert(ino, node);
        self.dir_mut(parent)?.cur.entries.insert(name.to_vec(), ino);
        Ok(entry)
    }

    /// Removes `name` from `parent`; `want_dir` says whether it must be a directory.
    fn remove(&mut self, parent: u64, name: &CStr, want_dir: bool) -> io::Result<()> {
        let ino = self.child(parent, name)?;
        let node = self.node(ino)?;
        match (want_dir, node.dir) {
            (true, false) => return Err(err(libc::ENOTDIR)),
            (false, true) => return Err(err(libc::EISDIR)),
            (true, true) if !node.cur.entries.is_empty() => return Err(err(libc::ENOTEMPTY)),
            _ => {}
        }
        self.dir_mut(parent)?.cur.entries.remove(name.to_bytes());
        Ok(())
    }

    fn rename(
        &mut self,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        let src = self.child(olddir, oldname)?;
        let dst = match self.child(newdir, newname) {
            Ok(ino) => Some(ino),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
            Err(e) => return Err(e),
        };
        let (old, new) = (oldname.to_bytes().to_vec(), newname.to_bytes().to_vec());
        if flags & libc::RENAME_EXCHANGE != 0 {
            let dst = dst.ok_or_else(|| err(libc::ENOENT))?;
            self.dir_mut(olddir)?.cur.entries.insert(old, dst);
            self.dir_mut(newdir)?.cur.entries.insert(new, src);
            return Ok(());
        }
        if flags & !libc::RENAME_NOREPLACE != 0 {
            return Err(err(libc::EINVAL));
        }
        if let Some(dst) = dst {
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(err(libc::EEXIST));
            }
            if dst == src {
                return Ok(());
            }
            let (s, d) = (self.node(src)?, self.node(dst)?);
            match (s.dir, d.dir) {
                (false, true) => return Err(err(libc::EISDIR)),
                (true, false) => return Err(err(libc::ENOTDIR)),
                (true, true) if !d.cur.entries.is_empty() => return Err(err(libc::ENOTEMPTY)),
                _ => {}
            }
        }
        self.ghosts.remove(&(newdir, new.clone()));
        if self.faults.ghosts && !self.node(src)?.dir {
            self.ghosts.insert((olddir, old.clone()), src);
        }
        self.dir_mut(olddir)?.cur.entries.remove(&old);
        self.dir_mut(newdir)?.cur.entries.insert(new, src);
        Ok(())
    }

    fn write(&mut self, ino: u64, offset: u64, bytes: &[u8], flags: u32) -> io::Result<usize> {
        let node = self.file_mut(ino)?;
        let data = &mut node.cur.data;
        // Without writeback caching the filesystem handles O_APPEND; the kernel's idea of the
        // size may predate a power loss.
        let at = if flags & libc::O_APPEND as u32 != 0 {
            data.len()
        } else {
            usize::try_from(offset).map_err(|_| err(libc::EFBIG))?
        };
        if at.checked_add(bytes.len()).is_none_or(|end| end > MAX_FILE) {
            return Err(err(libc::EFBIG));
        }
        data.write(at, bytes);
        let sync = libc::O_SYNC as u32;
        if flags & sync == sync {
            self.sync(ino, true)?;
        } else if flags & libc::O_DSYNC as u32 != 0 {
            self.sync(ino, false)?;
        }
        Ok(bytes.len())
    }

    /// One sync of `ino`. In EIO mode it fails and makes nothing durable; otherwise it makes the
    /// node durable, is counted, and cuts the power when it is the last one an armed count
    /// waits for.
    fn sync(&mut self, ino: u64, with_xattrs: bool) -> io::Result<()> {
        if self.faults.eio {
            self.node(ino)?;
            return Err(err(libc::EIO));
        }
        self.node_mut(ino)?.sync(with_xattrs);
        self.faults.syncs += 1;
        if self.faults.armed > 0 {
            self.faults.armed -= 1;
            if self.faults.armed == 0 {
                self.lose_power(false);
                self.faults.down = true;
            }
        }
        Ok(())
    }

    /// Runs one command read on stdin; returns the answer.
    fn command(&mut self, line: &str) -> String {
        let words: Vec<&str> = line.split_whitespace().collect();
        let f = &mut self.faults;
        match words[..] {
            ["eio", "on"] => {
                f.eio = true;
                "eio on".into()
            }
            ["eio", "off"] => {
                f.eio = false;
                "eio off".into()
            }
            ["after", n] => match n.parse::<u64>() {
                Ok(n) if n > 0 => {
                    f.armed = n;
                    format!("armed {n}")
                }
                _ => format!("error: after takes a count of syncs of at least 1, not {n:?}"),
            },
            ["disarm"] => {
                f.armed = 0;
                "disarmed".into()
            }
            ["ghosts", "on"] => {
                f.ghosts = true;
                "ghosts on".into()
            }
            ["ghosts", "off"] => {
                f.ghosts = false;
                self.ghosts.clear();
                "ghosts off".into()
            }
            ["restart"] => {
                f.down = false;
                "restarted".into()
            }
            ["status"] => format!(
                "status syncs={} armed={} down={} eio={}",
                f.syncs,
                f.armed,
                u8::from(f.down),
                u8::from(f.eio)
            ),
            _ => format!("error: unknown command {line:?}"),
        }
    }

    fn lose_power(&mut self, torn: bool) {
        let State { nodes, rng, .. } = self;
        for node in nodes.values_mut() {
            node.lose_power(torn, rng);
        }
    }
}

impl PowerlossFs {
    fn new(seed: u64) -> PowerlossFs {
        let mut nodes = HashMap::new();
        nodes.insert(ROOT_ID, Node::new(true, 0o755, 0, 0));
        PowerlossFs {
            state: Mutex::new(State {
                nodes,
                next_ino: ROOT_ID + 1,
                rng: StdRng::seed_from_u64(seed),
                faults: Faults::default(),
                ghosts: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state, unless the power is cut: then EIO, for every operation.
    fn live(&self) -> io::Result<MutexGuard<'_, State>> {
        let st = self.lock();
        if st.faults.down { Err(err(libc::EIO)) } else { Ok(st) }
    }
}

fn xattr_reply(value: &[u8], size: u32) -> io::Result<u32> {
    let len = u32::try_from(value.len()).map_err(|_| err(libc::E2BIG))?;
    if size != 0 && size < len {
        return Err(err(libc::ERANGE));
    }
    Ok(len)
}

impl FileSystem for PowerlossFs {
    type Inode = u64;
    type Handle = u64;

    fn init(&self, _capable: FsOptions) -> io::Result<FsOptions> {
        // Never WRITEBACK_CACHE: the kernel must not hold writes the filesystem has not seen.
        Ok(FsOptions::MAX_PAGES)
    }

    fn lookup(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        let mut st = self.live()?;
        let ino = match st.child(parent, name) {
            Err(e) => st.ghosts.remove(&(parent, name.to_bytes().to_vec())).ok_or(e)?,
            found => found?,
        };
        Ok(st.node(ino)?.entry(ino))
    }

    fn getattr(&self, _ctx: &Context, ino: u64, _h: Option<u64>) -> io::Result<(stat64, Duration)> {
        Ok((self.live()?.node(ino)?.attr(ino), Duration::ZERO))
    }

    fn setattr(
        &self,
        _ctx: &Context,
        ino: u64,
        attr: stat64,
        _h: Option<u64>,
        valid: SetattrValid,
    ) -> io::Result<(stat64, Duration)> {
        let mut st = self.live()?;
        if valid.contains(SetattrValid::SIZE) {
            let len = usize::try_from(attr.st_size).map_err(|_| err(libc::EINVAL))?;
            if len > MAX_FILE {
                return Err(err(libc::EFBIG));
            }
            st.file_mut(ino)?.cur.data.set_len(len);
        }
        let node = st.node_mut(ino)?;
        if valid.contains(SetattrValid::MODE) {
            node.perm = attr.st_mode & 0o7777;
        }
        if valid.contains(SetattrValid::UID) {
            node.uid = attr.st_uid;
        }
        if valid.contains(SetattrValid::GID) {
            node.gid = attr.st_gid;
        }
        Ok((node.attr(ino), Duration::ZERO))
    }

    fn symlink(&self, _ctx: &Context, _link: &CStr, _parent: u64, _name: &CStr) -> io::Result<Entry> {
        Err(err(libc::EPERM))
    }

    fn link(&self, _ctx: &Context, _ino: u64, _parent: u64, _name: &CStr) -> io::Result<Entry> {
        Err(err(libc::EPERM))
    }

    fn mknod(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        _rdev: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return Err(err(libc::EPERM));
        }
        self.live()?.make(ctx, parent, name, false, mode & !umask)
    }

    fn mkdir(&self, ctx: &Context, parent: u64, name: &CStr, mode: u32, umask: u32) -> io::Result<Entry> {
        self.live()?.make(ctx, parent, name, true, mode & !umask)
    }

    fn unlink(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.live()?.remove(parent, name, false)
    }

    fn rmdir(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.live()?.remove(parent, name, true)
    }

    fn rename(
        &self,
        _ctx: &Context,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.live()?.rename(olddir, oldname, newdir, newname, flags)
    }

    fn open(
        &self,
        _ctx: &Context,
        ino: u64,
        _flags: u32,
        _fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        if self.live()?.node(ino)?.dir {
            return Err(err(libc::EISDIR));
        }
        Ok((None, OpenOptions::DIRECT_IO, None))
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        args: CreateIn,
    ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
        let entry = self.live()?.make(ctx, parent, name, false, args.mode & !args.umask)?;
        Ok((entry, None, OpenOptions::DIRECT_IO, None))
    }

    fn read(
        &self,
        _ctx: &Context,
        ino: u64,
        _h: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _flags: u32,
    ) -> io::Result<usize> {
        let chunk = {
            let st = self.live()?;
            let node = st.node(ino)?;
            if node.dir {
                return Err(err(libc::EISDIR));
            }
            let from = usize::try_from(offset).unwrap_or(usize::MAX);
            node.cur.data.read(from, from.saturating_add(size as usize))
        };
        w.write_all(&chunk)?;
        Ok(chunk.len())
    }

    fn write(
        &self,
        _ctx: &Context,
        ino: u64,
        _h: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _delayed_write: bool,
        flags: u32,
        _fuse_flags: u32,
    ) -> io::Result<usize> {
        // Finish reading the request before taking the lock (and before any reply is written).
        let mut buf = vec![0u8; size as usize];
        r.read_exact(&mut buf)?;
        self.live()?.write(ino, offset, &buf, flags)
    }

    fn flush(&self, _ctx: &Context, _ino: u64, _h: u64, _lock_owner: u64) -> io::Result<()> {
        self.live().map(drop)
    }

    fn fsync(&self, _ctx: &Context, ino: u64, datasync: bool, _h: u64) -> io::Result<()> {
        self.live()?.sync(ino, !datasync)
    }

    fn fallocate(&self, _ctx: &Context, ino: u64, _h: u64, mode: u32, off: u64, len: u64) -> io::Result<()> {
        let st = self.live()?;
        // Space reserved past the end, which a memory filesystem always has: what a log asks
        // for before it journals an append.
        if mode == libc::FALLOC_FL_KEEP_SIZE as u32 {
            st.node(ino)?;
            return match off.checked_add(len) {
                Some(_) => Ok(()),
                None => Err(err(libc::EFBIG)),
            };
        }
        Err(err(libc::EOPNOTSUPP))
    }

    fn release(
        &self,
        _ctx: &Context,
        _ino: u64,
        _flags: u32,
        _h: u64,
        _flush: bool,
        _flock_release: bool,
        _lock_owner: Option<u64>,
    ) -> io::Result<()> {
        Ok(())
    }

    fn setxattr(&self, _ctx: &Context, ino: u64, name: &CStr, value: &[u8], flags: u32) -> io::Result<()> {
        let mut st = self.live()?;
        let xattrs = &mut st.node_mut(ino)?.cur.xattrs;
        let exists = xattrs.contains_key(name.to_bytes());
        if flags & libc::XATTR_CREATE as u32 != 0 && exists {
            return Err(err(libc::EEXIST));
        }
        if flags & libc::XATTR_REPLACE as u32 != 0 && !exists {
            return Err(err(libc::ENODATA));
        }
        xattrs.insert(name.to_bytes().to_vec(), value.to_vec());
        Ok(())
    }

    fn getxattr(&self, _ctx: &Context, ino: u64, name: &CStr, size: u32) -> io::Result<GetxattrReply> {
        let st = self.live()?;
        let value = st.node(ino)?.cur.xattrs.get(name.to_bytes()).ok_or_else(|| err(libc::ENODATA))?;
        let len = xattr_reply(value, size)?;
        Ok(if size == 0 { GetxattrReply::Count(len) } else { GetxattrReply::Value(value.clone()) })
    }

    fn listxattr(&self, _ctx: &Context, ino: u64, size: u32) -> io::Result<ListxattrReply> {
        let st = self.live()?;
        let mut names = Vec::new();
        for name in st.node(ino)?.cur.xattrs.keys() {
            names.extend_from_slice(name);
            names.push(0);
        }
        let len = xattr_reply(&names, size)?;
        Ok(if size == 0 { ListxattrReply::Count(len) } else { ListxattrReply::Names(names) })
    }

    fn removexattr(&self, _ctx: &Context, ino: u64, name: &CStr) -> io::Result<()> {
        let mut st = self.live()?;
        match st.node_mut(ino)?.cur.xattrs.remove(name.to_bytes()) {
            Some(_) => Ok(()),
            None => Err(err(libc::ENODATA)),
        }
    }

    fn opendir(&self, _ctx: &Context, ino: u64, _flags: u32) -> io::Result<(Option<u64>, OpenOptions)> {
        self.live()?.dir(ino)?;
        Ok((None, OpenOptions::empty()))
    }

    fn readdir(
        &self,
        _ctx: &Context,
        ino: u64,
        _h: u64,
        _size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        // Snapshot the listing, then emit without the lock. The cookie of entry i is i + 1.
        let listing: Vec<(Vec<u8>, u64, bool)> = {
            let st = self.live()?;
            let dir = st.dir(ino)?;
            let mut v = vec![(b".".to_vec(), ino, true), (b"..".to_vec(), ROOT_ID, true)];
            for (name, &child) in &dir.cur.entries {
                v.push((name.clone(), child, st.node(child).map(|n| n.dir).unwrap_or(false)));
            }
            v
        };
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (name, child, is_dir)) in listing.iter().enumerate().skip(skip) {
            let entry = DirEntry {
                ino: *child,
                offset: i as u64 + 1,
                type_: u32::from(if *is_dir { libc::DT_DIR } else { libc::DT_REG }),
                name,
            };
            if add_entry(entry)? == 0 {
                break;
            }
        }
        Ok(())
    }

    fn fsyncdir(&self, _ctx: &Context, ino: u64, datasync: bool, _h: u64) -> io::Result<()> {
        let mut st = self.live()?;
        st.dir(ino)?;
        st.sync(ino, !datasync)
    }

    fn releasedir(&self, _ctx: &Context, _ino: u64, _flags: u32, _h: u64) -> io::Result<()> {
        Ok(())
    }
}

/// Signal plumbing: the few raw calls this binary needs.
mod sys {
    use std::io;

    /// Blocks `signals` in the calling thread (and so in every thread it spawns afterwards) and
    /// returns the set, for [`wait`].
    #[allow(unsafe_code)]
    pub fn block(signals: &[libc::c_int]) -> io::Result<libc::sigset_t> {
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: `sigemptyset` initialises the set it is given a valid pointer to; `sigaddset`
        // and `pthread_sigmask` read that initialised set, and the old-mask pointer may be null.
        unsafe {
            if libc::sigemptyset(set.as_mut_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            for &s in signals {
                if libc::sigaddset(set.as_mut_ptr(), s) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut());
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            Ok(set.assume_init())
        }
    }

    /// Waits for one of the signals in `set` (blocked by [`block`]) and returns it.
    #[allow(unsafe_code)]
    pub fn wait(set: &libc::sigset_t) -> io::Result<libc::c_int> {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is an initialised signal set and `sig` a valid place for the result;
        // `sigwait` touches nothing else.
        let rc = unsafe { libc::sigwait(set, &mut sig) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(sig)
    }
}

fn serve(server: &Server<Arc<PowerlossFs>>, mut ch: FuseChannel, stopping: &AtomicBool) {
    loop {
        match ch.get_request() {
            Ok(Some((reader, writer))) => {
                if let Err(e) = server.handle_message(reader, writer.into(), None, None)
                    && !stopping.load(Ordering::Relaxed)
                {
                    eprintln!("powerloss-fs: {e}");
                }
            }
            Ok(None) => return,
            Err(e) => {
                // On unmount some channels report an epoll error instead of Ok(None).
                let msg = e.to_string();
                if !stopping.load(Ordering::Relaxed) && !msg.contains("epoll error") {
                    eprintln!("powerloss-fs: reading /dev/fuse: {msg}");
                }
                return;
            }
        }
    }
}

/// Answers the commands on stdin until it ends.
fn control(fs: &PowerlossFs) {
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { return };
        if !line.trim().is_empty() {
            let answer = fs.lock().command(&line);
            say(&answer);
        }
    }
}

fn say(word: &str) {
    let mut out = io::stdout().lock();
    // The test reads these lines; if it is gone there is nobody left to tell.
    let _ = writeln!(out, "{word}").and_then(|()| out.flush());
}

fn run(mountpoint: PathBuf, seed: u64) -> Result<(), String> {
    // A panicking server thread would leave its request unanswered and its caller hung in the
    // kernel; dying instead aborts the connection, and every caller gets an error.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::abort();
    }));
    // A test that dies without unmounting takes its filesystem with it.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .map_err(|e| format!("setting the parent-death signal: {e}"))?;
    let signals = sys::block(&[libc::SIGUSR1, libc::SIGUSR2, libc::SIGTERM, libc::SIGINT])
        .map_err(|e| format!("blocking signals: {e}"))?;
    let fs = Arc::new(PowerlossFs::new(seed));
    let server = Arc::new(Server::new(Arc::clone(&fs)));
    let mut session = FuseSession::new(&mountpoint, "powerloss", "powerloss", false)
        .map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    session.set_allow_other(false);
    session.mount().map_err(|e| format!("mounting {}: {e}", mountpoint.display()))?;
    let stopping = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for i in 0..SERVER_THREADS {
        let ch = session.new_channel().map_err(|e| format!("new channel: {e}"))?;
        let (server, stopping) = (Arc::clone(&server), Arc::clone(&stopping));
        let t = std::thread::Builder::new()
            .name(format!("fuse-{i}"))
            .spawn(move || serve(&server, ch, &stopping))
            .map_err(|e| format!("spawning a server thread: {e}"))?;
        threads.push(t);
    }
    say("ready");
    let control_fs = Arc::clone(&fs);
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || control(&control_fs))
        .map_err(|e| format!("spawning the control thread: {e}"))?;
    loop {
        match sys::wait(&signals).map_err(|e| format!("sigwait: {e}"))? {
            libc::SIGUSR1 => {
                fs.lock().lose_power(false);
                say("dropped");
            }
            libc::SIGUSR2 => {
                fs.lock().lose_power(true);
                say("dropped");
            }
            _ => break,
        }
    }
    stopping.store(true, Ordering::Relaxed);
    let unmounted = session.umount().map_err(|e| format!("unmounting: {e}"));
    session.wake().map_err(|e| format!("waking server threads: {e}"))?;
    for t in threads {
        let _ = t.join();
    }
    unmounted
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mountpoint, seed) = match &args[..] {
        [_, m] => (m, rand::random()),
        [_, m, s] => match s.parse() {
            Ok(seed) => (m, seed),
            Err(e) => {
                eprintln!("powerloss-fs: bad seed {s:?}: {e}");
                std::process::exit(2);
            }
        },
        _ => {
            eprintln!("usage: powerloss-fs MOUNTPOINT [SEED]");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(PathBuf::from(mountpoint), seed) {
        eprintln!("powerloss-fs: {e}");
        std::process::exit(1);
    }
}
