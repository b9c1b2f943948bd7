//! The dashboard's files (`GET /`, `GET /assets/<file>`): built into the binary, or read from
//! `server.static_dir` with its `assets/`, confined to that directory.

use std::path::{Path, PathBuf};

use super::{Answer, Body, Ctx, JSON, answer, error, header};

fn content_type(name: &str) -> &'static str {
    let extension = Path::new(name).extension().and_then(|e| e.to_str());
    match extension.map(str::to_ascii_lowercase).as_deref() {
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json" | "map") => JSON,
        Some("txt") => "text/plain; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("webp") => "image/webp",
        Some("ico") => "image/x-icon",
        Some("woff") => "font/woff",
        Some("woff2") => "font/woff2",
        Some("ttf") => "font/ttf",
        Some("wasm") => "application/wasm",
        _ => "application/octet-stream",
    }
}

/// Which dashboard file a request wants.
pub(super) enum DashboardFile<'a> {
    Index,
    /// The part of the path after `/assets/`, percent-decoded.
    Asset(&'a str),
}

/// What the browser may do on the dashboard: scripts and styles from this server only (no
/// inline script, no `eval`), requests (`fetch`, `/ws`) to this server only, nothing framed,
/// no form posted anywhere, no referrer sent. The page never loads anything from elsewhere.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// A dashboard file with the headers that keep the page strict.
fn strict(answer: Answer) -> Answer {
    answer
        .with_header(header("Content-Security-Policy", CONTENT_SECURITY_POLICY))
        .with_header(header("X-Content-Type-Options", "nosniff"))
        .with_header(header("Referrer-Policy", "no-referrer"))
}

/// A dashboard file from `server.static_dir`, or from the files built into the binary.
///
/// A static dir is laid out like a built dashboard: `index.html` at its top and the files the
/// page loads under `assets/`. `GET /assets/<file>` reads `<static_dir>/assets/<file>`, then
/// (the flat layout of earlier releases) `<static_dir>/<file>`. A name with an empty, `.` or
/// `..` segment, or a file whose real path leaves the static dir (a symlink), is not found.
pub(super) fn file(ctx: &Ctx, file: DashboardFile) -> Answer {
    strict(unguarded(ctx, file))
}

fn unguarded(ctx: &Ctx, file: DashboardFile) -> Answer {
    let static_dir: Option<PathBuf> = ctx
        .loaded
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .settings
        .server
        .static_dir
        .clone();
    let name = match file {
        DashboardFile::Index => "index.html",
        DashboardFile::Asset(name) => name,
    };
    let safe = !name.is_empty()
        && !name
            .split('/')
            .any(|seg| seg.is_empty() || seg == "." || seg == ".." || seg.contains(['\\', '\0']));
    if !safe {
        return error(404, "not_found", "Route not found");
    }
    let Some(dir) = static_dir else {
        return match crate::assets::get(name) {
            Some((ct, bytes)) => {
                answer(Body::Static(bytes)).with_header(header("Content-Type", ct))
            }
            None => error(404, "not_found", "Route not found"),
        };
    };
    let candidates = match file {
        DashboardFile::Index => vec![dir.join(name)],
        DashboardFile::Asset(_) => vec![dir.join("assets").join(name), dir.join(name)],
    };
    if let Some(bytes) = candidates
        .iter()
        .find_map(|path| read_contained(&dir, path))
    {
        return answer(Body::Owned(bytes)).with_header(header("Content-Type", content_type(name)));
    }
    match file {
        DashboardFile::Index => error(
            503,
            "dashboard_not_built",
            &format!(
                "Dashboard assets not found. Run: mkdir -p {dir}/assets && cp assets/index.html {dir}/ && cp assets/*.js assets/*.css {dir}/assets/ (or unset server.static_dir to use the dashboard built into svc)",
                dir = dir.display()
            ),
        ),
        DashboardFile::Asset(_) => error(404, "not_found", "Route not found"),
    }
}

/// The bytes of the regular file `path` when its real path lies inside the real `dir`.
fn read_contained(dir: &Path, path: &Path) -> Option<Vec<u8>> {
    let root = std::fs::canonicalize(dir).ok()?;
    let real = std::fs::canonicalize(path).ok()?;
    if !real.starts_with(&root) || !real.is_file() {
        return None;
    }
    std::fs::read(real).ok()
}
