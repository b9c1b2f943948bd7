//! Bearer tokens for `/mcp`: random base64url tokens in a process-local map, each bound to the
//! settings scope `mcp:<sha256(identity)>` (server host, port, tracker config, tool options).
//! Any change of those settings rotates the scope, and every older token stops working. The map
//! is keyed by the SHA-256 of the token, so lookups reveal nothing about stored tokens.

use std::collections::HashMap;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::config::Settings;
use crate::random::random_token;

/// The scope of the settings-scoped token (Token A).
pub fn scope(settings: &Settings) -> String {
    let mut h = Sha256::new();
    h.update(settings.server.host.as_bytes());
    h.update(b"\n");
    h.update(settings.server.port.to_string().as_bytes());
    h.update(b"\n");
    h.update(settings.identity.as_bytes());
    let digest = h.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("mcp:{hex}")
}

/// Constant-time equality of two byte strings (length is not secret).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn key(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Tokens minted by this process. Never persisted or shared.
#[derive(Default)]
pub struct Tokens {
    /// By the token's hash: the workflow it was minted for, and its scope.
    map: Mutex<HashMap<[u8; 32], (String, String)>>,
}

impl Tokens {
    /// Mints a token for `scope` of workflow `workflow`, forgetting that workflow's tokens of
    /// other (rotated) scopes; other workflows' tokens stay.
    pub fn mint(&self, workflow: &str, scope: &str) -> String {
        let token = random_token();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, (w, s)| w != workflow || s == scope);
        map.insert(key(&token), (workflow.to_string(), scope.to_string()));
        token
    }

    /// Whether `token` was minted for `scope`.
    pub fn check(&self, token: &str, scope: &str) -> bool {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&key(token))
            .is_some_and(|(_, s)| constant_time_eq(s.as_bytes(), scope.as_bytes()))
    }
}

/// The token of an `Authorization: Bearer <token>` header value.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let h = header?.trim();
    let (scheme, token) = h.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_valid_only_for_their_scope_and_rotate() {
        let t = Tokens::default();
        let a = t.mint("W.md", "mcp:one");
        assert_eq!(a.len(), 43);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        );
        assert!(t.check(&a, "mcp:one"));
        assert!(!t.check(&a, "mcp:two"));
        assert!(!t.check("forged", "mcp:one"));
        let other = t.mint("other/W.md", "mcp:three");
        let b = t.mint("W.md", "mcp:two");
        assert!(t.check(&b, "mcp:two"));
        assert!(
            !t.check(&a, "mcp:one"),
            "minting for a new scope forgets the workflow's old tokens"
        );
        assert!(
            t.check(&other, "mcp:three"),
            "another workflow's tokens stay"
        );
    }

    #[test]
    fn scope_changes_with_port_and_tracker_config() {
        use crate::orchestrator::testutil::settings;
        let mut s = settings("tracker:\n  kind: memory");
        let first = scope(&s);
        assert!(first.starts_with("mcp:") && first.len() == 4 + 64);
        s.server.port = 9999;
        assert_ne!(scope(&s), first);
        let other = settings("tracker:\n  kind: memory\n  active_states: [Ready]");
        assert_ne!(scope(&other), first);
        let same = settings("tracker:\n  kind: memory\npolling:\n  interval_ms: 5");
        assert_eq!(scope(&same), first, "unrelated settings keep the scope");
    }

    #[test]
    fn bearer_headers_and_constant_time_compare() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
