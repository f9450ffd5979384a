//! The egress proxy of a run whose model is elsewhere and whose policy grants no network: it
//! lets the CLI reach its model's `host:port` and nothing else.
//!
//! The supervisor serves it on a port of the host's loopback, which pasta splices into the
//! sandbox's otherwise empty network namespace; the CLI gets `HTTPS_PROXY` (and `HTTP_PROXY`)
//! pointing at it. It opens `CONNECT` tunnels to the model's `host:port` only, and forwards
//! plain `http` requests (absolute-form) only to that `host:port` when the route is `http`.
//! Anything else is answered `403` and reported (a `net.refused` event in the session).
//!
//! What the proxy spends on the agent's behalf is bounded ([`Limits`]): at most
//! [`CONNS_MAX`] connections of a run are served at once (two threads each), a further one is
//! answered `503` and closed (reported once per burst); a request head is read up to
//! [`HEAD_MAX`] bytes within [`HEAD_TIME`]; a tunnel that carries nothing either way for
//! [`IDLE_TIME`] is closed.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use policy::model::Url;

/// The largest request head read.
pub const HEAD_MAX: usize = 16 * 1024;
/// The most connections of one run served at once.
pub const CONNS_MAX: usize = 64;
/// How long a request head may take to arrive.
pub const HEAD_TIME: Duration = Duration::from_secs(10);
/// How long a tunnel may carry nothing before it is closed.
pub const IDLE_TIME: Duration = Duration::from_secs(300);

/// The bounds of one proxy.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once.
    pub conns: usize,
    /// Time for a request head.
    pub head: Duration,
    /// Idle time of a tunnel.
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { conns: CONNS_MAX, head: HEAD_TIME, idle: IDLE_TIME }
    }
}

/// What the proxy lets through: the model's URL.
#[derive(Clone, Debug)]
pub struct Allowed {
    /// The route's base URL.
    pub url: Url,
}

impl Allowed {
    /// Whether `target` of a `CONNECT` is the model's `host:port`.
    pub fn connect(&self, target: &str) -> bool {
        let (host, port) = match target.rsplit_once(':') {
            Some((h, p)) => (h.trim_start_matches('[').trim_end_matches(']'), p.parse::<u16>().ok()),
            None => return false,
        };
        host.eq_ignore_ascii_case(&self.url.host) && port == Some(self.url.port)
    }

    /// Whether the absolute-form `target` of a plain request is on the model's `host:port`
    /// (only for an `http` route).
    pub fn plain(&self, target: &str) -> bool {
        if self.url.https {
            return false;
        }
        let base = target.split(['?', '#']).next().unwrap_or("");
        Url::parse(base).is_ok_and(|u| !u.https && u.host == self.url.host && u.port == self.url.port)
    }
}

/// Where the request head in `bytes` ends (after its blank line), if it is there.
pub fn head_end(bytes: &[u8]) -> Option<usize> {
    bytes.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// The method and target of a request head's first line (empty when missing).
pub fn request_line(head: &[u8]) -> (String, String) {
    let line = String::from_utf8_lossy(head.split(|b| *b == b'\r').next().unwrap_or_default()).into_owned();
    let mut words = line.split_ascii_whitespace();
    (words.next().unwrap_or("").to_owned(), words.next().unwrap_or("").to_owned())
}

/// Reads a request head (through the blank line) from `c` within `within`; returns it and
/// whatever followed it in the same reads, or `None` when it is too long, too slow, or the
/// connection ends first.
fn head(c: &mut TcpStream, within: Duration) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let until = Instant::now() + within;
    let mut h = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        if let Some(end) = head_end(&h) {
            let rest = h.split_off(end);
            return Ok(Some((h, rest)));
        }
        let left = until.saturating_duration_since(Instant::now());
        if h.len() >= HEAD_MAX || left.is_zero() {
            return Ok(None);
        }
        c.set_read_timeout(Some(left))?;
        match c.read(&mut b) {
            Ok(0) => return Ok(None),
            Ok(n) => h.extend_from_slice(&b[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Ok(None);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Copies bytes both ways between `a` and `b` until either side ends or neither carries
/// anything for `idle` (a model streaming its answer to a client that says nothing keeps the
/// tunnel open).
/// Returns the bytes carried from `a` to `b` and from `b` to `a`.
fn splice(a: TcpStream, b: TcpStream, idle: Duration) -> io::Result<(u64, u64)> {
    // Reads wake at least this often to look at the other direction's last bytes.
    let tick = idle.min(Duration::from_secs(5));
    for s in [&a, &b] {
        s.set_read_timeout(Some(tick))?;
    }
    let started = Instant::now();
    let last = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let pump = move |mut from: TcpStream, mut to: TcpStream, last: Arc<std::sync::atomic::AtomicU64>| {
        let mut buf = [0u8; 16 * 1024];
        let mut carried = 0u64;
        loop {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    carried += n as u64;
                    last.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    let quiet = started.elapsed().as_millis() as u64 - last.load(Ordering::Relaxed);
                    if quiet >= idle.as_millis() as u64 {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
        carried
    };
    let (a2, b2, last2) = (a.try_clone()?, b.try_clone()?, Arc::clone(&last));
    let t = std::thread::Builder::new().name("egress-conn".into()).spawn(move || pump(a2, b2, last2))?;
    let down = pump(b, a, last);
    let up = t.join().unwrap_or(0);
    Ok((up, down))
}

/// One use of the model's route through the proxy: a tunnel or a forwarded request, from the
/// request to the close of its connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Use {
    /// The request line's method and target (`CONNECT host:port`, `POST http://...`).
    pub request: String,
    /// What the proxy answered or forwarded: 200 (a tunnel made, or a request forwarded),
    /// 502 (the model could not be reached).
    pub status: u16,
    /// Bytes from the CLI to the model, and back.
    pub up: u64,
    /// Bytes from the model to the CLI.
    pub down: u64,
    /// How long the connection lasted.
    pub duration: Duration,
}

/// What the proxy reports: each refused request (and each burst of connections over the
/// limit), and each use of the model's route.
pub trait Report: Send + Sync {
    /// A request refused, as it asked.
    fn refused(&self, what: &str);
    /// A use of the model's route, once its connection has closed.
    fn used(&self, u: &Use);
}

/// A function told of refusals only.
impl<F: Fn(&str) + Send + Sync> Report for F {
    fn refused(&self, what: &str) {
        self(what);
    }

    fn used(&self, _: &Use) {}
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

fn serve_one(mut c: TcpStream, allowed: &Allowed, limits: Limits, report: &dyn Report) -> io::Result<()> {
    let Some((h, rest)) = head(&mut c, limits.head)? else { return Ok(()) };
    let started = Instant::now();
    let (method, target) = request_line(&h);
    let (method, target) = (method.as_str(), target.as_str());
    let deny = |c: &mut TcpStream, why: &str| -> io::Result<()> {
        report.refused(why);
        c.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    };
    let connect = method.eq_ignore_ascii_case("CONNECT");
    if connect && !allowed.connect(target) {
        return deny(&mut c, target);
    }
    if !connect && !allowed.plain(target) {
        return deny(&mut c, &format!("{method} {target}"));
    }
    // A plain request's query may carry anything (a key): the record keeps the URL without it.
    let shown = target.split(['?', '#']).next().unwrap_or("");
    let mut used =
        Use { request: format!("{method} {shown}"), status: 502, up: 0, down: 0, duration: Duration::ZERO };
    let r = match upstream(&allowed.url) {
        Ok(mut up) => {
            used.status = 200;
            // Reported however the connection ends.
            let mut first = || -> io::Result<()> {
                if connect {
                    c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
                } else {
                    up.write_all(&h)?;
                    used.up += h.len() as u64;
                }
                up.write_all(&rest)?;
                used.up += rest.len() as u64;
                Ok(())
            };
            first().and_then(|()| {
                splice(c, up, limits.idle).map(|(to_model, back)| {
                    used.up += to_model;
                    used.down = back;
                })
            })
        }
        Err(_) => c.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    };
    used.duration = started.elapsed();
    report.used(&used);
    r
}

/// Serves the proxy on a fresh port of 127.0.0.1 in a thread of its own, within `limits`;
/// returns the port. `report` is told what each refused request asked for (and once per burst
/// of connections over the limit), and each use of the model's route.
pub fn serve(allowed: Allowed, limits: Limits, report: impl Report + 'static) -> io::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    let refused: Arc<dyn Report> = Arc::new(report);
    let open = Arc::new(AtomicUsize::new(0));
    let told = AtomicBool::new(false);
    std::thread::Builder::new().name("egress".into()).spawn(move || {
        for mut c in l.incoming().flatten() {
            if open.load(Ordering::Acquire) >= limits.conns {
                if !told.swap(true, Ordering::AcqRel) {
                    refused.refused(&format!("a connection past {} open at once", limits.conns));
                }
                let _ = c.set_write_timeout(Some(Duration::from_secs(1)));
                let _ = c.write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                continue;
            }
            told.store(false, Ordering::Release);
            open.fetch_add(1, Ordering::AcqRel);
            let (allowed, refused, open2) = (allowed.clone(), Arc::clone(&refused), Arc::clone(&open));
            let spawned = std::thread::Builder::new().name("egress-conn".into()).spawn(move || {
                let _ = serve_one(c, &allowed, limits, &*refused);
                open2.fetch_sub(1, Ordering::AcqRel);
            });
            if spawned.is_err() {
                open.fetch_sub(1, Ordering::AcqRel);
            }
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

    /// Connections past the limit are answered 503 at once and reported once; a head that
    /// never comes frees its place after the head time.
    #[test]
    fn connections_past_the_limit_are_refused_and_a_silent_one_is_dropped() {
        let url = Url::parse("http://127.0.0.1:9").unwrap();
        let told = Arc::new(std::sync::Mutex::new(Vec::new()));
        let t2 = Arc::clone(&told);
        let limits = Limits { conns: 3, head: Duration::from_millis(300), idle: Duration::from_secs(5) };
        let port =
            serve(Allowed { url }, limits, move |w: &str| t2.lock().unwrap().push(w.to_owned())).unwrap();
        let held: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(50));
        for _ in 0..2 {
            let mut extra = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let mut answer = String::new();
            extra.read_to_string(&mut answer).unwrap();
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        }
        assert_eq!(told.lock().unwrap().len(), 1, "one report per burst: {:?}", told.lock().unwrap());
        assert!(told.lock().unwrap()[0].contains("past 3"));
        // The held ones said nothing: each is closed once its head time is up.
        for mut h in held {
            let mut b = Vec::new();
            h.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            assert_eq!(h.read_to_end(&mut b).unwrap(), 0, "closed without an answer");
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut again = TcpStream::connect(("127.0.0.1", port)).unwrap();
        again.write_all(b"GET http://elsewhere.example/ HTTP/1.1\r\n\r\n").unwrap();
        let mut answer = String::new();
        again.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "places come back: {answer}");
    }

    /// `tail -f model/<p>/<m>.d/log` said nothing of a run's use of its model: each tunnel is
    /// reported when it closes, with the bytes it carried each way.
    #[test]
    fn each_use_of_the_route_is_reported_with_its_bytes() {
        struct Uses(std::sync::Mutex<Vec<Use>>);
        impl Report for Arc<Uses> {
            fn refused(&self, _: &str) {}
            fn used(&self, u: &Use) {
                self.0.lock().unwrap().push(u.clone());
            }
        }
        let model = TcpListener::bind("127.0.0.1:0").unwrap();
        let mport = model.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = model.accept().unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).unwrap();
            s.write_all(b"pong!").unwrap();
        });
        let uses = Arc::new(Uses(std::sync::Mutex::new(Vec::new())));
        let url = Url::parse(&format!("https://127.0.0.1:{mport}")).unwrap();
        let port = serve(Allowed { url }, Limits::default(), Arc::clone(&uses)).unwrap();
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(format!("CONNECT 127.0.0.1:{mport} HTTP/1.1\r\n\r\n").as_bytes()).unwrap();
        let mut head = [0u8; 39];
        c.read_exact(&mut head).unwrap();
        assert!(head.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&head));
        c.write_all(b"ping").unwrap();
        let mut answer = Vec::new();
        c.read_to_end(&mut answer).unwrap();
        assert_eq!(answer, b"pong!");
        let t = Instant::now();
        while uses.0.lock().unwrap().is_empty() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let u = uses.0.lock().unwrap()[0].clone();
        assert_eq!(
            (u.request.as_str(), u.status, u.up, u.down),
            (&*format!("CONNECT 127.0.0.1:{mport}"), 200, 4, 5)
        );
    }

    /// A tunnel whose model streams to a client that says nothing stays open past the idle
    /// time; one where neither side says anything is closed after it.
    #[test]
    fn a_tunnel_is_idle_only_when_neither_way_carries_anything() {
        let pair = || {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            (c, l.accept().unwrap().0)
        };
        let idle = Duration::from_millis(300);
        let (mut client, a) = pair();
        let (b, mut server) = pair();
        std::thread::spawn(move || splice(a, b, idle));
        std::thread::spawn(move || {
            for _ in 0..10 {
                server.write_all(b"x").unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let mut got = Vec::new();
        client.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        client.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 10, "the stream went on past the idle time");
        let (mut client, a) = pair();
        let (b, _server) = pair();
        std::thread::spawn(move || splice(a, b, idle));
        let mut got = Vec::new();
        client.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        assert_eq!(client.read_to_end(&mut got).unwrap(), 0, "closed once quiet both ways");
    }
}
