//! OAuth 2.0 Authorization Code with PKCE (RFC 6749, RFC 7636) for model routes whose driver
//! says `auth=oauth`.
//!
//! `ctx model login PROVIDER` signs in once: it makes a verifier (32 random bytes, base64url)
//! and a state, prints the provider's authorization URL (`code_challenge_method=S256`,
//! `redirect_uri=http://127.0.0.1:PORT/callback`), takes the one redirect the browser brings
//! back on that loopback listener (its state must match), and exchanges the code with the
//! verifier at the token endpoint. The tokens go to root's secret store only: `oauth:access`,
//! `oauth:refresh`, and `oauth:expires` (when the access token expires, in seconds since the
//! epoch). A launch takes the access token as the route's key and, when it has expired (or
//! will within a minute), refreshes it first. The verifier, the state and the tokens never
//! appear in a storage file, an argument or a log.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use policy::model::OAuth;
use sha2::Digest;

use super::{Error, Result, secrets};

/// Characters a query value keeps as they are (RFC 3986 unreserved).
const VALUE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
/// The most a token endpoint's answer, or the redirect's request head, may be.
const ANSWER_MAX: u64 = 64 * 1024;
/// A token this close to its expiry is refreshed before it is used.
const EARLY: u64 = 60;

fn random(n: usize) -> Result<String> {
    let mut b = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        filled += rustix::rand::getrandom(&mut b[filled..], rustix::rand::GetRandomFlags::empty())
            .map_err(|e| Error::Io(e.into()))?;
    }
    Ok(URL_SAFE_NO_PAD.encode(b))
}

fn now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The verifier's challenge: base64url(SHA-256(verifier)).
pub fn challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes()))
}

/// What a token endpoint answered.
#[derive(Debug)]
struct Tokens {
    access: String,
    refresh: Option<String>,
    expires_in: Option<u64>,
}

/// Posts `form` to the token endpoint and reads its JSON answer (RFC 6749 §5).
fn token_request(meta: &OAuth, form: &[(&str, &str)]) -> Result<Tokens> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into();
    let url = meta.token.to_string();
    let unreachable = |e: ureq::Error| Error::Unavailable(format!("the token endpoint {url}: {e}"));
    let mut answer = agent
        .post(&url)
        .header("Accept", "application/json")
        .send_form(form.iter().copied())
        .map_err(unreachable)?;
    let status = answer.status().as_u16();
    let body = answer.body_mut().with_config().limit(ANSWER_MAX).read_to_string().map_err(unreachable)?;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
    if status != 200 {
        let said = [v["error"].as_str(), v["error_description"].as_str()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(": ");
        return Err(Error::Denied(format!("the token endpoint {url} answered {status}: {said}")));
    }
    let text =
        |k: &str| v[k].as_str().filter(|s| !s.is_empty() && s.len() <= secrets::VALUE_MAX).map(str::to_owned);
    let access = text("access_token").ok_or_else(|| {
        Error::Unavailable(format!("the token endpoint {url} answered without an access_token"))
    })?;
    Ok(Tokens { access, refresh: text("refresh_token"), expires_in: v["expires_in"].as_u64() })
}

/// Keeps `t` in the store: a refresh token answered replaces the old one; no expiry answered
/// means none is known.
fn keep(provider: &str, t: &Tokens) -> Result<()> {
    secrets::set(provider, "oauth:access", t.access.as_bytes())?;
    if let Some(r) = &t.refresh {
        secrets::set(provider, "oauth:refresh", r.as_bytes())?;
    }
    match t.expires_in {
        Some(s) => secrets::set(provider, "oauth:expires", (now().saturating_add(s)).to_string().as_bytes())?,
        None => {
            secrets::remove(provider, "oauth:expires")?;
        }
    }
    Ok(())
}

/// The query parameters of a request target `path?query`, decoded (`+` is a space; invalid
/// UTF-8 is replaced): the redirect a browser brings back, any bytes at all.
pub fn query(target: &str) -> Vec<(String, String)> {
    let q = target.split_once('?').map_or("", |(_, q)| q);
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let dec = |s: &str| {
                percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned()
            };
            (dec(k), dec(v))
        })
        .collect()
}

fn reply(stream: &mut std::net::TcpStream, status: &str, text: &str) {
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
}

/// Signs in to `provider`: `announce` is given the authorization URL to open; the redirect is
/// awaited on `listener` (a loopback listener) for at most `wait`. The tokens are stored.
pub fn login(
    provider: &str,
    meta: &OAuth,
    listener: &TcpListener,
    announce: impl FnOnce(&str),
    wait: Duration,
) -> Result<()> {
    let port = listener.local_addr().map_err(Error::Io)?.port();
    let redirect = format!("http://127.0.0.1:{port}/callback");
    let (verifier, state) = (random(32)?, random(16)?);
    let enc = |s: &str| utf8_percent_encode(s, VALUE).to_string();
    let mut url = format!(
        "{}?response_type=code&client_id={}&redirect_uri={}&code_challenge={}&code_challenge_method=S256&state={}",
        meta.authorize,
        enc(&meta.client_id),
        enc(&redirect),
        challenge(&verifier),
        state
    );
    if let Some(s) = &meta.scope {
        url.push_str(&format!("&scope={}", enc(s)));
    }
    announce(&url);
    listener.set_nonblocking(true).map_err(Error::Io)?;
    let deadline = Instant::now() + wait;
    let code = loop {
        let mut stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Error::Unavailable(format!(
                        "no sign-in came back to {redirect} within {} s",
                        wait.as_secs()
                    )));
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(e) => return Err(Error::Io(e)),
        };
        stream.set_nonblocking(false).map_err(Error::Io)?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(Error::Io)?;
        let mut line = String::new();
        let read = BufReader::new(std::io::Read::take(&mut stream, ANSWER_MAX)).read_line(&mut line);
        let target = match read.ok().and_then(|_| line.strip_prefix("GET ")).and_then(|r| r.split(' ').next())
        {
            Some(t) if t == "/callback" || t.starts_with("/callback?") => t.to_owned(),
            _ => {
                reply(&mut stream, "404 Not Found", "not a sign-in\n");
                continue;
            }
        };
        let params = query(&target);
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        if get("state").as_deref() != Some(state.as_str()) {
            reply(&mut stream, "400 Bad Request", "this sign-in is not the one ctx model login started\n");
            return Err(Error::Denied("the redirect's state does not match this login's: refused".into()));
        }
        if let Some(e) = get("error") {
            reply(&mut stream, "200 OK", "sign-in refused; see the terminal\n");
            let why = get("error_description").map(|d| format!(": {d}")).unwrap_or_default();
            return Err(Error::Denied(format!("the provider refused the sign-in: {e}{why}")));
        }
        match get("code") {
            Some(c) if !c.is_empty() => {
                reply(&mut stream, "200 OK", "signed in; you may close this window\n");
                break c;
            }
            _ => {
                reply(&mut stream, "400 Bad Request", "no code\n");
                return Err(Error::Invalid("the redirect carried no code".into()));
            }
        }
    };
    let tokens = token_request(
        meta,
        &[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("redirect_uri", &redirect),
            ("client_id", &meta.client_id),
            ("code_verifier", &verifier),
        ],
    )?;
    keep(provider, &tokens)
}

/// The access token of `provider`, refreshed first when it has expired or will within a
/// minute (and a refresh token is kept); `None` when nobody has signed in.
pub fn access_token(provider: &str, meta: &OAuth) -> Result<Option<Vec<u8>>> {
    let Some(access) = secrets::get(provider, "oauth:access")? else { return Ok(None) };
    let expires = secrets::get(provider, "oauth:expires")?
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.trim().parse::<u64>().ok());
    let stale = expires.is_some_and(|at| now().saturating_add(EARLY) >= at);
    if !stale {
        return Ok(Some(access));
    }
    let Some(refresh) = secrets::get(provider, "oauth:refresh")? else {
        return Err(Error::Unavailable(format!(
            "the {provider} access token has expired and no refresh token is kept: ctx model login {provider}"
        )));
    };
    let refresh =
        String::from_utf8(refresh).map_err(|_| Error::Invalid("the refresh token is not text".into()))?;
    let mut form = vec![
        ("grant_type", "refresh_token"),
        ("refresh_token", refresh.as_str()),
        ("client_id", meta.client_id.as_str()),
    ];
    if let Some(s) = &meta.scope {
        form.push(("scope", s));
    }
    let tokens = token_request(meta, &form)?;
    keep(provider, &tokens)?;
    Ok(Some(tokens.access.into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7636, appendix B: the verifier and challenge of the example.
    #[test]
    fn the_challenge_of_rfc_7636_appendix_b() {
        assert_eq!(
            challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
        let v = random(32).unwrap();
        assert_eq!(v.len(), 43, "32 bytes, base64url without padding: {v}");
        assert!(v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    }

    #[test]
    fn a_redirect_query_is_decoded() {
        let q = query("/callback?code=a%2Fb+c&state=xyz&empty");
        assert_eq!(
            q,
            [
                ("code".into(), "a/b c".into()),
                ("state".into(), "xyz".into()),
                ("empty".into(), String::new())
            ]
        );
    }
}
