//! Strict section reading: unknown keys, type errors and secret references, each reported with
//! the spec's exact wording. Every problem is collected so that a file's errors are reported at
//! once, not one per edit.

use serde_norway::Value;

use super::secret::{Secret, SecretResolver};
use super::{ConfigError, Warning};
use crate::env::Env;

/// How keys are spelled: strict sections in snake_case, provider passthrough keys in camelCase.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Style {
    Snake,
    Camel,
}

/// Collects errors and warnings while one workflow is validated.
pub struct Ctx<'e> {
    pub env: &'e Env,
    pub errors: Vec<ConfigError>,
    pub warnings: Vec<Warning>,
    pub secrets: &'e mut SecretResolver,
    /// The `$NAME` references resolved so far, with their values (to tell which variables a
    /// credential came from).
    referenced: Vec<(String, String)>,
    /// The environment variables svc read a credential from (a credential key's `$NAME`, or
    /// its fallback variable): no agent inherits them.
    pub credential_vars: std::collections::BTreeSet<String>,
}

impl<'e> Ctx<'e> {
    pub fn new(env: &'e Env, secrets: &'e mut SecretResolver) -> Ctx<'e> {
        Ctx {
            env,
            errors: Vec::new(),
            warnings: Vec::new(),
            secrets,
            referenced: Vec::new(),
            credential_vars: Default::default(),
        }
    }

    pub fn error(&mut self, message: impl Into<String>) {
        self.errors.push(ConfigError {
            message: message.into(),
            hint: None,
        });
    }

    pub fn error_with_hint(&mut self, message: impl Into<String>, hint: impl Into<String>) {
        self.errors.push(ConfigError {
            message: message.into(),
            hint: Some(hint.into()),
        });
    }

    pub fn deprecated(&mut self, check: &str, message: impl Into<String>) {
        self.warnings.push(Warning {
            check: format!("config_deprecation_{check}"),
            message: message.into(),
        });
    }

    /// Resolves one string value of the front matter (spec rule 3, steps a and c): a value that
    /// is wholly `$VAR` becomes that variable (empty when unset), and a remaining `op://`
    /// reference is read through the 1Password CLI. Substrings are never interpolated. Every
    /// string value goes through this once, before any section is read
    /// ([`resolve_references`]), so no key can forget it. A failed read is recorded as an
    /// error and yields the empty string.
    pub fn resolve_value(&mut self, raw: &str) -> String {
        let value = match env_reference(raw) {
            Some(name) => {
                let value = self.env.get(name).unwrap_or("");
                self.referenced.push((name.to_string(), value.to_string()));
                value
            }
            None => raw,
        };
        if !value.starts_with("op://") {
            return value.to_string();
        }
        match self.secrets.read_op(self.env, value) {
            Ok(secret) => secret.expose().to_string(),
            Err(err) => {
                self.errors.push(err);
                String::new()
            }
        }
    }

    /// Step b of spec rule 3 for a value that [`Ctx::resolve_value`] already resolved: when it
    /// is absent or empty, the provider's environment fallback applies (itself possibly an
    /// `op://` reference, as in "a bare `op://` fallback resolves even with no inline value").
    pub fn with_fallback(&mut self, resolved: Option<&str>, fallback_env: Option<&str>) -> Secret {
        if let Some(value) = resolved.filter(|v| !v.is_empty()) {
            let names = self.referenced.iter().filter(|(_, v)| v == value);
            let names: Vec<String> = names.map(|(n, _)| n.clone()).collect();
            self.credential_vars.extend(names);
            return Secret::new(value);
        }
        let Some(fallback) = fallback_env.and_then(|name| self.env.non_empty(name)) else {
            return Secret::default();
        };
        if let Some(name) = fallback_env {
            self.credential_vars.insert(name.to_string());
        }
        let fallback = fallback.to_string();
        Secret::new(self.resolve_value(&fallback))
    }

    /// A reference written in the code rather than the file (such as `$TRACKER_B_BASE_URL`,
    /// the spec's default for `base_url`), resolved like a value of the file.
    pub fn resolve_default_ref(&mut self, reference: &str) -> Secret {
        Secret::new(self.resolve_value(reference))
    }
}

/// A copy of `value` with every string value resolved by [`Ctx::resolve_value`] (mapping
/// keys are names, not values, and stay as written). Spec rule 3: "any string value may be a
/// reference", including list elements and nested records such as `provider_config`.
pub fn resolve_references(ctx: &mut Ctx, value: &Value) -> Value {
    match value {
        Value::String(s) if s.starts_with('$') || s.starts_with("op://") => {
            Value::String(ctx.resolve_value(s))
        }
        Value::Sequence(seq) => {
            Value::Sequence(seq.iter().map(|v| resolve_references(ctx, v)).collect())
        }
        Value::Mapping(m) => Value::Mapping(
            m.iter()
                .map(|(k, v)| (k.clone(), resolve_references(ctx, v)))
                .collect(),
        ),
        Value::Tagged(t) => Value::Tagged(Box::new(serde_norway::value::TaggedValue {
            tag: t.tag.clone(),
            value: resolve_references(ctx, &t.value),
        })),
        other => other.clone(),
    }
}

/// The variable name when `raw` is wholly `$NAME` (letters, digits, underscores, not starting
/// with a digit).
pub fn env_reference(raw: &str) -> Option<&str> {
    let name = raw.strip_prefix('$')?;
    let mut chars = name.chars();
    let first = chars.next()?;
    let ok = (first == '_' || first.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric());
    ok.then_some(name)
}

pub fn to_snake(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 4);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

pub fn to_camel(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut upper = false;
    for c in key.chars() {
        if c == '_' && !out.is_empty() {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// One mapping of the front matter, its keys normalized to one style.
pub struct Section<'v> {
    pub path: String,
    pub style: Style,
    /// (normalized key, key as written, value)
    pub entries: Vec<(String, String, &'v Value)>,
}

impl<'v> Section<'v> {
    /// Reads `value` as a mapping at `path`. With `allowed`, any other key is reported as
    /// `<path>.<key> is not supported`. A null or absent value is an empty section.
    pub fn read(
        ctx: &mut Ctx,
        path: &str,
        value: Option<&'v Value>,
        style: Style,
        allowed: Option<&[&str]>,
    ) -> Section<'v> {
        let mut section = Section {
            path: path.to_string(),
            style,
            entries: Vec::new(),
        };
        let mapping = match value {
            None | Some(Value::Null) => return section,
            Some(Value::Mapping(m)) => m,
            Some(_) => {
                ctx.error(format!("{path} must be a mapping"));
                return section;
            }
        };
        for (k, v) in mapping {
            let Some(written) = k.as_str() else {
                ctx.error(format!("{path} has a key that is not a string"));
                continue;
            };
            let normalized = match style {
                Style::Snake => to_snake(written),
                Style::Camel => to_camel(written),
            };
            if let Some(allowed) = allowed
                && !allowed.contains(&normalized.as_str())
            {
                ctx.error(format!("{path}.{written} is not supported"));
                continue;
            }
            if let Some((_, first, _)) = section.entries.iter().find(|(n, _, _)| *n == normalized) {
                ctx.error(format!("{path}.{written} is given twice (also as {first})"));
                continue;
            }
            section.entries.push((normalized, written.to_string(), v));
        }
        section
    }

    /// The value of `key` (normalized spelling), with null treated as unset.
    pub fn get(&self, key: &str) -> Option<&'v Value> {
        self.entries
            .iter()
            .find(|(n, _, _)| n == key)
            .map(|(_, _, v)| *v)
            .filter(|v| !v.is_null())
    }

    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn key_path(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    pub fn string(&self, ctx: &mut Ctx, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(s) => Some(s.clone()),
            _ => {
                ctx.error(format!("{} must be a string", self.key_path(key)));
                None
            }
        }
    }

    /// A string that must not be blank.
    pub fn non_blank_string(&self, ctx: &mut Ctx, key: &str) -> Option<String> {
        let s = self.string(ctx, key)?;
        if s.trim().is_empty() {
            ctx.error(format!("{} must not be blank", self.key_path(key)));
            return None;
        }
        Some(s)
    }

    pub fn string_list(&self, ctx: &mut Ctx, key: &str) -> Option<Vec<String>> {
        let value = self.get(key)?;
        let list = value
            .as_sequence()
            .and_then(|seq| seq.iter().map(|v| v.as_str().map(str::to_string)).collect());
        if list.is_none() {
            ctx.error(format!("{} must be a list of strings", self.key_path(key)));
        }
        list
    }

    pub fn bool(&self, ctx: &mut Ctx, key: &str) -> Option<bool> {
        match self.get(key)? {
            Value::Bool(b) => Some(*b),
            _ => {
                ctx.error(format!("{} must be a boolean", self.key_path(key)));
                None
            }
        }
    }

    fn int_where(
        &self,
        ctx: &mut Ctx,
        key: &str,
        ok: impl Fn(i64) -> bool,
        what: &str,
    ) -> Option<i64> {
        let value = self.get(key)?;
        match value.as_i64().filter(|n| ok(*n)) {
            Some(n) => Some(n),
            None => {
                ctx.error(format!("{} must be {what}", self.key_path(key)));
                None
            }
        }
    }

    pub fn int(&self, ctx: &mut Ctx, key: &str) -> Option<i64> {
        self.int_where(ctx, key, |_| true, "an integer")
    }

    pub fn positive_int(&self, ctx: &mut Ctx, key: &str) -> Option<u64> {
        self.int_where(ctx, key, |n| n > 0, "a positive integer")
            .map(|n| n as u64)
    }

    pub fn non_negative_int(&self, ctx: &mut Ctx, key: &str) -> Option<u64> {
        self.int_where(ctx, key, |n| n >= 0, "a non-negative integer")
            .map(|n| n as u64)
    }

    pub fn int_in(&self, ctx: &mut Ctx, key: &str, lo: i64, hi: i64, what: &str) -> Option<i64> {
        self.int_where(ctx, key, |n| (lo..=hi).contains(&n), what)
    }

    /// A number (integer or float) that is not negative.
    pub fn non_negative_number(&self, ctx: &mut Ctx, key: &str) -> Option<f64> {
        let value = self.get(key)?;
        match value.as_f64().filter(|n| *n >= 0.0) {
            Some(n) => Some(n),
            None => {
                ctx.error(format!(
                    "{} must be a non-negative number",
                    self.key_path(key)
                ));
                None
            }
        }
    }

    /// A number (integer or float) above zero.
    pub fn positive_number(&self, ctx: &mut Ctx, key: &str) -> Option<f64> {
        let value = self.get(key)?;
        match value.as_f64().filter(|n| *n > 0.0 && n.is_finite()) {
            Some(n) => Some(n),
            None => {
                ctx.error(format!("{} must be a positive number", self.key_path(key)));
                None
            }
        }
    }

    pub fn one_of(&self, ctx: &mut Ctx, key: &str, choices: &[&str]) -> Option<String> {
        let s = self.string(ctx, key)?;
        if choices.contains(&s.as_str()) {
            Some(s)
        } else {
            ctx.error(format!(
                "{} must be one of: {}",
                self.key_path(key),
                choices.join(", ")
            ));
            None
        }
    }

    /// A nested section under `key`.
    pub fn section(
        &self,
        ctx: &mut Ctx,
        key: &str,
        style: Style,
        allowed: Option<&[&str]>,
    ) -> Section<'v> {
        Section::read(ctx, &self.key_path(key), self.get(key), style, allowed)
    }

    /// A credential: the (already resolved) value, or `fallback_env` when it is empty.
    pub fn secret(&self, ctx: &mut Ctx, key: &str, fallback_env: Option<&str>) -> Secret {
        let value = self.string(ctx, key);
        ctx.with_fallback(value.as_deref(), fallback_env)
    }

    /// A string value; `None` when it is unset or resolved to the empty string (an unset
    /// `$VAR`).
    pub fn non_empty_string(&self, ctx: &mut Ctx, key: &str) -> Option<String> {
        self.string(ctx, key).filter(|s| !s.is_empty())
    }
}

/// Converts a YAML value into JSON (for records such as `provider_config`).
pub fn yaml_to_json(value: &Value) -> serde_json::Value {
    match value {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into()
            } else if let Some(u) = n.as_u64() {
                u.into()
            } else {
                n.as_f64()
                    .and_then(serde_json::Number::from_f64)
                    .map_or(serde_json::Value::Null, serde_json::Value::Number)
            }
        }
        Value::String(s) => serde_json::Value::String(s.clone()),
        Value::Sequence(seq) => serde_json::Value::Array(seq.iter().map(yaml_to_json).collect()),
        Value::Mapping(m) => serde_json::Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Value::String(s) => s.clone(),
                        other => serde_norway::to_string(other)
                            .unwrap_or_default()
                            .trim()
                            .to_string(),
                    };
                    (key, yaml_to_json(v))
                })
                .collect(),
        ),
        Value::Tagged(t) => yaml_to_json(&t.value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_styles_convert_both_ways() {
        assert_eq!(to_snake("idPrefix"), "id_prefix");
        assert_eq!(to_snake("id_prefix"), "id_prefix");
        assert_eq!(to_camel("base_url"), "baseUrl");
        assert_eq!(to_camel("baseUrl"), "baseUrl");
        assert_eq!(to_camel("mcp"), "mcp");
    }

    #[test]
    fn env_reference_is_whole_value_only() {
        assert_eq!(env_reference("$TOKEN"), Some("TOKEN"));
        assert_eq!(env_reference("$_A1"), Some("_A1"));
        assert_eq!(env_reference("$1A"), None);
        assert_eq!(env_reference("$HOME/x"), None);
        assert_eq!(env_reference("x$HOME"), None);
        assert_eq!(env_reference("$"), None);
    }
}
