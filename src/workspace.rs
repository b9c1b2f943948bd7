//! Per-issue workspaces: directory names from identifiers, containment under the root through
//! real paths (re-checked before every local hook), creation, removal and the skills overlay.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::config::Isolation;

/// A containment or overlay failure; `code` is the spec's identifier or message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspaceError {
    pub code: &'static str,
    pub detail: String,
}

impl fmt::Display for WorkspaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.detail.is_empty() {
            f.write_str(self.code)
        } else {
            write!(f, "{}: {}", self.code, self.detail)
        }
    }
}

impl std::error::Error for WorkspaceError {}

fn err(code: &'static str, detail: impl Into<String>) -> WorkspaceError {
    WorkspaceError {
        code,
        detail: detail.into(),
    }
}

pub const INVALID_CWD: &str = "invalid_workspace_cwd";
pub const ROOT_AS_CWD: &str = "refusing to use workspace root as cwd";
pub const UNSAFE_SYMLINK: &str = "unsafe symlink in workspace path";
pub const OUTSIDE_ROOT: &str = "workspace outside root";
pub const SKILL_SYMLINK: &str = "workspace_skill_source_symlink";
pub const SKILL_UNSUPPORTED: &str = "workspace_skill_source_unsupported";

/// The directory name of an identifier: every character outside letters, digits, `_`, `.` and
/// `-` becomes `_`. Distinct identifiers may map to one name; there is no disambiguation.
pub fn dir_name(identifier: &str) -> String {
    let name: String = identifier
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // "." and ".." would name the root or its parent.
    if name.chars().all(|c| c == '.') {
        name.replace('.', "_")
    } else {
        name
    }
}

/// The directory name of one ensemble slot's workspace: [`dir_name`] outside ensemble mode
/// (`size` 1), else `<dir_name>+<slot>`. `+` never appears in a [`dir_name`], so a slot's
/// directory cannot be another identifier's.
pub fn slot_dir_name(identifier: &str, slot: u32, size: u32) -> String {
    let name = dir_name(identifier);
    if size > 1 {
        format!("{name}+{slot}")
    } else {
        name
    }
}

/// The workspace path of one ensemble slot of an issue (all slots share `shared` without
/// isolation).
pub fn slot_path(
    root: &Path,
    isolation: Isolation,
    identifier: &str,
    slot: u32,
    size: u32,
) -> PathBuf {
    match isolation {
        Isolation::PerAgent => root.join(slot_dir_name(identifier, slot, size)),
        Isolation::None => root.join("shared"),
    }
}

/// The workspace path of an issue (not yet checked or created).
pub fn path_for(root: &Path, isolation: Isolation, identifier: &str) -> PathBuf {
    match isolation {
        Isolation::PerAgent => root.join(dir_name(identifier)),
        Isolation::None => root.join("shared"),
    }
}

/// Checks that `path` is a usable working directory strictly inside `root`, resolving symlinks.
/// Paths that do not exist yet are checked through their nearest existing ancestor.
pub fn check_contained(root: &Path, path: &Path) -> Result<(), WorkspaceError> {
    let text = path.to_string_lossy();
    if text.trim().is_empty() || text.contains('\n') || text.contains('\r') {
        return Err(err(INVALID_CWD, ""));
    }
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(err(OUTSIDE_ROOT, path.display().to_string()));
    }
    let real_root = fs::canonicalize(root).map_err(|e| {
        err(
            INVALID_CWD,
            format!("workspace root {}: {e}", root.display()),
        )
    })?;
    // Resolve the longest existing prefix, then append the rest.
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    while fs::symlink_metadata(&existing).is_err() {
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => return Err(err(OUTSIDE_ROOT, path.display().to_string())),
        }
    }
    let mut real = fs::canonicalize(&existing)
        .map_err(|e| err(INVALID_CWD, format!("{}: {e}", existing.display())))?;
    for name in rest.iter().rev() {
        real.push(name);
    }
    if real == real_root {
        return Err(err(ROOT_AS_CWD, ""));
    }
    if !real.starts_with(&real_root) {
        // A path written under the root that resolves elsewhere went through a symlink.
        let lexically_inside = path.starts_with(root) || path.starts_with(&real_root);
        let code = if lexically_inside {
            UNSAFE_SYMLINK
        } else {
            OUTSIDE_ROOT
        };
        return Err(err(code, path.display().to_string()));
    }
    Ok(())
}

/// Makes sure the workspace exists; returns its path and whether it was created now.
pub fn ensure(root: &Path, path: &Path) -> Result<bool, WorkspaceError> {
    fs::create_dir_all(root).map_err(|e| {
        err(
            INVALID_CWD,
            format!("cannot create workspace root {}: {e}", root.display()),
        )
    })?;
    check_contained(root, path)?;
    match fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(false),
        Err(e) => Err(err(
            INVALID_CWD,
            format!("cannot create {}: {e}", path.display()),
        )),
    }
}

/// Removes a workspace after checking it is inside the root.
pub fn remove(root: &Path, path: &Path) -> Result<(), WorkspaceError> {
    if !path.exists() {
        return Ok(());
    }
    check_contained(root, path)?;
    fs::remove_dir_all(path).map_err(|e| {
        err(
            INVALID_CWD,
            format!("cannot remove {}: {e}", path.display()),
        )
    })
}

/// Copies each skill directory into `<workspace>/.svc/skills/<name>/`, with a `.gitignore` of
/// `*` so the overlay is never committed. Relative sources resolve against `base`.
pub fn overlay_skills(
    workspace: &Path,
    skills: &[String],
    base: &Path,
) -> Result<(), WorkspaceError> {
    if skills.is_empty() {
        return Ok(());
    }
    let target_root = workspace.join(".svc").join("skills");
    fs::create_dir_all(&target_root)
        .map_err(|e| err(SKILL_UNSUPPORTED, format!("{}: {e}", target_root.display())))?;
    fs::write(target_root.join(".gitignore"), "*\n")
        .map_err(|e| err(SKILL_UNSUPPORTED, e.to_string()))?;
    for skill in skills {
        let source = if Path::new(skill).is_absolute() {
            PathBuf::from(skill)
        } else {
            base.join(skill)
        };
        let meta = fs::symlink_metadata(&source)
            .map_err(|e| err(SKILL_UNSUPPORTED, format!("{}: {e}", source.display())))?;
        if meta.file_type().is_symlink() {
            return Err(err(SKILL_SYMLINK, source.display().to_string()));
        }
        if !meta.is_dir() {
            return Err(err(
                SKILL_UNSUPPORTED,
                format!("{} is not a directory", source.display()),
            ));
        }
        reject_symlinks(&source)?;
        let name = source
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        let dest = target_root.join(name);
        let _ = fs::remove_dir_all(&dest);
        copy_tree(&source, &dest)
            .map_err(|e| err(SKILL_UNSUPPORTED, format!("{}: {e}", source.display())))?;
    }
    Ok(())
}

fn reject_symlinks(dir: &Path) -> Result<(), WorkspaceError> {
    let entries =
        fs::read_dir(dir).map_err(|e| err(SKILL_UNSUPPORTED, format!("{}: {e}", dir.display())))?;
    for entry in entries.flatten() {
        let ft = entry
            .file_type()
            .map_err(|e| err(SKILL_UNSUPPORTED, e.to_string()))?;
        if ft.is_symlink() {
            return Err(err(SKILL_SYMLINK, entry.path().display().to_string()));
        }
        if ft.is_dir() {
            reject_symlinks(&entry.path())?;
        }
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let dest = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &dest)?;
        } else {
            fs::copy(entry.path(), dest)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("svc-ws-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn identifiers_become_safe_directory_names() {
        assert_eq!(dir_name("ENG-12"), "ENG-12");
        assert_eq!(dir_name("a/b c:d"), "a_b_c_d");
        assert_eq!(dir_name("../x"), ".._x");
        assert_eq!(dir_name(".."), "__");
        assert_eq!(dir_name("é"), "_");
        assert_eq!(dir_name("C1:1700.12"), "C1_1700.12");
    }

    #[test]
    fn containment_rules_give_the_spec_errors() {
        let base = temp("contain");
        let root = base.join("root");
        fs::create_dir_all(&root).unwrap();
        assert!(check_contained(&root, &root.join("ENG-1")).is_ok());
        assert_eq!(check_contained(&root, &root).unwrap_err().code, ROOT_AS_CWD);
        assert_eq!(
            check_contained(&root, Path::new(" ")).unwrap_err().code,
            INVALID_CWD
        );
        assert_eq!(
            check_contained(&root, &root.join("a\nb")).unwrap_err().code,
            INVALID_CWD
        );
        assert_eq!(
            check_contained(&root, &base.join("elsewhere"))
                .unwrap_err()
                .code,
            OUTSIDE_ROOT
        );
        assert_eq!(
            check_contained(&root, &root.join("../x")).unwrap_err().code,
            OUTSIDE_ROOT
        );
        let outside = base.join("outside");
        fs::create_dir_all(&outside).unwrap();
        symlink(&outside, root.join("link")).unwrap();
        assert_eq!(
            check_contained(&root, &root.join("link")).unwrap_err().code,
            UNSAFE_SYMLINK
        );
        assert_eq!(
            check_contained(&root, &root.join("link/deeper"))
                .unwrap_err()
                .code,
            UNSAFE_SYMLINK
        );
        // A symlink that stays inside the root is fine.
        fs::create_dir_all(root.join("real")).unwrap();
        symlink(root.join("real"), root.join("inner")).unwrap();
        assert!(check_contained(&root, &root.join("inner")).is_ok());
        fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn ensure_creates_once_and_remove_deletes() {
        let base = temp("ensure");
        let root = base.join("root");
        let ws = path_for(&root, Isolation::PerAgent, "ENG/7");
        assert_eq!(ws, root.join("ENG_7"));
        assert!(ensure(&root, &ws).unwrap());
        assert!(!ensure(&root, &ws).unwrap());
        fs::write(ws.join("f"), "x").unwrap();
        remove(&root, &ws).unwrap();
        assert!(!ws.exists());
        assert_eq!(path_for(&root, Isolation::None, "X-1"), root.join("shared"));
        fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn skills_are_copied_with_a_gitignore_and_symlinks_or_files_refused() {
        let base = temp("skills");
        let ws = base.join("ws");
        fs::create_dir_all(&ws).unwrap();
        fs::create_dir_all(base.join("skills/review/sub")).unwrap();
        fs::write(base.join("skills/review/SKILL.md"), "# review").unwrap();
        fs::write(base.join("skills/review/sub/x.txt"), "x").unwrap();
        overlay_skills(&ws, &["skills/review".into()], &base).unwrap();
        assert_eq!(
            fs::read_to_string(ws.join(".svc/skills/.gitignore")).unwrap(),
            "*\n"
        );
        assert_eq!(
            fs::read_to_string(ws.join(".svc/skills/review/sub/x.txt")).unwrap(),
            "x"
        );
        fs::write(base.join("skills/file.md"), "f").unwrap();
        assert_eq!(
            overlay_skills(&ws, &["skills/file.md".into()], &base)
                .unwrap_err()
                .code,
            SKILL_UNSUPPORTED
        );
        symlink(
            base.join("skills/review/SKILL.md"),
            base.join("skills/review/link.md"),
        )
        .unwrap();
        assert_eq!(
            overlay_skills(&ws, &["skills/review".into()], &base)
                .unwrap_err()
                .code,
            SKILL_SYMLINK
        );
        symlink(base.join("skills/review"), base.join("skills/alias")).unwrap();
        assert_eq!(
            overlay_skills(&ws, &["skills/alias".into()], &base)
                .unwrap_err()
                .code,
            SKILL_SYMLINK
        );
        fs::remove_dir_all(base).unwrap();
    }
}
