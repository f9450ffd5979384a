//! Live counters of each tool's and model's use, kept in memory from the lines their logs take
//! (`tool.call` for a tool; `model.use` and `net.refused` for a model), and served as the
//! object's `status` control: `cat /ctx/tool/fs.read.d/status` says how it is used without
//! reading its log. Counted since the daemon started, as the daemon takes each line. The lines
//! come from agents (tsh appends a tool's as the agent): any bytes are taken, never a panic.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Mutex;

/// The most distinct runs (agent, session) an object's counters remember.
const RUNS_MAX: usize = 4096;

/// The counters of every tool and model, by object (`tool/<n>`, `model/<p>/<m>`).
#[derive(Debug, Default)]
pub struct Usage {
    by: Mutex<HashMap<String, Counters>>,
}

#[derive(Debug, Default)]
struct Counters {
    calls: u64,
    errors: u64,
    denied: u64,
    refused: u64,
    bytes_up: u64,
    bytes_down: u64,
    last: Option<String>,
    last_status: Option<String>,
    runs: BTreeSet<(String, String)>,
}

/// The object whose log is `rel` (relative to the storage): `tool/<n>` or `model/<p>/<m>`.
fn log_of(rel: &Path) -> Option<String> {
    object_with(rel, "log")
}

/// The object whose `status` control is `rel` (relative to the storage).
pub fn status_of(rel: &Path) -> Option<String> {
    object_with(rel, "status")
}

fn object_with(rel: &Path, leaf: &str) -> Option<String> {
    let s = rel.to_str()?;
    let (ctl, last) = s.rsplit_once('/')?;
    let object = ctl.strip_suffix(".d")?;
    let ok = last == leaf
        && ((object.starts_with("tool/") && !object[5..].contains('/'))
            || (object.starts_with("model/") && object.matches('/').count() == 2));
    ok.then(|| object.to_owned())
}

impl Usage {
    /// Counts the whole lines `bytes` appended to the log at `rel` (relative to the storage),
    /// when it is a tool's or a model's.
    pub fn note(&self, rel: &Path, bytes: &[u8]) {
        let Some(object) = log_of(rel) else { return };
        let mut by = self.by.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let c = by.entry(object).or_default();
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else { continue };
            let text = |k: &str| v[k].as_str().map(str::to_owned);
            match v["type"].as_str() {
                Some("tool.call") => {
                    c.calls += 1;
                    match v["status"].as_str() {
                        Some("denied") => c.denied += 1,
                        Some("ok") => {}
                        _ => c.errors += 1,
                    }
                    c.last_status = text("status");
                }
                Some("model.use") => {
                    c.calls += 1;
                    if v["status"].as_u64() != Some(200) {
                        c.errors += 1;
                    }
                    c.bytes_up += v["bytes_up"].as_u64().unwrap_or(0);
                    c.bytes_down += v["bytes_down"].as_u64().unwrap_or(0);
                    c.last_status = v["status"].as_u64().map(|s| s.to_string());
                }
                Some("net.refused") => c.refused += 1,
                _ => continue,
            }
            c.last = text("ts").or(c.last.take());
            if let (Some(a), Some(s)) = (text("agent"), text("session"))
                && c.runs.len() < RUNS_MAX
            {
                c.runs.insert((a, s));
            }
        }
    }

    /// The `status` of `object`: a `key value` line each.
    pub fn render(&self, object: &str) -> Vec<u8> {
        let by = self.by.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let none = Counters::default();
        let c = by.get(object).unwrap_or(&none);
        let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_owned());
        let mut out = format!("object {object}\ncalls {}\nerrors {}\n", c.calls, c.errors);
        if object.starts_with("tool/") {
            out.push_str(&format!("denied {}\n", c.denied));
        } else {
            out.push_str(&format!(
                "refused {}\nbytes_up {}\nbytes_down {}\n",
                c.refused, c.bytes_up, c.bytes_down
            ));
        }
        out.push_str(&format!(
            "last_call {}\nlast_status {}\nruns {}\n",
            dash(&c.last),
            dash(&c.last_status),
            c.runs.len()
        ));
        out.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_of_logs_and_status_controls() {
        assert_eq!(log_of(Path::new("tool/fs.read.d/log")).as_deref(), Some("tool/fs.read"));
        assert_eq!(status_of(Path::new("model/p/m.d/status")).as_deref(), Some("model/p/m"));
        assert_eq!(log_of(Path::new("agent/coder.d/log")), None);
        assert_eq!(log_of(Path::new("home/0/agent/a/session/s/events.jsonl")), None);
        assert_eq!(status_of(Path::new("tool/x.d/hooks/status")), None);
        assert_eq!(status_of(Path::new("tool/fs.read.d/log")), None);
    }

    #[test]
    fn tool_calls_and_model_uses_are_counted_from_their_lines() {
        let u = Usage::default();
        let call = |status: &str, s: &str| {
            format!(
                "{{\"ts\":\"T{s}\",\"type\":\"tool.call\",\"agent\":\"a\",\"session\":\"{s}\",\"status\":\"{status}\"}}\n"
            )
        };
        let lines = [call("ok", "s1"), call("error", "s1"), call("denied", "s2")].concat();
        u.note(Path::new("tool/fs.read.d/log"), lines.as_bytes());
        u.note(Path::new("tool/fs.read.d/log"), b"not json\n");
        let s = String::from_utf8(u.render("tool/fs.read")).unwrap();
        assert!(s.contains("calls 3\nerrors 1\ndenied 1\n"), "{s}");
        assert!(s.contains("last_call Ts2\nlast_status denied\nruns 2\n"), "{s}");
        u.note(
            Path::new("model/p/m.d/log"),
            b"{\"ts\":\"U\",\"type\":\"model.use\",\"agent\":\"a\",\"session\":\"s\",\"status\":200,\"bytes_up\":4,\"bytes_down\":5}\n\
              {\"ts\":\"V\",\"type\":\"net.refused\",\"agent\":\"a\",\"session\":\"s\"}\n",
        );
        let m = String::from_utf8(u.render("model/p/m")).unwrap();
        assert!(m.contains("calls 1\nerrors 0\nrefused 1\nbytes_up 4\nbytes_down 5\n"), "{m}");
        assert!(String::from_utf8(u.render("tool/unused")).unwrap().contains("calls 0\n"));
    }
}
