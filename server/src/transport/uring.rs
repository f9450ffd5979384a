//! FUSE over io_uring: requests reach the daemon in buffers it registered with the kernel, and
//! one submission both sends a reply and asks for the next request.
//!
//! The kernel keeps one queue of entries per possible CPU and hands each request to the queue
//! of the CPU its caller runs on. An entry is a header buffer (the request's `fuse_in_header`,
//! its operation's own header, and the entry's bookkeeping) and a payload buffer (the rest of
//! the request: names, written data), registered with `IORING_OP_URING_CMD`
//! (`FUSE_IO_URING_CMD_REGISTER`) on the connection's `/dev/fuse`. The command completes when a
//! request is in the entry; `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` hands the reply back (the
//! `fuse_out_header` in the header buffer, the rest in the payload buffer) and waits for the
//! next request in the same entry.
//!
//! The daemon serves every queue from [`RINGS_PER_QUEUE`] threads, each with an io_uring of its
//! own that every connection shares: a connection adds entries to each ring, so a thousand views
//! cost entries, not threads, and a request that blocks one thread (an fsync) leaves the other
//! ring of its queue serving. A busy connection (the host view and its data connection) gets
//! [`BUSY_DEPTH`] entries per ring; an agent view one entry on the first ring of each queue.
//!
//! INIT, FORGET and INTERRUPT still arrive by `read(2)` on `/dev/fuse`, where the `/dev/fuse`
//! pool serves them (and every request that arrives before each queue has an entry). The INIT
//! reply is where the daemon accepts the transport: fuse-backend-rs answers INIT with the flags
//! it knows, and the pool adds `FUSE_OVER_IO_URING` to that reply (`accept`).
//!
//! The reply is written straight into the entry's buffers: data read from a file lands in the
//! payload buffer the kernel copies from, without a copy of its own.

use std::io;

use crate::errno::Why;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use fuse_backend_rs::abi::fuse_abi::{AttrOut, EntryOut, GETATTR_FH};
use fuse_backend_rs::api::filesystem::{Context, DirEntry, FileSystem, GetxattrReply, ZeroCopyWriter};
use fuse_backend_rs::file_traits::FileReadWriteVolatile;
use fuse_backend_rs::transport::{FuseBuf, FuseDevWriter, Reader};
use io_uring::{IoUring, cqueue, opcode, squeue, types};
use rustix::event::{EventfdFlags, eventfd};
use vm_memory::ByteValued;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::pool::Conn;
use crate::fs::WriteDone;

/// Opcodes of the steady state.
const OP_LOOKUP: u32 = 1;
const OP_GETATTR: u32 = 3;
const OP_READ: u32 = 15;
const OP_GETXATTR: u32 = 22;
const OP_OPENDIR: u32 = 27;
/// `FUSE_READ_LOCKOWNER`.
const READ_LOCKOWNER: u32 = 1 << 1;
const OP_READDIR: u32 = 28;
const OP_RELEASEDIR: u32 = 29;
/// The longest name a lookup brings (the kernel's `FUSE_NAME_MAX`), and its NUL.
const NAME_MAX: usize = 1024 + 1;

/// `struct fuse_getattr_in`.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct GetattrIn {
    flags: u32,
    dummy: u32,
    fh: u64,
}

/// `struct fuse_getxattr_in` and `struct fuse_getxattr_out` (a size, then padding).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct XattrSize {
    size: u32,
    padding: u32,
}

/// `struct fuse_open_in`.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct OpenIn {
    flags: u32,
    open_flags: u32,
}

/// `struct fuse_open_out`.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct OpenOut {
    fh: u64,
    open_flags: u32,
    backing_id: i32,
}

/// `struct fuse_read_in`, which READDIR brings too.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct ReadIn {
    fh: u64,
    offset: u64,
    size: u32,
    read_flags: u32,
    lock_owner: u64,
    flags: u32,
    padding: u32,
}

/// `struct fuse_release_in`.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct ReleaseIn {
    fh: u64,
    flags: u32,
    release_flags: u32,
    lock_owner: u64,
}

/// `struct fuse_dirent`, before its name.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct Dirent {
    ino: u64,
    off: u64,
    namelen: u32,
    kind: u32,
}

const _: () = assert!(
    size_of::<OpenIn>() == 8
        && size_of::<OpenOut>() == 16
        && size_of::<ReadIn>() == 40
        && size_of::<ReleaseIn>() == 24
        && size_of::<Dirent>() == 24
);

/// A read's data, written by the filesystem straight into the reply's payload buffer.
struct Payload<'a> {
    out: &'a mut [u8],
    used: usize,
}

impl io::Write for Payload<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let n = b.len().min(self.out.len() - self.used);
        self.out[self.used..self.used + n].copy_from_slice(&b[..n]);
        self.used += n;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ZeroCopyWriter for Payload<'_> {
    fn write_from(&mut self, _: &mut dyn FileReadWriteVolatile, _: usize, _: u64) -> io::Result<usize> {
        // CortexFS's reads write what they read; nothing copies from a file through here.
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    fn available_bytes(&self) -> usize {
        self.out.len() - self.used
    }
}

/// Adds directory entry `d` to the listing in `out` (of `used` bytes so far): its length, or 0
/// when it does not fit.
fn add_dirent(out: &mut [u8], used: usize, d: &DirEntry<'_>) -> usize {
    let len = size_of::<Dirent>() + d.name.len();
    let padded = (len + 7) & !7;
    let Some(room) = out.get_mut(used..used + padded) else { return 0 };
    let head = Dirent { ino: d.ino, off: d.offset, namelen: d.name.len() as u32, kind: d.type_ };
    room[..size_of::<Dirent>()].copy_from_slice(head.as_bytes());
    room[size_of::<Dirent>()..len].copy_from_slice(d.name);
    room[len..].fill(0);
    padded
}

/// Serves the requests of the steady state that need no more than their headers (a lookup,
/// attributes, a directory's listing) from the entry itself and answers in place, with nothing
/// allocated: the
/// operation's header decoded where the kernel put it, the reply encoded where the kernel
/// reads it. Returns the commit id; `None` for other requests, which fuse-backend-rs's server
/// serves.
fn steady(conn: &Conn, h: &InHeader, buf: &mut [u8], payload: usize) -> Option<u64> {
    let ctx = Context { uid: h.uid, gid: h.gid, pid: h.pid as i32 };
    let put = |buf: &mut [u8], reply: &[u8]| {
        buf[HEADER..HEADER + reply.len()].copy_from_slice(reply);
        reply.len()
    };
    let r = match h.opcode {
        OP_GETATTR => {
            let g: GetattrIn = read(&buf[IN_OUT..])?;
            let handle = (g.flags & GETATTR_FH != 0).then_some(g.fh);
            conn.fs.getattr(&ctx, h.nodeid, handle).map(|(st, t)| {
                let out = AttrOut {
                    attr_valid: t.as_secs(),
                    attr_valid_nsec: t.subsec_nanos(),
                    dummy: 0,
                    attr: st.into(),
                };
                put(buf, out.as_slice())
            })
        }
        OP_LOOKUP | OP_GETXATTR => {
            // The name is in the payload buffer, where the reply goes: copied out first.
            let mut name = [0u8; NAME_MAX];
            let len = payload.min(NAME_MAX);
            name[..len].copy_from_slice(&buf[HEADER..HEADER + len]);
            // One name, ending in its NUL (as fuse-backend-rs's server requires).
            let Ok(name) = std::ffi::CStr::from_bytes_with_nul(&name[..len]) else {
                return Some(reply(buf, h.unique, Err(io::Error::from(Why::Invalid))));
            };
            if h.opcode == OP_LOOKUP {
                conn.fs.lookup(&ctx, h.nodeid, name).map(|e| put(buf, EntryOut::from(e).as_slice()))
            } else {
                // Asked before every write (`security.capability`, to drop a file's
                // capabilities), and most often answered ENODATA.
                let x: XattrSize = read(&buf[IN_OUT..])?;
                match conn.fs.getxattr(&ctx, h.nodeid, name, x.size) {
                    Ok(GetxattrReply::Value(v)) if v.len() <= PAYLOAD => Ok(put(buf, &v)),
                    Ok(GetxattrReply::Value(_)) => Err(io::Error::from(Why::ArgumentTooLong)),
                    Ok(GetxattrReply::Count(n)) => Ok(put(buf, XattrSize { size: n, padding: 0 }.as_bytes())),
                    Err(e) => Err(e),
                }
            }
        }
        OP_READ | OP_READDIR if read::<ReadIn>(&buf[IN_OUT..])?.size as usize > PAYLOAD => {
            // More than the entry holds (the kernel asks for at most `max_pages`).
            Err(io::Error::from(Why::NoMemory))
        }
        OP_READ => {
            let r: ReadIn = read(&buf[IN_OUT..])?;
            let owner = (r.read_flags & READ_LOCKOWNER != 0).then_some(r.lock_owner);
            let mut w = Payload { out: &mut buf[HEADER..HEADER + (r.size as usize).min(PAYLOAD)], used: 0 };
            conn.fs
                .read(&ctx, h.nodeid, r.fh, &mut w, r.size, r.offset, owner, r.flags)
                .map(|n| n.min(w.used))
        }
        OP_OPENDIR => {
            let o: OpenIn = read(&buf[IN_OUT..])?;
            conn.fs.opendir(&ctx, h.nodeid, o.flags).map(|(fh, opts)| {
                let out = OpenOut { fh: fh.unwrap_or(0), open_flags: opts.bits(), backing_id: 0 };
                put(buf, out.as_bytes())
            })
        }
        OP_READDIR => {
            let r: ReadIn = read(&buf[IN_OUT..])?;
            let out = &mut buf[HEADER..HEADER + (r.size as usize).min(PAYLOAD)];
            let mut used = 0;
            conn.fs
                .readdir(&ctx, h.nodeid, r.fh, r.size, r.offset, &mut |d| {
                    let n = add_dirent(out, used, &d);
                    used += n;
                    Ok(n)
                })
                .map(|()| used)
        }
        OP_RELEASEDIR => {
            let r: ReleaseIn = read(&buf[IN_OUT..])?;
            conn.fs.releasedir(&ctx, h.nodeid, r.flags, r.fh).map(|()| 0)
        }
        _ => return None,
    };
    Some(reply(buf, h.unique, r))
}

/// Puts the header of the reply to request `unique` in the entry `buf`, whose payload holds
/// the reply's `r` bytes (or which failed); returns the commit id.
fn reply(buf: &mut [u8], unique: u64, r: io::Result<usize>) -> u64 {
    let (len, error) = match r {
        Ok(n) => (n, 0),
        Err(e) => (0, -e.raw_os_error().unwrap_or(Why::Io.errno())),
    };
    let out = OutHeader { len: (OUT_HEADER + len) as u32, error, unique };
    buf[..OUT_HEADER].copy_from_slice(out.as_bytes());
    set_ent(buf, unique, len);
    unique
}

/// `FUSE_OVER_IO_URING`, bit 41 of the INIT flags (bit 9 of `flags2`).
pub const FUSE_OVER_IO_URING: u64 = 1 << 41;
/// `FUSE_INIT_EXT`: the INIT messages carry `flags2`.
const FUSE_INIT_EXT: u32 = 1 << 30;
/// `FUSE_INIT`'s opcode.
pub(crate) const OP_INIT: u32 = 26;
/// `FUSE_WRITE`'s opcode.
pub(crate) const OP_WRITE: u32 = 16;

/// A WRITE request, from its `fuse_in_header` and `fuse_write_in` (80 bytes) and its data.
pub(crate) struct WriteRequest<'a> {
    pub(crate) unique: u64,
    pub(crate) ino: u64,
    pub(crate) fh: u64,
    pub(crate) offset: u64,
    pub(crate) flags: u32,
    pub(crate) data: &'a [u8],
}

impl<'a> WriteRequest<'a> {
    /// `head`: the in header then `fuse_write_in`; `data`: what follows them (at least
    /// `size` bytes).
    pub(crate) fn parse(head: &[u8], data: &'a [u8]) -> Option<WriteRequest<'a>> {
        let h: InHeader = read(head)?;
        let w: WriteIn = read(head.get(IN_HEADER..)?)?;
        if h.opcode != OP_WRITE {
            return None;
        }
        Some(WriteRequest {
            unique: h.unique,
            ino: h.nodeid,
            fh: w.fh,
            offset: w.offset,
            flags: w.flags,
            data: data.get(..w.size as usize)?,
        })
    }
}

/// Writes the reply to a WRITE into `out` (24 bytes): `fuse_out_header`, then `fuse_write_out`
/// when it succeeded. Returns its length.
pub(crate) fn write_reply(out: &mut [u8; 24], unique: u64, r: io::Result<usize>) -> usize {
    let (len, error, size) = match r {
        Ok(n) => (24u32, 0i32, u32::try_from(n).unwrap_or(u32::MAX)),
        Err(e) => (16, -e.raw_os_error().unwrap_or(Why::Io.errno()), 0),
    };
    out[..OUT_HEADER].copy_from_slice(OutHeader { len, error, unique }.as_bytes());
    out[OUT_HEADER..].copy_from_slice(WriteOut { size, padding: 0 }.as_bytes());
    len as usize
}

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_req_header`: `in_out` (128), `op_in` (128), `ring_ent_in_out` (32).
const IN_OUT: usize = 128;
const OP_IN: usize = 128;
const ENT: usize = IN_OUT + OP_IN;
const HEADER: usize = ENT + 32;
/// `struct fuse_in_header` and `struct fuse_out_header`.
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
/// The payload buffer: the largest request or reply payload (`max_write` and `max_pages` of
/// the INIT reply, 1 MiB).
const PAYLOAD: usize = 1 << 20;
/// Room after the payload buffer for the reply to a request whose own payload fills it (the
/// reply is written after the request, then moved into place): the largest such reply is an
/// extended attribute's value.
const SLACK: usize = (64 << 10) + 4096;
/// One entry's memory.
const ENTRY: usize = HEADER + PAYLOAD + SLACK;

/// Threads (and rings) per queue.
pub const RINGS_PER_QUEUE: usize = 2;
/// Entries per ring of a busy connection.
pub const BUSY_DEPTH: usize = 16;
/// The `user_data` of the wake-up eventfd's read.
const WAKE: u64 = u64::MAX;

/// Whether this kernel offers FUSE over io_uring to new connections
/// (`/sys/module/fuse/parameters/enable_uring`); the reason when it does not.
pub fn offered_by_kernel() -> Result<(), String> {
    const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
    match std::fs::read_to_string(PARAM) {
        Ok(s) if s.trim() == "Y" || s.trim() == "1" => Ok(()),
        Ok(_) => Err(format!("{PARAM} is N (root may set it to Y)")),
        Err(e) => Err(format!("this kernel has no FUSE over io_uring ({PARAM}: {e})")),
    }
}

/// The number of queues the kernel keeps: one per possible CPU (`nr_cpu_ids`).
fn queues() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| s.trim().split(',').filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok()).max())
        .map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()), |m| m + 1)
}

/// `struct fuse_in_header`.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct InHeader {
    len: u32,
    opcode: u32,
    unique: u64,
    nodeid: u64,
    uid: u32,
    gid: u32,
    pid: u32,
    total_extlen: u16,
    padding: u16,
}

/// `struct fuse_out_header`.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct OutHeader {
    len: u32,
    error: i32,
    unique: u64,
}

/// `struct fuse_write_in`.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct WriteIn {
    fh: u64,
    offset: u64,
    size: u32,
    write_flags: u32,
    lock_owner: u64,
    flags: u32,
    padding: u32,
}

/// `struct fuse_write_out`.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct WriteOut {
    size: u32,
    padding: u32,
}

/// `struct fuse_uring_ent_in_out`.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct EntInOut {
    flags: u64,
    commit_id: u64,
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// The start of `struct fuse_init_in`, up to `flags2` (protocol 7.36).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct InitIn {
    major: u32,
    minor: u32,
    max_readahead: u32,
    flags: u32,
    flags2: u32,
}

/// The start of `struct fuse_init_out`, up to `flags2`.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct InitOut {
    major: u32,
    minor: u32,
    max_readahead: u32,
    flags: u32,
    max_background: u16,
    congestion_threshold: u16,
    max_write: u32,
    time_gran: u32,
    max_pages: u16,
    map_alignment: u16,
    flags2: u32,
}

// The kernel's layouts, checked where they are built.
const _: () = assert!(size_of::<InHeader>() == IN_HEADER && size_of::<OutHeader>() == OUT_HEADER);
const _: () = assert!(size_of::<WriteIn>() == 40 && size_of::<WriteOut>() == 8);
const _: () = assert!(size_of::<EntInOut>() == HEADER - ENT && size_of::<InitOut>() == 36);

/// The `T` at the start of `b` (a copy: ring memory has no alignment to rely on here).
fn read<T: FromBytes>(b: &[u8]) -> Option<T> {
    T::read_from_prefix(b).ok().map(|(t, _)| t)
}

/// Whether an INIT request (`fuse_in_header` then `fuse_init_in`) offers FUSE over io_uring.
pub(crate) fn offered(req: &[u8]) -> bool {
    // fuse_init_in: major, minor, max_readahead, flags, then (7.36) flags2.
    let Some(i) = req.get(IN_HEADER..).and_then(read::<InitIn>) else { return false };
    i.flags & FUSE_INIT_EXT != 0 && (u64::from(i.flags2) << 32) & FUSE_OVER_IO_URING != 0
}

/// Adds `FUSE_OVER_IO_URING` to an INIT reply (`fuse_out_header` then `fuse_init_out`) that
/// succeeded; false when it did not, or is too short to carry `flags2`.
pub(crate) fn accept(reply: &mut [u8]) -> bool {
    let (Some(h), Some(mut o)) =
        (read::<OutHeader>(reply), reply.get(OUT_HEADER..).and_then(read::<InitOut>))
    else {
        return false;
    };
    if h.error != 0 {
        return false;
    }
    o.flags |= FUSE_INIT_EXT;
    o.flags2 |= (FUSE_OVER_IO_URING >> 32) as u32;
    o.write_to_prefix(&mut reply[OUT_HEADER..]).is_ok()
}

/// What a connection asks of the rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// Entries on every ring of every queue.
    Busy,
    /// One entry on the first ring of each queue.
    Idle,
}

enum Msg {
    Attach(Arc<Conn>, Load),
    Stop,
}

/// How a ring's thread is reached from other threads: a message, or a reply to a deferred
/// write, then a wake-up.
#[derive(Clone)]
struct Mailbox {
    tx: Sender<Msg>,
    replies: Arc<Replies>,
}

impl Mailbox {
    fn send(&self, m: Msg) {
        let _ = self.tx.send(m);
        self.replies.wake();
    }
}

/// The replies to deferred WRITEs of one ring's entries, each `(ud, unique, bytes taken or
/// -errno)`, pushed by the threads that commit logs once the bytes are durable (or failed)
/// and taken by the ring's thread. Its buffers are kept, so that a reply allocates nothing.
struct Replies {
    ready: Mutex<Vec<(u64, u64, i64)>>,
    wake: OwnedFd,
}

impl Replies {
    fn wake(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// Moves the replies ready into `into` (empty), leaving it its buffer.
    fn take(&self, into: &mut Vec<(u64, u64, i64)>) {
        if let Ok(mut ready) = self.ready.lock() {
            std::mem::swap(&mut *ready, into);
        }
    }
}

impl ringfs::log::Tell for Replies {
    fn tell(&self, [ud, unique, size]: [u64; 3], outcome: ringfs::Result<u64>) {
        let r = match outcome {
            Ok(_) => i64::try_from(size).unwrap_or(i64::MAX),
            Err(e) => -i64::from(e.errno()),
        };
        if let Ok(mut ready) = self.ready.lock() {
            ready.push((ud, unique, r));
        }
        self.wake();
    }
}

struct Ring {
    mailbox: Mutex<Mailbox>,
    thread: Option<JoinHandle<()>>,
}

/// The rings: [`RINGS_PER_QUEUE`] serving threads per queue.
pub struct Rings {
    rings: Vec<Ring>,
}

impl std::fmt::Debug for Rings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rings").field("rings", &self.rings.len()).finish()
    }
}

impl Rings {
    /// Starts the serving threads, after checking that io_uring can carry FUSE commands here.
    pub fn new() -> io::Result<Rings> {
        let mut rings = Vec::new();
        for qid in 0..queues() {
            for k in 0..RINGS_PER_QUEUE {
                let ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder().build(256)?;
                let wake = eventfd(0, EventfdFlags::CLOEXEC)?;
                let (tx, rx) = channel();
                let replies = Arc::new(Replies { ready: Mutex::new(Vec::with_capacity(64)), wake });
                let mailbox = Mailbox { tx, replies };
                let qid = u16::try_from(qid).map_err(|_| io::Error::other("too many CPUs"))?;
                let own = mailbox.clone();
                let thread = std::thread::Builder::new()
                    .name(format!("fuse-ring-{qid}.{k}"))
                    .spawn(move || serve(ring, qid, k, &rx, &own))?;
                rings.push(Ring { mailbox: Mutex::new(mailbox), thread: Some(thread) });
            }
        }
        Ok(Rings { rings })
    }

    /// Registers `conn`'s entries (after its INIT reply accepted the transport).
    pub(crate) fn attach(&self, conn: &Arc<Conn>, load: Load) {
        for (i, r) in self.rings.iter().enumerate() {
            if load == Load::Idle && i % RINGS_PER_QUEUE != 0 {
                continue;
            }
            if let Ok(m) = r.mailbox.lock() {
                m.send(Msg::Attach(Arc::clone(conn), load));
            }
        }
    }

    /// Stops the threads (after every connection was unmounted).
    pub fn shutdown(&mut self) {
        for r in &self.rings {
            if let Ok(m) = r.mailbox.lock() {
                m.send(Msg::Stop);
            }
        }
        for r in &mut self.rings {
            if let Some(t) = r.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Rings {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Anonymous memory of one entry, mapped on its own so that the pages a request never
/// touches are never resident.
struct Memory {
    ptr: *mut u8,
    len: usize,
}

impl Memory {
    fn new(len: usize) -> io::Result<Memory> {
        // SAFETY: a fresh private anonymous mapping, at an address the kernel chooses: it
        // aliases nothing.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )?
        };
        Ok(Memory { ptr: ptr.cast(), len })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `len` bytes, readable and writable, for as long as `self` lives;
        // the borrow of `self` keeps this slice the only one.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no slice of it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
    }
}

/// One registered entry: its memory, and the two `iovec`s the kernel was given for it.
struct Entry {
    mem: Memory,
    iov: [libc::iovec; 2],
}

/// A connection's entries on one ring.
struct Attached {
    conn: Arc<Conn>,
    /// Allocated once and never grown: the kernel holds the addresses of their `iov`s.
    entries: Vec<Entry>,
    /// Entries the kernel still holds.
    live: usize,
}

fn user_data(slot: usize, idx: usize) -> u64 {
    ((slot as u64) << 16) | idx as u64
}

/// An `IORING_OP_URING_CMD` for the connection `fd` on queue `qid`.
fn command(
    fd: RawFd,
    op: u32,
    qid: u16,
    commit_id: u64,
    iov: *const libc::iovec,
    ud: u64,
) -> squeue::Entry128 {
    // struct fuse_uring_cmd_req: flags, commit_id, qid, padding.
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let e = opcode::UringCmd80::new(types::Fd(fd), op).cmd(cmd).addr(Some(iov as u64)).build().user_data(ud);
    // The kernel takes the number of iovecs from the entry's `len`, which the crate's builder
    // does not set.
    // SAFETY: `Entry128` is `repr(C)`, 128 bytes of plain integers (an `io_uring_sqe` and 64
    // more bytes), valid for any bit pattern, as is `[u8; 128]`.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    // io_uring_sqe.len, at byte 24.
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// One ring's thread.
fn serve(
    mut ring: IoUring<squeue::Entry128, cqueue::Entry>,
    qid: u16,
    k: usize,
    rx: &Receiver<Msg>,
    mailbox: &Mailbox,
) {
    crate::fs::prepare_thread();
    let wake = &mailbox.replies.wake;
    let mut replies: Vec<(u64, u64, i64)> = Vec::with_capacity(64);
    // On the queue's own CPU, as the kernel hands this queue the requests of callers running
    // there: serving one is then a switch on that CPU, not a wake-up across CPUs.
    let mut cpu = rustix::thread::CpuSet::new();
    cpu.set(usize::from(qid));
    if let Err(e) = rustix::thread::sched_setaffinity(None, &cpu) {
        tracing::debug!(error = %e, qid, "cannot keep a ring thread on its queue's CPU");
    }
    let mut slots: Vec<Option<Attached>> = Vec::new();
    let mut wake_buf = [0u8; 8];
    let mut todo: Vec<squeue::Entry128> = Vec::new();
    let mut done: Vec<(u64, i32)> = Vec::new();
    let arm_wake = |buf: &mut [u8; 8]| {
        squeue::Entry128::from(
            opcode::Read::new(types::Fd(wake.as_fd().as_raw_fd()), buf.as_mut_ptr(), 8)
                .build()
                .user_data(WAKE),
        )
    };
    todo.push(arm_wake(&mut wake_buf));
    let mut stopping = false;
    loop {
        for e in todo.drain(..) {
            // SAFETY: every buffer an entry names stays valid until its completion: the waker's
            // buffer lives on this stack frame, which returns only after the ring is dropped,
            // and an entry's memory is dropped only after the kernel ended its command.
            while unsafe { ring.submission().push(&e) }.is_err() {
                if let Err(e) = ring.submit() {
                    tracing::error!(error = %e, qid, "io_uring submit failed");
                    return;
                }
            }
        }
        if stopping {
            // Dropping the ring cancels the commands it still holds; their entries are freed
            // after it (`slots` is dropped last).
            drop(ring);
            drop(slots);
            return;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error() == Some(Why::Busy.errno()) => {}
            Err(e) => {
                tracing::error!(error = %e, qid, "io_uring wait failed");
                return;
            }
        }
        done.extend(ring.completion().map(|c| (c.user_data(), c.result())));
        for (ud, res) in done.drain(..) {
            if ud == WAKE {
                mailbox.replies.take(&mut replies);
                for (ud, unique, r) in replies.drain(..) {
                    let (slot, idx) = ((ud >> 16) as usize, (ud & 0xffff) as usize);
                    if let Some(Some(a)) = slots.get_mut(slot)
                        && let Some(entry) = a.entries.get_mut(idx)
                    {
                        let result = if r < 0 {
                            Err(io::Error::from_raw_os_error(i32::try_from(-r).unwrap_or(Why::Io.errno())))
                        } else {
                            Ok(usize::try_from(r).unwrap_or(usize::MAX))
                        };
                        let mut out = [0u8; 24];
                        let n = write_reply(&mut out, unique, result);
                        let buf = entry.mem.bytes();
                        buf[..OUT_HEADER].copy_from_slice(&out[..OUT_HEADER]);
                        buf[HEADER..HEADER + n - OUT_HEADER].copy_from_slice(&out[OUT_HEADER..n]);
                        set_ent(buf, unique, n - OUT_HEADER);
                        let fd = a.conn.file.as_raw_fd();
                        todo.push(command(fd, CMD_COMMIT_AND_FETCH, qid, unique, entry.iov.as_ptr(), ud));
                    }
                }
                while let Ok(m) = rx.try_recv() {
                    match m {
                        Msg::Stop => stopping = true,
                        Msg::Attach(conn, load) => {
                            let depth = if load == Load::Busy { BUSY_DEPTH } else { 1 };
                            if let Err(e) = register(&mut slots, conn, depth, qid, &mut todo) {
                                tracing::warn!(error = %e, qid, k, "cannot make ring entries");
                            }
                        }
                    }
                }
                todo.push(arm_wake(&mut wake_buf));
                continue;
            }
            let (slot, idx) = ((ud >> 16) as usize, (ud & 0xffff) as usize);
            let Some(Some(a)) = slots.get_mut(slot) else { continue };
            if res == -Why::TryAgain.errno() || res == -Why::Interrupted.errno() {
                // Registered too early, or interrupted: register the entry again.
                let fd = a.conn.file.as_raw_fd();
                if let Some(entry) = a.entries.get(idx) {
                    todo.push(command(fd, CMD_REGISTER, qid, 0, entry.iov.as_ptr(), ud));
                }
                continue;
            }
            if res < 0 {
                // The connection ended (ENOTCONN), or the kernel refused the entry.
                if res != -Why::NotConnected.errno() && res != -Why::Cancelled.errno() {
                    tracing::warn!(error = %io::Error::from_raw_os_error(-res), qid, "a ring entry ended");
                }
                a.live -= 1;
                if a.live == 0 {
                    slots[slot] = None;
                }
                continue;
            }
            a.conn.wire.ring_requests.fetch_add(1, Ordering::Relaxed);
            let fd = a.conn.file.as_raw_fd();
            let Some(entry) = a.entries.get_mut(idx) else { continue };
            // None: a deferred write, answered through the mailbox once durable.
            if let Some(commit_id) = handle(&a.conn, entry.mem.bytes(), ud, Some(mailbox)) {
                todo.push(command(fd, CMD_COMMIT_AND_FETCH, qid, commit_id, entry.iov.as_ptr(), ud));
            }
        }
    }
}

/// Makes `depth` entries for `conn` and queues their registration.
fn register(
    slots: &mut Vec<Option<Attached>>,
    conn: Arc<Conn>,
    depth: usize,
    qid: u16,
    todo: &mut Vec<squeue::Entry128>,
) -> io::Result<()> {
    let slot = slots.iter().position(Option::is_none).unwrap_or_else(|| {
        slots.push(None);
        slots.len() - 1
    });
    let mut entries = Vec::with_capacity(depth);
    for _ in 0..depth {
        let mut mem = Memory::new(ENTRY)?;
        let base = mem.bytes().as_mut_ptr();
        let iov = [
            libc::iovec { iov_base: base.cast(), iov_len: HEADER },
            // SAFETY: HEADER < ENTRY, inside the mapping.
            libc::iovec { iov_base: unsafe { base.add(HEADER) }.cast(), iov_len: PAYLOAD },
        ];
        entries.push(Entry { mem, iov });
    }
    let fd = conn.file.as_raw_fd();
    for (i, e) in entries.iter().enumerate() {
        todo.push(command(fd, CMD_REGISTER, qid, 0, e.iov.as_ptr(), user_data(slot, i)));
    }
    slots[slot] = Some(Attached { conn, entries, live: depth });
    Ok(())
}

/// Sets `ring_ent_in_out` for a reply: flags, commit_id, payload_sz, padding, reserved.
fn set_ent(buf: &mut [u8], unique: u64, payload: usize) {
    let ent = EntInOut { flags: 0, commit_id: unique, payload_sz: payload as u32, padding: 0, reserved: 0 };
    buf[ENT..HEADER].copy_from_slice(ent.as_bytes());
}

/// Serves the request in the entry `buf` (registered as `ud`) and leaves the reply there;
/// returns the commit id (the request's `unique`). A WRITE to a log is not answered here: its
/// bytes join the log's next batch, and the reply comes through `mailbox` once they are
/// durable (None). Without a mailbox, every request is answered in place.
fn handle(conn: &Conn, buf: &mut [u8], ud: u64, mailbox: Option<&Mailbox>) -> Option<u64> {
    if buf.len() < HEADER + PAYLOAD {
        return None;
    }
    let mut inh = [0u8; IN_HEADER];
    inh.copy_from_slice(&buf[..IN_HEADER]);
    let h: InHeader = read(&inh)?;
    let ent: EntInOut = read(&buf[ENT..])?;
    let (unique, in_len) = (h.unique, h.len as usize);
    let payload = (ent.payload_sz as usize).min(PAYLOAD);
    if let (OP_WRITE, Some(mailbox)) = (h.opcode, mailbox) {
        let mut head = [0u8; IN_HEADER + 40];
        head[..IN_HEADER].copy_from_slice(&inh);
        head[IN_HEADER..].copy_from_slice(&buf[IN_OUT..IN_OUT + 40]);
        if let Some(w) = WriteRequest::parse(&head, &buf[HEADER..HEADER + payload]) {
            let to: Arc<dyn ringfs::log::Tell> = mailbox.replies.clone();
            let deferred = conn.fs.write_deferred(
                w.ino,
                w.fh,
                w.offset,
                w.flags,
                w.data,
                WriteDone::Tell(to, [ud, unique]),
            );
            if deferred {
                return None;
            }
        }
    }
    if let Some(n) = steady(conn, &h, buf, payload) {
        return Some(n);
    }
    // The operation's own header: what the request holds beyond its header and payload.
    let op = in_len.saturating_sub(IN_HEADER + payload).min(OP_IN);
    // Rebuild the request as `/dev/fuse` delivers it (header, operation header, payload),
    // ending where the payload ends; without a payload, 16 bytes short of the payload
    // buffer, so that the reply can be written with its data in place.
    let end = if payload == 0 { HEADER - OUT_HEADER } else { HEADER };
    let start = end - op - IN_HEADER;
    buf.copy_within(IN_OUT..IN_OUT + op, end - op);
    buf[start..start + IN_HEADER].copy_from_slice(&inh);
    let total = (IN_HEADER + op + payload) as u32;
    buf[start..start + 4].copy_from_slice(&total.to_ne_bytes());
    // The reply goes after the request.
    let at = if payload == 0 { HEADER - OUT_HEADER } else { (HEADER + payload + 7) & !7 };
    let (req, rest) = buf.split_at_mut(at);
    let cap = rest.len();
    let served = (|| {
        let reader = Reader::from_fuse_buffer(FuseBuf::new(&mut req[start..end + payload])).ok()?;
        // A buffered writer over `rest`: fuse-backend-rs then writes every reply into
        // memory, and writes it to the descriptor only on `commit`, which, with no descriptor
        // (-1), fails after the reply is in place.
        let mut w = FuseDevWriter::<()>::new(-1, rest).ok()?;
        let w = w.split_at(0).ok()?;
        let _ = conn.server.handle_message(reader, w.into(), None, None);
        Some(())
    })();
    let o = read::<OutHeader>(&buf[at..]);
    let out_len = o.as_ref().map_or(0, |o| o.len as usize);
    let replied = served.is_some()
        && o.is_some_and(|o| o.unique == unique)
        && (OUT_HEADER..=cap.min(OUT_HEADER + PAYLOAD)).contains(&out_len);
    let data = if replied { out_len - OUT_HEADER } else { 0 };
    let mut out = [0u8; OUT_HEADER];
    if replied {
        out.copy_from_slice(&buf[at..at + OUT_HEADER]);
        if at + OUT_HEADER != HEADER {
            buf.copy_within(at + OUT_HEADER..at + OUT_HEADER + data, HEADER);
        }
    } else {
        out.copy_from_slice(OutHeader { len: OUT_HEADER as u32, error: -Why::Io.errno(), unique }.as_bytes());
    }
    buf[..OUT_HEADER].copy_from_slice(&out);
    set_ent(buf, unique, data);
    Some(unique)
}

/// Serves `entry`, the bytes of a ring entry as the kernel fills one (its headers, then the
/// payload buffer), on a filesystem of an empty storage of its own, as a ring worker would:
/// the decoder's fuzz target. Whatever the bytes, it answers or refuses, and never panics.
#[cfg(feature = "fuzz")]
pub fn serve_entry_bytes(entry: &[u8]) -> Option<u64> {
    static CONN: std::sync::OnceLock<Option<Conn>> = std::sync::OnceLock::new();
    let conn = CONN
        .get_or_init(|| {
            // One storage, emptied at each start of the target.
            let dir = std::env::temp_dir().join("cortexfs-ring-fuzz");
            let _ = std::fs::remove_dir_all(&dir);
            let fs = crate::CtxFs::new(crate::Config::new(dir, Vec::new())).ok()?;
            Some(Conn::detached(Arc::new(fs)))
        })
        .as_ref()?;
    let mut buf = vec![0u8; HEADER + PAYLOAD];
    let n = entry.len().min(buf.len());
    buf[..n].copy_from_slice(&entry[..n]);
    handle(conn, &mut buf, 0, None)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::errno::Why;

    use zerocopy::{FromBytes, IntoBytes};

    use super::{
        HEADER, IN_OUT, InHeader, OP_LOOKUP, OP_READ, OP_READDIR, OutHeader, PAYLOAD, ReadIn, steady,
    };
    use crate::transport::pool::Conn;
    use crate::{Config, CtxFs};

    fn conn() -> (tempfile::TempDir, Conn) {
        let dir = tempfile::tempdir().unwrap();
        let fs = CtxFs::new(Config::new(dir.path().to_owned(), Vec::new())).unwrap();
        (dir, Conn::detached(Arc::new(fs)))
    }

    /// Serves the request of `opcode` on the root, with operation header `op` and `payload`,
    /// in a ring entry of its own; the reply's error (0 or a negative errno) and length.
    fn serve(conn: &Conn, opcode: u32, op: &[u8], payload: &[u8]) -> (i32, usize) {
        let mut buf = vec![0u8; HEADER + PAYLOAD + 4096];
        let h = InHeader {
            len: (40 + op.len() + payload.len()) as u32,
            opcode,
            unique: 7,
            nodeid: 1,
            uid: 0,
            gid: 0,
            pid: 1,
            total_extlen: 0,
            padding: 0,
        };
        buf[IN_OUT..IN_OUT + op.len()].copy_from_slice(op);
        buf[HEADER..HEADER + payload.len()].copy_from_slice(payload);
        assert_eq!(steady(conn, &h, &mut buf, payload.len()), Some(7), "served in place");
        let (o, _) = OutHeader::read_from_prefix(&buf).unwrap();
        assert_eq!(o.unique, 7);
        (o.error, o.len as usize)
    }

    fn read_in(size: usize) -> ReadIn {
        ReadIn { fh: 0, offset: 0, size: size as u32, read_flags: 0, lock_owner: 0, flags: 0, padding: 0 }
    }

    #[test]
    fn a_read_or_listing_larger_than_the_entry_is_refused_with_enomem() {
        let (_dir, conn) = conn();
        for opcode in [OP_READ, OP_READDIR] {
            let (error, len) = serve(&conn, opcode, read_in(PAYLOAD + 1).as_bytes(), &[]);
            assert_eq!((error, len), (-Why::NoMemory.errno(), 16), "opcode {opcode}");
        }
        // The entry's size is served (here, a listing of the root without a handle).
        let (error, _) = serve(&conn, OP_READDIR, read_in(PAYLOAD).as_bytes(), &[]);
        assert_ne!(error, -Why::NoMemory.errno());
    }

    #[test]
    fn a_name_must_end_in_its_nul() {
        let (_dir, conn) = conn();
        // The positive control: `home` in the root, ending in its NUL.
        let (error, len) = serve(&conn, OP_LOOKUP, &[], b"home\0");
        assert_eq!(error, 0);
        assert!(len > 16, "an entry came back");
        for bad in [&b"home"[..], b"ho\0me\0", b"home\0\0"] {
            assert_eq!(serve(&conn, OP_LOOKUP, &[], bad).0, -Why::Invalid.errno(), "{bad:?}");
        }
    }
}
