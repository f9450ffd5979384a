//! An agent's resource ceilings: the host-owned control `agent/<n>.d/limits`.
//!
//! The ABI's agent controls name no ceilings, so CortexFS adds this one, in the grammar of the
//! other KEY=VALUE controls (tsh's config): one `key=value` a line, blank lines and `#`
//! comments allowed, each key at most once, unknown keys refused.
//!
//! | key | value | default |
//! |---|---|---|
//! | `memory` | bytes, with an optional binary suffix `K`, `M`, `G`, `T`; or `max` | `4G` |
//! | `pids` | processes and threads, at least 1; or `max` | `1024` |
//! | `cpu` | percent of one CPU (`150`: one and a half), at least 1; or `max` | `max` |
//! | `disk` | bytes the agent's files may hold, written through `/ctx` (its home and sessions, the shared spaces it writes), with a suffix; or `max` | `max` |
//! | `files` | files and directories the agent may have there, at least 1; or `max` | `max` |
//!
//! A missing control, or a missing key, takes the default; `max` is no ceiling.

/// The ceilings of one run; `None` is no ceiling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Memory, in bytes (swap included where the host can say so).
    pub memory: Option<u64>,
    /// Processes and threads.
    pub pids: Option<u64>,
    /// CPU time, in percent of one CPU.
    pub cpu: Option<u64>,
    /// Bytes of the agent's files (their sizes), counted by the daemon.
    pub disk: Option<u64>,
    /// The agent's files and directories, counted by the daemon.
    pub files: Option<u64>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { memory: Some(4 << 30), pids: Some(1024), cpu: None, disk: None, files: None }
    }
}

/// Parses a size: digits with an optional binary suffix (`K`, `M`, `G`, `T`).
pub fn parse_size(v: &str) -> Result<u64, String> {
    let (digits, shift) = match v.as_bytes().last() {
        Some(b'K' | b'k') => (&v[..v.len() - 1], 10),
        Some(b'M' | b'm') => (&v[..v.len() - 1], 20),
        Some(b'G' | b'g') => (&v[..v.len() - 1], 30),
        Some(b'T' | b't') => (&v[..v.len() - 1], 40),
        _ => (v, 0),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{v:?} is not a size (bytes, or with K, M, G or T)"))?;
    n.checked_mul(1 << shift).filter(|&b| b > 0).ok_or_else(|| format!("{v:?} is out of range"))
}

fn count(v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{v:?} is not a number of at least 1")),
    }
}

/// Parses the `limits` control.
pub fn parse(text: &[u8]) -> Result<Limits, String> {
    let text = std::str::from_utf8(text).map_err(|_| "not UTF-8".to_owned())?;
    let mut l = Limits::default();
    let mut seen: Vec<&str> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |e: String| format!("line {}: {e}", i + 1);
        let (k, v) = line.split_once('=').ok_or_else(|| at("expected key=value".into()))?;
        let (k, v) = (k.trim(), v.trim());
        if seen.contains(&k) {
            return Err(at(format!("{k} is given twice")));
        }
        let unlimited = v == "max";
        match k {
            "memory" => l.memory = if unlimited { None } else { Some(parse_size(v).map_err(at)?) },
            "pids" => l.pids = if unlimited { None } else { Some(count(v).map_err(at)?) },
            "cpu" => l.cpu = if unlimited { None } else { Some(count(v).map_err(at)?) },
            "disk" => l.disk = if unlimited { None } else { Some(parse_size(v).map_err(at)?) },
            "files" => l.files = if unlimited { None } else { Some(count(v).map_err(at)?) },
            _ => return Err(at(format!("unknown key {k:?} (memory, pids, cpu, disk, files)"))),
        }
        seen.push(k);
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_their_defaults() {
        assert_eq!(parse(b"").unwrap(), Limits::default());
        assert_eq!(
            parse(b"# ceilings\nmemory=256M\npids = 64\ncpu=150\n").unwrap(),
            Limits { memory: Some(256 << 20), pids: Some(64), cpu: Some(150), disk: None, files: None }
        );
        assert_eq!(parse(b"memory=max\n").unwrap().memory, None);
        let d = parse(b"disk=1M\nfiles=20\n").unwrap();
        assert_eq!((d.disk, d.files), (Some(1 << 20), Some(20)));
        for bad in
            [&b"memory=lots\n"[..], b"pids=0\n", b"cpu=-1\n", b"swap=1G\n", b"pids=1\npids=2\n", b"memory\n"]
        {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(parse_size("1K"), Ok(1024));
        assert!(parse_size("99999999999T").is_err());
    }
}
