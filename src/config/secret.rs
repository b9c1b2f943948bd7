//! Secret values and `op://` references read through the 1Password CLI. A [`Secret`] never
//! prints its value: `Debug` and `Display` redact it, so a secret cannot leak through a log line,
//! an error message or a `{:?}` of the settings.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::ConfigError;
use crate::env::Env;

/// A resolved credential. Read it with [`Secret::expose`] only where it is sent to its service.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "Secret(<empty>)"
        } else {
            "Secret(<redacted>)"
        })
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How long a value read through `op` is reused. The workflow is re-read before every poll; this
/// keeps the CLI from being called every few seconds while still picking up rotated secrets.
const OP_CACHE_TTL: Duration = Duration::from_secs(300);
const OP_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `program` with `args`, its whole process group killed past `timeout`; answers whether it
/// exited 0, and its standard output. `config` starts no process itself (it depends on nothing
/// in the crate but `env`): whoever loads a workflow hands in the runner (`process::run_program`).
pub type RunProgram =
    fn(program: &Path, args: &[&str], timeout: Duration) -> Result<(bool, String), String>;

/// Reads `op://` references, probing the CLI once and caching values for a while.
#[derive(Default)]
pub struct SecretResolver {
    /// `None` (the default, for tests and fuzzing): `op://` references cannot be read, and say
    /// the CLI is required.
    run: Option<RunProgram>,
    op_binary: Option<PathBuf>,
    cache: HashMap<String, (Secret, Instant)>,
    /// Whether any `op://` reference was seen (doctor checks the CLI only then).
    pub used_op: bool,
}

impl fmt::Debug for SecretResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretResolver")
            .field("cached", &self.cache.len())
            .finish()
    }
}

impl SecretResolver {
    /// A resolver that reads `op://` references through `run`.
    pub fn new(run: RunProgram) -> SecretResolver {
        SecretResolver {
            run: Some(run),
            ..SecretResolver::default()
        }
    }

    pub fn read_op(&mut self, env: &Env, reference: &str) -> Result<Secret, ConfigError> {
        self.used_op = true;
        if let Some((secret, at)) = self.cache.get(reference)
            && at.elapsed() < OP_CACHE_TTL
        {
            return Ok(secret.clone());
        }
        let op = self.op_binary(env)?;
        let failed = || ConfigError {
            message: format!("Failed to resolve 1Password reference: {reference}"),
            hint: Some(
                "check the reference with `op read` and that the CLI is signed in".to_string(),
            ),
        };
        let run = self.run.ok_or_else(failed)?;
        let (ok, stdout) =
            run(&op, &["read", "--no-newline", reference], OP_TIMEOUT).map_err(|_| failed())?;
        if !ok {
            return Err(failed());
        }
        let secret = Secret::new(stdout.trim_end_matches(['\n', '\r']));
        self.cache
            .insert(reference.to_string(), (secret.clone(), Instant::now()));
        Ok(secret)
    }

    /// Finds `op` on PATH and checks it answers `op --version`.
    pub fn op_binary(&mut self, env: &Env) -> Result<PathBuf, ConfigError> {
        if let Some(path) = &self.op_binary {
            return Ok(path.clone());
        }
        let missing = || ConfigError {
            message: "1Password CLI (op) is required to resolve op:// references".to_string(),
            hint: Some(
                "install the 1Password CLI, put `op` on PATH and sign in, or use $VAR references"
                    .to_string(),
            ),
        };
        let path = env.find_executable("op").ok_or_else(missing)?;
        let run = self.run.ok_or_else(missing)?;
        let (ok, _) = run(&path, &["--version"], OP_TIMEOUT).map_err(|_| missing())?;
        if !ok {
            return Err(missing());
        }
        self.op_binary = Some(path.clone());
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_never_show_the_value() {
        let s = Secret::new("hunter2-planted");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(!format!("{s}").contains("hunter2"));
        assert_eq!(s.expose(), "hunter2-planted");
    }
}
