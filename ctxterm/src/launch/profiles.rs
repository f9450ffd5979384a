//! Launch profiles: which program runs in an agent's terminal, what it needs in its home, and
//! how the agent's model route becomes the CLI's own configuration.
//!
//! CortexFS runs these CLIs as they are; it never re-implements their model loop, sessions or
//! approvals. A profile only spells, in the CLI's own options and variables, where the model is
//! (its base URL, API and id) and which variable holds the key; the key itself reaches the
//! CLI's environment through a descriptor (see [`mod@super::supervise`]), never its arguments.

use policy::model::Api;

use super::models::Model;
use super::{Error, Result};

/// A hosted CLI launch profile.
#[derive(Debug)]
pub struct Profile {
    /// `--profile NAME`.
    pub name: &'static str,
    /// The program, as seen inside the sandbox (host `/usr` is bound read-only).
    pub program: &'static str,
    /// Environment it needs (its state in the agent's home, `/home/agent`).
    pub env: &'static [(&'static str, &'static str)],
    /// Directories it needs in the agent's home, made before the run (relative to it).
    pub dirs: &'static [&'static str],
    /// Files made in the agent's home when missing (relative path, contents), never changed
    /// once there: the CLI's own state from then on.
    pub seed: &'static [(&'static str, &'static str)],
    /// Arguments before everything else.
    pub args: &'static [&'static str],
    /// Where it comes from, for the error when it is missing.
    pub install: &'static str,
    /// Whether it talks to a model (and so resolves the agent's).
    pub hosted: bool,
}

/// The profiles. Each CLI runs on the terminal's PTY, or headless on the caller's streams.
pub const PROFILES: &[Profile] = &[
    Profile {
        name: "tsh",
        program: "/ctx/bin/tsh",
        env: &[],
        dirs: &[],
        seed: &[],
        args: &[],
        install: "ctx mount serves it in /ctx/bin",
        hosted: false,
    },
    Profile {
        name: "codex",
        program: "/usr/bin/codex",
        env: &[("CODEX_HOME", "/home/agent/.codex")],
        dirs: &[".codex"],
        seed: &[],
        // The sandbox is CortexFS's: Codex's own cannot nest in it (no user namespaces inside).
        args: &["-c", "sandbox_mode=\"danger-full-access\""],
        install: "npm install -g @openai/codex",
        hosted: true,
    },
    Profile {
        name: "claude",
        program: "/usr/bin/claude",
        env: &[
            ("CLAUDE_CONFIG_DIR", "/home/agent/.claude"),
            ("DISABLE_AUTOUPDATER", "1"),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ],
        dirs: &[".claude"],
        // First-run onboarding checks that api.anthropic.com answers, which a sandbox reaching
        // only its model cannot: the agent's Claude Code starts as one that has been set up.
        seed: &[(".claude/.claude.json", "{\"hasCompletedOnboarding\": true}\n")],
        args: &[],
        install: "npm install -g @anthropic-ai/claude-code",
        hosted: true,
    },
    Profile {
        name: "pi",
        program: "/usr/bin/pi",
        env: &[],
        dirs: &[".pi", ".pi/agent"],
        seed: &[],
        args: &[],
        install: "npm install -g @mariozechner/pi-coding-agent",
        hosted: true,
    },
];

/// The profile named `name`.
pub fn find(name: &str) -> Option<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name)
}

/// The names of every profile.
pub fn names() -> Vec<&'static str> {
    PROFILES.iter().map(|p| p.name).collect()
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
    let url = m.driver.base_url.to_string();
    let refuse = |why: &str| {
        Err(Error::Invalid(format!(
            "profile {} cannot use model {} ({}): {why}",
            p.name, m.name, m.driver.api
        )))
    };
    match p.name {
        "codex" => {
            let wire_api = match m.driver.api {
                Api::OpenaiResponses => "responses",
                Api::OpenaiChat => "chat",
                Api::AnthropicMessages => return refuse("Codex speaks the OpenAI APIs only"),
            };
            let key = "CORTEXFS_MODEL_KEY";
            let mut c = vec![
                "model_provider=\"cortexfs\"".to_owned(),
                "model_providers.cortexfs.name=\"cortexfs\"".to_owned(),
                format!("model_providers.cortexfs.base_url={}", toml_string(&url)),
                format!("model_providers.cortexfs.wire_api=\"{wire_api}\""),
                format!("model={}", toml_string(&m.id)),
            ];
            if m.driver.needs_key {
                c.push(format!("model_providers.cortexfs.env_key=\"{key}\""));
            }
            Ok(Wired {
                args: c.into_iter().flat_map(|c| ["-c".to_owned(), c]).collect(),
                env: Vec::new(),
                key_env: m.driver.needs_key.then(|| key.to_owned()),
                files: Vec::new(),
            })
        }
        "claude" => {
            if m.driver.api != Api::AnthropicMessages {
                return refuse("Claude Code speaks Anthropic Messages only");
            }
            let env = [
                ("ANTHROPIC_BASE_URL", url.as_str()),
                ("ANTHROPIC_MODEL", m.id.as_str()),
                ("ANTHROPIC_DEFAULT_HAIKU_MODEL", m.id.as_str()),
                ("ANTHROPIC_DEFAULT_SONNET_MODEL", m.id.as_str()),
                ("ANTHROPIC_DEFAULT_OPUS_MODEL", m.id.as_str()),
            ];
            // The key comes through a helper that prints the variable: Claude Code then neither
            // asks whether to use a key found in its environment nor keeps a part of it.
            let key = "CORTEXFS_MODEL_KEY";
            let args = if m.driver.needs_key {
                let settings = serde_json::json!({"apiKeyHelper": format!("printenv {key}")});
                vec!["--settings".to_owned(), settings.to_string()]
            } else {
                Vec::new()
            };
            Ok(Wired {
                args,
                env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
                key_env: m.driver.needs_key.then(|| key.to_owned()),
                files: Vec::new(),
            })
        }
        "pi" => {
            let api = match m.driver.api {
                Api::OpenaiResponses => "openai-responses",
                Api::OpenaiChat => "openai-completions",
                Api::AnthropicMessages => "anthropic-messages",
            };
            let key = "CORTEXFS_MODEL_KEY";
            // pi takes an apiKey that names a variable; a route without a key gets a word
            // that is none.
            let models = serde_json::json!({"providers": {"cortexfs": {
                "baseUrl": url, "api": api,
                "apiKey": if m.driver.needs_key { key } else { "none" },
                "models": [{"id": m.id}],
            }}});
            Ok(Wired {
                args: vec!["--provider".into(), "cortexfs".into(), "--model".into(), m.id.clone()],
                env: Vec::new(),
                key_env: m.driver.needs_key.then(|| key.to_owned()),
                files: vec![(".pi/agent/models.json".into(), format!("{models:#}\n"))],
            })
        }
        _ => refuse("this profile has no model wiring"),
    }
}

/// The arguments that give `p` the agent's `system.md` (its instructions), in the way the
/// CLI takes them: Codex's `developer_instructions`, Claude Code's and pi's
/// `--append-system-prompt`. Empty instructions give none.
pub fn instruct(p: &Profile, system: &str) -> Vec<String> {
    let system = system.trim();
    if system.is_empty() {
        return Vec::new();
    }
    match p.name {
        "codex" => vec!["-c".into(), format!("developer_instructions={}", toml_string(system))],
        "claude" | "pi" => vec!["--append-system-prompt".into(), system.to_owned()],
        _ => Vec::new(),
    }
}

/// `s` as a TOML basic string.
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

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
