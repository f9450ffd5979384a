//! Launch profiles: which program runs in an agent's terminal, what it needs in its home, how a
//! headless turn is spelled and resumed, and how the agent's model route becomes the CLI's own
//! configuration.
//!
//! CortexFS runs these CLIs as they are; it never re-implements their model loop, sessions or
//! approvals. A profile is data, one TOML file per CLI ([`policy::profile`] reads it): the
//! files in `ctxterm/profiles/` are built in, and a root-owned file in [`DIR`] adds a profile or
//! replaces the built-in one of its name. A profile only spells, in the CLI's own options and
//! variables, where the model is (its base URL, API and id) and which variable holds the key;
//! the key itself reaches the CLI's environment through a descriptor (see
//! [`mod@super::supervise`]), never its arguments.

use std::sync::OnceLock;

use policy::profile::{self as spec, Prompt, Session};

use super::models::Model;
use super::{Error, Result};

pub use policy::profile::Profile;

/// Where an operator's profiles are read from (`NAME.toml`, owned by root, written by no one
/// else).
pub const DIR: &str = "/etc/cortexfs/profiles";

/// The built-in profiles: every file in `ctxterm/profiles/`.
const BUILT_IN: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/profiles.rs"));

/// Every profile, and the files that could not be read (each with why).
fn loaded() -> &'static (Vec<Profile>, Vec<String>) {
    static ALL: OnceLock<(Vec<Profile>, Vec<String>)> = OnceLock::new();
    ALL.get_or_init(|| {
        let (mut all, mut bad) = (Vec::new(), Vec::new());
        for (name, text) in BUILT_IN {
            match spec::parse(name, text.as_bytes()) {
                Ok(p) => all.push(p),
                Err(e) => bad.push(e.to_string()),
            }
        }
        for (name, bytes) in operators() {
            match bytes.and_then(|b| spec::parse(&name, &b).map_err(|e| e.to_string())) {
                Ok(p) => {
                    all.retain(|q: &Profile| q.name != p.name);
                    all.push(p);
                }
                Err(e) => bad.push(format!("{DIR}/{name}.toml: {e}")),
            }
        }
        (all, bad)
    })
}

/// The operator's profile files: name and contents, or why they are not taken.
fn operators() -> Vec<(String, std::result::Result<Vec<u8>, String>)> {
    use std::os::unix::fs::MetadataExt;
    // root's: /etc
    let Ok(dir) = std::fs::read_dir(DIR) else { return Vec::new() };
    let mut out = Vec::new();
    // The directory is root's alone too: else whoever may write it could rename root's files.
    // root's: /etc
    match std::fs::symlink_metadata(DIR) {
        Ok(m) if m.is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0 => {}
        _ => {
            out.push(("*".to_owned(), Err(format!("{DIR} is not a directory of root's alone"))));
            return out;
        }
    }
    for e in dir.flatten().take(256) {
        let path = e.path();
        let Some(name) = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned) else { continue };
        if path.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let read = (|| {
            use std::io::Read;
            let f = ringfs::beneath::Tree::open(std::path::Path::new(DIR))
                .and_then(|t| t.open_regular(e.file_name(), rustix::fs::OFlags::RDONLY))
                .map_err(|e| e.to_string())?;
            let m = f.metadata().map_err(|e| e.to_string())?;
            if m.uid() != 0 || m.mode() & 0o022 != 0 {
                return Err("not root's alone (owned by root, written by no one else)".to_owned());
            }
            let mut b = Vec::new();
            f.take(spec::MAX_BYTES as u64 + 1).read_to_end(&mut b).map_err(|e| e.to_string())?;
            Ok(b)
        })();
        out.push((name, read));
    }
    out
}

/// The profile named `name`.
pub fn find(name: &str) -> Option<&'static Profile> {
    loaded().0.iter().find(|p| p.name == name)
}

/// The profile named `name`, or why there is none.
pub fn get(name: &str) -> Result<&'static Profile> {
    find(name).ok_or_else(|| {
        let bad = &loaded().1;
        let why = if bad.is_empty() { String::new() } else { format!("; not read: {}", bad.join("; ")) };
        Error::Invalid(format!("unknown profile {name:?} (known: {}){why}", names().join(" ")))
    })
}

/// Whether `name` is a profile that talks to a model (a hosted CLI).
pub fn hosted(name: &str) -> bool {
    find(name).is_some_and(|p| p.hosted)
}

/// The names of every profile.
pub fn names() -> Vec<&'static str> {
    let mut n: Vec<_> = loaded().0.iter().map(|p| p.name.as_str()).collect();
    n.sort_unstable();
    n
}

/// A model route turned into a CLI's configuration.
#[derive(Debug, Default)]
pub struct Wired {
    /// Arguments before the operator's.
    pub args: Vec<String>,
    /// Variables of the CLI.
    pub env: Vec<(String, String)>,
    /// The variable the CLI reads its key from.
    pub key_env: Option<String>,
    /// Files written into the agent's home before each run (path relative to it, contents):
    /// configuration naming the route, never the key.
    pub files: Vec<(String, String)>,
}

/// How `p` is pointed at `m`.
pub fn wire(p: &Profile, m: &Model) -> Result<Wired> {
    let refuse = |why: &str| {
        Err(Error::Invalid(format!(
            "profile {} cannot use model {} ({}): {why}",
            p.name, m.name, m.driver.api
        )))
    };
    let Some(w) = &p.model else { return refuse("this profile has no model wiring") };
    let Some(api) = w.apis.get(m.driver.api.as_str()) else {
        return refuse(if w.refuse.is_empty() { "it does not speak this API" } else { &w.refuse });
    };
    let url = m.driver.base_url.to_string();
    let key = if m.driver.needs_key { w.key_env.as_str() } else { w.keyless.as_str() };
    let vars = [
        ("url", url.as_str()),
        ("model", m.id.as_str()),
        ("api", api.as_str()),
        ("key_env", &w.key_env),
        ("key", key),
    ];
    let x =
        |t: &String| spec::expand(t, &vars).map_err(|e| Error::Invalid(format!("profile {}: {e}", p.name)));
    let mut args = w.args.iter().map(x).collect::<Result<Vec<_>>>()?;
    if m.driver.needs_key {
        args.extend(w.keyed_args.iter().map(x).collect::<Result<Vec<_>>>()?);
    }
    let env = w.env.iter().map(|(k, v)| Ok((k.clone(), x(v)?))).collect::<Result<Vec<_>>>()?;
    let mut files = Vec::new();
    for f in &w.files {
        let text = match (&f.json, &f.text) {
            (Some(j), _) => format!(
                "{:#}\n",
                spec::json_of(j, &vars).map_err(|e| Error::Invalid(format!("profile {}: {e}", p.name)))?
            ),
            (None, Some(t)) => x(t)?,
            (None, None) => String::new(),
        };
        files.push((f.path.clone(), text));
    }
    Ok(Wired { args, env, key_env: m.driver.needs_key.then(|| w.key_env.clone()), files })
}

/// The arguments that give `p` the agent's `system.md` (its instructions), in the way the
/// CLI takes them (its profile's `instructions`). Empty instructions give none.
pub fn instruct(p: &Profile, system: &str) -> Vec<String> {
    let system = system.trim();
    if system.is_empty() {
        return Vec::new();
    }
    p.instructions.iter().filter_map(|t| spec::expand(t, &[("system", system)]).ok()).collect()
}

/// A headless turn of `p`: its arguments, whether the prompt goes on standard input, and the
/// id of a conversation this turn begins (to be kept when it succeeds). `known` is the id of
/// the conversation to resume; `chosen` makes one when the profile picks its own.
pub fn turn(
    p: &Profile,
    known: Option<&str>,
    prompt: &str,
    chosen: impl FnOnce() -> std::io::Result<String>,
) -> Result<(Vec<String>, bool, Option<String>)> {
    let t = &p.turn;
    let (templates, session, new) = match known {
        Some(id) if !t.resume.is_empty() && t.session != Session::None => (&t.resume, id.to_owned(), None),
        _ if t.session == Session::Chosen => {
            let id = chosen().map_err(|e| Error::Internal(format!("a conversation id: {e}")))?;
            (&t.new, id.clone(), Some(id))
        }
        _ => (&t.new, String::new(), None),
    };
    // A prompt in the arguments never reads as an option or a file to attach (`-x`, `@path`):
    // one that begins so gets a space in front.
    let spaced;
    let prompt = if t.prompt == Prompt::Argument && prompt.starts_with(['-', '@']) {
        spaced = format!(" {prompt}");
        spaced.as_str()
    } else {
        prompt
    };
    let vars = [("prompt", prompt), ("session", session.as_str())];
    let args = templates
        .iter()
        .map(|a| spec::expand(a, &vars).map_err(|e| Error::Invalid(format!("profile {}: {e}", p.name))))
        .collect::<Result<Vec<_>>>()?;
    Ok((args, t.prompt == Prompt::Stdin, new))
}

/// The conversation id a turn of `p` printed on its standard error, when the profile finds it
/// there.
pub fn session_on_stderr(p: &Profile, stderr: &str) -> Option<String> {
    if p.turn.session != Session::Stderr {
        return None;
    }
    let prefix = p.turn.session_prefix.as_str();
    stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .map(|s| s.trim().to_owned())
        .filter(|s| is_conversation_id(s))
}

/// Whether `s` may be a CLI's conversation id as CortexFS hands it back: a word of at most 64
/// letters, digits and `-` that begins with a letter or digit (never an option).
pub fn is_conversation_id(s: &str) -> bool {
    s.len() <= 64
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sender's text is one argument and never an option or a file to attach; an id read
    /// back from the agent's session directory is never an option either.
    #[test]
    fn a_turn_keeps_the_prompt_one_argument_that_is_no_option() {
        let g = find("gemini").unwrap();
        let (args, stdin, new) = turn(g, None, "--model=x", || Ok("0b6f1c1e".into())).unwrap();
        assert_eq!(args, ["--session-id", "0b6f1c1e", "--prompt= --model=x"]);
        assert!(!stdin && new.as_deref() == Some("0b6f1c1e"));
        let p = find("pi").unwrap();
        let (args, _, _) = turn(p, None, "@/etc/shadow", || Ok(String::new())).unwrap();
        assert_eq!(args, ["-p", "--continue", " @/etc/shadow"]);
        let (args, stdin, _) =
            turn(find("codex").unwrap(), Some("abc-1"), "-x", || Ok(String::new())).unwrap();
        assert!(stdin && args.contains(&"abc-1".to_owned()) && !args.contains(&" -x".to_owned()));
        assert_eq!(session_on_stderr(find("codex").unwrap(), "session id: --evil\n"), None);
        assert_eq!(
            session_on_stderr(find("codex").unwrap(), "session id: 0199-ab\n").as_deref(),
            Some("0199-ab")
        );
    }

    #[test]
    fn every_built_in_profile_reads() {
        assert!(loaded().1.is_empty(), "{:?}", loaded().1);
        assert_eq!(names(), ["claude", "codex", "gemini", "pi", "tsh"]);
    }

    fn model(api: &str) -> Model {
        let driver =
            policy::model::parse(format!("api={api}\nbase_url=http://127.0.0.1:9/v1\n").as_bytes()).unwrap();
        Model { name: "local/m".into(), driver, id: "m-1".into() }
    }

    #[test]
    fn codex_gets_a_provider_of_its_own_and_never_the_key() {
        let w = wire(find("codex").unwrap(), &model("openai-responses")).unwrap();
        let args = w.args.join(" ");
        assert!(args.contains("model_providers.cortexfs.base_url=\"http://127.0.0.1:9/v1\""), "{args}");
        assert!(args.contains("model=\"m-1\"") && args.contains("wire_api=\"responses\""), "{args}");
        assert_eq!(w.key_env.as_deref(), Some("CORTEXFS_MODEL_KEY"));
        assert!(wire(find("claude").unwrap(), &model("openai-responses")).is_err());
        let c = wire(find("claude").unwrap(), &model("anthropic-messages")).unwrap();
        assert!(c.env.contains(&("ANTHROPIC_MODEL".into(), "m-1".into())));
        assert_eq!(c.key_env.as_deref(), Some("CORTEXFS_MODEL_KEY"));
        assert!(c.args.join(" ").contains("printenv CORTEXFS_MODEL_KEY"), "{:?}", c.args);
        let p = wire(find("pi").unwrap(), &model("openai-chat")).unwrap();
        assert_eq!(p.args, ["--provider", "cortexfs", "--model", "m-1"]);
        let (path, text) = &p.files[0];
        assert_eq!(path, ".pi/agent/models.json");
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(v["providers"]["cortexfs"]["api"], "openai-completions");
        assert_eq!(
            v["providers"]["cortexfs"]["apiKey"], "CORTEXFS_MODEL_KEY",
            "a variable's name, not a key"
        );
    }
}
