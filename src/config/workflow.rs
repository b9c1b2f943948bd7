//! Finding and splitting `WORKFLOW.md`: YAML front matter between the first `---` and the next
//! `---` is the configuration; the Markdown after it is the prompt template.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::env::Env;

/// The workflow path: the positional argument, else `SVC_WORKFLOW` (absolute kept, relative
/// joined to the working directory), else `<cwd>/WORKFLOW.md`.
pub fn resolve_path(arg: Option<&Path>, env: &Env) -> PathBuf {
    let chosen = match arg {
        Some(p) => p.to_path_buf(),
        None => match env.non_empty("SVC_WORKFLOW") {
            Some(p) => PathBuf::from(p),
            None => PathBuf::from("WORKFLOW.md"),
        },
    };
    if chosen.is_absolute() {
        chosen
    } else {
        env.cwd().join(chosen)
    }
}

/// A workflow file split into its two parts.
#[derive(Clone, Debug)]
pub struct WorkflowFile {
    pub path: PathBuf,
    pub front_matter: serde_norway::Value,
    pub body: String,
    /// 1-based line of the file where the body starts.
    pub body_line: usize,
}

/// Why a workflow file could not be read. Every message names the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkflowError {
    Missing {
        path: PathBuf,
    },
    Unreadable {
        path: PathBuf,
        reason: String,
    },
    NoFrontMatter {
        path: PathBuf,
    },
    Unterminated {
        path: PathBuf,
    },
    Yaml {
        path: PathBuf,
        line: Option<usize>,
        reason: String,
    },
    NotAMapping {
        path: PathBuf,
    },
}

impl fmt::Display for WorkflowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkflowError::Missing { path } => {
                write!(f, "{}: workflow file not found", path.display())
            }
            WorkflowError::Unreadable { path, reason } => {
                write!(f, "{}: cannot read workflow file: {reason}", path.display())
            }
            WorkflowError::NoFrontMatter { path } => write!(
                f,
                "{}: missing YAML front matter: the file must start with a `---` line, then the configuration, then a closing `---` line",
                path.display()
            ),
            WorkflowError::Unterminated { path } => {
                write!(
                    f,
                    "{}: YAML front matter is not closed: add a `---` line after the configuration",
                    path.display()
                )
            }
            WorkflowError::Yaml {
                path,
                line: Some(line),
                reason,
            } => {
                write!(
                    f,
                    "{}:{line}: invalid YAML in front matter at line {line}: {reason}",
                    path.display()
                )
            }
            WorkflowError::Yaml {
                path,
                line: None,
                reason,
            } => {
                write!(
                    f,
                    "{}: invalid YAML in front matter: {reason}",
                    path.display()
                )
            }
            WorkflowError::NotAMapping { path } => {
                write!(
                    f,
                    "{}: front matter must be a YAML mapping of sections (tracker:, agent:, ...)",
                    path.display()
                )
            }
        }
    }
}

pub fn read(path: &Path) -> Result<WorkflowFile, WorkflowError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(WorkflowError::Missing {
                path: path.to_path_buf(),
            });
        }
        Err(e) => {
            return Err(WorkflowError::Unreadable {
                path: path.to_path_buf(),
                reason: e.to_string(),
            });
        }
    };
    parse(path, &text)
}

pub fn parse(path: &Path, text: &str) -> Result<WorkflowFile, WorkflowError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or("");
    if first.trim_end() != "---" {
        return Err(WorkflowError::NoFrontMatter {
            path: path.to_path_buf(),
        });
    }
    let mut yaml_end = first.len();
    let mut line_no = 1;
    let mut body_start = None;
    for line in lines {
        line_no += 1;
        if line.trim_end() == "---" {
            body_start = Some(yaml_end + line.len());
            break;
        }
        yaml_end += line.len();
    }
    let body_start = body_start.ok_or_else(|| WorkflowError::Unterminated {
        path: path.to_path_buf(),
    })?;
    let yaml = &text[first.len()..yaml_end];
    let front_matter: serde_norway::Value = if yaml.trim().is_empty() {
        serde_norway::Value::Mapping(Default::default())
    } else {
        serde_norway::from_str(yaml).map_err(|e| WorkflowError::Yaml {
            path: path.to_path_buf(),
            // The YAML starts on line 2 of the file.
            line: e.location().map(|l| l.line() + 1),
            reason: strip_location(&e.to_string()),
        })?
    };
    let front_matter = match front_matter {
        serde_norway::Value::Null => serde_norway::Value::Mapping(Default::default()),
        v @ serde_norway::Value::Mapping(_) => v,
        _ => {
            return Err(WorkflowError::NotAMapping {
                path: path.to_path_buf(),
            });
        }
    };
    Ok(WorkflowFile {
        path: path.to_path_buf(),
        front_matter,
        body: text[body_start..].to_string(),
        body_line: line_no + 1,
    })
}

/// serde's YAML errors end with " at line N column M"; the file line is reported separately.
fn strip_location(message: &str) -> String {
    match message.find(" at line ") {
        Some(idx) => message[..idx].to_string(),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("/w/WORKFLOW.md")
    }

    #[test]
    fn splits_front_matter_and_body() {
        let wf = parse(
            p(),
            "---\ntracker:\n  kind: memory\n---\nHello {{ issue.title }}\n",
        )
        .unwrap();
        assert_eq!(wf.body, "Hello {{ issue.title }}\n");
        assert_eq!(wf.body_line, 5);
        assert_eq!(wf.front_matter["tracker"]["kind"].as_str(), Some("memory"));
    }

    #[test]
    fn body_may_contain_more_rulers() {
        let wf = parse(p(), "---\na: 1\n---\nx\n---\ny\n").unwrap();
        assert_eq!(wf.body, "x\n---\ny\n");
    }

    #[test]
    fn empty_front_matter_is_an_empty_mapping() {
        let wf = parse(p(), "---\n---\n").unwrap();
        assert!(wf.front_matter.as_mapping().unwrap().is_empty());
    }

    #[test]
    fn missing_or_unclosed_front_matter_is_reported_with_the_file() {
        let err = parse(p(), "# just markdown\n").unwrap_err();
        assert_eq!(err, WorkflowError::NoFrontMatter { path: p().into() });
        assert!(
            err.to_string()
                .starts_with("/w/WORKFLOW.md: missing YAML front matter")
        );
        let err = parse(p(), "---\na: 1\n").unwrap_err();
        assert!(err.to_string().contains("not closed"));
    }

    #[test]
    fn broken_yaml_names_the_file_line() {
        let err = parse(
            p(),
            "---\ntracker:\n  kind: memory\n  bad: [unclosed\n---\n",
        )
        .unwrap_err();
        let WorkflowError::Yaml { line, .. } = &err else {
            panic!("{err:?}")
        };
        assert!(matches!(line, Some(4..=5)), "{err}");
        assert!(err.to_string().starts_with("/w/WORKFLOW.md:"), "{err}");
    }

    #[test]
    fn front_matter_must_be_a_mapping() {
        assert!(matches!(
            parse(p(), "---\n- a\n---\n"),
            Err(WorkflowError::NotAMapping { .. })
        ));
    }

    #[test]
    fn path_resolution_prefers_argument_then_env_then_cwd() {
        let env = Env::from_pairs([("SVC_WORKFLOW", "conf/W.md")], Path::new("/cwd"));
        assert_eq!(
            resolve_path(Some(Path::new("a.md")), &env),
            PathBuf::from("/cwd/a.md")
        );
        assert_eq!(resolve_path(None, &env), PathBuf::from("/cwd/conf/W.md"));
        let env = Env::from_pairs([("SVC_WORKFLOW", "/abs/W.md")], Path::new("/cwd"));
        assert_eq!(resolve_path(None, &env), PathBuf::from("/abs/W.md"));
        let env = Env::from_pairs([], Path::new("/cwd"));
        assert_eq!(resolve_path(None, &env), PathBuf::from("/cwd/WORKFLOW.md"));
    }
}
