//! tsh's commands: the built-ins and tool runs, one line at a time.
//!
//! The working set (`load`, `pin`) is kept between tsh processes in the session's `tsh.json` in
//! an agent terminal (`CTX_HOME/.tsh/human.json` otherwise), replaced atomically; agent CLIs run
//! `tsh load X` and `tsh X ...` as separate processes and expect it to stay.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;

use policy::tshconf::TshConfig;
use serde::{Deserialize, Serialize};

use crate::Fail;
use crate::context::{Context, PathSource};
use crate::resolve::{Hit, Resolver};
use crate::run::{self, Mode};

/// The built-in commands, which take precedence over tools of the same name.
pub const BUILTINS: &[&str] = &[
    "tools", "which", "describe", "load", "unload", "loads", "pin", "unpin", "pins", "submit", "collect",
    "jobs", "help", "exit",
];

const HELP: &str = "\
tsh: the CortexFS tool shell

  tsh TOOL ARG...      run a tool found through CTX_PATH (needs an agent terminal)
  tsh --json TOOL      native mode: JSON input on stdin, JSONL frames out
  tsh                  a prompt on a terminal; otherwise commands are read from stdin

built-ins:
  tools [-l|--json]    the tools CTX_PATH resolves (-l: with path and description; --json: as JSON)
  which TOOL           the executable TOOL resolves to
  describe TOOL        a tool's description and input schema
  load TOOL            load a tool's metadata into the working set
  unload TOOL          drop it (and its cached resolution)
  loads                the loaded tools (* pinned)
  pin TOOL             keep a tool loaded and its resolution cached
  unpin TOOL           put it back under the cache's policy
  pins                 the pinned tools
  submit TOOL ARG...   run a tool in the background; prints its id (the result goes to the
                       session's outbox, async/done/)
  collect ID [--wait] [--json]
                       the output and exit status of a submitted call (69 while it runs)
  jobs                 the session's submissions and their states
  help                 this text
  exit [N]             leave the prompt
";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Saved {
    #[serde(default)]
    pinned: Vec<String>,
    #[serde(default)]
    loaded: Vec<String>,
}

/// A tsh session: context, configuration, resolver and working set.
#[derive(Debug)]
pub struct Shell {
    ctx: Context,
    config: TshConfig,
    resolver: Resolver,
    /// Loaded tools, oldest first (pinned ones included).
    loaded: Vec<String>,
    pinned: Vec<String>,
}

fn config_of(ctx: &Context) -> TshConfig {
    let file = ctx.root.join("tool/tsh.d/config");
    match std::fs::read(&file) {
        Ok(text) => policy::tshconf::parse_config(&text).unwrap_or_else(|errs| {
            let why: Vec<String> = errs.iter().map(ToString::to_string).collect();
            eprintln!("tsh: {}: {}; using the defaults", file.display(), why.join("; "));
            TshConfig::default()
        }),
        Err(_) => TshConfig::default(),
    }
}

impl Shell {
    /// A shell for `ctx`, with the configuration and working set it finds.
    pub fn new(ctx: Context) -> Shell {
        let config = config_of(&ctx);
        let resolver = Resolver::new(ctx.path.clone(), &config);
        let mut sh = Shell { ctx, config, resolver, loaded: Vec::new(), pinned: Vec::new() };
        if let Ok(bytes) = std::fs::read(sh.ctx.state_file())
            && let Ok(saved) = serde_json::from_slice::<Saved>(&bytes)
        {
            for name in saved.pinned {
                if let Ok((hit, _)) = sh.resolver.resolve(&name) {
                    sh.resolver.pin(hit);
                    sh.pinned.push(name);
                }
            }
            sh.loaded = saved.loaded;
        }
        sh
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Works the session's submissions until none is left (`tsh --async-worker`, started by
    /// `submit`).
    pub fn work(&mut self) -> Result<i32, Fail> {
        crate::submit::work(&self.ctx, &mut self.resolver)
    }

    fn save(&self) -> Result<(), Fail> {
        let file = self.ctx.state_file();
        let saved = Saved { pinned: self.pinned.clone(), loaded: self.loaded.clone() };
        let write = || -> std::io::Result<()> {
            let dir = file.parent().unwrap_or(Path::new("."));
            std::fs::create_dir_all(dir)?;
            let tmp = dir.join(format!(".{}.{}", std::process::id(), "tmp"));
            std::fs::write(&tmp, serde_json::to_vec(&saved).map_err(std::io::Error::other)?)?;
            std::fs::rename(&tmp, &file)
        };
        write().map_err(|e| Fail::Failed(format!("keeping the working set in {}: {e}", file.display())))
    }

    fn hit(&mut self, name: &str) -> Result<Hit, Fail> {
        match self.resolver.resolve(name) {
            Ok((hit, evicted)) => {
                if let Some(e) = evicted {
                    tracing_note(&format!("cache: {e} evicted"));
                }
                Ok(hit)
            }
            Err(miss) => {
                let mut why = format!("{name}: not found in CTX_PATH ({})", self.ctx.path_string());
                if !miss.not_executable.is_empty() {
                    let d: Vec<String> =
                        miss.not_executable.iter().map(|d| d.display().to_string()).collect();
                    why.push_str(&format!("; not executable in {}", d.join(", ")));
                }
                Err(Fail::Failed(why))
            }
        }
    }

    /// Runs one command (a built-in or a tool) and returns its exit code.
    pub fn command(&mut self, argv: &[OsString], mode: Mode, out: &mut dyn Write) -> Result<i32, Fail> {
        let Some((first, rest)) = argv.split_first() else { return Ok(0) };
        let Some(cmd) = first.to_str() else {
            return Err(Fail::Usage(format!("{}: not a valid tool name", first.to_string_lossy())));
        };
        let word = |i: usize, what: &str| -> Result<String, Fail> {
            rest.get(i)
                .and_then(|a| a.to_str())
                .map(str::to_owned)
                .ok_or_else(|| Fail::Usage(format!("{cmd}: expected {what}")))
        };
        let io = |e: std::io::Error| Fail::Failed(format!("writing the output: {e}"));
        match cmd {
            "tools" => {
                let long = rest.iter().any(|a| a == "-l");
                if let Some(bad) = rest.iter().find(|a| *a != "-l" && *a != "--json") {
                    return Err(Fail::Usage(format!("tools: unknown option {}", bad.to_string_lossy())));
                }
                if rest.iter().any(|a| a == "--json") {
                    // One JSON array: name, path and the first line of the description of each.
                    let all: Vec<serde_json::Value> = self
                        .resolver
                        .all()
                        .iter()
                        .map(|hit| {
                            let desc = std::fs::read_to_string(hit.controls().join("description"))
                                .unwrap_or_default();
                            serde_json::json!({
                                "name": hit.name,
                                "path": hit.path,
                                "description": desc.lines().next().unwrap_or(""),
                            })
                        })
                        .collect();
                    writeln!(out, "{}", serde_json::Value::Array(all)).map_err(io)?;
                    return Ok(0);
                }
                for hit in self.resolver.all() {
                    if long {
                        let desc =
                            std::fs::read_to_string(hit.controls().join("description")).unwrap_or_default();
                        let desc = desc.lines().next().unwrap_or("");
                        writeln!(out, "{}\t{}\t{desc}", hit.name, hit.path.display()).map_err(io)?;
                    } else {
                        writeln!(out, "{}", hit.name).map_err(io)?;
                    }
                }
                Ok(0)
            }
            "which" => {
                let name = word(0, "a tool name")?;
                let hit = self.hit(&name)?;
                writeln!(out, "{}", hit.path.display()).map_err(io)?;
                Ok(0)
            }
            "describe" => {
                let name = word(0, "a tool name")?;
                let hit = self.hit(&name)?;
                let read = |c: &str| std::fs::read_to_string(hit.controls().join(c)).unwrap_or_default();
                write!(
                    out,
                    "name: {}\npath: {}\ndescription: {}\nschema: {}\n",
                    hit.name,
                    hit.path.display(),
                    read("description").trim_end(),
                    read("schema").trim_end()
                )
                .map_err(io)?;
                Ok(0)
            }
            "load" => {
                let name = word(0, "a tool name")?;
                // The lookup records the access in the sketch that `trim_loaded` consults.
                self.hit(&name)?;
                if !self.loaded.contains(&name) {
                    self.loaded.push(name.clone());
                }
                writeln!(out, "loaded {name}").map_err(io)?;
                for gone in self.trim_loaded() {
                    writeln!(out, "unloaded {gone} (max_loaded_tools={})", self.config.max_loaded_tools)
                        .map_err(io)?;
                }
                self.save()?;
                Ok(0)
            }
            "unload" => {
                let name = word(0, "a tool name")?;
                if self.pinned.contains(&name) {
                    return Err(Fail::Failed(format!("{name} is pinned; unpin it first")));
                }
                self.loaded.retain(|n| n != &name);
                self.resolver.forget(&name);
                self.save()?;
                Ok(0)
            }
            "loads" => {
                for n in &self.loaded {
                    let mark = if self.pinned.contains(n) { "*" } else { "" };
                    writeln!(out, "{n}{mark}").map_err(io)?;
                }
                Ok(0)
            }
            "pin" => {
                let name = word(0, "a tool name")?;
                let hit = self.hit(&name)?;
                self.resolver.pin(hit);
                if !self.pinned.contains(&name) {
                    self.pinned.push(name.clone());
                }
                if !self.loaded.contains(&name) {
                    self.loaded.push(name.clone());
                }
                for gone in self.trim_loaded() {
                    writeln!(out, "unloaded {gone} (max_loaded_tools={})", self.config.max_loaded_tools)
                        .map_err(io)?;
                }
                self.save()?;
                Ok(0)
            }
            "unpin" => {
                let name = word(0, "a tool name")?;
                if !self.pinned.contains(&name) {
                    return Err(Fail::Failed(format!("{name} is not pinned")));
                }
                self.pinned.retain(|n| n != &name);
                if let Some(e) = self.resolver.unpin(&name) {
                    tracing_note(&format!("cache: {e} evicted"));
                }
                for gone in self.trim_loaded() {
                    writeln!(out, "unloaded {gone} (max_loaded_tools={})", self.config.max_loaded_tools)
                        .map_err(io)?;
                }
                self.save()?;
                Ok(0)
            }
            "pins" => {
                for n in &self.pinned {
                    writeln!(out, "{n}").map_err(io)?;
                }
                Ok(0)
            }
            "help" => {
                out.write_all(HELP.as_bytes()).map_err(io)?;
                let src = match &self.ctx.source {
                    PathSource::Injected => "injected by the agent terminal".to_owned(),
                    PathSource::Tshrc(p) => p.display().to_string(),
                    PathSource::Environment => "the environment".to_owned(),
                    PathSource::Default => "the default".to_owned(),
                };
                writeln!(out, "\nCTX_PATH={} (from {src})", self.ctx.path_string()).map_err(io)?;
                Ok(0)
            }
            "submit" => {
                let Some((tool, args)) = rest.split_first() else {
                    return Err(Fail::Usage("submit: expected a tool name".into()));
                };
                let tool =
                    tool.to_str().ok_or_else(|| Fail::Usage("submit: not a valid tool name".into()))?;
                crate::submit::submit(&self.ctx, &mut self.resolver, tool, args, out)
            }
            "collect" => {
                let mut id = None;
                let (mut wait, mut json) = (false, false);
                for a in rest {
                    match a.to_str() {
                        Some("--wait") => wait = true,
                        Some("--json") => json = true,
                        Some(w) if !w.starts_with('-') && id.is_none() => id = Some(w.to_owned()),
                        _ => return Err(Fail::Usage(format!("collect: unexpected {}", a.to_string_lossy()))),
                    }
                }
                let id = id.ok_or_else(|| Fail::Usage("collect: expected a submission id".into()))?;
                crate::submit::collect(&self.ctx, &id, wait, json, out)
            }
            "jobs" => crate::submit::jobs(&self.ctx, out),
            "exit" => Ok(rest.first().and_then(|a| a.to_str()).and_then(|a| a.parse().ok()).unwrap_or(0)),
            name => run::run(&self.ctx, &mut self.resolver, name, rest, mode),
        }
    }

    /// Unloads the least frequently used unpinned tools beyond `max_loaded_tools`, by the
    /// resolution cache's sketch (ties: the oldest load goes first).
    fn trim_loaded(&mut self) -> Vec<String> {
        let mut gone = Vec::new();
        let max = self.config.max_loaded_tools as usize;
        loop {
            let unpinned: Vec<&String> = self.loaded.iter().filter(|n| !self.pinned.contains(n)).collect();
            if unpinned.len() <= max {
                return gone;
            }
            let newest = self.loaded.last().cloned();
            let victim = unpinned
                .iter()
                .filter(|n| Some(**n) != newest.as_ref())
                .min_by_key(|n| self.resolver.cache().frequency(n.as_str()))
                .map(|n| (*n).clone());
            let Some(victim) = victim else { return gone };
            self.loaded.retain(|n| n != &victim);
            gone.push(victim);
        }
    }
}

fn tracing_note(msg: &str) {
    if std::env::var_os("TSH_DEBUG").is_some() {
        eprintln!("tsh: {msg}");
    }
}
