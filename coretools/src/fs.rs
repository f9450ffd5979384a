//! The file tools, all confined to the workspace: `fs.read`, `fs.list`, `fs.stat`, `fs.write`.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use serde::{Deserialize, Serialize};

use crate::input::{self, Input, non_null};
use crate::workspace::Workspace;
use crate::{Error, Result, Tool, ToolInfo, sys};

pub(crate) const READ: Tool = Tool {
    info: ToolInfo {
        name: "fs.read",
        description: "Reads a file in the workspace and writes its bytes to stdout; `offset` and \
                      `length` select a byte range.\n",
        schema: r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "path": {"type": "string", "description": "The file, relative to the workspace or absolute beneath it."},
    "offset": {"type": "integer", "minimum": 0, "description": "The first byte to read (default 0)."},
    "length": {"type": "integer", "minimum": 0, "description": "The most bytes to read (default: to the end)."}
  },
  "required": ["path"],
  "additionalProperties": false
}
"#,
    },
    usage: "fs.read PATH",
    run: read,
};

pub(crate) const LIST: Tool = Tool {
    info: ToolInfo {
        name: "fs.list",
        description: "Lists a directory in the workspace (default: the workspace itself), one name \
                      per line, sorted, directories with a trailing `/`.\n",
        schema: r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "path": {"type": "string", "description": "The directory, relative to the workspace or absolute beneath it (default: the workspace)."}
  },
  "additionalProperties": false
}
"#,
    },
    usage: "fs.list [PATH]",
    run: list,
};

pub(crate) const STAT: Tool = Tool {
    info: ToolInfo {
        name: "fs.stat",
        description: "Describes a path in the workspace as one JSON line: `path`, `type` (file, dir, \
                      symlink or other), `size`, `mode` (octal permission bits) and `mtime` (Unix \
                      seconds). A final symlink is described, not followed.\n",
        schema: r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "path": {"type": "string", "description": "The path, relative to the workspace or absolute beneath it."}
  },
  "required": ["path"],
  "additionalProperties": false
}
"#,
    },
    usage: "fs.stat PATH",
    run: stat,
};

pub(crate) const WRITE: Tool = Tool {
    info: ToolInfo {
        name: "fs.write",
        description: "Writes `content` to a file in the workspace. `replace` (the default) swaps in \
                      a complete new file atomically (a symlink at the path is replaced, not \
                      followed), `create` fails if the file exists, `append` \
                      adds to its end. On the command line the content is read from stdin.\n",
        schema: r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "path": {"type": "string", "description": "The file, relative to the workspace or absolute beneath it."},
    "content": {"type": "string", "description": "The text to write."},
    "mode": {"enum": ["create", "replace", "append"], "description": "How to write (default replace)."}
  },
  "required": ["path", "content"],
  "additionalProperties": false
}
"#,
    },
    usage: "fs.write PATH < CONTENT",
    run: write,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadInput {
    path: PathBuf,
    #[serde(default, deserialize_with = "non_null")]
    offset: Option<u64>,
    #[serde(default, deserialize_with = "non_null")]
    length: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListInput {
    #[serde(default, deserialize_with = "non_null")]
    path: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StatInput {
    path: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteInput {
    path: PathBuf,
    content: String,
    #[serde(default, deserialize_with = "non_null")]
    mode: Option<WriteMode>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum WriteMode {
    Create,
    #[default]
    Replace,
    Append,
}

/// The only argument, a path.
fn one_path(args: Vec<OsString>, tool: &Tool) -> Result<PathBuf> {
    match <[OsString; 1]>::try_from(args) {
        Ok([path]) => Ok(path.into()),
        Err(_) => Err(Error::usage(tool)),
    }
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

fn read(input: Input) -> Result<i32> {
    let req = match input {
        Input::Json(json) => input::json(&json)?,
        Input::Args(args) => ReadInput { path: one_path(args, &READ)?, offset: None, length: None },
    };
    let ws = Workspace::open()?;
    let mut file = File::from(ws.open_at(&req.path, OFlags::RDONLY, Mode::empty())?);
    if let Some(offset) = req.offset {
        file.seek(SeekFrom::Start(offset)).map_err(|e| Error::io(shown(&req.path), e))?;
    }
    let mut file = file.take(req.length.unwrap_or(u64::MAX));
    let mut out = io::stdout().lock();
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(shown(&req.path), e)),
        };
        out.write_all(&buf[..n]).map_err(Error::Stdout)?;
    }
    out.flush().map_err(Error::Stdout)?;
    Ok(0)
}

fn list(input: Input) -> Result<i32> {
    let path = match input {
        Input::Json(json) => input::json::<ListInput>(&json)?.path,
        Input::Args(args) if args.len() <= 1 => args.into_iter().next().map(PathBuf::from),
        Input::Args(_) => return Err(Error::usage(&LIST)),
    };
    let path = path.unwrap_or_else(|| ".".into());
    let ws = Workspace::open()?;
    let fd = ws.open_at(&path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
    let failed = |e| Error::io(shown(&path), e);
    let mut names = Vec::new();
    for entry in Dir::read_from(&fd).map_err(failed)? {
        let entry = entry.map_err(failed)?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            FileType::Unknown => rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory),
            _ => false,
        };
        let mut line = name.to_vec();
        if is_dir {
            line.push(b'/');
        }
        names.push(line);
    }
    names.sort_unstable();
    let mut out = BufWriter::new(io::stdout().lock());
    for name in names {
        out.write_all(&name).and_then(|()| out.write_all(b"\n")).map_err(Error::Stdout)?;
    }
    out.flush().map_err(Error::Stdout)?;
    Ok(0)
}

#[derive(Serialize)]
struct Stat<'a> {
    path: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    size: u64,
    mode: String,
    mtime: i64,
}

fn stat(input: Input) -> Result<i32> {
    let path = match input {
        Input::Json(json) => input::json::<StatInput>(&json)?.path,
        Input::Args(args) => one_path(args, &STAT)?,
    };
    let ws = Workspace::open()?;
    let fd = ws.open_at(&path, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())?;
    let st = rustix::fs::fstat(&fd).map_err(|e| Error::io(shown(&path), e))?;
    let line = serde_json::to_string(&Stat {
        path: &path.to_string_lossy(),
        kind: match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => "file",
            FileType::Directory => "dir",
            FileType::Symlink => "symlink",
            _ => "other",
        },
        size: u64::try_from(st.st_size).unwrap_or(0),
        mode: format!("{:04o}", st.st_mode & 0o7777),
        mtime: st.st_mtime,
    })
    .map_err(|e| Error::Internal(format!("stat: {e}")))?;
    writeln!(io::stdout(), "{line}").map_err(Error::Stdout)?;
    Ok(0)
}

fn write(input: Input) -> Result<i32> {
    let (path, mode, mut content): (PathBuf, WriteMode, Box<dyn Read>) = match input {
        Input::Json(json) => {
            let req: WriteInput = input::json(&json)?;
            (req.path, req.mode.unwrap_or_default(), Box::new(io::Cursor::new(req.content.into_bytes())))
        }
        Input::Args(args) => (one_path(args, &WRITE)?, WriteMode::Replace, Box::new(io::stdin().lock())),
    };
    let n = put(&Workspace::open()?, &path, mode, &mut content)?;
    writeln!(io::stdout(), "wrote {n} bytes to {}", path.display()).map_err(Error::Stdout)?;
    Ok(0)
}

/// Writes `src` to `path` and returns how many bytes were written.
fn put(ws: &Workspace, path: &Path, mode: WriteMode, src: &mut dyn Read) -> Result<u64> {
    let new = Mode::from_raw_mode(0o666);
    let flags = match mode {
        WriteMode::Create => OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
        WriteMode::Append => OFlags::WRONLY | OFlags::CREATE | OFlags::APPEND,
        WriteMode::Replace => return replace(ws, path, src),
    };
    let file = File::from(ws.open_at(path, flags, new)?);
    fill(file, src, false).map_err(|e| Error::io(shown(path), e))
}

fn fill(mut file: File, src: &mut dyn Read, sync: bool) -> io::Result<u64> {
    let n = io::copy(src, &mut file)?;
    if sync {
        file.sync_all()?;
    }
    sys::close(file)?;
    Ok(n)
}

/// Writes a temp file beside `path`, syncs it and renames it over `path`, keeping the old file's
/// permission bits; the temp file is removed if anything fails.
fn replace(ws: &Workspace, path: &Path, src: &mut dyn Read) -> Result<u64> {
    let (dir, name) = ws.parent(path)?;
    let old = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .ok()
        .filter(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile);
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".{}.tmp", std::process::id()));
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(&dir, &tmp, flags, Mode::from_raw_mode(0o666))
        .map_err(|e| Error::io(shown(path), e))?;
    let written = (|| {
        let file = File::from(fd);
        if let Some(st) = &old {
            rustix::fs::fchmod(&file, Mode::from_raw_mode(st.st_mode & 0o7777))?;
        }
        let n = fill(file, src, true)?;
        rustix::fs::renameat(&dir, &tmp, &dir, name)?;
        Ok::<_, io::Error>(n)
    })();
    if written.is_err() {
        let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
    }
    written.map_err(|e| Error::io(shown(path), e))
}
