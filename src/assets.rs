//! The web dashboard's files, built into the binary so that svc serves them with no build step
//! and no files beside it. `server.static_dir` can override them.

/// (path under `/`, content type, bytes)
pub const FILES: &[(&str, &str, &[u8])] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../assets/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../assets/app.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_bytes!("../assets/style.css"),
    ),
];

pub fn get(path: &str) -> Option<(&'static str, &'static [u8])> {
    FILES
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, ct, bytes)| (*ct, *bytes))
}

pub fn total_bytes() -> usize {
    FILES.iter().map(|(_, _, b)| b.len()).sum()
}
