//! Launch profiles: which program runs in an agent's terminal and what it needs.

/// A hosted CLI launch profile: which program runs in the terminal and what it needs. CortexFS
/// runs these CLIs as they are; it never re-implements their model loop, sessions or approvals.
#[derive(Debug)]
pub struct Profile {
    /// `--profile NAME`.
    pub name: &'static str,
    /// The program, as seen inside the sandbox (host `/usr` is bound read-only).
    pub program: &'static str,
    /// Environment it needs (its state under the sandbox's private `HOME`).
    pub env: &'static [(&'static str, &'static str)],
    /// Where it comes from, for the error when it is missing.
    pub install: &'static str,
}

/// The profiles. Each CLI runs on the terminal's PTY.
pub const PROFILES: &[Profile] = &[
    Profile { name: "tsh", program: "/ctx/bin/tsh", env: &[], install: "ctx mount serves it in /ctx/bin" },
    Profile {
        name: "codex",
        program: "/usr/bin/codex",
        env: &[("CODEX_HOME", "/home/agent/.codex")],
        install: "npm install -g @openai/codex",
    },
    Profile {
        name: "claude",
        program: "/usr/bin/claude",
        env: &[("CLAUDE_CONFIG_DIR", "/home/agent/.claude"), ("DISABLE_AUTOUPDATER", "1")],
        install: "npm install -g @anthropic-ai/claude-code",
    },
    Profile {
        name: "pi",
        program: "/usr/bin/pi",
        env: &[],
        install: "npm install -g @mariozechner/pi-coding-agent",
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
