//! Where tsh runs: the `/ctx` root, the caller's home, the agent terminal context (if any) and
//! the `CTX_PATH` in force (spec §3).
//!
//! The agent terminal context is not claimed by an environment variable: it is read from the
//! `status` file of the `/ctx` that tsh sees, which the server computes for the connection. An
//! agent's view says `view agent NAME session S`; the host mount says `view host`. `CTX_AGENT` and
//! `CTX_SESSION`, when set, must agree with it.
//!
//! `CTX_PATH`: inside an agent terminal the injected `CTX_PATH` is authoritative (default
//! `$CTX_ROOT/tool:$CTX_HOME/tool`); for a person, `CTX_HOME/.tshrc` (a data file), then the
//! environment, then that default.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::Fail;

/// The agent and session of an agent terminal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Agent {
    /// The agent's name.
    pub name: String,
    /// The session.
    pub session: String,
    /// The agent whose session directory it is: the agent's own, or the one its run resumes.
    pub owner: String,
    /// The shared space the session is in, when it is not in a home.
    pub space: Option<String>,
}

/// Where the `CTX_PATH` in force came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathSource {
    /// Injected by the runtime into an agent terminal.
    Injected,
    /// `CTX_HOME/.tshrc`.
    Tshrc(PathBuf),
    /// The process environment.
    Environment,
    /// The default, `$CTX_ROOT/tool:$CTX_HOME/tool`.
    Default,
}

/// tsh's view of the world.
#[derive(Clone, Debug)]
pub struct Context {
    /// `CTX_ROOT` (default `/ctx`).
    pub root: PathBuf,
    /// `CTX_HOME` (default `$CTX_ROOT/home/<uid>`).
    pub home: PathBuf,
    /// The agent terminal context, if tsh runs in one.
    pub agent: Option<Agent>,
    /// The `CTX_PATH` directories, left to right.
    pub path: Vec<PathBuf>,
    /// Where `path` came from.
    pub source: PathSource,
    /// The workspace passed on to tools (`CTX_WORKSPACE`): in an agent terminal the run's
    /// (the view's `status`), whatever the environment says; for people, `CTX_WORKSPACE`.
    pub workspace: Option<OsString>,
}

/// The identity line of a `/ctx/status` file: `Some(agent)` for an agent's view, `None` for the
/// host view.
pub fn view_of(status: &str) -> Result<Option<Agent>, String> {
    match policy::status::view(status)? {
        policy::status::View::Host => Ok(None),
        policy::status::View::Agent { name, session, session_of, space, .. } => {
            let owner = session_of.unwrap_or_else(|| name.clone());
            Ok(Some(Agent { name, session, owner, space }))
        }
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn dirs(list: Vec<String>) -> Vec<PathBuf> {
    list.into_iter().map(PathBuf::from).collect()
}

impl Context {
    /// Reads the context from the environment and `$CTX_ROOT/status`.
    pub fn from_env() -> Result<Context, Fail> {
        let root = PathBuf::from(var("CTX_ROOT").unwrap_or_else(|| "/ctx".into()));
        let uid = rustix::process::getuid().as_raw();
        let home = var("CTX_HOME").map_or_else(|| root.join("home").join(uid.to_string()), PathBuf::from);
        let status = std::fs::read_to_string(root.join("status")).ok();
        let agent = match &status {
            Some(s) => view_of(s)
                .map_err(|e| Fail::Unavailable(format!("{}: {e}", root.join("status").display())))?,
            // No CortexFS here: a person can still list what CTX_PATH holds.
            None => None,
        };
        let workspace = match (&agent, status.as_deref()) {
            (Some(_), Some(s)) => policy::status::field(s, "workspace").map(OsString::from),
            _ => std::env::var_os("CTX_WORKSPACE"),
        };
        if let Some(a) = &agent {
            for (var_name, want) in [("CTX_AGENT", &a.name), ("CTX_SESSION", &a.session)] {
                if let Some(v) = var(var_name)
                    && &v != want
                {
                    return Err(Fail::Unavailable(format!(
                        "{var_name}={v} but {} serves agent {} session {}",
                        root.display(),
                        a.name,
                        a.session
                    )));
                }
            }
        }
        let default = || vec![root.join("tool"), home.join("tool")];
        let parse_env = |v: &str| {
            policy::tshconf::parse_ctx_path(v).map(dirs).map_err(|e| Fail::Usage(format!("CTX_PATH: {e}")))
        };
        let (path, source) = if agent.is_some() {
            match var("CTX_PATH") {
                Some(v) => (parse_env(&v)?, PathSource::Injected),
                None => (default(), PathSource::Default),
            }
        } else {
            let rc = home.join(".tshrc");
            match std::fs::read(&rc) {
                Ok(text) => match policy::tshconf::parse_tshrc(&text) {
                    Ok(Some(p)) => (dirs(p), PathSource::Tshrc(rc)),
                    Ok(None) => Self::env_or_default(parse_env, default)?,
                    Err(errs) => {
                        let why: Vec<String> = errs.iter().map(ToString::to_string).collect();
                        return Err(Fail::Usage(format!("{}: {}", rc.display(), why.join("; "))));
                    }
                },
                Err(_) => Self::env_or_default(parse_env, default)?,
            }
        };
        Ok(Context { root, home, agent, path, source, workspace })
    }

    fn env_or_default(
        parse_env: impl Fn(&str) -> Result<Vec<PathBuf>, Fail>,
        default: impl Fn() -> Vec<PathBuf>,
    ) -> Result<(Vec<PathBuf>, PathSource), Fail> {
        Ok(match var("CTX_PATH") {
            Some(v) => (parse_env(&v)?, PathSource::Environment),
            None => (default(), PathSource::Default),
        })
    }

    /// `CTX_PATH` as a string.
    pub fn path_string(&self) -> String {
        let v: Vec<String> = self.path.iter().map(|p| p.display().to_string()).collect();
        v.join(":")
    }

    /// The session directory of the agent terminal, if any.
    pub fn session_dir(&self) -> Option<PathBuf> {
        let a = self.agent.as_ref()?;
        Some(match &a.space {
            Some(space) => self.root.join(policy::runtime::shared_session_path(space, &a.owner, &a.session)),
            None => self.home.join(policy::runtime::session_in_home(&a.owner, &a.session)),
        })
    }

    /// How an object path is named in records: relative to `CTX_ROOT` when below it.
    pub fn object_name(&self, path: &Path) -> String {
        path.strip_prefix(&self.root).map_or_else(|_| path.display().to_string(), |p| p.display().to_string())
    }

    /// The file that keeps this context's pins and loads between tsh processes.
    pub fn state_file(&self) -> PathBuf {
        match self.session_dir() {
            // In an agent terminal: the session's own (the one place of /ctx, but for the
            // logs, that the command-less tsh path may write).
            Some(d) => d.join("tsh.json"),
            None => self.home.join(".tsh").join("human.json"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(view_of("version 1\nview host\n"), Ok(None));
        assert_eq!(
            view_of("view agent coder session s1\nrequests 3\n"),
            Ok(Some(Agent {
                name: "coder".into(),
                session: "s1".into(),
                owner: "coder".into(),
                space: None
            }))
        );
        assert!(view_of("view agent coder\n").is_err());
        assert!(view_of("hello\n").is_err());
    }
}
