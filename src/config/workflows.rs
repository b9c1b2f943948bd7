//! Several workflows in one daemon, the configuration side: which files the command line names
//! (files and directories of `*.md`), each workflow's name, the daemon-wide sections every file
//! must agree on (and that each file's settings then all carry), and distinct workspace roots.
//! Pure apart from reading directories and files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_norway::{Mapping, Value};

use super::validate::to_snake;
use super::workflow::{self, WorkflowFile};
use super::{ConfigError, LoadError, Loaded, SecretResolver, Settings};
use crate::env::Env;

/// One workflow of the daemon: its name (unique in the daemon) and its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub name: String,
    pub path: PathBuf,
}

/// The sections that belong to the daemon, not to one workflow.
pub const DAEMON_WIDE: [&str; 4] = ["server", "logging", "observability", "daemon"];

/// The rule a workflow name follows, as the error messages say it.
pub const NAME_RULE: &str = "a letter or digit, then letters, digits, '.', '_' or '-'";

/// Whether `name` is a valid workflow name (`[A-Za-z0-9][A-Za-z0-9._-]*`): it is used in
/// `<workflow>:<identifier>` and in folder names.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn err(message: String, hint: &str) -> ConfigError {
    ConfigError {
        message,
        hint: Some(hint.to_string()),
    }
}

/// A workflow file found on the command line, before its front matter is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    /// Whether it was found in a directory (its name is then its stem).
    pub in_dir: bool,
}

/// The workflow files the command line names. No path: today's single default
/// ([`workflow::resolve_path`]: `$SVC_WORKFLOW`, else `./WORKFLOW.md`). A directory: each `*.md`
/// file directly in it, sorted by name (hidden files and non-files skipped); an empty one is an
/// error. Anything else: that file (a missing file is reported when it is loaded). Relative
/// paths are joined to the working directory. The same file named twice is an error.
pub fn discover(args: &[PathBuf], env: &Env) -> Result<Vec<Found>, ConfigError> {
    let given: Vec<PathBuf> = if args.is_empty() {
        vec![workflow::resolve_path(None, env)]
    } else {
        args.iter()
            .map(|a| workflow::resolve_path(Some(a), env))
            .collect()
    };
    let mut found: Vec<Found> = Vec::new();
    for path in given {
        if path.is_dir() {
            let files = dir_workflows(&path)?;
            if files.is_empty() {
                return Err(err(
                    format!("{}: no workflow files in this directory", path.display()),
                    "add a *.md workflow file to it, or name a workflow file instead",
                ));
            }
            found.extend(files.into_iter().map(|path| Found { path, in_dir: true }));
        } else {
            found.push(Found {
                path,
                in_dir: false,
            });
        }
    }
    let mut seen: Vec<(PathBuf, &Path)> = Vec::new();
    for f in &found {
        let real = std::fs::canonicalize(&f.path).unwrap_or_else(|_| f.path.clone());
        if let Some((_, first)) = seen.iter().find(|(r, _)| *r == real) {
            return Err(err(
                format!(
                    "{} and {} are the same workflow file, given twice",
                    first.display(),
                    f.path.display()
                ),
                "name each workflow file once (a directory already names every *.md in it)",
            ));
        }
        seen.push((real, &f.path));
    }
    Ok(found)
}

/// The `*.md` files directly in `dir`, sorted by name; hidden files and non-files skipped.
fn dir_workflows(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ConfigError {
        message: format!("{}: cannot read the directory: {e}", dir.display()),
        hint: None,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !name.starts_with('.') && p.extension().is_some_and(|x| x == "md") && p.is_file()
        })
        .collect();
    files.sort();
    Ok(files)
}

/// The workflow file a control client (`svc status`, `runs`, `steer`, ...) finds the daemon
/// from: the one given (or the default), or for a directory its first `*.md` file by name.
pub fn control_path(arg: Option<&Path>, env: &Env) -> Result<PathBuf, ConfigError> {
    let path = workflow::resolve_path(arg, env);
    if !path.is_dir() {
        return Ok(path);
    }
    dir_workflows(&path)?.into_iter().next().ok_or_else(|| {
        err(
            format!("{}: no workflow files in this directory", path.display()),
            "name the daemon's workflow file or its directory of *.md workflows",
        )
    })
}

/// The front matter's `name:` when it is set (a string; null counts as unset).
pub fn explicit_name(file: &WorkflowFile) -> Result<Option<String>, ConfigError> {
    match file.front_matter.get("name") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(err(
            format!("{}: name must be a string", file.path.display()),
            NAME_RULE,
        )),
    }
}

/// The name a file gets without `name:`: its stem in a directory; for `WORKFLOW.md`, its
/// parent folder's name; else its stem.
pub fn implicit_name(found: &Found) -> String {
    let stem = found
        .path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let is_default = found.path.file_name().is_some_and(|n| n == "WORKFLOW.md");
    if found.in_dir || !is_default {
        return stem;
    }
    found
        .path
        .parent()
        .and_then(Path::file_name)
        .map_or(stem, |p| p.to_string_lossy().into_owned())
}

/// A name that breaks [`NAME_RULE`], as an error naming the file.
fn check_name(name: &str, path: &Path, explicit: bool) -> Result<(), ConfigError> {
    if valid_name(name) {
        return Ok(());
    }
    let from = if explicit {
        "its name: key".to_string()
    } else {
        "its file or folder name".to_string()
    };
    Err(err(
        format!(
            "{}: workflow name {name:?} (from {from}) is not valid: a name must be {NAME_RULE}",
            path.display()
        ),
        "set a valid name: in the front matter, or rename the file",
    ))
}

/// Names the found files: `name:` in the front matter wins over [`implicit_name`]. A file
/// whose front matter cannot be read keeps its implicit name (its load reports the problem).
/// Invalid names and two workflows with one name are errors. A single workflow whose implicit
/// name breaks the rule (a `WORKFLOW.md` in a folder named `my repo`) is not refused: it gets
/// the rule's nearest spelling, so one workflow starts as it always did.
pub fn name_all(found: &[Found]) -> Result<Vec<Source>, ConfigError> {
    let mut sources: Vec<Source> = Vec::new();
    for f in found {
        let explicit = match workflow::read(&f.path) {
            Ok(file) => explicit_name(&file)?,
            Err(_) => None,
        };
        let name = match explicit {
            Some(name) => {
                check_name(&name, &f.path, true)?;
                name
            }
            None => {
                let name = implicit_name(f);
                if found.len() == 1 && !valid_name(&name) {
                    sanitized(&name)
                } else {
                    check_name(&name, &f.path, false)?;
                    name
                }
            }
        };
        if let Some(other) = sources.iter().find(|s| s.name == name) {
            return Err(err(
                format!(
                    "{} and {} are both named workflow {name:?}",
                    other.path.display(),
                    f.path.display()
                ),
                "rename one of the files or set a different name: in its front matter",
            ));
        }
        sources.push(Source {
            name,
            path: f.path.clone(),
        });
    }
    Ok(sources)
}

/// `name` with every character outside the rule replaced by `-`, and a leading one dropped.
fn sanitized(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let s = s.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    if s.is_empty() {
        "workflow".to_string()
    } else {
        s.to_string()
    }
}

/// [`discover`], then [`name_all`]: the daemon's workflows, in command-line order.
pub fn sources(args: &[PathBuf], env: &Env) -> Result<Vec<Source>, ConfigError> {
    name_all(&discover(args, env)?)
}

/// Whether a key's value is a secret (never printed): its name mentions a token, secret,
/// password or key.
fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["token", "secret", "password", "key"]
        .iter()
        .any(|w| k.contains(w))
}

/// A leaf value for a message, or `(hidden)` for a secret.
fn shown(key: &str, value: &Value) -> String {
    if is_secret_key(key) {
        return "(hidden)".to_string();
    }
    match value {
        Value::String(s) => format!("{s:?}"),
        other => serde_norway::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_string(),
    }
}

/// The daemon-wide keys some workflows set: dotted leaf key (`server.port`, normalized to
/// snake_case) to the value as written (before `$VAR` resolution) and the file that set it.
/// At start it is built from every file; on a reload of one workflow, from the others.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DaemonWide {
    keys: BTreeMap<String, (String, Value, PathBuf)>,
}

/// The daemon-wide leaves of one front matter: (dotted normalized key, key as written, value).
/// A section that is not a mapping is one leaf (the validator refuses it).
fn leaves(front_matter: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    let Some(root) = front_matter.as_mapping() else {
        return out;
    };
    for section in DAEMON_WIDE {
        match root.get(section) {
            None | Some(Value::Null) => {}
            Some(Value::Mapping(m)) => {
                for (k, v) in m {
                    let Some(written) = k.as_str() else { continue };
                    if v.is_null() {
                        continue;
                    }
                    let dotted = format!("{section}.{}", to_snake(written));
                    out.push((dotted, written.to_string(), v.clone()));
                }
            }
            Some(other) => out.push((section.to_string(), section.to_string(), other.clone())),
        }
    }
    out
}

impl DaemonWide {
    /// The union of the daemon-wide keys `files` set; two files that disagree on one are an
    /// error naming both, the key and (unless secret) both values.
    pub fn from_files<'a>(
        files: impl IntoIterator<Item = &'a WorkflowFile>,
    ) -> Result<DaemonWide, ConfigError> {
        let mut wide = DaemonWide::default();
        for f in files {
            wide.add(f)?;
        }
        Ok(wide)
    }

    /// Adds one file's daemon-wide keys, refusing a disagreement with those already held.
    pub fn add(&mut self, file: &WorkflowFile) -> Result<(), ConfigError> {
        self.check(file)?;
        for (dotted, written, value) in leaves(&file.front_matter) {
            self.keys
                .entry(dotted)
                .or_insert((written, value, file.path.clone()));
        }
        Ok(())
    }

    /// Refuses `file` when it sets a daemon-wide key to another value than the one held.
    pub fn check(&self, file: &WorkflowFile) -> Result<(), ConfigError> {
        for (dotted, _, value) in leaves(&file.front_matter) {
            let Some((_, held, from)) = self.keys.get(&dotted) else {
                continue;
            };
            if *held != value && from != &file.path {
                return Err(err(
                    format!(
                        "{dotted} differs between workflows: {} sets {}, {} sets {}",
                        from.display(),
                        shown(&dotted, held),
                        file.path.display(),
                        shown(&dotted, &value)
                    ),
                    "server, logging, observability and daemon belong to the whole daemon: give the key one value in every file that sets it, or set it in one file only",
                ));
            }
        }
        Ok(())
    }

    /// Checks `file` ([`DaemonWide::check`]) and writes into its front matter every held key
    /// it does not set, so its settings carry the daemon's sections.
    pub fn check_and_fill(&self, file: &mut WorkflowFile) -> Result<(), ConfigError> {
        self.check(file)?;
        let own: Vec<String> = leaves(&file.front_matter)
            .into_iter()
            .map(|(d, ..)| d)
            .collect();
        let Some(root) = file.front_matter.as_mapping_mut() else {
            return Ok(());
        };
        for (dotted, (written, value, _)) in &self.keys {
            if own.contains(dotted) {
                continue;
            }
            let Some((section, _)) = dotted.split_once('.') else {
                continue;
            };
            let slot = root
                .entry(Value::String(section.to_string()))
                .or_insert(Value::Null);
            if slot.is_null() {
                *slot = Value::Mapping(Mapping::new());
            }
            if let Value::Mapping(m) = slot {
                m.insert(Value::String(written.clone()), value.clone());
            }
        }
        Ok(())
    }

    /// Whether no workflow sets a daemon-wide key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// At start: checks that every file agrees with every other on the daemon-wide keys, then
/// fills each with the keys the others set. Returns the union (every file's keys).
pub fn agree(files: &mut [WorkflowFile]) -> Result<DaemonWide, ConfigError> {
    let wide = DaemonWide::from_files(files.iter())?;
    for f in files.iter_mut() {
        wide.check_and_fill(f)?;
    }
    Ok(wide)
}

/// [`super::load`] for one workflow of several: `shared` holds the daemon-wide keys of the
/// other workflows. A disagreement is a configuration error of this file (on a reload, the
/// caller keeps its last good settings); else the file is filled from `shared` and validated.
pub fn load_shared(
    path: &Path,
    env: &Env,
    secrets: &mut SecretResolver,
    shared: &DaemonWide,
) -> Result<Loaded, LoadError> {
    let mut file = workflow::read(path).map_err(LoadError::File)?;
    if let Err(e) = shared.check_and_fill(&mut file) {
        return Err(LoadError::Invalid {
            path: file.path,
            errors: vec![e],
            warnings: Vec::new(),
        });
    }
    super::from_workflow(&file, env, secrets)
}

/// Refuses two workflows whose workspace roots are one folder.
pub fn distinct_roots<'a>(
    workflows: impl IntoIterator<Item = (&'a Source, &'a Settings)>,
) -> Result<(), ConfigError> {
    let mut seen: Vec<(&Source, &Path)> = Vec::new();
    for (source, settings) in workflows {
        let root = settings.workspace.root.as_path();
        if let Some((other, first)) = seen.iter().find(|(_, r)| *r == root) {
            return Err(err(
                format!(
                    "{} and {} use one workspace root, {}",
                    other.path.display(),
                    source.path.display(),
                    first.display()
                ),
                "give each workflow its own workspace.root in its file (a root no file sets, the default or SVC_WORKSPACE_ROOT's, gets a folder per workflow under it)",
            ));
        }
        seen.push((source, root));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
