//! Launch profiles as data: how a hosted CLI is started, driven headless, resumed and pointed at
//! the agent's model route, one TOML file per CLI.
//!
//! A profile names the program and spells, in the CLI's own options, variables and files,
//! everything the launcher hands it. Its strings are templates: `{name}` is replaced by a value
//! the launcher knows at that point, `{name:quoted}` by the value as a quoted string (JSON's
//! and TOML's basic string), `{{` and `}}` are braces. A name a field does not know is refused
//! when the file is read, never at a run.
//!
//! ```toml
//! program = "/usr/bin/mycli"
//! install = "npm install -g mycli"
//! hosted = true                           # it talks to a model
//! env = { MYCLI_HOME = "/home/agent/.mycli" }
//! dirs = [".mycli"]                       # made in the agent's home before a run
//! seed = { ".mycli/state.json" = "{}" }   # made when missing, never changed after
//! args = ["--no-update"]                  # before everything else
//! instructions = ["--system", "{system}"] # how the agent's system.md is given
//!
//! [turn]                                  # a headless turn (the agent socket)
//! new = ["-p", "{prompt}", "--session-id", "{session}"]
//! resume = ["-p", "{prompt}", "--resume", "{session}"]
//! prompt = "argument"                     # or "stdin"
//! session = "chosen"                      # "chosen" (a UUID the launcher picks), "stderr", "none"
//!
//! [model]                                 # how a model route becomes the CLI's configuration
//! key_env = "MYCLI_KEY"                   # the variable the key reaches it in
//! apis = { openai-chat = "chat" }         # the driver APIs it speaks, as it spells them
//! refuse = "mycli speaks chat completions only"
//! args = ["--base-url", "{url}", "--model", "{model}", "--api", "{api}"]
//! keyed_args = ["--key-from", "{key_env}"] # only when the route has a key
//! env = { MYCLI_MODEL = "{model}" }
//! files = [{ path = ".mycli/models.json", json = { url = "{url}", key = "{key}" } }]
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

/// The largest profile file read.
pub const MAX_BYTES: usize = 64 * 1024;

/// A launch profile.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Its name (the file's stem).
    #[serde(skip)]
    pub name: String,
    /// The program, as seen inside the sandbox.
    pub program: String,
    /// Where it comes from, for the error when it is missing.
    #[serde(default)]
    pub install: String,
    /// Whether it talks to a model (and so resolves the agent's).
    #[serde(default)]
    pub hosted: bool,
    /// Environment it needs.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Directories made in the agent's home before a run.
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Files made in the agent's home when missing, never changed once there.
    #[serde(default)]
    pub seed: BTreeMap<String, String>,
    /// Arguments before everything else.
    #[serde(default)]
    pub args: Vec<String>,
    /// How the agent's instructions are given (`{system}`); none when empty.
    #[serde(default)]
    pub instructions: Vec<String>,
    /// A headless turn.
    #[serde(default)]
    pub turn: Turn,
    /// The model route's wiring; a hosted profile without it runs with the CLI's own
    /// configuration only.
    pub model: Option<Wiring>,
}

/// A headless turn: the arguments of a new conversation and of a resumed one.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// The arguments that begin a conversation (`{prompt}`, `{session}`).
    #[serde(default)]
    pub new: Vec<String>,
    /// The arguments that resume one (`{prompt}`, `{session}`); empty: every turn is `new`.
    #[serde(default)]
    pub resume: Vec<String>,
    /// Where the prompt goes.
    #[serde(default)]
    pub prompt: Prompt,
    /// How the conversation's id is known.
    #[serde(default)]
    pub session: Session,
    /// For `session = "stderr"`: the line's beginning that precedes the id.
    #[serde(default)]
    pub session_prefix: String,
}

/// Where a turn's prompt goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Prompt {
    /// On standard input.
    #[default]
    Stdin,
    /// In the arguments (`{prompt}`); standard input is empty.
    Argument,
}

/// How a conversation's id is known, to resume it at the next turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Session {
    /// The CLI continues its own last conversation; no id is kept.
    #[default]
    None,
    /// The launcher picks a UUID and hands it over in `new` (`{session}`).
    Chosen,
    /// The CLI prints it on standard error after `session_prefix`.
    Stderr,
}

/// How a model route becomes the CLI's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wiring {
    /// The variable the CLI reads its key from.
    pub key_env: String,
    /// `{key}` when the route has no key.
    #[serde(default = "none_word")]
    pub keyless: String,
    /// The driver APIs it speaks (`openai-responses`, ...), each as the CLI spells it (`{api}`).
    pub apis: BTreeMap<String, String>,
    /// Why a route of another API is refused.
    #[serde(default)]
    pub refuse: String,
    /// Arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Arguments only when the route has a key.
    #[serde(default)]
    pub keyed_args: Vec<String>,
    /// Variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Files written into the agent's home before each run: configuration naming the route,
    /// never the key.
    #[serde(default)]
    pub files: Vec<FileTemplate>,
}

fn none_word() -> String {
    "none".into()
}

/// A file of the CLI's configuration: JSON built from a table (each string expanded), or text.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileTemplate {
    /// Relative to the agent's home.
    pub path: String,
    /// A JSON document.
    pub json: Option<toml::Value>,
    /// A text template.
    pub text: Option<String>,
}

/// A profile that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// The names a model wiring's templates know.
pub const MODEL_VARS: [&str; 5] = ["url", "model", "api", "key_env", "key"];
/// The names a turn's templates know.
pub const TURN_VARS: [&str; 2] = ["prompt", "session"];
/// The names the instructions know.
pub const SYSTEM_VARS: [&str; 1] = ["system"];

/// Reads the profile `name` from `bytes`.
pub fn parse(name: &str, bytes: &[u8]) -> Result<Profile, Invalid> {
    let bad = |why: String| Invalid(format!("profile {name}: {why}"));
    if name.is_empty()
        || name.len() > 64
        || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err(Invalid(format!("profile {name:?}: a name is 1-64 of a-z 0-9 - _")));
    }
    if bytes.len() > MAX_BYTES {
        return Err(bad(format!("larger than {MAX_BYTES} bytes")));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8".into()))?;
    let mut p: Profile = toml::from_str(text).map_err(|e| bad(e.message().to_owned()))?;
    p.name = name.to_owned();
    if !p.program.starts_with('/') || crate::path::check_absolute(&p.program).is_err() {
        return Err(bad(format!("program {:?} is not an absolute path", p.program)));
    }
    for k in p.env.keys().chain(p.model.iter().flat_map(|m| m.env.keys())) {
        if !is_var(k) {
            return Err(bad(format!("{k:?} is not a variable name")));
        }
    }
    if let Some(m) = &p.model
        && !is_var(&m.key_env)
    {
        return Err(bad(format!("key_env {:?} is not a variable name", m.key_env)));
    }
    let homes = p
        .dirs
        .iter()
        .chain(p.seed.keys())
        .chain(p.model.iter().flat_map(|m| m.files.iter().map(|f| &f.path)));
    for rel in homes {
        if crate::path::check_relative(rel).is_err() {
            return Err(bad(format!("{rel:?} is not a path inside the agent's home")));
        }
    }
    let check = |ts: &[String], vars: &[&str], what: &str| -> Result<(), Invalid> {
        for t in ts {
            expand(t, &vars.iter().map(|v| (*v, "")).collect::<Vec<_>>())
                .map_err(|e| bad(format!("{what}: {e}")))?;
        }
        Ok(())
    };
    check(&p.instructions, &SYSTEM_VARS, "instructions")?;
    check(&p.turn.new, &TURN_VARS, "turn.new")?;
    check(&p.turn.resume, &TURN_VARS, "turn.resume")?;
    if p.turn.session == Session::Stderr && p.turn.session_prefix.is_empty() {
        return Err(bad("turn.session = \"stderr\" needs turn.session_prefix".into()));
    }
    if p.turn.prompt == Prompt::Argument && !p.turn.new.iter().any(|a| a.contains("{prompt")) {
        return Err(bad("turn.prompt = \"argument\" needs {prompt} in turn.new".into()));
    }
    if let Some(m) = &p.model {
        check(&m.args, &MODEL_VARS, "model.args")?;
        check(&m.keyed_args, &MODEL_VARS, "model.keyed_args")?;
        check(&m.env.values().cloned().collect::<Vec<_>>(), &MODEL_VARS, "model.env")?;
        let vars: Vec<_> = MODEL_VARS.iter().map(|v| (*v, "")).collect();
        for f in &m.files {
            match (&f.json, &f.text) {
                (Some(j), None) => {
                    json_of(j, &vars).map_err(|e| bad(format!("model.files {}: {e}", f.path)))?;
                }
                (None, Some(t)) => check(std::slice::from_ref(t), &MODEL_VARS, "model.files")?,
                _ => return Err(bad(format!("model.files {}: one of json or text", f.path))),
            }
        }
        for a in m.apis.keys() {
            if crate::model::Api::parse(a).is_none() {
                return Err(bad(format!("model.apis: {a:?} is no driver API")));
            }
        }
    }
    Ok(p)
}

fn is_var(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 128
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// `template` with each `{name}` replaced by its value in `vars` and each `{name:quoted}` by
/// the value as a quoted string; `{{` and `}}` are braces.
pub fn expand(template: &str, vars: &[(&str, &str)]) -> Result<String, Invalid> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
            continue;
        }
        if tail.starts_with('}') {
            return Err(Invalid(format!("a lone }} in {template:?} (write }}}})")));
        }
        let end = tail.find('}').ok_or_else(|| Invalid(format!("an unclosed {{ in {template:?}")))?;
        let spec = &tail[1..end];
        let (name, quoted) = match spec.split_once(':') {
            Some((n, "quoted")) => (n, true),
            Some((_, how)) => return Err(Invalid(format!("{{{spec}}}: unknown form {how:?} (quoted)"))),
            None => (spec, false),
        };
        let value = vars.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).ok_or_else(|| {
            let known: Vec<_> = vars.iter().map(|(n, _)| *n).collect();
            Invalid(format!("{{{name}}} is not known here (known: {})", known.join(" ")))
        })?;
        if quoted {
            out.push_str(&serde_json::to_string(value).unwrap_or_default());
        } else {
            out.push_str(value);
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A JSON document from a TOML table, each string expanded.
pub fn json_of(v: &toml::Value, vars: &[(&str, &str)]) -> Result<serde_json::Value, Invalid> {
    use serde_json::Value as J;
    Ok(match v {
        toml::Value::String(s) => J::String(expand(s, vars)?),
        toml::Value::Integer(i) => J::from(*i),
        toml::Value::Float(f) => J::from(*f),
        toml::Value::Boolean(b) => J::Bool(*b),
        toml::Value::Datetime(d) => J::String(d.to_string()),
        toml::Value::Array(a) => J::Array(a.iter().map(|x| json_of(x, vars)).collect::<Result<_, _>>()?),
        toml::Value::Table(t) => J::Object(
            t.iter().map(|(k, x)| Ok((k.clone(), json_of(x, vars)?))).collect::<Result<_, Invalid>>()?,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_expand_quote_and_refuse_unknown_names() {
        let v = [("url", "http://h/\"x\""), ("model", "m")];
        assert_eq!(expand("a={url:quoted} m={model}", &v).unwrap(), "a=\"http://h/\\\"x\\\"\" m=m");
        assert_eq!(expand("{{\"k\": {model:quoted}}}", &v).unwrap(), "{\"k\": \"m\"}");
        assert!(expand("{key}", &v).is_err());
        assert!(expand("{url:toml}", &v).is_err());
        assert!(expand("{url", &v).is_err());
        assert!(expand("x}", &v).is_err());
    }

    #[test]
    fn a_profile_is_checked_when_read() {
        let ok = b"program = \"/usr/bin/x\"\nhosted = true\n[turn]\nnew = [\"-p\", \"{prompt}\"]\nprompt = \"argument\"\n\
                   [model]\nkey_env = \"K\"\napis = { openai-chat = \"chat\" }\nargs = [\"{url}\"]\n\
                   files = [{ path = \".x/m.json\", json = { u = \"{url}\", n = [1, true] } }]\n";
        let p = parse("x", ok).unwrap();
        assert_eq!((p.name.as_str(), p.turn.prompt), ("x", Prompt::Argument));
        let j = json_of(p.model.unwrap().files[0].json.as_ref().unwrap(), &[("url", "u1")]).unwrap();
        assert_eq!(j, serde_json::json!({"u": "u1", "n": [1, true]}));
        for (bad, why) in [
            (&b"program = \"x\"\n"[..], "absolute"),
            (b"program = \"/x\"\nturn = { new = [\"{nope}\"] }\n", "not known"),
            (b"program = \"/x\"\nbogus = 1\n", "unknown field"),
            (b"program = \"/x\"\ndirs = [\"../up\"]\n", "inside the agent's home"),
            (b"program = \"/x\"\nenv = { \"A B\" = \"1\" }\n", "variable name"),
            (b"program = \"/x\"\nturn = { session = \"stderr\" }\n", "session_prefix"),
            (b"program = \"/x\"\nmodel = { key_env = \"K\", apis = { gopher = \"g\" } }\n", "no driver API"),
        ] {
            let e = parse("x", bad).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        assert!(parse("../x", b"program = \"/x\"\n").is_err());
    }
}
