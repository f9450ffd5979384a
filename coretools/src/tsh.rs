//! `tsh.config`: prints or updates tsh's configuration, `$CTX_ROOT/tool/tsh.d/config`.

use std::env;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use policy::tshconf::{self, TshConfig};
use serde::Deserialize;

use crate::input::{self, Input, non_null};
use crate::{Error, Result, Tool, ToolInfo, sys};

pub(crate) const CONFIG: Tool = Tool {
    info: ToolInfo {
        name: "tsh.config",
        description: "Prints tsh's configuration (`tool/tsh.d/config`) or updates it: \
                      `max_loaded_tools` caps the unpinned tools loaded into tsh's context, \
                      `cache_capacity` the resolution cache, `window_percent` its admission \
                      window. Every value is checked before the file is rewritten; the new \
                      configuration is printed.\n",
        schema: r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "set": {
      "type": "object",
      "description": "Keys to change; the others keep their values.",
      "properties": {
        "max_loaded_tools": {"type": "integer", "minimum": 1, "maximum": 65536},
        "cache_capacity": {"type": "integer", "minimum": 1, "maximum": 1000000},
        "window_percent": {"type": "integer", "minimum": 1, "maximum": 99}
      },
      "additionalProperties": false
    }
  },
  "additionalProperties": false
}
"#,
    },
    usage: "tsh.config [KEY=VALUE...]",
    run: config,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfigInput {
    #[serde(default, deserialize_with = "non_null")]
    set: Option<Settings>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Settings {
    #[serde(default, deserialize_with = "non_null")]
    max_loaded_tools: Option<u64>,
    #[serde(default, deserialize_with = "non_null")]
    cache_capacity: Option<u64>,
    #[serde(default, deserialize_with = "non_null")]
    window_percent: Option<u64>,
}

impl Settings {
    fn pairs(&self) -> Vec<(String, String)> {
        [
            ("max_loaded_tools", self.max_loaded_tools),
            ("cache_capacity", self.cache_capacity),
            ("window_percent", self.window_percent),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_string())))
        .collect()
    }
}

fn config(input: Input) -> Result<i32> {
    let sets = match input {
        Input::Json(json) => input::json::<ConfigInput>(&json)?.set.map(|s| s.pairs()).unwrap_or_default(),
        Input::Args(args) => args
            .iter()
            .map(|arg| {
                arg.to_str()
                    .and_then(|a| a.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .ok_or_else(|| Error::Invalid(format!("{arg:?}: expected KEY=VALUE")))
            })
            .collect::<Result<_>>()?,
    };
    let root = env::var_os("CTX_ROOT")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/ctx"), PathBuf::from);
    let cfg = tsh_config(&root, &sets)?;
    io::stdout().write_all(cfg.render().as_bytes()).map_err(Error::Stdout)?;
    Ok(0)
}

/// Reads `root/tool/tsh.d/config` (defaults when it is missing), applies `sets` (`key`, `value`
/// pairs, each key at most once) and returns the result. When there is anything to set, every
/// value is checked first, then the file is rewritten in one write and closed, which is when the
/// `/ctx` mount validates and publishes it.
pub fn tsh_config(root: &Path, sets: &[(String, String)]) -> Result<TshConfig> {
    let path = root.join("tool/tsh.d/config");
    let mut cfg = match fs::read(&path) {
        Ok(text) => {
            tshconf::parse_config(&text).map_err(|errors| Error::Config { path: path.clone(), errors })?
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => TshConfig::default(),
        Err(e) => return Err(Error::io(path.display().to_string(), e)),
    };
    if sets.is_empty() {
        return Ok(cfg);
    }
    for (i, (key, value)) in sets.iter().enumerate() {
        if sets[..i].iter().any(|(k, _)| k == key) {
            return Err(Error::Invalid(format!("{key} is set twice")));
        }
        cfg.set(key, value).map_err(Error::Invalid)?;
    }
    let failed = |e| Error::io(path.display().to_string(), e);
    let mut file = OpenOptions::new().write(true).create(true).truncate(true).open(&path).map_err(failed)?;
    file.write_all(cfg.render().as_bytes()).map_err(failed)?;
    sys::close(file).map_err(failed)?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;

    fn set(k: &str, v: &str) -> (String, String) {
        (k.to_owned(), v.to_owned())
    }

    #[test]
    fn missing_config_is_the_defaults_and_is_created_on_set() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("tool/tsh.d")).unwrap();
        assert_eq!(tsh_config(root.path(), &[]).unwrap(), TshConfig::default());
        let cfg = tsh_config(root.path(), &[set("window_percent", "5")]).unwrap();
        assert_eq!(cfg.window_percent, 5);
        let text = fs::read(root.path().join("tool/tsh.d/config")).unwrap();
        assert_eq!(tshconf::parse_config(&text).unwrap(), cfg);
    }

    #[test]
    fn all_sets_are_checked_before_writing() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("tool/tsh.d")).unwrap();
        let file = root.path().join("tool/tsh.d/config");
        fs::write(&file, "# mine\ncache_capacity=32\n").unwrap();
        for bad in [
            vec![set("cache_capacity", "64"), set("window_percent", "100")],
            vec![set("cache_capacity", "64"), set("cache_capacity", "65")],
            vec![set("colour", "1")],
        ] {
            assert!(matches!(tsh_config(root.path(), &bad), Err(Error::Invalid(_))), "{bad:?}");
        }
        assert_eq!(fs::read_to_string(&file).unwrap(), "# mine\ncache_capacity=32\n");
    }

    #[test]
    fn a_malformed_config_is_reported_by_line() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("tool/tsh.d")).unwrap();
        fs::write(root.path().join("tool/tsh.d/config"), "cache_capacity=0\n").unwrap();
        let e = tsh_config(root.path(), &[]).unwrap_err();
        assert_eq!(e.exit_code(), 1);
        assert!(e.to_string().contains("line 1: cache_capacity"), "{e}");
    }
}
