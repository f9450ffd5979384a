//! Model routes: what `model/<provider>/<model>.d/driver` says about reaching a model.
//!
//! A driver is `KEY=VALUE` lines (blank lines and `#` comments allowed), each key at most once,
//! no other keys:
//!
//! ```text
//! api=openai-responses          # or openai-chat, anthropic-messages, google-gemini
//! base_url=https://api.example.com/v1
//! key_env=OPENAI_API_KEY EXAMPLE_KEY   # the operator's variables tried first, in order
//! secret=example                # the secret store's service cortexfs:<secret> (default: the provider)
//! auth=key                      # or none: the endpoint takes no key; or oauth:
//! oauth_authorize=https://auth.example.com/authorize   # (auth=oauth) Authorization Code + PKCE
//! oauth_token=https://auth.example.com/token
//! oauth_client_id=cortexfs-cli
//! oauth_scope=models.read models.use                     # optional
//! ```
//!
//! Only `api` and `base_url` are required. Secrets themselves never appear here: a driver
//! names where a key comes from, not the key.

use std::fmt;

/// The wire format a route speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// OpenAI Responses (`POST {base_url}/responses`).
    OpenaiResponses,
    /// OpenAI chat completions (`POST {base_url}/chat/completions`).
    OpenaiChat,
    /// Anthropic Messages (`POST {base_url}/v1/messages`).
    AnthropicMessages,
    /// Google's Gemini API (`POST {base_url}/v1beta/models/{id}:streamGenerateContent`).
    GoogleGemini,
}

impl Api {
    /// Every API, by its driver spelling.
    pub const ALL: [Api; 4] =
        [Api::OpenaiResponses, Api::OpenaiChat, Api::AnthropicMessages, Api::GoogleGemini];

    /// Every API's spelling, for messages.
    pub const SPELLED: &str = "openai-responses, openai-chat, anthropic-messages or google-gemini";

    /// Parses the driver spelling.
    pub fn parse(s: &str) -> Option<Api> {
        Api::ALL.into_iter().find(|a| a.as_str() == s)
    }

    /// The driver spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::OpenaiResponses => "openai-responses",
            Api::OpenaiChat => "openai-chat",
            Api::AnthropicMessages => "anthropic-messages",
            Api::GoogleGemini => "google-gemini",
        }
    }

    /// The variable a key for this API is conventionally in, tried when `key_env` is not set.
    pub fn default_key_env(self) -> &'static str {
        match self {
            Api::OpenaiResponses | Api::OpenaiChat => "OPENAI_API_KEY",
            Api::AnthropicMessages => "ANTHROPIC_API_KEY",
            Api::GoogleGemini => "GEMINI_API_KEY",
        }
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `http` or `https` URL as a route needs it: scheme, host, port, path. No user
/// information, query or fragment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    /// `https` or `http`.
    pub https: bool,
    /// A DNS name, an IPv4 address, or an IPv6 address (without brackets).
    pub host: String,
    /// The port, explicit or the scheme's.
    pub port: u16,
    /// The path, `""` or starting with `/`, without a trailing `/`.
    pub path: String,
}

impl Url {
    /// Parses `http[s]://HOST[:PORT][/PATH]`.
    pub fn parse(s: &str) -> Result<Url, String> {
        let (https, rest) = if let Some(r) = s.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = s.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(format!("{s:?} is not an http:// or https:// URL"));
        };
        if s.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control() || !b.is_ascii()) {
            return Err(format!("{s:?}: a URL is printable ASCII without spaces"));
        }
        if s.contains(['?', '#', '@', '\\']) {
            return Err(format!("{s:?}: no user, query or fragment in a route's URL"));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| format!("{s:?}: unclosed [ in the host"))?;
            h.parse::<std::net::Ipv6Addr>().map_err(|_| format!("{s:?}: [{h}] is not an IPv6 address"))?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| format!("{s:?}: junk after the host"))?),
            };
            (h, port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() || host.len() > 253 {
            return Err(format!("{s:?}: no host"));
        }
        if !authority.starts_with('[')
            && !host.split('.').all(|l| {
                !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
        {
            return Err(format!("{s:?}: {host:?} is not a host name or address"));
        }
        let port = match port {
            None => {
                if https {
                    443
                } else {
                    80
                }
            }
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 && !p.starts_with('0') => n,
                _ => return Err(format!("{s:?}: {p:?} is not a port")),
            },
        };
        if path.split('/').any(|seg| seg == ".." || seg == ".") {
            return Err(format!("{s:?}: no . or .. in the path"));
        }
        Ok(Url { https, host: host.to_ascii_lowercase(), port, path: path.trim_end_matches('/').to_owned() })
    }

    /// True when the host is this machine's loopback (`localhost`, `127.0.0.0/8`, `::1`).
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost"
            || self.host.parse::<std::net::Ipv4Addr>().is_ok_and(|a| a.is_loopback())
            || self.host.parse::<std::net::Ipv6Addr>().is_ok_and(|a| a.is_loopback())
    }

    /// `host:port` as a CONNECT request names it.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        let default = if self.https { 443 } else { 80 };
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        if self.port == default {
            write!(f, "{scheme}://{host}{}", self.path)
        } else {
            write!(f, "{scheme}://{host}:{}{}", self.port, self.path)
        }
    }
}

/// A parsed driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Driver {
    /// The wire format.
    pub api: Api,
    /// Where it is served.
    pub base_url: Url,
    /// The operator's variables a key is looked for in, in order (the API's convention when
    /// the driver names none).
    pub key_env: Vec<String>,
    /// The secret store's provider: the key is `service=cortexfs:<secret>`, `account=api-key`.
    /// `None`: the model's provider.
    pub secret: Option<String>,
    /// Whether the endpoint needs a key at all.
    pub needs_key: bool,
    /// With `auth=oauth`: the provider's Authorization Code + PKCE metadata; the key is the
    /// access token `ctx model login` stored (refreshed when it has expired).
    pub oauth: Option<OAuth>,
}

/// A provider's Authorization Code + PKCE metadata (RFC 6749, RFC 7636), as a driver declares
/// it. The endpoints are `https`, or `http` on this machine's loopback only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OAuth {
    /// The authorization endpoint, where the person signs in.
    pub authorize: Url,
    /// The token endpoint.
    pub token: Url,
    /// The client id registered with the provider (a public client: no secret).
    pub client_id: String,
    /// The scopes asked for, space-separated; `None`: the provider's default.
    pub scope: Option<String>,
}

fn oauth_token_text(s: &str) -> bool {
    !s.is_empty() && s.len() <= 256 && s.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\'))
}

/// The largest driver (a control).
pub const DRIVER_MAX: usize = crate::controls::CONTROL_MAX;

fn env_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl Driver {
    /// The variables tried for its key, in order.
    pub fn key_vars(&self) -> Vec<String> {
        if self.key_env.is_empty() {
            vec![self.api.default_key_env().to_owned()]
        } else {
            self.key_env.clone()
        }
    }

    /// The driver's text, as [`parse`] reads it.
    pub fn to_text(&self) -> String {
        let mut t = format!("api={}\nbase_url={}\n", self.api, self.base_url);
        if !self.key_env.is_empty() {
            t.push_str(&format!("key_env={}\n", self.key_env.join(" ")));
        }
        if let Some(s) = &self.secret {
            t.push_str(&format!("secret={s}\n"));
        }
        if !self.needs_key {
            t.push_str("auth=none\n");
        }
        if let Some(o) = &self.oauth {
            t.push_str(&format!(
                "auth=oauth\noauth_authorize={}\noauth_token={}\noauth_client_id={}\n",
                o.authorize, o.token, o.client_id
            ));
            if let Some(s) = &o.scope {
                t.push_str(&format!("oauth_scope={s}\n"));
            }
        }
        t
    }
}

/// Parses a driver; every problem is reported with its line.
pub fn parse(bytes: &[u8]) -> Result<Driver, String> {
    if bytes.len() > DRIVER_MAX {
        return Err(format!("{} bytes is over the 64 KiB control limit", bytes.len()));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_owned())?;
    let (mut api, mut base_url, mut key_env, mut secret, mut auth) = (None, None, None, None, None);
    let (mut o_authorize, mut o_token, mut o_client, mut o_scope) = (None, None, None, None);
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| format!("line {n}: {line:?} is not KEY=VALUE"))?;
        let (k, v) = (k.trim(), v.trim());
        let slot = match k {
            "api" => &mut api,
            "base_url" => &mut base_url,
            "key_env" => &mut key_env,
            "secret" => &mut secret,
            "auth" => &mut auth,
            "oauth_authorize" => &mut o_authorize,
            "oauth_token" => &mut o_token,
            "oauth_client_id" => &mut o_client,
            "oauth_scope" => &mut o_scope,
            _ => {
                return Err(format!(
                    "line {n}: unknown key {k:?} (api base_url key_env secret auth oauth_authorize oauth_token \
                     oauth_client_id oauth_scope)"
                ));
            }
        };
        if slot.is_some() {
            return Err(format!("line {n}: {k} is set twice"));
        }
        *slot = Some((n, v.to_owned()));
    }
    let (n, a) = api.ok_or_else(|| format!("api is missing ({})", Api::SPELLED))?;
    let api = Api::parse(&a).ok_or_else(|| format!("line {n}: api {a:?} is not {}", Api::SPELLED))?;
    let (n, u) = base_url.ok_or("base_url is missing")?;
    let base_url = Url::parse(&u).map_err(|e| format!("line {n}: base_url: {e}"))?;
    let key_env = match key_env {
        None => Vec::new(),
        Some((n, v)) => {
            let vars: Vec<String> = v.split_ascii_whitespace().map(str::to_owned).collect();
            if vars.is_empty() || vars.len() > 16 {
                return Err(format!("line {n}: key_env names 1 to 16 variables"));
            }
            if let Some(bad) = vars.iter().find(|v| !env_name(v)) {
                return Err(format!("line {n}: key_env: {bad:?} is not a variable name"));
            }
            vars
        }
    };
    let secret = match secret {
        None => None,
        Some((n, s)) => {
            crate::name::validate(&s).map_err(|e| format!("line {n}: secret {s:?}: {e}"))?;
            Some(s)
        }
    };
    let (needs_key, oauth) = match auth.as_ref().map(|(n, v)| (*n, v.as_str())) {
        None | Some((_, "key")) => (true, false),
        Some((_, "none")) => (false, false),
        Some((_, "oauth")) => (true, true),
        Some((n, v)) => return Err(format!("line {n}: auth {v:?} is not key, none or oauth")),
    };
    let oauth = if oauth {
        let url = |slot: Option<(usize, String)>, key: &str| -> Result<Url, String> {
            let (n, u) = slot.ok_or_else(|| format!("auth=oauth needs {key}"))?;
            let url = Url::parse(&u).map_err(|e| format!("line {n}: {key}: {e}"))?;
            if !url.https && !url.is_loopback() {
                return Err(format!(
                    "line {n}: {key}: tokens travel over https only (or http on this machine's loopback)"
                ));
            }
            Ok(url)
        };
        let (authorize, token) = (url(o_authorize, "oauth_authorize")?, url(o_token, "oauth_token")?);
        let (n, client_id) = o_client.ok_or("auth=oauth needs oauth_client_id")?;
        if !oauth_token_text(&client_id) {
            return Err(format!("line {n}: oauth_client_id {client_id:?} is 1 to 256 printable characters"));
        }
        let scope = match o_scope {
            None => None,
            Some((n, s)) => {
                if s.len() > 1024 || s.split(' ').any(|w| !oauth_token_text(w)) {
                    return Err(format!("line {n}: oauth_scope is space-separated printable words"));
                }
                Some(s)
            }
        };
        Some(OAuth { authorize, token, client_id, scope })
    } else {
        if let Some((n, _)) = o_authorize.or(o_token).or(o_client).or(o_scope) {
            return Err(format!("line {n}: oauth_ keys need auth=oauth"));
        }
        None
    };
    Ok(Driver { api, base_url, key_env, secret, needs_key, oauth })
}

/// Checks a model's name, `PROVIDER/MODEL`: two names (see [`crate::name`]).
pub fn check_name(s: &str) -> Result<(&str, &str), String> {
    let (p, m) = s.split_once('/').ok_or_else(|| format!("{s:?} is not PROVIDER/MODEL"))?;
    crate::name::validate(p).map_err(|e| format!("provider {p:?}: {e}"))?;
    crate::name::validate(m).map_err(|e| format!("model {m:?}: {e}"))?;
    if matches!(p, "main" | "helper") {
        return Err(format!("{p:?} is an alias, not a provider"));
    }
    Ok((p, m))
}

/// The aliases `model/main` and `model/helper`.
pub const ALIASES: [&str; 2] = ["main", "helper"];

/// Checks a model's upstream id (`.d/id`): one line of printable ASCII without spaces.
pub fn check_id(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 256 || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{s:?} is not a model id (printable ASCII without spaces, at most 256 bytes)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_round_trips() {
        let d =
            parse(b"# route\napi=openai-responses\nbase_url=http://127.0.0.1:8080/v1/\nkey_env=A_KEY B\n")
                .unwrap();
        assert_eq!(d.api, Api::OpenaiResponses);
        assert_eq!(d.base_url.to_string(), "http://127.0.0.1:8080/v1");
        assert!(d.base_url.is_loopback());
        assert_eq!(d.key_vars(), ["A_KEY", "B"]);
        assert_eq!(parse(d.to_text().as_bytes()).unwrap(), d);
        let a = parse(b"api=anthropic-messages\nbase_url=https://api.example.com\nauth=none\nsecret=ex\n")
            .unwrap();
        assert_eq!(
            (a.base_url.port, a.needs_key, a.key_vars()[0].as_str()),
            (443, false, "ANTHROPIC_API_KEY")
        );
        assert_eq!(a.base_url.authority(), "api.example.com:443");
        assert_eq!(parse(a.to_text().as_bytes()).unwrap(), a);
        let o = parse(
            b"api=openai-chat\nbase_url=https://api.example.com/v1\nauth=oauth\n\
              oauth_authorize=https://auth.example.com/authorize\noauth_token=https://auth.example.com/token\n\
              oauth_client_id=cortexfs\noauth_scope=models.read models.use\n",
        )
        .unwrap();
        let meta = o.oauth.as_ref().unwrap();
        assert_eq!(
            (o.needs_key, meta.client_id.as_str(), meta.token.path.as_str()),
            (true, "cortexfs", "/token")
        );
        assert_eq!(parse(o.to_text().as_bytes()).unwrap(), o);
    }

    #[test]
    fn bad_drivers_say_which_line() {
        for (text, says) in [
            ("api=openai-responses\n", "base_url is missing"),
            ("api=x\nbase_url=http://h\n", "line 1: api"),
            ("api=openai-chat\nbase_url=ftp://h\n", "line 2: base_url"),
            ("api=openai-chat\nbase_url=http://u@h\n", "no user"),
            ("api=openai-chat\nbase_url=http://h:0\n", "not a port"),
            ("api=openai-chat\nbase_url=http://h\napi=openai-chat\n", "line 3: api is set twice"),
            ("api=openai-chat\nbase_url=http://h\nkey=sk-123\n", "unknown key"),
            ("api=openai-chat\nbase_url=http://h\nkey_env=1X\n", "not a variable"),
            ("api=openai-chat\nbase_url=http://h/../x\n", ". or .."),
            ("api=openai-chat\nbase_url=http://[::1\n", "unclosed"),
            ("nonsense\n", "not KEY=VALUE"),
            ("api=openai-chat\nbase_url=http://h\nauth=oauth\n", "needs oauth_authorize"),
            (
                "api=openai-chat\nbase_url=http://h\nauth=oauth\noauth_authorize=http://auth.example.com/a\n",
                "https only",
            ),
            ("api=openai-chat\nbase_url=http://h\noauth_client_id=x\n", "need auth=oauth"),
        ] {
            let e = parse(text.as_bytes()).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        assert!(Url::parse("http://[::1]:9/v1").unwrap().is_loopback());
        assert_eq!(Url::parse("http://[::1]:9/v1").unwrap().authority(), "[::1]:9");
    }

    #[test]
    fn model_names_are_two_names() {
        assert_eq!(check_name("local/qwen").unwrap(), ("local", "qwen"));
        for bad in ["qwen", "a/b/c", "main/x", "../x", "a/", "/b"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert!(check_id("gpt-5.1-codex").is_ok() && check_id("smollm2:135m").is_ok());
        assert!(check_id("a b").is_err() && check_id("").is_err());
    }
}
