//! `ctx model add|ls|inspect|alias|rm` (models in storage) and `ctx secret set|rm|ls` (the
//! root-owned secret store their keys may come from).
//!
//! Exit codes: 0 ok, 1 failure (exists, missing), 2 invalid input, 13 permission denied.

use std::io::Read;

use clap::Subcommand;
use ctxterm::launch::{models, secrets};
use policy::model::{Api, Driver, Url};

use crate::cmd::agent::At;
use crate::exit::{self, Exit};
use crate::out;

/// Models.
// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Install model/PROVIDER/MODEL with its route (.d/driver) and upstream id (.d/id).
    Add {
        #[command(flatten)]
        at: At,
        /// PROVIDER/MODEL.
        name: String,
        /// The wire format: openai-responses, openai-chat, anthropic-messages or google-gemini.
        #[arg(long, value_parser = parse_api)]
        api: Api,
        /// Where it is served, e.g. `https://api.example.com/v1` or `http://127.0.0.1:11434/v1`.
        #[arg(long, value_parser = Url::parse)]
        base_url: Url,
        /// The id sent upstream (default: MODEL).
        #[arg(long)]
        id: Option<String>,
        /// The operator's variables the key is looked for in, in order (default: the API's
        /// convention, OPENAI_API_KEY or ANTHROPIC_API_KEY; repeatable).
        #[arg(long = "key-env", value_name = "VAR")]
        key_env: Vec<String>,
        /// The secret store's provider the key is kept under (default: PROVIDER).
        #[arg(long)]
        secret: Option<String>,
        /// The endpoint takes no key.
        #[arg(long, conflicts_with = "oauth_authorize")]
        no_key: bool,
        /// Sign in with OAuth (Authorization Code + PKCE) at this authorization endpoint
        /// (`ctx model login PROVIDER`); needs --oauth-token and --oauth-client-id.
        #[arg(long, value_name = "URL", requires_all = ["oauth_token", "oauth_client_id"])]
        oauth_authorize: Option<String>,
        /// The provider's token endpoint.
        #[arg(long, value_name = "URL", requires = "oauth_authorize")]
        oauth_token: Option<String>,
        /// The client id registered with the provider.
        #[arg(long, value_name = "ID", requires = "oauth_authorize")]
        oauth_client_id: Option<String>,
        /// The scopes to ask for, space-separated.
        #[arg(long, value_name = "SCOPES", requires = "oauth_authorize")]
        oauth_scope: Option<String>,
        /// A policy of the model's own (lines of policy v0); agents then need its grant too.
        #[arg(long, value_name = "TEXT")]
        policy: Option<String>,
    },
    /// List models: NAME, API and BASE_URL, tab-separated; then the aliases.
    Ls {
        #[command(flatten)]
        at: At,
        /// Print one JSON object: {"models": [{"name","api","base_url","id"}], "aliases": {..}}.
        #[arg(long)]
        json: bool,
    },
    /// Print a model's route, id and the aliases pointing at it.
    Inspect {
        #[command(flatten)]
        at: At,
        /// PROVIDER/MODEL, main or helper.
        name: String,
        /// Print one JSON object: {"model","id","api","base_url","key_from","aliases"}.
        #[arg(long)]
        json: bool,
    },
    /// Point model/main or model/helper at an installed model.
    Alias {
        #[command(flatten)]
        at: At,
        /// main or helper.
        alias: String,
        /// PROVIDER/MODEL.
        target: String,
    },
    /// Sign in to PROVIDER with OAuth (Authorization Code + PKCE), as its models' driver declares
    /// (auth=oauth): prints the URL to open, waits for the browser's redirect on a loopback port,
    /// and keeps the tokens in root's secret store (oauth:access, oauth:refresh).
    Login {
        #[command(flatten)]
        at: At,
        /// The provider (the secret store's provider, as the driver's secret= names it).
        provider: String,
        /// The loopback port the redirect comes back to (default: any free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Seconds to wait for the sign-in.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Remove model/PROVIDER/MODEL (refused while an alias points at it).
    Rm {
        #[command(flatten)]
        at: At,
        /// PROVIDER/MODEL.
        name: String,
    },
}

/// The secret store: `/var/lib/cortexfs/secrets` (or $CTX_SECRETS), root's only.
#[derive(Debug, Subcommand)]
pub enum SecretCmd {
    /// Store a provider's secret, read from standard input (never from arguments).
    Set {
        /// The provider (service cortexfs:PROVIDER).
        provider: String,
        /// api-key, oauth:access or oauth:refresh.
        #[arg(long, default_value = "api-key")]
        account: String,
    },
    /// Remove a provider's secret.
    Rm {
        /// The provider.
        provider: String,
        /// api-key, oauth:access or oauth:refresh.
        #[arg(long, default_value = "api-key")]
        account: String,
    },
    /// List stored secrets as SERVICE and ACCOUNT, tab-separated; never a value.
    Ls {
        /// Print a JSON array of {"service","account"} objects.
        #[arg(long)]
        json: bool,
    },
}

fn parse_api(s: &str) -> Result<Api, String> {
    Api::parse(s).ok_or_else(|| format!("{s:?} is not {}", Api::SPELLED))
}

fn invalid(message: impl Into<String>) -> anyhow::Error {
    Exit::new(exit::INVALID, message).into()
}

/// Runs `ctx model`.
/// `ctx model login`: the OAuth metadata of PROVIDER's models (one, or several that agree),
/// then the sign-in.
fn login(storage: &std::path::Path, provider: &str, port: u16, timeout: u64) -> anyhow::Result<()> {
    policy::name::validate(provider).map_err(|e| invalid(format!("provider {provider:?}: {e}")))?;
    let all = models::installed(storage).map_err(exit::launch)?;
    let of = |m: &&models::Model| {
        let own = m.name.split_once('/').map_or("", |(p, _)| p);
        m.driver.secret.as_deref().unwrap_or(own) == provider
    };
    let metas: Vec<&policy::model::OAuth> =
        all.iter().filter(of).filter_map(|m| m.driver.oauth.as_ref()).collect();
    let Some(meta) = metas.first() else {
        return Err(Exit::new(
            exit::FAILURE,
            format!("no model of {provider} signs in with OAuth (its driver needs auth=oauth: ctx model add --oauth-authorize ...)"),
        )
        .into());
    };
    if metas.iter().any(|m| m != meta) {
        return Err(invalid(format!(
            "the models of {provider} declare different OAuth metadata; make them agree"
        )));
    }
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| Exit::new(exit::UNAVAILABLE, format!("cannot listen on 127.0.0.1:{port}: {e}")))?;
    ctxterm::launch::oauth::login(
        provider,
        meta,
        &listener,
        |url| {
            eprintln!("ctx: open this address in a browser to sign in to {provider}:");
            eprintln!("{url}");
        },
        std::time::Duration::from_secs(timeout),
    )
    .map_err(exit::launch)?;
    out::line(format_args!(
        "signed in to {provider}: tokens kept in the secret store ({})",
        secrets::service(provider)
    ))
}

pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Add {
            at,
            name,
            api,
            base_url,
            id,
            key_env,
            secret,
            no_key,
            oauth_authorize,
            oauth_token,
            oauth_client_id,
            oauth_scope,
            policy,
        } => {
            let mut text = format!(
                "api={api}\nbase_url={base_url}\n{}{}{}",
                if key_env.is_empty() { String::new() } else { format!("key_env={}\n", key_env.join(" ")) },
                secret.map(|s| format!("secret={s}\n")).unwrap_or_default(),
                if no_key { "auth=none\n" } else { "" }
            );
            if let (Some(a), Some(t), Some(c)) = (oauth_authorize, oauth_token, oauth_client_id) {
                for (k, v) in [("oauth_authorize", &a), ("oauth_token", &t), ("oauth_client_id", &c)] {
                    if v.contains('\n') {
                        return Err(invalid(format!("--{}: one line", k.replace('_', "-"))));
                    }
                }
                text.push_str(&format!(
                    "auth=oauth\noauth_authorize={a}\noauth_token={t}\noauth_client_id={c}\n"
                ));
                if let Some(s) = oauth_scope.filter(|s| !s.contains('\n')) {
                    text.push_str(&format!("oauth_scope={s}\n"));
                }
            }
            let driver: Driver = policy::model::parse(text.as_bytes()).map_err(invalid)?;
            let mut policy_text = policy;
            if let Some(p) = &mut policy_text
                && !p.ends_with('\n')
            {
                p.push('\n');
            }
            if let Some(p) = &policy_text {
                policy::v0::parse(p.as_bytes()).map_err(|errs| {
                    let lines: Vec<String> = errs.iter().map(ToString::to_string).collect();
                    invalid(format!("--policy: {}", lines.join("; ")))
                })?;
            }
            let said = models::add(&at.source, &name, &driver, id.as_deref(), policy_text.as_deref())
                .map_err(exit::launch)?;
            crate::cmd::config::own_objects(
                &at.source,
                &[format!("model/{name}")],
                &format!("model add {name}"),
            )?;
            out::line(said)
        }
        Cmd::Ls { at, json } => {
            let all = models::installed(&at.source).map_err(exit::launch)?;
            let aliases: Vec<(&str, String)> = policy::model::ALIASES
                .iter()
                .filter_map(|a| models::alias_target(&at.source, a).map(|t| (*a, t)))
                .collect();
            if json {
                let ms: Vec<serde_json::Value> = all
                    .iter()
                    .map(|m| {
                        serde_json::json!({"name": m.name, "api": m.driver.api.as_str(),
                            "base_url": m.driver.base_url.to_string(), "id": m.id})
                    })
                    .collect();
                let al: serde_json::Map<String, serde_json::Value> = aliases
                    .iter()
                    .map(|(a, t)| ((*a).to_owned(), serde_json::Value::from(t.as_str())))
                    .collect();
                return out::line(serde_json::json!({"models": ms, "aliases": al}));
            }
            let mut list = out::Listing::new("NAME\tAPI\tBASE_URL\tALIASES");
            for m in &all {
                let named: Vec<&str> =
                    aliases.iter().filter(|(_, t)| *t == m.name).map(|(a, _)| *a).collect();
                let named = if named.is_empty() { "-".to_owned() } else { named.join(",") };
                list.row(format_args!("{}\t{}\t{}\t{named}", m.name, m.driver.api, m.driver.base_url))?;
            }
            Ok(())
        }
        Cmd::Inspect { at, name, json } => {
            let name = if policy::model::ALIASES.contains(&name.as_str()) {
                models::alias_target(&at.source, &name)
                    .ok_or_else(|| Exit::new(exit::FAILURE, format!("model/{name} is not set")))?
            } else {
                name
            };
            let m = models::read(&at.source, &name).map_err(exit::launch)?;
            let aliases: Vec<&str> = policy::model::ALIASES
                .iter()
                .copied()
                .filter(|a| models::alias_target(&at.source, a).as_deref() == Some(m.name.as_str()))
                .collect();
            if json {
                let key: Option<Vec<String>> = m.driver.needs_key.then(|| m.driver.key_vars());
                return out::line(serde_json::json!({"model": m.name, "id": m.id,
                    "api": m.driver.api.as_str(), "base_url": m.driver.base_url.to_string(),
                    "key_from": key, "aliases": aliases}));
            }
            out::line(format_args!("model {}", m.name))?;
            out::line(format_args!("id {}", m.id))?;
            out::line(format_args!("api {}", m.driver.api))?;
            out::line(format_args!("base_url {}", m.driver.base_url))?;
            if m.driver.needs_key {
                out::line(format_args!("key from {} or the secret store", m.driver.key_vars().join(" ")))?;
            } else {
                out::line("key none")?;
            }
            for a in aliases {
                out::line(format_args!("alias {a}"))?;
            }
            Ok(())
        }
        Cmd::Alias { at, alias, target } => {
            models::set_alias(&at.source, &alias, &target).map_err(exit::launch)?;
            crate::cmd::config::own_change(
                &at.source,
                &[format!("model/{alias}")],
                &format!("model alias {alias} {target}"),
            )?;
            out::line(format_args!("model/{alias} -> {target}"))
        }
        Cmd::Login { at, provider, port, timeout } => login(&at.source, &provider, port, timeout),
        Cmd::Rm { at, name } => {
            for step in models::remove(&at.source, &name).map_err(exit::launch)? {
                out::line(step)?;
            }
            let mut objects = vec![format!("model/{name}")];
            objects.extend(policy::model::ALIASES.iter().map(|a| format!("model/{a}")));
            crate::cmd::config::own_objects(&at.source, &objects, &format!("model rm {name}"))
        }
    }
}

/// Runs `ctx secret`.
pub fn secret(cmd: SecretCmd) -> anyhow::Result<()> {
    match cmd {
        SecretCmd::Set { provider, account } => {
            let mut v = Vec::new();
            std::io::stdin()
                .take(secrets::VALUE_MAX as u64 + 1)
                .read_to_end(&mut v)
                .map_err(|e| Exit::io("standard input", &e))?;
            while v.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                v.pop();
            }
            secrets::set(&provider, &account, &v).map_err(exit::launch)?;
            out::line(format_args!("stored {} {account}", secrets::service(&provider)))
        }
        SecretCmd::Rm { provider, account } => {
            if !secrets::remove(&provider, &account).map_err(exit::launch)? {
                return Err(Exit::new(
                    exit::FAILURE,
                    format!("no {} {account}", secrets::service(&provider)),
                )
                .into());
            }
            out::line(format_args!("removed {} {account}", secrets::service(&provider)))
        }
        SecretCmd::Ls { json } => {
            let all = secrets::list().map_err(exit::launch)?;
            if json {
                let v: Vec<serde_json::Value> =
                    all.iter().map(|(s, a)| serde_json::json!({"service": s, "account": a})).collect();
                return out::line(serde_json::Value::Array(v));
            }
            let mut list = out::Listing::new("SERVICE\tACCOUNT");
            for (s, a) in all {
                list.row(format_args!("{s}\t{a}"))?;
            }
            Ok(())
        }
    }
}
