//! tsh's data files (spec §3): `tool/tsh.d/config` and `CTX_HOME/.tshrc`, and `CTX_PATH` itself.
//!
//! Both files are data, never shell code: no expansion, no quoting, no `export`.
//!
//! `config`: blank lines, `#` comments, and `key=value` for `max_loaded_tools` (1..=65536, default
//! 64), `cache_capacity` (1..=1000000, default 32) and `window_percent` (1..=99, default 1). A key
//! may appear once; unknown keys and bad values are errors.
//!
//! `.tshrc`: blank lines, `#` comments, and at most one `CTX_PATH=...` line.
//!
//! `CTX_PATH`: a `:`-separated list of absolute, normalized directories, at least one.

use crate::path;

/// A bad line in a tsh data file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ConfError {
    /// 1-based line number.
    pub line: u32,
    /// What is wrong.
    pub message: String,
}

/// The tsh configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TshConfig {
    /// Cap on unpinned tools whose metadata is loaded into tsh's context.
    pub max_loaded_tools: u32,
    /// Capacity of the W-TinyLFU resolution cache (unpinned entries).
    pub cache_capacity: u32,
    /// Admission window size in percent of `cache_capacity`.
    pub window_percent: u32,
}

impl Default for TshConfig {
    fn default() -> TshConfig {
        TshConfig { max_loaded_tools: 64, cache_capacity: 32, window_percent: 1 }
    }
}

impl TshConfig {
    /// Window size in entries: `max(1, ceil(cache_capacity * window_percent / 100))`.
    pub fn window(&self) -> u32 {
        let w = (u64::from(self.cache_capacity) * u64::from(self.window_percent)).div_ceil(100);
        u32::try_from(w).unwrap_or(u32::MAX).max(1)
    }

    /// Renders the file form, which [`parse_config`] reads back.
    pub fn render(&self) -> String {
        format!(
            "max_loaded_tools={}\ncache_capacity={}\nwindow_percent={}\n",
            self.max_loaded_tools, self.cache_capacity, self.window_percent
        )
    }

    /// Sets one key from text, with the same checks as the file parser.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let (slot, lo, hi) = match key {
            "max_loaded_tools" => (&mut self.max_loaded_tools, 1, 65_536),
            "cache_capacity" => (&mut self.cache_capacity, 1, 1_000_000),
            "window_percent" => (&mut self.window_percent, 1, 99),
            _ => {
                return Err(format!(
                    "unknown key {key:?} (known: max_loaded_tools cache_capacity window_percent)"
                ));
            }
        };
        let v: u32 = value
            .parse()
            .ok()
            .filter(|_| value.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| format!("{key}: {value:?} is not a decimal integer"))?;
        if !(lo..=hi).contains(&v) {
            return Err(format!("{key}: {v} is out of range {lo}..={hi}"));
        }
        *slot = v;
        Ok(())
    }
}

fn lines(text: &[u8]) -> impl Iterator<Item = (u32, Result<&str, ConfError>)> {
    text.split(|&b| b == b'\n').enumerate().filter_map(|(i, raw)| {
        let line = u32::try_from(i + 1).unwrap_or(u32::MAX);
        match std::str::from_utf8(raw) {
            Err(_) => Some((line, Err(ConfError { line, message: "line is not valid UTF-8".into() }))),
            Ok(t) => {
                let t = t.trim_matches([' ', '\t']);
                if t.is_empty() || t.starts_with('#') { None } else { Some((line, Ok(t))) }
            }
        }
    })
}

/// Parses `tool/tsh.d/config`; reports every bad line.
pub fn parse_config(text: &[u8]) -> Result<TshConfig, Vec<ConfError>> {
    let mut cfg = TshConfig::default();
    let mut seen: Vec<String> = Vec::new();
    let mut errors = Vec::new();
    for (line, t) in lines(text) {
        let result = t.and_then(|t| {
            let Some((k, v)) = t.split_once('=') else {
                return Err(ConfError { line, message: format!("expected key=value, found {t:?}") });
            };
            if seen.iter().any(|s| s == k) {
                return Err(ConfError { line, message: format!("{k} is set twice") });
            }
            cfg.set(k, v).map_err(|message| ConfError { line, message })?;
            seen.push(k.to_owned());
            Ok(())
        });
        if let Err(e) = result {
            errors.push(e);
        }
    }
    if errors.is_empty() { Ok(cfg) } else { Err(errors) }
}

/// Parses a `CTX_PATH` value.
pub fn parse_ctx_path(value: &str) -> Result<Vec<String>, String> {
    if value.is_empty() {
        return Err("CTX_PATH is empty".into());
    }
    value
        .split(':')
        .map(|d| path::check_absolute(d).map(|()| d.to_owned()).map_err(|e| format!("CTX_PATH entry: {e}")))
        .collect()
}

/// Parses `.tshrc`; returns the `CTX_PATH` it sets, if any.
pub fn parse_tshrc(text: &[u8]) -> Result<Option<Vec<String>>, Vec<ConfError>> {
    let mut found: Option<Vec<String>> = None;
    let mut errors = Vec::new();
    for (line, t) in lines(text) {
        let result = t.and_then(|t| {
            let Some(value) = t.strip_prefix("CTX_PATH=") else {
                return Err(ConfError {
                    line,
                    message: format!(
                        "expected CTX_PATH=DIR[:DIR...], found {t:?} (.tshrc is data, not shell)"
                    ),
                });
            };
            if found.is_some() {
                return Err(ConfError { line, message: "CTX_PATH is set twice".into() });
            }
            found = Some(parse_ctx_path(value).map_err(|message| ConfError { line, message })?);
            Ok(())
        });
        if let Err(e) = result {
            errors.push(e);
        }
    }
    if errors.is_empty() { Ok(found) } else { Err(errors) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_values() {
        assert_eq!(parse_config(b"").unwrap(), TshConfig::default());
        let c =
            parse_config(b"# tsh\n\nmax_loaded_tools=8\ncache_capacity=1000\n  window_percent=20\n").unwrap();
        assert_eq!(c, TshConfig { max_loaded_tools: 8, cache_capacity: 1000, window_percent: 20 });
        assert_eq!(parse_config(c.render().as_bytes()).unwrap(), c);
    }

    #[test]
    fn config_errors() {
        let t = b"cache_capacity=0\nwindow_percent=100\nfoo=1\nmax_loaded_tools\nmax_loaded_tools=+5\ncache_capacity = 3\nwindow_percent=5\nwindow_percent=6\n";
        let e = parse_config(t).unwrap_err();
        assert_eq!(e.iter().map(|e| e.line).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 6, 8]);
    }

    #[test]
    fn window_size() {
        let w =
            |cap, pct| TshConfig { max_loaded_tools: 1, cache_capacity: cap, window_percent: pct }.window();
        assert_eq!(w(32, 1), 1);
        assert_eq!(w(1000, 1), 10);
        assert_eq!(w(1001, 1), 11);
        assert_eq!(w(1, 99), 1);
        assert_eq!(w(64, 20), 13);
    }

    #[test]
    fn tshrc() {
        assert_eq!(parse_tshrc(b"# mine\n").unwrap(), None);
        assert_eq!(
            parse_tshrc(b"CTX_PATH=/ctx/home/1000/tool:/ctx/tool\n").unwrap(),
            Some(vec!["/ctx/home/1000/tool".into(), "/ctx/tool".into()])
        );
        for bad in [
            &b"export CTX_PATH=/ctx/tool"[..],
            b"CTX_PATH=$HOME/tool",
            b"CTX_PATH=~/tool",
            b"CTX_PATH=/ctx/tool::/x",
            b"CTX_PATH=",
            b"CTX_PATH=/a\nCTX_PATH=/b",
            b"PATH=/usr/bin",
        ] {
            assert!(parse_tshrc(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
