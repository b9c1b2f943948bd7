//! A snapshot of the process environment and working directory, so that configuration loading
//! is a pure function of (file text, environment) and tests can hand in their own variables.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Environment variables and the current directory, read once.
#[derive(Clone, Debug, Default)]
pub struct Env {
    vars: BTreeMap<String, String>,
    cwd: PathBuf,
}

impl Env {
    /// The real process environment.
    pub fn from_process() -> Env {
        let vars = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        Env { vars, cwd }
    }

    /// An environment made of the given variables (tests).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>, cwd: &Path) -> Env {
        let vars = pairs
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env {
            vars,
            cwd: cwd.to_path_buf(),
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// The value of `name` when it is set and not empty.
    pub fn non_empty(&self, name: &str) -> Option<&str> {
        self.get(name).filter(|v| !v.is_empty())
    }

    pub fn set(&mut self, name: &str, value: &str) {
        self.vars.insert(name.to_string(), value.to_string());
    }

    pub fn cwd(&self) -> &Path {
        &self.cwd
    }

    pub fn home(&self) -> Option<PathBuf> {
        self.non_empty("HOME")
            .or_else(|| self.non_empty("USERPROFILE"))
            .map(PathBuf::from)
    }

    /// The system temporary directory (`TMPDIR`, else `/tmp`).
    pub fn tmpdir(&self) -> PathBuf {
        self.non_empty("TMPDIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp"))
    }

    /// Expands a leading `~` against the home directory and joins a relative path to the
    /// working directory.
    pub fn resolve_path(&self, raw: &str) -> PathBuf {
        let expanded = match (raw.strip_prefix('~'), self.home()) {
            (Some(""), Some(home)) => home,
            (Some(rest), Some(home)) if rest.starts_with('/') => home.join(&rest[1..]),
            _ => PathBuf::from(raw),
        };
        if expanded.is_absolute() {
            expanded
        } else {
            self.cwd.join(expanded)
        }
    }

    /// Expands `$VAR` and `${VAR}` anywhere in `raw` (unset variables become empty), then
    /// resolves it like [`Env::resolve_path`].
    pub fn resolve_path_with_vars(&self, raw: &str) -> PathBuf {
        self.resolve_path(&self.expand_vars(raw))
    }

    fn expand_vars(&self, raw: &str) -> String {
        let mut out = String::with_capacity(raw.len());
        let mut rest = raw;
        while let Some(idx) = rest.find('$') {
            out.push_str(&rest[..idx]);
            let after = &rest[idx + 1..];
            let (name, consumed) = if let Some(braced) = after.strip_prefix('{') {
                match braced.find('}') {
                    Some(end) => (&braced[..end], end + 2),
                    None => ("", 0),
                }
            } else {
                let end = after
                    .char_indices()
                    .find(|&(i, c)| {
                        !(c == '_' || c.is_ascii_alphanumeric()) || (i == 0 && c.is_ascii_digit())
                    })
                    .map_or(after.len(), |(i, _)| i);
                (&after[..end], end)
            };
            if name.is_empty() {
                out.push('$');
                rest = after;
            } else {
                out.push_str(self.get(name).unwrap_or(""));
                rest = &after[consumed..];
            }
        }
        out.push_str(rest);
        out
    }

    /// Finds an executable named `program` on this environment's `PATH`, or checks an explicit
    /// path.
    pub fn find_executable(&self, program: &str) -> Option<PathBuf> {
        if program.contains('/') {
            let path = self.resolve_path(program);
            return is_executable(&path).then_some(path);
        }
        let search = self.get("PATH")?;
        std::env::split_paths(search)
            .map(|dir| dir.join(program))
            .find(|p| is_executable(p))
    }

    pub fn vars(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tilde_and_relative_paths_resolve_against_home_and_cwd() {
        let env = Env::from_pairs([("HOME", "/home/u")], Path::new("/work"));
        assert_eq!(env.resolve_path("~"), PathBuf::from("/home/u"));
        assert_eq!(env.resolve_path("~/x/y"), PathBuf::from("/home/u/x/y"));
        assert_eq!(env.resolve_path("a/b"), PathBuf::from("/work/a/b"));
        assert_eq!(env.resolve_path("/abs"), PathBuf::from("/abs"));
        assert_eq!(env.resolve_path("~other"), PathBuf::from("/work/~other"));
    }

    #[test]
    fn variables_expand_in_both_forms_and_unset_ones_become_empty() {
        let env = Env::from_pairs([("HOME", "/h"), ("B", "board")], Path::new("/w"));
        assert_eq!(
            env.resolve_path_with_vars("$HOME/${B}s"),
            PathBuf::from("/h/boards")
        );
        assert_eq!(
            env.resolve_path_with_vars("x/$NOPE/y"),
            PathBuf::from("/w/x//y")
        );
        assert_eq!(
            env.resolve_path_with_vars("cost$"),
            PathBuf::from("/w/cost$")
        );
    }
}
