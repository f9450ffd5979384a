//! A scripted OAuth 2.0 provider on this host's loopback (it stands in for a provider's sign-in,
//! which tests cannot have here): an authorization endpoint that approves at once and
//! redirects to the client's `redirect_uri` with a code, and a token endpoint that gives tokens
//! for that code only with the PKCE verifier of its challenge (RFC 7636, S256), and new tokens
//! for its refresh token. Every token request is kept for the test to look at.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use base64::Engine;
use sha2::Digest;

/// One token request.
#[derive(Clone, Debug)]
pub struct Grant {
    /// Its form, decoded.
    pub form: HashMap<String, String>,
    /// What it was answered (the HTTP status).
    pub status: u16,
}

#[derive(Debug, Default)]
struct State {
    /// The challenge, redirect and client of each code given.
    codes: HashMap<String, (String, String, String)>,
    grants: Vec<Grant>,
    issued: u32,
}

/// The provider.
#[derive(Debug)]
pub struct Provider {
    /// Its port on 127.0.0.1.
    pub port: u16,
    state: Arc<Mutex<State>>,
    /// Seconds each access token lives (`expires_in`).
    pub lifetime: u64,
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned()
}

fn params(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

impl Provider {
    /// Listens on 127.0.0.1; each access token lives `lifetime` seconds.
    pub fn start(lifetime: u64) -> Provider {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let state = Arc::new(Mutex::new(State::default()));
        let s2 = Arc::clone(&state);
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let s = Arc::clone(&s2);
                std::thread::spawn(move || {
                    let _ = serve(c, &s, lifetime);
                });
            }
        });
        Provider { port, state, lifetime }
    }

    /// The token requests so far.
    pub fn grants(&self) -> Vec<Grant> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).grants.clone()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

fn reply(w: &mut TcpStream, status: &str, headers: &str, body: &str) -> std::io::Result<()> {
    write!(
        w,
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn serve(c: TcpStream, state: &Mutex<State>, lifetime: u64) -> std::io::Result<()> {
    let mut r = BufReader::new(c.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().unwrap_or(0).min(1 << 16);
        }
    }
    let mut w = c.try_clone()?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match (method, path) {
        ("GET", "/authorize") => {
            let q = params(query);
            let ok = q.get("response_type").map(String::as_str) == Some("code")
                && q.get("code_challenge_method").map(String::as_str) == Some("S256");
            let (Some(redirect), Some(challenge), Some(client), Some(st)) =
                (q.get("redirect_uri"), q.get("code_challenge"), q.get("client_id"), q.get("state"))
            else {
                return reply(&mut w, "400 Bad Request", "", "missing parameters\n");
            };
            if !ok {
                return reply(&mut w, "400 Bad Request", "", "code with S256 only\n");
            }
            let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
            s.issued += 1;
            let code = format!("code-{}", s.issued);
            s.codes.insert(code.clone(), (challenge.clone(), redirect.clone(), client.clone()));
            let to = format!("{redirect}?code={code}&state={st}");
            reply(&mut w, "302 Found", &format!("Location: {to}\r\n"), "")
        }
        ("POST", "/token") => {
            let mut body = vec![0; len];
            r.read_exact(&mut body)?;
            let form = params(&String::from_utf8_lossy(&body));
            let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
            let get = |k: &str| form.get(k).cloned().unwrap_or_default();
            let granted = match get("grant_type").as_str() {
                "authorization_code" => {
                    s.codes.remove(&get("code")).is_some_and(|(challenge, redirect, client)| {
                        let made = base64::engine::general_purpose::URL_SAFE_NO_PAD
                            .encode(sha2::Sha256::digest(get("code_verifier").as_bytes()));
                        made == challenge && redirect == get("redirect_uri") && client == get("client_id")
                    })
                }
                "refresh_token" => get("refresh_token").starts_with("rt-"),
                _ => false,
            };
            let status = if granted { 200 } else { 400 };
            s.grants.push(Grant { form: form.clone(), status });
            if !granted {
                return reply(
                    &mut w,
                    "400 Bad Request",
                    "Content-Type: application/json\r\n",
                    r#"{"error":"invalid_grant"}"#,
                );
            }
            s.issued += 1;
            let n = s.issued;
            let body = format!(
                r#"{{"access_token":"at-{n}","refresh_token":"rt-{n}","token_type":"Bearer","expires_in":{lifetime}}}"#
            );
            reply(&mut w, "200 OK", "Content-Type: application/json\r\n", &body)
        }
        _ => reply(&mut w, "404 Not Found", "", ""),
    }
}
