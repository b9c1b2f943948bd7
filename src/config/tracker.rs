//! `tracker` and `trackers.<bundle>`: choosing the provider, merging a bundle with its selector,
//! and validating each provider's own options (camelCase in messages). The `tools.<pack>` slices
//! and the pack registry are `super::tools`, which reads a slice with the same validators.

use std::collections::BTreeMap;

use serde_norway::Value;

use super::validate::{Ctx, Section, Style, to_camel};
use super::*;

/// Keys of `tracker` that every provider shares (snake_case in messages).
const CORE_KEYS: [&str; 5] = [
    "kind",
    "provider",
    "active_states",
    "terminal_states",
    "dispatch",
];
/// Keys any provider may take that are not flat-shape deprecations.
const SELECTOR_KEYS: [&str; 4] = ["endpoint", "apiKey", "assignee", "webhookSecret"];

pub(super) fn tracker(ctx: &mut Ctx, root: &Section) -> Option<TrackerSettings> {
    let tracker_value = root.get("tracker");
    // Read with no allow-list: which keys are valid depends on the provider.
    let selector = Section::read(ctx, "tracker", tracker_value, Style::Snake, None);
    let bundles = root.section(ctx, "trackers", Style::Snake, None);

    // The keys every provider shares are read first, so their errors are reported even when
    // the kind is missing or unknown (every error in the file at once).
    let active_states = selector
        .string_list(ctx, "active_states")
        .unwrap_or_else(|| vec!["Todo".into(), "In Progress".into()]);
    let terminal_states = selector
        .string_list(ctx, "terminal_states")
        .unwrap_or_else(|| {
            ["Closed", "Cancelled", "Canceled", "Duplicate", "Done"]
                .map(String::from)
                .to_vec()
        });
    let d = selector.section(
        ctx,
        "dispatch",
        Style::Snake,
        Some(&["accept_unrouted", "only_routes", "route_label_prefix"]),
    );
    let dispatch = DispatchSettings {
        accept_unrouted: d.bool(ctx, "accept_unrouted").unwrap_or(true),
        only_routes: d.string_list(ctx, "only_routes"),
        route_label_prefix: d
            .string(ctx, "route_label_prefix")
            .unwrap_or_else(|| "Svc:".to_string()),
    };

    let kind = match selector.get("kind") {
        None => {
            ctx.error_with_hint(
                "tracker.kind is required",
                "set tracker.kind to one of tracker-a, tracker-b, tracker-b-mcp, local, chat-a, chat-b, github, gitlab, memory",
            );
            return None;
        }
        Some(_) => selector.non_blank_string(ctx, "kind")?,
    };

    // Bundle shape: `trackers.<kind>` exists and names its provider.
    let bundle = bundles
        .entries
        .iter()
        .find(|(_, written, _)| *written == kind)
        .map(|(_, _, v)| *v);
    let (provider_name, bundle_section) = match bundle {
        Some(value) => {
            let section = Section::read(
                ctx,
                &format!("trackers.{kind}"),
                Some(value),
                Style::Camel,
                None,
            );
            let name = match section.get("provider") {
                None => {
                    ctx.error(format!("trackers.{kind}.provider is required"));
                    return None;
                }
                Some(_) => section.non_blank_string(ctx, "provider")?,
            };
            if let Some(sel) = selector.string(ctx, "provider")
                && sel != name
            {
                ctx.error(format!(
                    "tracker.provider ({sel}) does not match trackers.{kind}.provider ({name})"
                ));
            }
            (name, Some(section))
        }
        None => (
            selector
                .string(ctx, "provider")
                .unwrap_or_else(|| kind.clone()),
            None,
        ),
    };
    let Some(provider) = Provider::from_name(&provider_name) else {
        ctx.error_with_hint(
            format!("tracker.kind {provider_name} is not a registered tracker"),
            "use one of tracker-a, tracker-b, tracker-b-mcp, local, chat-a, chat-b, github, gitlab, memory; out-of-tree tracker modules and the dispatch kind are not supported by svc",
        );
        return None;
    };

    // Provider options: the bundle's keys, then the selector's non-core keys over them.
    let mut options: Vec<(String, String, &Value)> = Vec::new();
    if let Some(b) = &bundle_section {
        for (key, _, v) in &b.entries {
            if key != "provider" {
                options.push((key.clone(), b.key_path(key), v));
            }
        }
    }
    let mut flat_keys = Vec::new();
    for (key, written, v) in &selector.entries {
        if CORE_KEYS.contains(&key.as_str()) {
            continue;
        }
        let camel = to_camel(written);
        if bundle_section.is_none() && !SELECTOR_KEYS.contains(&camel.as_str()) {
            flat_keys.push(written.clone());
        }
        options.retain(|(k, _, _)| *k != camel);
        options.push((camel.clone(), format!("tracker.{camel}"), v));
    }
    if !flat_keys.is_empty() {
        ctx.deprecated(
            "flat_tracker",
            format!(
                "provider options directly under tracker ({}) are deprecated: move them to trackers.<name> with provider: {provider_name}, and set tracker.kind to <name>",
                flat_keys.join(", ")
            ),
        );
    }

    let home = bundle_section
        .as_ref()
        .map_or_else(|| "tracker".to_string(), |b| b.path.clone());
    let opts = ProviderSection {
        entries: options,
        home,
    };
    // The webhook route's secret, for the providers that have one (the others reject the key).
    let webhook_env = match provider {
        Provider::Github => Some("GITHUB_WEBHOOK_SECRET"),
        Provider::Gitlab => Some("GITLAB_WEBHOOK_SECRET"),
        Provider::TrackerA => Some("TRACKER_A_WEBHOOK_SECRET"),
        Provider::TrackerB => Some("TRACKER_B_WEBHOOK_SECRET"),
        _ => None,
    };
    let webhook_secret = webhook_env
        .map(|env| opts.secret(ctx, "webhookSecret", Some(env)))
        .filter(|s| !s.is_empty());
    let options = provider_options(ctx, provider, &opts)?;
    let rework_state = match &options {
        ProviderOptions::Github(g) => g.rework_state.as_ref(),
        ProviderOptions::Gitlab(g) => g.rework_state.as_ref(),
        _ => None,
    };
    if let Some(rework) = rework_state
        && !contains_state(&active_states, rework)
    {
        ctx.error_with_hint(
            format!("{}.reworkState ({rework}) is not one of tracker.active_states", opts.home),
            "name an active state (for example In Progress): an issue that gets review feedback is moved there to be worked again",
        );
    }
    Some(TrackerSettings {
        kind,
        provider,
        active_states,
        terminal_states,
        dispatch,
        options,
        webhook_secret,
    })
}

/// A provider's merged options: (camelCase key, display path, value).
pub(super) struct ProviderSection<'v> {
    pub(super) entries: Vec<(String, String, &'v Value)>,
    /// Where required keys are said to be missing (`tracker` or `trackers.<name>`).
    pub(super) home: String,
}

impl<'v> ProviderSection<'v> {
    /// A section view so the typed getters can be reused; paths come from the entries.
    pub(super) fn reject_unknown(&self, ctx: &mut Ctx, allowed: &[&str]) {
        for (key, path, _) in &self.entries {
            if !allowed.contains(&key.as_str()) {
                ctx.error(format!("{path} is not supported"));
            }
        }
    }

    fn value(&self, key: &str) -> Option<(&str, &'v Value)> {
        self.entries
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, p, v)| (p.as_str(), *v))
            .filter(|(_, v)| !v.is_null())
    }

    /// A one-entry [`Section`] whose path makes `<path>` the key's display path.
    fn single(&self, key: &str) -> Option<Section<'v>> {
        let (path, value) = self.value(key)?;
        let (parent, leaf) = path.rsplit_once('.').unwrap_or(("tracker", key));
        Some(Section {
            path: parent.to_string(),
            style: Style::Camel,
            entries: vec![(leaf.to_string(), leaf.to_string(), value)],
        })
    }

    fn leaf(key: &str) -> &str {
        key.rsplit('.').next().unwrap_or(key)
    }

    fn string(&self, ctx: &mut Ctx, key: &str) -> Option<String> {
        self.single(key)?.string(ctx, Self::leaf(key))
    }

    fn string_list(&self, ctx: &mut Ctx, key: &str) -> Option<Vec<String>> {
        self.single(key)?.string_list(ctx, Self::leaf(key))
    }

    /// A credential: the (already resolved) value, or `fallback_env` when it is empty.
    fn secret(&self, ctx: &mut Ctx, key: &str, fallback_env: Option<&str>) -> Secret {
        let value = self.string(ctx, key);
        ctx.with_fallback(value.as_deref(), fallback_env)
    }

    /// A string value that may be a reference; `None` when it resolves to nothing.
    fn resolved(&self, ctx: &mut Ctx, key: &str, fallback_env: Option<&str>) -> Option<String> {
        let s = self.secret(ctx, key, fallback_env);
        (!s.is_empty()).then(|| s.expose().to_string())
    }

    fn number(&self, ctx: &mut Ctx, key: &str) -> Option<f64> {
        self.single(key)?.non_negative_number(ctx, Self::leaf(key))
    }

    fn require(&self, ctx: &mut Ctx, key: &str, ok: bool, hint: &str) {
        if !ok {
            ctx.error_with_hint(format!("{}.{key} is required", self.home), hint);
        }
    }

    /// A nested mapping (such as `mcp`) as its own provider section.
    fn nested(&self, ctx: &mut Ctx, key: &str) -> ProviderSection<'v> {
        let mut entries = Vec::new();
        if let Some((path, value)) = self.value(key) {
            let section = Section::read(ctx, path, Some(value), Style::Camel, None);
            for (k, _, v) in section.entries {
                entries.push((k.clone(), format!("{path}.{k}"), v));
            }
        }
        ProviderSection {
            entries,
            home: format!("{}.{key}", self.home),
        }
    }
}

fn provider_options(
    ctx: &mut Ctx,
    provider: Provider,
    o: &ProviderSection,
) -> Option<ProviderOptions> {
    match provider {
        Provider::Memory => {
            o.reject_unknown(ctx, &[]);
            Some(ProviderOptions::Memory)
        }
        Provider::Local => {
            o.reject_unknown(ctx, &["path", "idPrefix", "users"]);
            local_options(ctx, o).map(ProviderOptions::Local)
        }
        Provider::TrackerA => tracker_a_options(ctx, o).map(ProviderOptions::TrackerA),
        Provider::TrackerB => {
            o.reject_unknown(
                ctx,
                &[
                    "baseUrl",
                    "email",
                    "apiKey",
                    "projectKeys",
                    "jql",
                    "issueType",
                    "assignee",
                    "users",
                    "webhookSecret",
                ],
            );
            tracker_b_options(ctx, o, true).map(ProviderOptions::TrackerB)
        }
        Provider::TrackerBMcp => tracker_b_mcp_options(ctx, o).map(ProviderOptions::TrackerBMcp),
        Provider::ChatA => chat_options(ctx, provider, o, true).map(ProviderOptions::ChatA),
        Provider::ChatB => chat_options(ctx, provider, o, true).map(ProviderOptions::ChatB),
        Provider::Github => {
            o.reject_unknown(ctx, GITHUB_KEYS);
            github_options(ctx, o, true).map(ProviderOptions::Github)
        }
        Provider::Gitlab => {
            o.reject_unknown(ctx, GITLAB_KEYS);
            gitlab_options(ctx, o, true).map(ProviderOptions::Gitlab)
        }
    }
}

/// The keys of a `gitlab` tracker; a `tools.gitlab` slice takes those before `users`
/// (`users`, `reworkState` and `webhookSecret` are the tracker's alone).
pub(super) const GITLAB_KEYS: &[&str] = &[
    "apiKey",
    "endpoint",
    "projects",
    "labels",
    "assignee",
    "statusLabelPrefix",
    "users",
    "reworkState",
    "webhookSecret",
];

/// `group/sub/project`: GitLab's path characters, at least one slash, no empty part.
fn valid_project_path(path: &str) -> bool {
    let ok = |part: &str| {
        !part.is_empty()
            && !part.starts_with('.')
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    path.contains('/') && path.split('/').all(ok)
}

/// Whether the URL's authority has a user part (`https://oauth2:<token>@host/...`), with or
/// without a scheme.
fn has_userinfo(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split(['/', '?', '#'])
        .next()
        .is_some_and(|authority| authority.contains('@'))
}

/// A `gitlab` tracker's options (`tracker`: the rework state and steering users too).
pub(super) fn gitlab_options(
    ctx: &mut Ctx,
    o: &ProviderSection,
    tracker: bool,
) -> Option<GitlabOptions> {
    let api_key = o.secret(ctx, "apiKey", Some("GITLAB_TOKEN"));
    o.require(
        ctx,
        "apiKey",
        !api_key.is_empty(),
        "set api_key (for example $GITLAB_TOKEN) or the GITLAB_TOKEN environment variable: a personal, group or project access token with the api scope",
    );
    let endpoint = o
        .resolved(ctx, "endpoint", None)
        .map(|e| e.trim().trim_end_matches('/').to_string())
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| GITLAB_DEFAULT_ENDPOINT.to_string());
    if has_userinfo(&endpoint) {
        // Never echoed: the user part is a credential.
        let path = o
            .value("endpoint")
            .map_or_else(|| format!("{}.endpoint", o.home), |(p, _)| p.to_string());
        ctx.error_with_hint(
            format!("{path} must not carry credentials (a user or token before @)"),
            "write the URL without them (https://<host>/api/v4) and set api_key (for example $GITLAB_TOKEN) instead",
        );
    } else if !(endpoint.starts_with("https://") || endpoint.starts_with("http://"))
        || !endpoint.ends_with("/api/v4")
    {
        let path = o
            .value("endpoint")
            .map_or_else(|| format!("{}.endpoint", o.home), |(p, _)| p.to_string());
        ctx.error_with_hint(
            format!("{path} must be a GitLab API v4 base URL ending in /api/v4 (got {endpoint})"),
            "for gitlab.com leave it out (https://gitlab.com/api/v4); for a self-managed instance use https://<host>/api/v4",
        );
    }
    let projects = o.string_list(ctx, "projects").unwrap_or_default();
    o.require(
        ctx,
        "projects",
        !projects.is_empty(),
        "set projects to a list of full project paths (group/project or group/sub/project) whose issues svc works",
    );
    for project in &projects {
        if !valid_project_path(project) {
            let path = o
                .value("projects")
                .map_or_else(|| format!("{}.projects", o.home), |(p, _)| p.to_string());
            ctx.error(format!(
                "{path} must list full project paths such as group/project (got {project:?})"
            ));
        }
    }
    let assignee = o
        .resolved(ctx, "assignee", None)
        .map(|a| a.trim().trim_start_matches('@').to_string())
        .filter(|a| !a.is_empty());
    let prefix = o
        .string(ctx, "statusLabelPrefix")
        .map(|p| p.trim().to_string())
        .unwrap_or_else(|| "status".to_string());
    let scope = prefix.trim_end_matches("::");
    if scope.is_empty() || scope.contains("::") {
        let path = o.value("statusLabelPrefix").map_or_else(
            || format!("{}.statusLabelPrefix", o.home),
            |(p, _)| p.to_string(),
        );
        ctx.error(format!(
            "{path} must be a label scope such as status (the labels are then status::<State>)"
        ));
    }
    let status_label_prefix = format!("{scope}::");
    let (users, rework_state) = if tracker {
        (
            // Usernames as GitLab shows them (`@alice` is `alice`).
            o.string_list(ctx, "users")
                .unwrap_or_default()
                .into_iter()
                .map(|u| u.trim().trim_start_matches('@').to_string())
                .collect(),
            o.string(ctx, "reworkState")
                .filter(|s| !s.trim().is_empty()),
        )
    } else {
        (Vec::new(), None)
    };
    if projects.is_empty() || api_key.is_empty() {
        return None;
    }
    Some(GitlabOptions {
        api_key,
        endpoint,
        projects,
        labels: o.string_list(ctx, "labels").unwrap_or_default(),
        assignee,
        users,
        status_label_prefix,
        rework_state,
    })
}

/// The keys of a `github` tracker; a `tools.github` slice takes those before `users`
/// (`users`, `reworkState` and `webhookSecret` are the tracker's alone).
pub(super) const GITHUB_KEYS: &[&str] = &[
    "apiKey",
    "endpoint",
    "repos",
    "labels",
    "project",
    "assignee",
    "users",
    "reworkState",
    "webhookSecret",
];

/// `owner/name`: GitHub's characters for both, one slash.
fn valid_repo(repo: &str) -> bool {
    let ok = |part: &str| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    matches!(repo.split_once('/'), Some((owner, name)) if ok(owner) && ok(name))
}

/// A `github` tracker's options (`tracker`: the rework state and steering users too).
pub(super) fn github_options(
    ctx: &mut Ctx,
    o: &ProviderSection,
    tracker: bool,
) -> Option<GithubOptions> {
    let api_key = o.secret(ctx, "apiKey", Some("GITHUB_TOKEN"));
    o.require(
        ctx,
        "apiKey",
        !api_key.is_empty(),
        "set api_key (for example $GITHUB_TOKEN) or the GITHUB_TOKEN environment variable: a token that may read and write the repositories' issues (and the project)",
    );
    let endpoint = o
        .resolved(ctx, "endpoint", None)
        .map(|e| e.trim().trim_end_matches('/').to_string())
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| GITHUB_DEFAULT_ENDPOINT.to_string());
    let repos = o.string_list(ctx, "repos").unwrap_or_default();
    o.require(
        ctx,
        "repos",
        !repos.is_empty(),
        "set repos to a list of owner/name repositories whose issues svc works",
    );
    let path = |key: &str| {
        o.value(key)
            .map_or_else(|| format!("{}.{key}", o.home), |(p, _)| p.to_string())
    };
    for repo in &repos {
        if !valid_repo(repo) {
            ctx.error(format!(
                "{} must list repositories as owner/name (got {repo:?})",
                path("repos")
            ));
        }
    }
    let project = if o.value("project").is_some() {
        let p = o.nested(ctx, "project");
        p.reject_unknown(ctx, &["owner", "number", "statusField"]);
        let owner = p.string(ctx, "owner").filter(|s| !s.trim().is_empty());
        p.require(
            ctx,
            "owner",
            owner.is_some(),
            "set project.owner to the organization or user that owns the board",
        );
        let number = p.number(ctx, "number");
        let number = match number {
            Some(n) if n >= 1.0 && n.fract() == 0.0 => Some(n as u64),
            Some(_) => {
                ctx.error(format!("{}.number must be a positive whole number", p.home));
                None
            }
            None => {
                p.require(
                    ctx,
                    "number",
                    false,
                    "set project.number to the board's number (the N of /orgs/<owner>/projects/N)",
                );
                None
            }
        };
        let status_field = p
            .string(ctx, "statusField")
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| "Status".to_string());
        Some(GithubProject {
            owner: owner?,
            number: number?,
            status_field,
        })
    } else {
        None
    };
    let assignee = o
        .resolved(ctx, "assignee", None)
        .map(|a| a.trim().trim_start_matches('@').to_string())
        .filter(|a| !a.is_empty());
    let (users, rework_state) = if tracker {
        (
            o.string_list(ctx, "users").unwrap_or_default(),
            o.string(ctx, "reworkState")
                .filter(|s| !s.trim().is_empty()),
        )
    } else {
        (Vec::new(), None)
    };
    if repos.is_empty() || api_key.is_empty() {
        return None;
    }
    Some(GithubOptions {
        api_key,
        endpoint,
        repos,
        labels: o.string_list(ctx, "labels").unwrap_or_default(),
        assignee,
        users,
        project,
        rework_state,
    })
}

pub(super) fn local_options(ctx: &mut Ctx, o: &ProviderSection) -> Option<LocalOptions> {
    let path = match o.string(ctx, "path") {
        Some(p) if p.trim().is_empty() => {
            let path = o
                .value("path")
                .map_or("tracker.path".to_string(), |(p, _)| p.to_string());
            ctx.error(format!("{path} must not be empty"));
            return None;
        }
        Some(p) => ctx.env.resolve_path_with_vars(&p),
        None => ctx.env.resolve_path(".svc/local"),
    };
    let id_prefix = o
        .string(ctx, "idPrefix")
        .unwrap_or_else(|| "BOARD-".to_string());
    if !valid_id_prefix(&id_prefix) {
        let path = o
            .value("idPrefix")
            .map_or("tracker.idPrefix".to_string(), |(p, _)| p.to_string());
        ctx.error(format!(
            "{path} must start with a letter or digit followed by letters, digits, _ or - (got {id_prefix:?})"
        ));
        return None;
    }
    let users = o.string_list(ctx, "users").unwrap_or_default();
    Some(LocalOptions {
        path,
        id_prefix,
        users,
    })
}

pub fn valid_id_prefix(prefix: &str) -> bool {
    let mut chars = prefix.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn tracker_a_options(ctx: &mut Ctx, o: &ProviderSection) -> Option<TrackerAOptions> {
    o.reject_unknown(
        ctx,
        &[
            "apiKey",
            "endpoint",
            "projectSlug",
            "projectSlugs",
            "projectLabels",
            "assignee",
            "users",
            "webhookSecret",
        ],
    );
    let api_key = o.secret(ctx, "apiKey", Some("TRACKER_A_API_KEY"));
    o.require(ctx, "apiKey", !api_key.is_empty(), "set tracker.api_key (for example $TRACKER_A_API_KEY) or the TRACKER_A_API_KEY environment variable");
    let endpoint = o
        .resolved(ctx, "endpoint", None)
        .unwrap_or_else(|| TRACKER_A_DEFAULT_ENDPOINT.to_string());
    let slug = o.string(ctx, "projectSlug");
    let slugs = o.string_list(ctx, "projectSlugs");
    let labels = o.string_list(ctx, "projectLabels");
    if slug.is_some() {
        ctx.deprecated(
            "project_slug",
            "tracker.project_slug is deprecated: use tracker.project_slugs: [<slug>]",
        );
    }
    let given = [slug.is_some(), slugs.is_some(), labels.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if given != 1 {
        ctx.error_with_hint(
            format!("{} needs exactly one of projectSlugs, projectLabels or projectSlug", o.home),
            "set project_slugs (a list of project slugs) or project_labels (discover projects by label)",
        );
    }
    let assignee = o
        .resolved(ctx, "assignee", Some("TRACKER_A_ASSIGNEE"))
        .filter(|a| !a.trim().is_empty());
    let projects = match (slug, slugs, labels) {
        (_, Some(s), _) => TrackerAProjects::Slugs(s),
        (_, _, Some(l)) => TrackerAProjects::Labels(l),
        (Some(s), _, _) => TrackerAProjects::Slug(s),
        _ => return None,
    };
    Some(TrackerAOptions {
        api_key,
        endpoint,
        projects,
        assignee,
        users: o.string_list(ctx, "users").unwrap_or_default(),
    })
}

fn tracker_b_scope(ctx: &mut Ctx, o: &ProviderSection) -> TrackerBScope {
    let project_keys = o.string_list(ctx, "projectKeys").unwrap_or_default();
    let jql = o
        .resolved(ctx, "jql", None)
        .filter(|j| !j.trim().is_empty());
    if project_keys.is_empty() && jql.is_none() {
        ctx.error_with_hint(
            format!("{} needs at least one of jql or projectKeys", o.home),
            "set tracker.jql (a JQL filter) and/or tracker.project_keys (a list of project keys)",
        );
    }
    TrackerBScope {
        project_keys,
        jql,
        issue_type: o
            .resolved(ctx, "issueType", None)
            .unwrap_or_else(|| "Task".to_string()),
        assignee: o
            .resolved(ctx, "assignee", None)
            .filter(|a| !a.trim().is_empty()),
    }
}

pub(super) fn tracker_b_options(
    ctx: &mut Ctx,
    o: &ProviderSection,
    require_scope: bool,
) -> Option<TrackerBOptions> {
    let base_url = match o.value("baseUrl") {
        Some(_) => o.secret(ctx, "baseUrl", Some("TRACKER_B_BASE_URL")),
        None => ctx.resolve_default_ref("$TRACKER_B_BASE_URL"),
    };
    o.require(
        ctx,
        "baseUrl",
        !base_url.is_empty(),
        "set tracker.base_url (for example https://your-site.atlassian.net) or TRACKER_B_BASE_URL",
    );
    let email = o.secret(ctx, "email", Some("TRACKER_B_EMAIL"));
    o.require(
        ctx,
        "email",
        !email.is_empty(),
        "set tracker.email or the TRACKER_B_EMAIL environment variable",
    );
    let api_key = o.secret(ctx, "apiKey", Some("TRACKER_B_API_KEY"));
    o.require(
        ctx,
        "apiKey",
        !api_key.is_empty(),
        "set tracker.api_key (for example $TRACKER_B_API_KEY) or TRACKER_B_API_KEY",
    );
    let scope = if require_scope {
        tracker_b_scope(ctx, o)
    } else {
        TrackerBScope {
            project_keys: o.string_list(ctx, "projectKeys").unwrap_or_default(),
            jql: o.resolved(ctx, "jql", None),
            issue_type: o
                .resolved(ctx, "issueType", None)
                .unwrap_or_else(|| "Task".to_string()),
            assignee: o.resolved(ctx, "assignee", None),
        }
    };
    Some(TrackerBOptions {
        base_url,
        email,
        api_key,
        scope,
        users: o.string_list(ctx, "users").unwrap_or_default(),
    })
}

fn tracker_b_mcp_options(ctx: &mut Ctx, o: &ProviderSection) -> Option<TrackerBMcpOptions> {
    o.reject_unknown(
        ctx,
        &[
            "baseUrl",
            "mcp",
            "projectKeys",
            "jql",
            "issueType",
            "assignee",
            "users",
        ],
    );
    let base_url = match o.value("baseUrl") {
        Some(_) => Some(o.secret(ctx, "baseUrl", None)),
        None => Some(ctx.resolve_default_ref("$TRACKER_B_BASE_URL")),
    }
    .filter(|s| !s.is_empty());
    let mcp = o.nested(ctx, "mcp");
    mcp.reject_unknown(ctx, &["url", "token", "headers", "tools"]);
    let url = mcp.secret(ctx, "url", None);
    o.require(
        ctx,
        "mcp.url",
        !url.is_empty(),
        "set tracker.mcp.url to the MCP server's Streamable HTTP URL",
    );
    let token = mcp.value("token").map(|_| mcp.secret(ctx, "token", None));
    let mut headers = Vec::new();
    let header_section = mcp.nested(ctx, "headers");
    for (name, path, value) in &header_section.entries {
        match value.as_str() {
            Some(value) => headers.push((name.clone(), Secret::new(value))),
            None => ctx.error(format!("{path} must be a string")),
        }
    }
    let tools_section = mcp.nested(ctx, "tools");
    tools_section.reject_unknown(
        ctx,
        &[
            "search",
            "readIssue",
            "updateStatus",
            "listComments",
            "comment",
            "updateComment",
            "createIssue",
        ],
    );
    let name = |ctx: &mut Ctx, key: &str, default: &str| {
        tools_section
            .string(ctx, key)
            .unwrap_or_else(|| default.to_string())
    };
    let tools = McpToolNames {
        search: name(ctx, "search", "tracker_b_search"),
        read_issue: name(ctx, "readIssue", "tracker_b_get_issue"),
        update_status: name(ctx, "updateStatus", "tracker_b_transition_issue"),
        list_comments: name(ctx, "listComments", "tracker_b_get_comments"),
        comment: name(ctx, "comment", "tracker_b_add_comment"),
        update_comment: name(ctx, "updateComment", "tracker_b_update_comment"),
        create_issue: name(ctx, "createIssue", "tracker_b_create_issue"),
    };
    let scope = tracker_b_scope(ctx, o);
    Some(TrackerBMcpOptions {
        base_url,
        url,
        token,
        headers,
        tools,
        scope,
        users: o.string_list(ctx, "users").unwrap_or_default(),
    })
}

/// The options of a chat tracker. `required` is false for a standalone `tools.chat_a` or
/// `tools.chat_b` slice,
/// whose tools then fail closed without a bot user id or channels instead of failing validation.
pub(super) fn chat_options(
    ctx: &mut Ctx,
    provider: Provider,
    o: &ProviderSection,
    required: bool,
) -> Option<ChatOptions> {
    let chat_a = provider == Provider::ChatA;
    let mut allowed = vec![
        "channels",
        "botUserId",
        "apiKey",
        "endpoint",
        "emojiStates",
        "markerEmoji",
        "users",
    ];
    allowed.extend(if chat_a {
        ["replyLookbackDays"].as_slice()
    } else {
        ["guildId", "scanLookbackDays"].as_slice()
    });
    // Socket Mode is the tracker's live feed; the tools never open one.
    if chat_a && required {
        allowed.push("appToken");
    }
    o.reject_unknown(ctx, &allowed);
    let (token_env, user_env) = if chat_a {
        ("CHAT_A_BOT_TOKEN", "CHAT_A_BOT_USER_ID")
    } else {
        ("CHAT_B_BOT_TOKEN", "CHAT_B_BOT_USER_ID")
    };
    let raw_channels = o.string_list(ctx, "channels");
    o.require(
        ctx,
        "channels",
        raw_channels.is_some() || !required,
        "list the channel ids the bot watches",
    );
    // `$VAR` references are supported per channel (resolved with every other value); an
    // unresolved one is empty and dropped.
    let channels = raw_channels
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !c.is_empty())
        .collect();
    let bot_user_id = o.resolved(ctx, "botUserId", Some(user_env));
    o.require(
        ctx,
        "botUserId",
        bot_user_id.is_some() || !required,
        &format!("set tracker.bot_user_id or {user_env}; without it any mention would start a run"),
    );
    let api_key = o.secret(ctx, "apiKey", Some(token_env));
    let app_token = if chat_a && required {
        o.secret(ctx, "appToken", Some("CHAT_A_APP_TOKEN"))
    } else {
        Secret::new("")
    };
    let guild_id = if chat_a {
        None
    } else {
        o.resolved(ctx, "guildId", Some("CHAT_B_GUILD_ID"))
    };
    if !chat_a {
        o.require(
            ctx,
            "guildId",
            guild_id.is_some() || !required,
            "set tracker.guild_id or CHAT_B_GUILD_ID",
        );
        o.require(
            ctx,
            "apiKey",
            !api_key.is_empty() || !required,
            "set tracker.api_key or CHAT_B_BOT_TOKEN",
        );
    }
    let mut emoji_states: BTreeMap<String, String> = if chat_a {
        [
            ("eyes", "In Progress"),
            ("white_check_mark", "Done"),
            ("x", "Cancelled"),
        ]
    } else {
        [("👀", "In Progress"), ("✅", "Done"), ("❌", "Cancelled")]
    }
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let emoji = o.nested(ctx, "emojiStates");
    for (_, path, value) in &emoji.entries {
        let key = path.rsplit('.').next().unwrap_or_default().to_string();
        match value.as_str() {
            Some(state) => {
                emoji_states.insert(key, state.to_string());
            }
            None => ctx.error(format!("{path} must be a string")),
        }
    }
    Some(ChatOptions {
        guild_id,
        channels,
        bot_user_id,
        users: o.string_list(ctx, "users").unwrap_or_default(),
        api_key,
        app_token,
        endpoint: o.resolved(ctx, "endpoint", None).unwrap_or_else(|| {
            if chat_a {
                "https://slack.com/api"
            } else {
                "https://discord.com/api/v10"
            }
            .to_string()
        }),
        emoji_states,
        marker_emoji: o
            .string(ctx, "markerEmoji")
            .unwrap_or_else(|| if chat_a { "robot_face" } else { "🤖" }.to_string()),
        lookback_days: o
            .number(
                ctx,
                if chat_a {
                    "replyLookbackDays"
                } else {
                    "scanLookbackDays"
                },
            )
            .unwrap_or(if chat_a { 2.0 } else { 0.0 }),
    })
}
