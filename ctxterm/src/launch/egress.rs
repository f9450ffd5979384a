//! The egress proxy of a run whose model is elsewhere and whose policy grants no network: it
//! lets the CLI reach its model's `host:port` and nothing else.
//!
//! The supervisor serves it on a port of the host's loopback, which pasta splices into the
//! sandbox's otherwise empty network namespace; the CLI gets `HTTPS_PROXY` (and `HTTP_PROXY`)
//! pointing at it. It opens `CONNECT` tunnels to the model's `host:port` only, and forwards
//! plain `http` requests (absolute-form) only to that `host:port` when the route is `http`.
//! Anything else is answered `403` and reported (a `net.refused` event in the session).
//! Requests are read up to [`HEAD_MAX`] bytes; the tunnel copies bytes both ways until either
//! side closes.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use policy::model::Url;

/// The largest request head read.
pub const HEAD_MAX: usize = 16 * 1024;

/// What the proxy lets through: the model's URL.
#[derive(Clone, Debug)]
pub struct Allowed {
    /// The route's base URL.
    pub url: Url,
}

impl Allowed {
    /// Whether `target` of a `CONNECT` is the model's `host:port`.
    fn connect(&self, target: &str) -> bool {
        let (host, port) = match target.rsplit_once(':') {
            Some((h, p)) => (h.trim_start_matches('[').trim_end_matches(']'), p.parse::<u16>().ok()),
            None => return false,
        };
        host.eq_ignore_ascii_case(&self.url.host) && port == Some(self.url.port)
    }

    /// Whether the absolute-form `target` of a plain request is on the model's `host:port`
    /// (only for an `http` route).
    fn plain(&self, target: &str) -> bool {
        if self.url.https {
            return false;
        }
        let base = target.split(['?', '#']).next().unwrap_or("");
        Url::parse(base).is_ok_and(|u| !u.https && u.host == self.url.host && u.port == self.url.port)
    }
}

/// Reads a request head (through the blank line) from `c`; `None` when it is too long or the
/// connection ends first.
fn head(c: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut h = Vec::new();
    let mut b = [0u8; 1];
    while !h.ends_with(b"\r\n\r\n") {
        if h.len() >= HEAD_MAX || c.read(&mut b)? == 0 {
            return Ok(None);
        }
        h.push(b[0]);
    }
    Ok(Some(h))
}

/// Copies bytes both ways between `a` and `b` until either side ends.
fn splice(a: TcpStream, b: TcpStream) -> io::Result<()> {
    let (mut a2, mut b2) = (a.try_clone()?, b.try_clone()?);
    let t = std::thread::spawn(move || {
        let _ = io::copy(&mut a2, &mut b2);
        let _ = b2.shutdown(Shutdown::Write);
    });
    let (mut a, mut b) = (a, b);
    let _ = io::copy(&mut b, &mut a);
    let _ = a.shutdown(Shutdown::Write);
    let _ = t.join();
    Ok(())
}

fn upstream(url: &Url) -> io::Result<TcpStream> {
    let addrs: Vec<_> = (url.host.as_str(), url.port).to_socket_addrs()?.collect();
    let mut last = io::Error::other("no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, Duration::from_secs(10)) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn serve_one(mut c: TcpStream, allowed: &Allowed, refused: &(dyn Fn(&str) + Send + Sync)) -> io::Result<()> {
    let Some(h) = head(&mut c)? else { return Ok(()) };
    let line = String::from_utf8_lossy(h.split(|b| *b == b'\r').next().unwrap_or_default()).into_owned();
    let mut words = line.split_ascii_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let deny = |c: &mut TcpStream, why: &str| -> io::Result<()> {
        refused(why);
        c.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        if !allowed.connect(target) {
            return deny(&mut c, target);
        }
        match upstream(&allowed.url) {
            Ok(up) => {
                c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
                splice(c, up)
            }
            Err(_) => {
                c.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            }
        }
    } else if allowed.plain(target) {
        match upstream(&allowed.url) {
            Ok(mut up) => {
                up.write_all(&h)?;
                splice(c, up)
            }
            Err(_) => {
                c.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            }
        }
    } else {
        deny(&mut c, &format!("{method} {target}"))
    }
}

/// Serves the proxy on a fresh port of 127.0.0.1 in a thread of its own; returns the port.
/// `refused` is told what each refused request asked for.
pub fn serve(allowed: Allowed, refused: impl Fn(&str) + Send + Sync + 'static) -> io::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    let refused: Arc<dyn Fn(&str) + Send + Sync> = Arc::new(refused);
    std::thread::Builder::new().name("egress".into()).spawn(move || {
        for c in l.incoming().flatten() {
            let (allowed, refused) = (allowed.clone(), Arc::clone(&refused));
            let _ = std::thread::Builder::new().name("egress-conn".into()).spawn(move || {
                let _ = serve_one(c, &allowed, &*refused);
            });
        }
    })?;
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_models_host_and_port_pass() {
        let a = Allowed { url: Url::parse("https://api.example.com/v1").unwrap() };
        assert!(a.connect("api.example.com:443") && a.connect("API.example.com:443"));
        assert!(!a.connect("api.example.com:80") && !a.connect("evil.example.com:443") && !a.connect("x"));
        assert!(!a.plain("http://api.example.com:443/v1"), "an https route takes tunnels only");
        let h = Allowed { url: Url::parse("http://10.0.0.2:8080").unwrap() };
        assert!(h.plain("http://10.0.0.2:8080/v1/responses?x=1"));
        assert!(!h.plain("http://10.0.0.3:8080/") && !h.plain("/relative") && !h.plain("http://10.0.0.2/"));
        let v6 = Allowed { url: Url::parse("https://[fd00::2]:9443").unwrap() };
        assert!(v6.connect("[fd00::2]:9443"));
    }
}
