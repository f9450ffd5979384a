//! The `/ctx/status` file a view serves: one `key value` line each. Its identity lines are the
//! run's facts that a client inside a sandbox may rely on, since the daemon writes them and
//! the agent cannot: `view host` or `view agent <name> session <session>`, and in an agent's
//! view `workspace <path>` (the run's workspace as its sandbox sees it, absent when the run has
//! none) and `session_of <agent>` (when the run resumes another agent's session: the session
//! directory is that agent's).

use std::path::PathBuf;

/// What a status file says about the view serving it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum View {
    /// The host view (people).
    Host,
    /// An agent's view.
    Agent {
        /// The agent.
        name: String,
        /// Its session.
        session: String,
        /// The run's workspace, if it has one.
        workspace: Option<PathBuf>,
        /// The agent whose session the run resumes, when not its own.
        session_of: Option<String>,
        /// The shared space the session is in, when it is not in a home.
        space: Option<String>,
    },
}

/// The value of the first line `key value`, if any.
pub fn field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
}

/// Which view a status file comes from; an error when its `view` line is missing or unknown.
pub fn view(status: &str) -> Result<View, String> {
    let rest = field(status, "view").ok_or("no view line (is this a CortexFS mount?)")?;
    if rest == "host" {
        return Ok(View::Host);
    }
    let w: Vec<&str> = rest.split(' ').collect();
    if let ["agent", name, "session", session] = w.as_slice() {
        let workspace = field(status, "workspace").map(PathBuf::from);
        let session_of = field(status, "session_of").map(str::to_owned);
        let space = field(status, "session_space").map(str::to_owned);
        return Ok(View::Agent {
            name: (*name).to_owned(),
            session: (*session).to_owned(),
            workspace,
            session_of,
            space,
        });
    }
    Err(format!("unexpected status line \"view {rest}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_and_their_workspace() {
        assert_eq!(view("version 1\nview host\n"), Ok(View::Host));
        assert_eq!(
            view("view agent a session s\nworkspace /workspace\n"),
            Ok(View::Agent {
                name: "a".into(),
                session: "s".into(),
                workspace: Some("/workspace".into()),
                session_of: None,
                space: None,
            })
        );
        assert_eq!(
            view("view agent a session s\n"),
            Ok(View::Agent {
                name: "a".into(),
                session: "s".into(),
                workspace: None,
                session_of: None,
                space: None
            })
        );
        assert_eq!(
            view("view agent a session s\nsession_space team\n"),
            Ok(View::Agent {
                name: "a".into(),
                session: "s".into(),
                workspace: None,
                session_of: None,
                space: Some("team".into())
            })
        );
        assert!(view("version 1\n").is_err());
        assert!(view("view agent a\n").is_err());
    }
}
