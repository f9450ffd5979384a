//! What a storage path is in the `/ctx` ABI, decided from its components alone.

use std::path::{Component, Path};

use policy::controls::{self, ObjectClass, Owner};

/// The role of a path under the storage root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Area {
    /// `tool/`, `agent/`, `model/`: objects are installed with `ctx object install`.
    ClassDir,
    /// An object's executable (`tool/<name>`, `agent/<name>`, anything under `model/`).
    Object,
    /// An object's socket (`<name>.sock`).
    Socket,
    /// An object's control directory or a directory inside it (`<name>.d/`, `hooks/...`).
    ControlDir,
    /// A control file, with who may write it.
    Control(Owner),
    /// `home/` or `shared/` themselves.
    DataRoot,
    /// Ordinary data under `home/<uid>/` or `shared/<name>/`.
    Data,
    /// A session's `messages.jsonl` or `events.jsonl`: append-only, group-committed.
    SessionLog,
    /// An object's `.d/log` (spec §6): append-only, group-committed, written by the runtime
    /// (tsh appends one line per tool call) and never rewritten.
    ObjectLog,
}

/// Components deep enough for every path the ABI names (a session log is 7 deep); deeper
/// ones are data, or controls classified by their whole path.
const DEPTH: usize = 12;

/// The normal components of `rel`, when there are at most [`DEPTH`] and each is UTF-8, without
/// an allocation; `None` otherwise.
fn names(rel: &Path) -> Option<([&str; DEPTH], usize)> {
    let mut n = [""; DEPTH];
    let mut len = 0;
    for c in rel.components() {
        let Component::Normal(c) = c else { return None };
        let c = c.to_str()?;
        if len == DEPTH {
            return None;
        }
        n[len] = c;
        len += 1;
    }
    Some((n, len))
}

/// Classifies a storage-relative path. `None` for paths the projection never shows.
pub fn classify(rel: &Path) -> Option<Area> {
    match names(rel) {
        Some((n, len)) => classify_names(rel, &n[..len], false),
        // Deep paths by the same rules, from a list of their components. A name that is not
        // UTF-8 is data's alone (no object, control or model has one): it is ignored in
        // `home/` and `shared/`, and elsewhere the path is shown as nothing.
        None => {
            let mut utf8 = true;
            let n: Vec<&str> = rel
                .components()
                .filter_map(|c| match c {
                    Component::Normal(n) => n.to_str().or_else(|| {
                        utf8 = false;
                        None
                    }),
                    _ => None,
                })
                .collect();
            if !utf8 && !matches!(n.first(), Some(&("home" | "shared"))) {
                return None;
            }
            classify_names(rel, &n, true)
        }
    }
}

/// [`classify`], from `rel`'s UTF-8 components `n`; `listed` when they are not all of its
/// components one for one (then a control's path is made from them).
fn classify_names(rel: &Path, n: &[&str], listed: bool) -> Option<Area> {
    match n {
        [] => None,
        ["tool" | "agent" | "model"] => Some(Area::ClassDir),
        ["home" | "shared"] => Some(Area::DataRoot),
        ["home" | "shared", rest @ ..] => Some(data(rest)),
        [class @ ("tool" | "agent"), name, rest @ ..] => {
            let class = ObjectClass::parse(class)?;
            if listed {
                return object(class, name, rest, &rest.join("/"));
            }
            // The control's path below `<name>.d/`, as the storage names it.
            let mut below = rel.components();
            below.next();
            below.next();
            object(class, name, rest, below.as_path().to_str()?)
        }
        ["model", rest @ ..] => {
            // Models nest as model/<provider>/<model>: directories and objects, all projected.
            let last = rest.last()?;
            if last.starts_with('.') {
                None
            } else if let Some(i) = rest.iter().position(|c| c.ends_with(".d")) {
                Some(if i + 1 == rest.len() {
                    Area::ControlDir
                } else if i + 2 == rest.len() && *last == "log" {
                    Area::ObjectLog
                } else {
                    Area::Control(Owner::Host)
                })
            } else if last.ends_with(".sock") {
                Some(Area::Socket)
            } else {
                Some(Area::Object)
            }
        }
        _ => None,
    }
}

/// `name` and what is below it (`rest`, all of it `control`).
fn object(class: ObjectClass, name: &str, rest: &[&str], control: &str) -> Option<Area> {
    if rest.is_empty() {
        if let Some(obj) = name.strip_suffix(".d") {
            return policy::name::validate(obj).ok().map(|()| Area::ControlDir);
        }
        if let Some(obj) = name.strip_suffix(".sock") {
            return policy::name::validate(obj).ok().map(|()| Area::Socket);
        }
        return policy::name::validate(name).ok().map(|()| Area::Object);
    }
    name.strip_suffix(".d").and_then(|obj| policy::name::validate(obj).ok())?;
    match rest {
        ["hooks"] | ["hooks", "pre.d" | "post.d"] => Some(Area::ControlDir),
        ["log"] => Some(Area::ObjectLog),
        _ => controls::classify(class, control).map(Area::Control),
    }
}

fn data(rest: &[&str]) -> Area {
    // home/<uid>/agent/<agent>/session/<s>/{messages,events}.jsonl
    // shared/<name>/agent/<agent>/session/<s>/{messages,events}.jsonl
    match rest {
        [_, "agent", _, "session", _, "messages.jsonl" | "events.jsonl"] => Area::SessionLog,
        _ => Area::Data,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    fn c(p: &str) -> Option<Area> {
        classify(Path::new(p))
    }

    #[test]
    fn areas() {
        assert_eq!(c("tool"), Some(Area::ClassDir));
        assert_eq!(c("tool/fs.read"), Some(Area::Object));
        assert_eq!(c("tool/fs.read.d"), Some(Area::ControlDir));
        assert_eq!(c("tool/fs.read.d/policy"), Some(Area::Control(Owner::Host)));
        assert_eq!(c("tool/fs.read.d/status"), Some(Area::Control(Owner::Runtime)));
        assert_eq!(c("tool/fs.read.d/log"), Some(Area::ObjectLog));
        assert_eq!(c("model/p/m.d/log"), Some(Area::ObjectLog));
        assert_eq!(c("tool/fs.read.d/hooks/pre.d"), Some(Area::ControlDir));
        assert_eq!(c("tool/fs.read.d/hooks/pre.d/10-x"), Some(Area::Control(Owner::Host)));
        assert_eq!(c("tool/fs.read.d/bogus"), None);
        assert_eq!(c("tool/.cortexfs-stage.x.1.2"), None);
        assert_eq!(c("agent/coder.d/system.md"), Some(Area::Control(Owner::SelfUpdatable)));
        assert_eq!(c("agent/coder.sock"), Some(Area::Socket));
        assert_eq!(c("home"), Some(Area::DataRoot));
        assert_eq!(c("home/1000/notes.txt"), Some(Area::Data));
        assert_eq!(c("home/1000/agent/coder/session/default/messages.jsonl"), Some(Area::SessionLog));
        assert_eq!(c("shared/p/agent/coder/session/s/events.jsonl"), Some(Area::SessionLog));
        assert_eq!(c("shared/p/agent/coder/session/s/latest.md"), Some(Area::Data));
        assert_eq!(c("model/openai/gpt-5"), Some(Area::Object));
        assert_eq!(c("model/main.d/driver"), Some(Area::Control(Owner::Host)));
        assert_eq!(c("status"), None);
        assert_eq!(c("home/1/a/b/c/d/e/f/g/h/i/j/k/l/m"), Some(Area::Data), "deeper than the names kept");
        assert_eq!(c("tool/t.d/a/b/c/d/e/f/g/h/i/j/k/l"), None);
        assert_eq!(c("model/a/b/c/d/e/f/g/h/i/j/k/l"), Some(Area::Object), "as deep as it goes");
        assert_eq!(c("model/a/b/c/d/e/f/g/h/i/j/k.d/l"), Some(Area::Control(Owner::Host)));
        let bad = std::ffi::OsStr::from_bytes(b"\xff");
        assert_eq!(classify(&Path::new("home/1000").join(bad)), Some(Area::Data), "a data name in any bytes");
        assert_eq!(classify(&Path::new("agent").join(bad).join("coder.d/system.md")), None);
    }
}
