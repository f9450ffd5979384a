//! Another host, as far as a test can have one on this machine: a network namespace the test
//! creates, joined to the host by a veth pair (`10.231.N.1` on the host's side, `10.231.N.2`
//! inside), where listeners are bound. Traffic to it never leaves this machine.

use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};

static NEXT: AtomicU8 = AtomicU8::new(1);

/// The namespace; removed (with its veth pair) when dropped.
#[derive(Debug)]
pub struct Elsewhere {
    /// Its name (`ip netns`).
    pub ns: String,
    /// Its address, reachable from the host.
    pub addr: Ipv4Addr,
}

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("ip");
    assert!(o.status.success(), "ip {args:?}: {}", crate::shown(&o));
}

impl Elsewhere {
    /// Creates the namespace and its link to the host.
    pub fn new() -> Elsewhere {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id() % 100_000;
        let ns = format!("cfs-else-{pid}-{n}");
        let (host, inside) = (format!("cfe{pid}a{n}"), format!("cfe{pid}b{n}"));
        ip(&["netns", "add", &ns]);
        let e = Elsewhere { ns, addr: Ipv4Addr::new(10, 231, n, 2) };
        ip(&["link", "add", &host, "type", "veth", "peer", "name", &inside, "netns", &e.ns]);
        ip(&["addr", "add", &format!("10.231.{n}.1/30"), "dev", &host]);
        ip(&["link", "set", &host, "up"]);
        ip(&["-n", &e.ns, "addr", "add", &format!("10.231.{n}.2/30"), "dev", &inside]);
        ip(&["-n", &e.ns, "link", "set", &inside, "up"]);
        ip(&["-n", &e.ns, "link", "set", "lo", "up"]);
        e
    }

    /// A TCP listener on a fresh port of its address, made inside the namespace.
    pub fn listen(&self) -> TcpListener {
        let (ns, addr) = (self.ns.clone(), self.addr);
        std::thread::spawn(move || {
            let f = std::fs::File::open(format!("/run/netns/{ns}")).expect("the namespace");
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&f),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("setns");
            TcpListener::bind((addr, 0)).expect("bind inside")
        })
        .join()
        .expect("the listening thread")
    }
}

impl Default for Elsewhere {
    fn default() -> Self {
        Elsewhere::new()
    }
}

impl Drop for Elsewhere {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}
