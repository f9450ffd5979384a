//! The `FileSystem` implementation: one function per FUSE opcode, each deciding with the
//! state, inodes and checks of the parent module.

#[allow(clippy::wildcard_imports)]
use super::*;

impl FileSystem for CtxFs {
    type Inode = u64;
    type Handle = u64;

    fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
        // No ATOMIC_O_TRUNC: the kernel checks an open's O_TRUNC (ETXTBSY for a running
        // executable) only after OPEN returns, so the truncation must come after it, as a
        // SETATTR; a control being rewritten takes that as a no-op (see `setattr`). No writeback
        // cache: session appends must reach the log one by one.
        let mut want =
            FsOptions::ASYNC_READ | FsOptions::BIG_WRITES | FsOptions::MAX_PAGES | FsOptions::PARALLEL_DIROPS;
        if self.zero_open {
            // Pages outlive opens here: drop them when a refreshed mtime shows a change.
            want |= FsOptions::AUTO_INVAL_DATA;
        }
        // POSIX ACLs: the kernel enforces them (with `default_permissions`, which every mount
        // has) and caches them; the backing files keep them; the umask is applied here, where
        // a parent's default ACL is known (`creation_mode`).
        if capable.contains(FsOptions::POSIX_ACL | FsOptions::DONT_MASK) {
            want |= FsOptions::POSIX_ACL | FsOptions::DONT_MASK;
            self.acls.store(true, Ordering::Relaxed);
        }
        Ok(capable & want)
    }

    fn lookup(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        self.stats.count("lookup");
        let n = name.to_bytes();
        if parent == ROOT && self.view.as_ref().is_some_and(|a| !a.alive(&self.storage)) {
            // The agent is gone: its view is empty.
            return Err(err(Why::NotFound));
        }
        match parent {
            ROOT => match n {
                b"status" => Ok(self.entry(
                    STATUS,
                    synthetic(STATUS, libc::S_IFREG | 0o444, self.status().len() as u64),
                    Duration::ZERO,
                )),
                b"bin" => Ok(self.entry(BIN, synthetic(BIN, libc::S_IFDIR | 0o555, 0), LONG)),
                _ => {
                    let i =
                        LAYOUT.iter().position(|d| d.as_bytes() == n).ok_or_else(|| err(Why::NotFound))?;
                    let ino = LAYOUT_FIRST + i as u64;
                    let (attr, _) = self.backed_attr(Path::new(LAYOUT[i]))?;
                    Ok(self.entry(ino, attr, LONG))
                }
            },
            BIN => {
                let i = self
                    .bins
                    .iter()
                    .position(|(b, _)| b.as_bytes() == n)
                    .ok_or_else(|| err(Why::NotFound))?;
                let ino = BIN_FIRST + i as u64;
                let st = rustix::fs::stat(&self.bins[i].1).map_err(ioerr)?;
                let mut attr = attr_of(&st, self.storage.dev());
                attr.st_ino = VIRTUAL_INO | ino;
                attr.st_mode = libc::S_IFREG | 0o555;
                attr.st_uid = 0;
                attr.st_gid = 0;
                Ok(self.entry(ino, attr, LONG))
            }
            STATUS => Err(err(Why::NotDirectory)),
            _ => {
                let dir = self.rel(parent)?;
                joined(&dir, component(name)?.as_os_str(), |rel| self.lookup_backed(rel, Some(parent)))
            }
        }
    }

    fn forget(&self, _ctx: &Context, inode: u64, count: u64) {
        lock(&self.inodes).forget(inode, count);
    }

    fn batch_forget(&self, _ctx: &Context, requests: Vec<(u64, u64)>) {
        let mut inodes = lock(&self.inodes);
        for (i, n) in requests {
            inodes.forget(i, n);
        }
    }

    fn getattr(&self, _ctx: &Context, ino: u64, h: Option<u64>) -> io::Result<(stat64, Duration)> {
        self.stats.count("getattr");
        match ino {
            ROOT => Ok((synthetic(ROOT, libc::S_IFDIR | 0o755, 0), LONG)),
            STATUS => {
                Ok((synthetic(STATUS, libc::S_IFREG | 0o444, self.status().len() as u64), Duration::ZERO))
            }
            BIN => Ok((synthetic(BIN, libc::S_IFDIR | 0o555, 0), LONG)),
            i if (BIN_FIRST..BIN_FIRST + self.bins.len() as u64).contains(&i) => {
                let st = rustix::fs::stat(&self.bins[(i - BIN_FIRST) as usize].1).map_err(ioerr)?;
                let mut attr = attr_of(&st, self.storage.dev());
                attr.st_ino = VIRTUAL_INO | i;
                attr.st_mode = libc::S_IFREG | 0o555;
                attr.st_uid = 0;
                attr.st_gid = 0;
                Ok((attr, LONG))
            }
            _ => {
                let rel = match self.rel(ino) {
                    Ok(rel) => rel,
                    // Unlinked but open: its handles still reach it.
                    Err(e) => {
                        let f = self.open_file(ino, h).or_else(|| self.kept(ino)).ok_or(e)?;
                        let st = rustix::fs::fstat(&f).map_err(ioerr)?;
                        return Ok((attr_of(&st, self.storage.dev()), Duration::ZERO));
                    }
                };
                if !self.permitted(&rel) {
                    return Err(err(Why::NotFound));
                }
                if classify(&rel) == Some(Area::Data) {
                    let st = self.data_stat(ino, &rel)?;
                    let (attr, area) = self.shown_attr(&rel, &st)?;
                    return Ok((attr, self.timeout(area)));
                }
                let (attr, area) = self.backed_attr(&rel)?;
                Ok((attr, self.timeout(area)))
            }
        }
    }

    fn setattr(
        &self,
        _ctx: &Context,
        ino: u64,
        attr: stat64,
        h: Option<u64>,
        valid: SetattrValid,
    ) -> io::Result<(stat64, Duration)> {
        self.stats.count("setattr");
        if ino < DYNAMIC_FIRST && !(LAYOUT_FIRST..LAYOUT_FIRST + LAYOUT.len() as u64).contains(&ino) {
            return Err(err(Why::ReadOnly));
        }
        let rel = match self.rel(ino) {
            Ok(rel) => rel,
            // Unlinked but open: changed through one of its handles. Only in the host view, since
            // a view's grants are decided by path.
            Err(e) => {
                let f = if self.view.is_none() {
                    self.open_file(ino, h).or_else(|| self.kept(ino))
                } else {
                    None
                };
                let f = f.ok_or(e)?;
                set_file_attr(&f, &attr, valid)?;
                let st = rustix::fs::fstat(&f).map_err(ioerr)?;
                return Ok((attr_of(&st, self.storage.dev()), Duration::ZERO));
            }
        };
        let area = classify(&rel).ok_or_else(|| err(Why::NotFound))?;
        self.may_write(&rel)?;
        match area {
            Area::Data | Area::DataRoot => {}
            // The truncation of open(O_TRUNC) (no handle; see `init`) of a control just opened for
            // rewriting: it is replaced whole when the new contents are published, never
            // truncated in place. Any other truncation of a control is refused below.
            Area::Control(_)
                if valid.contains(SetattrValid::SIZE)
                    && attr.st_size == 0
                    && h.is_none()
                    && self.rewriting(ino) =>
            {
                let (attr, _) = self.backed_attr(&rel)?;
                return Ok((attr, Duration::ZERO));
            }
            Area::SessionLog | Area::ObjectLog if !valid.contains(SetattrValid::SIZE) => {}
            _ if valid.intersects(SetattrValid::SIZE) => return Err(err(Why::Object)),
            Area::ClassDir
            | Area::Object
            | Area::Socket
            | Area::ControlDir
            | Area::Control(_)
            | Area::SessionLog
            | Area::ObjectLog => {
                return Err(err(Why::Object));
            }
        }
        let (dir, name) = self.storage.parent_of(&rel)?;
        if valid.contains(SetattrValid::MODE) {
            let fd = self.storage.open_rel(&rel, OFlags::PATH, 0)?;
            chmod_unfollowed(&fd, attr.st_mode & 0o7777)?;
        }
        if valid.intersects(SetattrValid::UID | SetattrValid::GID) {
            let (uid, gid) = owner_of(&attr, valid)?;
            rustix::fs::chownat(&dir, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW).map_err(ioerr)?;
        }
        if valid.contains(SetattrValid::SIZE) {
            let fd = self.storage.open_rel(&rel, OFlags::WRONLY, 0)?;
            let (to, was) = (
                attr.st_size as u64,
                u64::try_from(rustix::fs::fstat(&fd).map_err(ioerr)?.st_size).unwrap_or(0),
            );
            let charged = self.charge_to(&fd, to)?;
            rustix::fs::ftruncate(&fd, to).map_err(ioerr).inspect_err(|_| self.credit_bytes(charged))?;
            self.credit_bytes(was.saturating_sub(to));
            self.data_changed(ino);
        }
        if valid.intersects(SetattrValid::ATIME | SetattrValid::MTIME) {
            rustix::fs::utimensat(&dir, name, &times_of(&attr, valid), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(ioerr)?;
        }
        let (attr, _) = self.backed_attr(&rel)?;
        Ok((attr, self.ttl))
    }

    fn readlink(&self, _ctx: &Context, ino: u64) -> io::Result<Vec<u8>> {
        let rel = self.rel(ino)?;
        let (dir, name) = self.storage.parent_of(&rel)?;
        let target = rustix::fs::readlinkat(&dir, name, Vec::new()).map_err(ioerr)?;
        Ok(target.into_bytes())
    }

    fn symlink(&self, ctx: &Context, linkname: &CStr, parent: u64, name: &CStr) -> io::Result<Entry> {
        caller(ctx)?;
        let (rel, area) = self.new_child(parent, name)?;
        if area != Area::Data {
            return Err(err(Why::Object));
        }
        let (dir, leaf) = self.dir_of(parent, &rel)?;
        self.charged(|| rustix::fs::symlinkat(linkname, &dir, leaf).map_err(ioerr))?;
        give_to_caller(ctx, &dir, leaf, None, None)?;
        self.lookup_backed(&rel, None)
    }

    fn mknod(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        self.stats.count("create");
        caller(ctx)?;
        let (rel, area) = self.new_child(parent, name)?;
        if area != Area::Data {
            return Err(err(Why::Object));
        }
        let (dir, leaf) = self.dir_of(parent, &rel)?;
        let kind = rustix::fs::FileType::from_raw_mode(mode);
        let (mode, inherits) = self.creation_mode(&dir, mode, umask);
        self.charged(|| {
            rustix::fs::mknodat(&dir, leaf, kind, Mode::from_raw_mode(mode), u64::from(rdev)).map_err(ioerr)
        })?;
        let mode = Self::made_mode(mode, inherits, || {
            rustix::fs::statat(&dir, leaf, AtFlags::SYMLINK_NOFOLLOW).map_err(ioerr)
        })?;
        give_to_caller(ctx, &dir, leaf, None, Some(mode))?;
        self.lookup_backed(&rel, None)
    }

    fn mkdir(&self, ctx: &Context, parent: u64, name: &CStr, mode: u32, umask: u32) -> io::Result<Entry> {
        self.stats.count("mkdir");
        caller(ctx)?;
        let (rel, area) = self.new_child(parent, name)?;
        if area != Area::Data {
            return Err(err(Why::Object));
        }
        let (dir, leaf) = self.dir_of(parent, &rel)?;
        let (mode, inherits) = self.creation_mode(&dir, mode, umask);
        self.charged(|| rustix::fs::mkdirat(&dir, leaf, Mode::from_raw_mode(mode)).map_err(ioerr))?;
        let mode = Self::made_mode(mode, inherits, || {
            rustix::fs::statat(&dir, leaf, AtFlags::SYMLINK_NOFOLLOW).map_err(ioerr)
        })?;
        give_to_caller(ctx, &dir, leaf, None, Some(mode))?;
        self.lookup_backed(&rel, None)
    }

    fn unlink(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.remove(parent, name, AtFlags::empty())
    }

    fn rmdir(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.remove(parent, name, AtFlags::REMOVEDIR)
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
        self.stats.count("rename");
        if [olddir, newdir].iter().any(|&d| d == ROOT || d == BIN) {
            return Err(err(Why::ReadOnly));
        }
        let from = self.rel(olddir)?.join(component(oldname)?);
        let to = self.rel(newdir)?.join(component(newname)?);
        self.may_write(&from)?;
        self.may_write(&to)?;
        match (classify(&from), classify(&to)) {
            (Some(Area::Data), Some(Area::Data)) => {}
            (Some(Area::Control(_)), None) => return Err(err(Why::Object)), // unknown control name
            (Some(_), Some(_)) | (Some(_), None) => return Err(err(Why::Object)),
            (None, _) => return Err(err(Why::NotFound)),
        }
        let (fdir, fleaf) = self.dir_of(olddir, &from)?;
        let (tdir, tleaf) = self.dir_of(newdir, &to)?;
        let rflags = RenameFlags::from_bits(flags).ok_or_else(|| err(Why::Invalid))?;
        if !rflags.contains(RenameFlags::EXCHANGE) {
            self.keep_reachable(&to);
        }
        rustix::fs::renameat_with(&fdir, fleaf, &tdir, tleaf, rflags).map_err(ioerr)?;
        if rflags.contains(RenameFlags::EXCHANGE) {
            let tmp = PathBuf::from("\0exchange");
            let mut inodes = lock(&self.inodes);
            inodes.moved(&from, &tmp);
            inodes.moved(&to, &from);
            inodes.moved(&tmp, &to);
        } else {
            lock(&self.inodes).moved(&from, &to);
        }
        Ok(())
    }

    fn link(&self, _ctx: &Context, ino: u64, newparent: u64, newname: &CStr) -> io::Result<Entry> {
        let from = self.rel(ino)?;
        self.may_write(&from)?;
        let (to, area) = self.new_child(newparent, newname)?;
        if classify(&from) != Some(Area::Data) || area != Area::Data {
            return Err(err(Why::Object));
        }
        let (fdir, fleaf) = self.storage.parent_of(&from)?;
        // The file the kernel knows as `ino`, not another that took its name.
        self.is_known(ino, &rustix::fs::statat(&fdir, fleaf, AtFlags::SYMLINK_NOFOLLOW).map_err(ioerr)?)?;
        let (tdir, tleaf) = self.dir_of(newparent, &to)?;
        self.charged(|| rustix::fs::linkat(&fdir, fleaf, &tdir, tleaf, AtFlags::empty()).map_err(ioerr))?;
        self.lookup_backed(&to, None)
    }

    fn open(
        &self,
        _ctx: &Context,
        ino: u64,
        flags: u32,
        _fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        self.stats.count("open");
        if self.zero_open {
            return Err(err(Why::NotImplemented));
        }
        let write = Self::is_write(flags);
        let (h, opts) = match ino {
            STATUS if write => return Err(err(Why::NotPermitted)),
            STATUS => (Handle::Bytes(self.status()), OpenOptions::DIRECT_IO | noflush()),
            ROOT | BIN => return Err(err(Why::IsDirectory)),
            i if (BIN_FIRST..BIN_FIRST + self.bins.len() as u64).contains(&i) => {
                if write {
                    return Err(err(Why::NotPermitted));
                }
                (Handle::File(File::open(&self.bins[(i - BIN_FIRST) as usize].1)?), OpenOptions::KEEP_CACHE)
            }
            _ => {
                let rel = self.rel(ino)?;
                self.open_backed(ino, &rel, flags)?
            }
        };
        Ok((Some(self.new_handle(ino, h)), opts, None))
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        args: CreateIn,
    ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
        self.stats.count("create");
        caller(ctx)?;
        let (rel, area) = self.new_child(parent, name)?;
        let (dir, leaf) = self.dir_of(parent, &rel)?;
        let (h, opts) = match area {
            Area::Data => {
                let keep = OFlags::from_bits_retain(args.flags)
                    & (OFlags::ACCMODE
                        | OFlags::TRUNC
                        | OFlags::APPEND
                        | OFlags::EXCL
                        | OFlags::SYNC
                        | OFlags::DSYNC);
                let (mode, inherits) = self.creation_mode(&dir, args.mode, args.umask);
                let created = self.charged(|| {
                    rustix::fs::openat(
                        &dir,
                        leaf,
                        keep | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::from_raw_mode(mode),
                    )
                    .map_err(io::Error::from)
                });
                let fd = match created {
                    Ok(fd) => {
                        let mode = Self::made_mode(mode, inherits, || rustix::fs::fstat(&fd).map_err(ioerr))?;
                        give_to_caller(ctx, &dir, leaf, Some(&fd), Some(mode))?;
                        fd
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists && !keep.contains(OFlags::EXCL) => {
                        // Created by someone else since the kernel's lookup: opened as open(2)
                        // would open it, keeping its owner and mode.
                        open_existing(&dir, leaf, keep, ctx)?
                    }
                    Err(e) => return Err(e),
                };
                // A new file: its inode's stamp (if any) is cleared below, once the inode is
                // known, so that the next read-only open drops whatever the kernel had cached.
                (Handle::File(File::from(fd)), noflush())
            }
            Area::SessionLog => {
                let (mode, inherits) = self.creation_mode(&dir, args.mode, args.umask);
                let fd = self.charged(|| {
                    rustix::fs::openat(
                        &dir,
                        leaf,
                        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::from_raw_mode(mode),
                    )
                    .map_err(ioerr)
                })?;
                let mode = Self::made_mode(mode, inherits, || rustix::fs::fstat(&fd).map_err(ioerr))?;
                give_to_caller(ctx, &dir, leaf, Some(&fd), Some(mode))?;
                drop(fd);
                (Handle::Log(self.log(&rel)?), OpenOptions::DIRECT_IO | noflush())
            }
            Area::ObjectLog => {
                // The object's own log, missing when the object predates it: root-owned,
                // like every file of an installed object.
                let fd = rustix::fs::openat(
                    &dir,
                    leaf,
                    OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )
                .map_err(ioerr)?;
                drop(fd);
                (Handle::Log(self.log(&rel)?), OpenOptions::DIRECT_IO | noflush())
            }
            Area::Control(_) => {
                let fd = rustix::fs::openat(
                    &dir,
                    leaf,
                    OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::from_raw_mode(if controls::is_hook(&rel.to_string_lossy()) {
                        0o755
                    } else {
                        0o644
                    }),
                )
                .map_err(ioerr)?;
                Self::chown_to_caller(&fd, ctx)?;
                (
                    Handle::Control {
                        rel: rel.clone(),
                        buf: Vec::new(),
                        dirty: true,
                        file: None,
                        writer: ctx.pid,
                    },
                    OpenOptions::DIRECT_IO,
                )
            }
            _ => return Err(err(Why::Object)),
        };
        let entry = self.lookup_backed(&rel, None)?;
        if self.zero_open {
            // Requests on this file come without a handle (see `data`).
            return Ok((entry, None, opts, None));
        }
        if matches!(h, Handle::File(_)) {
            lock(&self.inodes).restamp(entry.inode, None);
        }
        Ok((entry, Some(self.new_handle(entry.inode, h)), opts, None))
    }

    fn read(
        &self,
        _ctx: &Context,
        ino: u64,
        handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _flags: u32,
    ) -> io::Result<usize> {
        self.stats.count("read");
        with_scratch(size as usize, |buf| self.read_into(ino, handle, buf, offset, w))
    }

    fn write(
        &self,
        ctx: &Context,
        ino: u64,
        handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        _lock_owner: Option<u64>,
        _delayed_write: bool,
        flags: u32,
        _fuse_flags: u32,
    ) -> io::Result<usize> {
        self.stats.count("write");
        // Finish reading the request before anything else: reader and writer share a buffer.
        let mut data = vec![0u8; size as usize];
        r.read_exact(&mut data)?;
        if self.zero_open && handle == 0 {
            let rel = self.rel(ino);
            if rel.as_deref().ok().and_then(classify) == Some(Area::SessionLog) {
                let rel = rel?;
                let log = self.log(&rel)?;
                return self.log_write_now(&log, ino, offset, flags, &data, Some(rel), true);
            }
            return self.inode_file(ino, true)?.write_at(&data, offset);
        }
        let h = self.handle(handle)?;
        let mut h = lock(&h);
        match &mut *h {
            Handle::File(f) => {
                let charged = self.charge_to(&*f, offset.saturating_add(data.len() as u64))?;
                let n = f.write_at(&data, offset).inspect_err(|_| self.credit_bytes(charged))?;
                drop(h);
                self.data_changed(ino);
                Ok(n)
            }
            Handle::Control { rel, buf, .. } => {
                // A control is replaced whole: writes start at 0 and follow each other. A
                // handle that saw a refused write publishes nothing: the old content stays.
                let refused = if offset != buf.len() as u64 {
                    Some((Why::Invalid, format!("write at offset {offset}, not at {}", buf.len())))
                } else if buf.len() + data.len() > controls::CONTROL_MAX {
                    Some((Why::TooLarge, format!("larger than {} bytes", controls::CONTROL_MAX)))
                } else {
                    let checked = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                    buf.extend_from_slice(&data);
                    // Line-structured controls refuse a bad complete line at once, so that even
                    // a shell, which ignores errors from close, sees the write fail.
                    check_lines(rel, &buf[checked..]).err().map(|why| (Why::Invalid, why))
                };
                if let Some((code, why)) = refused {
                    tracing::warn!(control = %rel.display(), %why, "control write refused; nothing is published");
                    *h = Handle::Bytes(Vec::new());
                    return Err(err(code));
                }
                if let Handle::Control { dirty, writer, .. } = &mut *h {
                    *dirty = true;
                    *writer = ctx.pid;
                }
                Ok(data.len())
            }
            Handle::Log(l) => {
                let l = Arc::clone(l);
                drop(h);
                // The host's data connection keeps pages of session logs.
                let rel = self.rel(ino).ok().filter(|rel| classify(rel) == Some(Area::SessionLog));
                if rel.is_some() {
                    self.charge_bytes(data.len() as u64)?;
                }
                self.log_write_now(&l, ino, offset, flags, &data, rel, false)
            }
            Handle::Bytes(_) => Err(err(Why::NotPermitted)),
            Handle::Dir(_) => Err(err(Why::IsDirectory)),
        }
    }

    fn fallocate(
        &self,
        _ctx: &Context,
        ino: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        self.stats.count("write");
        if self.zero_open && handle == 0 {
            let f = self.inode_file(ino, true)?;
            return rustix::fs::fallocate(
                &*f,
                rustix::fs::FallocateFlags::from_bits_retain(mode),
                offset,
                length,
            )
            .map_err(ioerr);
        }
        let h = self.handle(handle)?;
        let h = lock(&h);
        match &*h {
            // Only data is open writable as a plain file; anything else fails on its read-only fd.
            Handle::File(f) => {
                let flags = rustix::fs::FallocateFlags::from_bits_retain(mode);
                // A size that does not change (KEEP_SIZE, PUNCH_HOLE) charges nothing.
                let grows = !flags.intersects(
                    rustix::fs::FallocateFlags::KEEP_SIZE | rustix::fs::FallocateFlags::PUNCH_HOLE,
                );
                let charged = if grows { self.charge_to(f, offset.saturating_add(length))? } else { 0 };
                rustix::fs::fallocate(f, flags, offset, length)
                    .map_err(ioerr)
                    .inspect_err(|_| self.credit_bytes(charged))?;
                drop(h);
                self.data_changed(ino);
                Ok(())
            }
            _ => Err(err(Why::Unsupported)),
        }
    }

    fn flush(&self, ctx: &Context, _ino: u64, handle: u64, _lock_owner: u64) -> io::Result<()> {
        self.stats.count("flush");
        if self.zero_open {
            return Err(err(Why::NotImplemented));
        }
        let h = self.handle(handle)?;
        let mut h = lock(&h);
        // Every close of a descriptor flushes, also one that a forked child inherited and
        // closes at exec while the writer is still writing: only the writer's own close
        // publishes (and hears of a refusal); anything else waits for release.
        if let Handle::Control { rel, buf, dirty, writer, .. } = &mut *h
            && *dirty
            && *writer == ctx.pid
        {
            let r = self.publish_control(rel, buf);
            *dirty = false;
            return r;
        }
        Ok(())
    }

    fn fsync(&self, _ctx: &Context, ino: u64, datasync: bool, handle: u64) -> io::Result<()> {
        self.stats.count("fsync");
        if self.zero_open && handle == 0 {
            // Session appends are durable when their write returns.
            if self.rel(ino).ok().as_deref().and_then(classify) == Some(Area::SessionLog) {
                return Ok(());
            }
            let f = self.inode_file(ino, false)?;
            return if datasync { f.sync_data() } else { f.sync_all() };
        }
        let h = self.handle(handle)?;
        let h = lock(&h);
        match &*h {
            Handle::File(f) if datasync => f.sync_data(),
            Handle::File(f) => f.sync_all(),
            // Session appends are durable when their write returns; controls when published.
            _ => Ok(()),
        }
    }

    fn release(
        &self,
        _ctx: &Context,
        _ino: u64,
        _flags: u32,
        handle: u64,
        _flush: bool,
        _flock_release: bool,
        _lock_owner: Option<u64>,
    ) -> io::Result<()> {
        self.stats.count("release");
        if let Some((_, h)) = lock(&self.handles).remove(&handle)
            && let Handle::Control { rel, buf, dirty: true, .. } = &*lock(&h)
        {
            // Written but never flushed (no close reported it): publish now; errors have no one
            // to go to, so they are logged.
            if let Err(e) = self.publish_control(rel, buf) {
                tracing::info!(control = %rel.display(), error = %e, "control not published");
            }
        }
        Ok(())
    }

    /// The storage filesystem's sizes and counts, for every inode: `df` on `/ctx` (or any of
    /// its directories) sees the storage it writes to.
    fn statfs(&self, _ctx: &Context, _ino: u64) -> io::Result<libc::statvfs64> {
        self.stats.count("other");
        let v = self.storage.statvfs()?;
        #[allow(unsafe_code)]
        // SAFETY: statvfs64 is a plain C struct of integers (with private padding that cannot
        // be named), for which all zero bytes are a valid value.
        let mut st: libc::statvfs64 = unsafe { std::mem::zeroed() };
        st.f_bsize = v.f_bsize;
        st.f_frsize = v.f_frsize;
        st.f_blocks = v.f_blocks;
        st.f_bfree = v.f_bfree;
        st.f_bavail = v.f_bavail;
        st.f_files = v.f_files;
        st.f_ffree = v.f_ffree;
        st.f_favail = v.f_favail;
        st.f_fsid = v.f_fsid;
        st.f_namemax = v.f_namemax;
        Ok(st)
    }

    fn getxattr(&self, _ctx: &Context, ino: u64, name: &CStr, size: u32) -> io::Result<GetxattrReply> {
        self.stats.count("xattr");
        if let Some(value) = self.computed_xattr(ino, name.to_bytes())? {
            return if size == 0 {
                Ok(GetxattrReply::Count(value.len() as u32))
            } else if (size as usize) < value.len() {
                Err(err(Why::BufferTooSmall))
            } else {
                Ok(GetxattrReply::Value(value))
            };
        }
        if name.to_bytes() != KIND_XATTR {
            // Data keeps its own attributes, as the backing filesystem does.
            let Some((_, fd)) = self.data_inode(ino)? else { return Err(err(Why::NoAttribute)) };
            if data_xattr(name.to_bytes()).is_err() {
                return Err(err(Why::NoAttribute));
            }
            // Read whole (most values are short; at most the kernel's limit), then answered
            // as asked.
            let path = proc_fd(&fd);
            let mut value = vec![0u8; 256];
            let n = match rustix::fs::getxattr(&path, name, &mut value[..]) {
                Err(rustix::io::Errno::RANGE) => {
                    value.resize(XATTR_MAX, 0);
                    rustix::fs::getxattr(&path, name, &mut value[..]).map_err(ioerr)?
                }
                r => r.map_err(ioerr)?,
            };
            value.truncate(n);
            if size == 0 {
                return Ok(GetxattrReply::Count(n as u32));
            }
            if (size as usize) < n {
                return Err(err(Why::BufferTooSmall));
            }
            return Ok(GetxattrReply::Value(value));
        }
        let kind = self.kind_of(ino)?;
        let value = kind.as_bytes();
        if size == 0 {
            Ok(GetxattrReply::Count(value.len() as u32))
        } else if (size as usize) < value.len() {
            Err(err(Why::BufferTooSmall))
        } else {
            Ok(GetxattrReply::Value(value.to_vec()))
        }
    }

    fn listxattr(&self, _ctx: &Context, ino: u64, size: u32) -> io::Result<ListxattrReply> {
        self.stats.count("xattr");
        // CortexFS's own marker is read by name; it is listed only on the objects and controls,
        // never in `home/` and `shared/` (data, session logs), so that a copy of a file there
        // does not carry it elsewhere.
        let mut names = Vec::new();
        let data = self.data_inode(ino)?;
        let in_data_area = ino >= LAYOUT_FIRST
            && matches!(classify(&self.rel(ino)?), Some(Area::SessionLog | Area::Data | Area::DataRoot));
        if data.is_none() && !in_data_area {
            names.extend_from_slice(KIND_XATTR);
            names.push(0);
        }
        if let Some((_, fd)) = data {
            let mut list = vec![0u8; XATTR_MAX];
            let n = rustix::fs::listxattr(proc_fd(&fd), &mut list[..]).map_err(ioerr)?;
            for name in list[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
                if data_xattr(name).is_ok() {
                    names.extend_from_slice(name);
                    names.push(0);
                }
            }
        }
        if size == 0 {
            Ok(ListxattrReply::Count(names.len() as u32))
        } else if (size as usize) < names.len() {
            Err(err(Why::BufferTooSmall))
        } else {
            Ok(ListxattrReply::Names(names))
        }
    }

    /// Data files take `user.*`, `security.*` and `trusted.*` attributes as the backing
    /// filesystem does (the kernel has checked the caller's permission and capabilities before
    /// the request arrives); CortexFS's own `user.cortexfs.*` and everything that is not data
    /// stay read-only (EPERM). POSIX ACLs (`system.posix_acl_*`) are data's too: the kernel has
    /// checked that the caller owns the file and enforces them from then on; the backing
    /// filesystem keeps them and makes the mode follow.
    fn setxattr(&self, _ctx: &Context, ino: u64, name: &CStr, value: &[u8], flags: u32) -> io::Result<()> {
        self.stats.count("xattr");
        if name.to_bytes() == KIND_XATTR {
            // Copying a file copies its attributes (`cp -a`, `mv` across home/ and shared/):
            // setting the kind it already has changes nothing; any other is refused.
            return if value == self.kind_of(ino)?.as_bytes() { Ok(()) } else { Err(err(Why::Object)) };
        }
        let Some((rel, fd)) = self.data_inode(ino)? else { return Err(err(Why::Object)) };
        data_xattr(name.to_bytes())?;
        self.may_write(&rel)?;
        let flags = rustix::fs::XattrFlags::from_bits_retain(flags);
        rustix::fs::setxattr(proc_fd(&fd), name, value, flags).map_err(ioerr)
    }

    fn removexattr(&self, _ctx: &Context, ino: u64, name: &CStr) -> io::Result<()> {
        self.stats.count("xattr");
        let Some((rel, fd)) = self.data_inode(ino)? else { return Err(err(Why::Object)) };
        data_xattr(name.to_bytes())?;
        self.may_write(&rel)?;
        rustix::fs::removexattr(proc_fd(&fd), name).map_err(ioerr)
    }

    /// In the host view, a storage directory's listing is cached by the kernel (CACHE_DIR) and
    /// kept across opens while the backing directory is unchanged (KEEP_CACHE): what the host
    /// view shows of a directory depends only on its entries (and, for `<name>.d`, on `<name>`
    /// in the same directory). The kernel drops the cache itself when it changes the directory
    /// through this mount. A listing filled while another handle of the directory is open
    /// might be older than the stamp recorded last, so then nothing is cached or kept. Agent
    /// views filter listings by policy, which changes without the directory changing: never
    /// cached there.
    fn opendir(&self, _ctx: &Context, ino: u64, _flags: u32) -> io::Result<(Option<u64>, OpenOptions)> {
        self.stats.count("readdir");
        // In a view, listings follow the policies, so only an object's control directories are
        // kept (`hooks/`, `hooks/pre.d`...): what they list does not depend on the policies, and
        // they are reached only through entries that are dropped when the policies change.
        let cacheable = ino >= LAYOUT_FIRST
            && (self.view.is_none()
                || (self.view_timeout > Duration::ZERO
                    && self.rel(ino).is_ok_and(|r| {
                        classify(&r) == Some(Area::ControlDir) && r.components().count() > 2
                    })));
        // Stamp before listing, so that the listing is never older than its stamp.
        let stamp = if cacheable {
            let rel = self.rel(ino)?;
            Some(stamp_of(&self.storage.stat(&rel)?))
        } else {
            None
        };
        let handle = self.dir_handle();
        if !cacheable {
            let Handle::Dir(listing) = &mut *lock(&handle) else { unreachable!("a directory handle") };
            self.list_dir(ino, listing)?;
        }
        let id = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let mut handles = lock(&self.handles);
        let mut opts = OpenOptions::empty();
        if cacheable {
            // The kernel opens directories only with OPENDIR: every handle of `ino` is a listing.
            let alone = !handles.values().any(|(i, _)| *i == ino);
            let stamp = stamp.filter(|_| alone);
            if lock(&self.inodes).restamp(ino, stamp) {
                opts |= OpenOptions::KEEP_CACHE;
            }
            if alone {
                opts |= OpenOptions::CACHE_DIR;
            }
        }
        handles.insert(id, (ino, handle));
        Ok((Some(id), opts))
    }

    fn readdir(
        &self,
        _ctx: &Context,
        ino: u64,
        handle: u64,
        _size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.stats.count("readdir");
        let h = self.handle(handle)?;
        let mut h = lock(&h);
        let Handle::Dir(listing) = &mut *h else { return Err(err(Why::NotDirectory)) };
        if !listing.taken {
            self.list_dir(ino, listing)?;
        }
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (name, ino, t)) in listing.from(skip).enumerate() {
            let e = DirEntry {
                ino: if ino == 0 { u64::MAX } else { ino },
                offset: (skip + i) as u64 + 1,
                type_: t,
                name,
            };
            if add_entry(e)? == 0 {
                break;
            }
        }
        Ok(())
    }

    fn releasedir(&self, _ctx: &Context, _ino: u64, _flags: u32, handle: u64) -> io::Result<()> {
        let closed = lock(&self.handles).remove(&handle);
        if let Some((_, h)) = closed {
            self.spare_dir(h);
        }
        Ok(())
    }

    fn fsyncdir(&self, _ctx: &Context, ino: u64, _datasync: bool, _handle: u64) -> io::Result<()> {
        self.stats.count("fsync");
        if ino < LAYOUT_FIRST {
            return Ok(());
        }
        let fd = self.storage.dir(&self.rel(ino)?)?;
        self.is_known(ino, &rustix::fs::fstat(&fd).map_err(ioerr)?)?;
        rustix::fs::fsync(&fd).map_err(ioerr)
    }
}

impl CtxFs {
    /// A read of `buf.len()` bytes at `offset` of `ino` (through `handle`, or its kept file),
    /// into `buf`, then written to `w`.
    fn read_into(
        &self,
        ino: u64,
        handle: u64,
        buf: &mut [u8],
        offset: u64,
        w: &mut dyn ZeroCopyWriter,
    ) -> io::Result<usize> {
        if self.zero_open && handle == 0 {
            let rel = self.rel(ino);
            let n = if rel.as_deref().ok().and_then(classify) == Some(Area::SessionLog) {
                self.log(&rel?)?.read_at(buf, offset).map_err(|e| ringfs_errno(&e))?
            } else {
                self.inode_file(ino, false)?.read_at(buf, offset)?
            };
            w.write_all(&buf[..n])?;
            return Ok(n);
        }
        let h = self.handle(handle)?;
        let n = match &*lock(&h) {
            Handle::File(f) => f.read_at(buf, offset)?,
            Handle::Control { file: Some(f), .. } => f.read_at(buf, offset)?,
            Handle::Control { file: None, .. } => 0,
            Handle::Log(l) => l.read_at(buf, offset).map_err(|e| ringfs_errno(&e))?,
            Handle::Bytes(b) => {
                let from = usize::try_from(offset).unwrap_or(usize::MAX).min(b.len());
                let n = (b.len() - from).min(buf.len());
                buf[..n].copy_from_slice(&b[from..from + n]);
                n
            }
            Handle::Dir(_) => return Err(err(Why::IsDirectory)),
        };
        w.write_all(&buf[..n])?;
        Ok(n)
    }
}
