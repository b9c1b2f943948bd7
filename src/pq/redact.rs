//! Connection strings written for people: [`redact`] hides every password of a PostgreSQL
//! connection string (a URI or libpq's `key=value` form), and [`secrets`] lists every form in
//! which one might be echoed, for [`scrub`] to remove from libpq's messages. Parsing is careful
//! where libpq is not (a password holding `@`, `/` or `?`), since a string libpq refuses is
//! still shown in the error that says so.

use super::is_uri;

/// `uri` with every password replaced by `***`: in the URI's userinfo (`user:pw@`), in a
/// `password=` or `sslpassword=` query parameter, or as the `password` or `sslpassword`
/// keyword of a `key=value` string. For
/// every message and log line that shows a connection string.
pub fn redact(uri: &str) -> String {
    let mut out = String::with_capacity(uri.len());
    let mut at = 0;
    for (start, end) in password_spans(uri) {
        out.push_str(&uri[at..start]);
        out.push_str("***");
        at = end;
    }
    out.push_str(&uri[at..]);
    out
}

/// The byte ranges of the password values in a connection string, in order, not overlapping.
fn password_spans(s: &str) -> Vec<(usize, usize)> {
    if let Some(scheme) = ["postgresql://", "postgres://"]
        .into_iter()
        .find(|p| s.starts_with(p))
    {
        uri_password_spans(s, scheme.len())
    } else {
        keyword_password_spans(s)
    }
}

/// Password spans of a URI whose authority starts at `start`. libpq ends the userinfo at the
/// first `@` before any `/`; this is more careful, since a password may hold unescaped `@`,
/// `/` or `?` (libpq then fails, and its message or our log must not show the rest): the
/// userinfo ends at the last `@` that is not inside a query parameter (`?a=b@c`).
fn uri_password_spans(s: &str, start: usize) -> Vec<(usize, usize)> {
    let rest = &s[start..];
    let userinfo_end = rest.rmatch_indices('@').map(|(i, _)| i).find(|&i| {
        let before = &rest[..i];
        before.find('?').is_none_or(|q| !before[q..].contains('='))
    });
    let mut spans = Vec::new();
    let mut query_from = start;
    if let Some(end) = userinfo_end {
        let userinfo = &rest[..end];
        if let Some(colon) = userinfo.find(':') {
            spans.push((start + colon + 1, start + end));
        }
        query_from = start + end + 1;
    }
    if let Some(q) = s[query_from..].find('?') {
        let mut at = query_from + q + 1;
        for pair in s[at..].split('&') {
            if let Some(eq) = pair.find('=') {
                let key = percent_decode(&pair[..eq]);
                if is_password_key(&key) {
                    spans.push((at + eq + 1, at + pair.len()));
                }
            }
            at += pair.len() + 1;
        }
    }
    spans.retain(|(a, b)| a < b);
    spans
}

/// The connection parameters whose values are secrets: the password, and the passphrase of
/// the client key (`sslpassword`).
fn is_password_key(key: &str) -> bool {
    matches!(key, "password" | "sslpassword")
}

/// Password spans of a libpq `key = value` string (values bare or single-quoted, with
/// backslash escapes). Parsing stops where the string is malformed; a password value that
/// runs off the end is redacted to the end.
fn keyword_password_spans(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    loop {
        skip_ws(&mut i);
        if i >= b.len() {
            break;
        }
        let key_start = i;
        while i < b.len() && b[i] != b'=' && !b[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &s[key_start..i];
        skip_ws(&mut i);
        if i >= b.len() || b[i] != b'=' {
            break;
        }
        i += 1;
        skip_ws(&mut i);
        let value_start = i;
        if i < b.len() && b[i] == b'\'' {
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i = (i + 1).min(b.len());
        } else {
            while i < b.len() && !b[i].is_ascii_whitespace() {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i = i.min(b.len());
        }
        if is_password_key(key) && value_start < i {
            spans.push((value_start, i));
        }
    }
    spans
}

/// `%XX` sequences decoded (lossy for invalid UTF-8; a malformed `%` is kept).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// A key/value value as libpq reads it: quotes removed, backslash escapes resolved.
fn unquote(v: &str) -> String {
    let v = v
        .strip_prefix('\'')
        .map(|v| v.strip_suffix('\'').unwrap_or(v))
        .unwrap_or(v);
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Every form in which a password of `conninfo` (or of `PGPASSWORD`) might be echoed: as
/// written, percent-decoded, unquoted.
pub(super) fn secrets(conninfo: &str) -> Vec<String> {
    let mut out = Vec::new();
    let uri = is_uri(conninfo);
    for (a, b) in password_spans(conninfo) {
        let raw = &conninfo[a..b];
        out.push(raw.to_string());
        out.push(if uri {
            percent_decode(raw)
        } else {
            unquote(raw)
        });
    }
    if let Ok(p) = std::env::var("PGPASSWORD") {
        out.push(p);
    }
    out.retain(|s| !s.is_empty());
    // Longest first, so a password containing another is removed whole.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.dedup();
    out
}

/// `message` with every secret replaced by `***`.
pub(super) fn scrub(message: &str, secrets: &[String]) -> String {
    let mut out = message.to_string();
    for s in secrets {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "***");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_the_password_of_the_userinfo() {
        assert_eq!(
            redact("postgres://svc:s3cret@db.example:5432/svc?sslmode=require"),
            "postgres://svc:***@db.example:5432/svc?sslmode=require"
        );
        assert_eq!(
            redact("postgresql://svc:p%40ss@db/svc"),
            "postgresql://svc:***@db/svc"
        );
        // Unescaped `@`, `/` and `?` in the password: all of it is hidden.
        assert_eq!(redact("postgres://u:p@s/s?x@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u:pa/ss@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u:p?w@h/db"), "postgres://u:***@h/db");
        // No password, nothing to hide.
        assert_eq!(redact("postgres://svc@db/svc"), "postgres://svc@db/svc");
        assert_eq!(redact("postgres://db/svc"), "postgres://db/svc");
        assert_eq!(
            redact("postgres://u:pw@h/db?application_name=a@b"),
            "postgres://u:***@h/db?application_name=a@b"
        );
        assert_eq!(redact("postgres://u:@h/db"), "postgres://u:@h/db");
    }

    #[test]
    fn redact_hides_a_password_query_parameter() {
        assert_eq!(
            redact("postgres://db/svc?user=svc&password=s3cret&sslmode=verify-full"),
            "postgres://db/svc?user=svc&password=***&sslmode=verify-full"
        );
        assert_eq!(
            redact("postgresql://u:one@db/svc?pass%77ord=two"),
            "postgresql://u:***@db/svc?pass%77ord=***"
        );
        assert_eq!(
            redact("postgres:///svc?host=/run/pg&password=x"),
            "postgres:///svc?host=/run/pg&password=***"
        );
    }

    #[test]
    fn redact_hides_the_client_keys_passphrase() {
        assert_eq!(
            redact("postgres://u@db/svc?sslkey=/k.pem&sslpassword=open-sesame&sslmode=verify-full"),
            "postgres://u@db/svc?sslkey=/k.pem&sslpassword=***&sslmode=verify-full"
        );
        assert_eq!(
            redact("host=db sslpassword='open sesame' user=svc"),
            "host=db sslpassword=*** user=svc"
        );
        assert!(secrets("host=db sslpassword=xyzzy").contains(&"xyzzy".to_string()));
    }

    #[test]
    fn redact_hides_a_password_keyword() {
        assert_eq!(
            redact("host=db port=5432 password=s3cret dbname=svc"),
            "host=db port=5432 password=*** dbname=svc"
        );
        assert_eq!(
            redact("host=db password = 'se cr\\'et' user=svc"),
            "host=db password = *** user=svc"
        );
        assert_eq!(redact("password=s3cret"), "password=***");
        assert_eq!(redact("password='unterminated"), "password=***");
        assert_eq!(redact("/var/lib/svc/claims.db"), "/var/lib/svc/claims.db");
        assert_eq!(redact(""), "");
    }

    #[test]
    fn secrets_cover_every_written_form() {
        let s = secrets("postgres://u:p%40ss@h/db?password=two");
        assert!(s.contains(&"p%40ss".to_string()));
        assert!(s.contains(&"p@ss".to_string()));
        assert!(s.contains(&"two".to_string()));
        let s = secrets("password='a b\\'c'");
        assert!(s.contains(&"a b'c".to_string()));
        assert_eq!(
            scrub(
                "failed for p@ss and p%40ss",
                &secrets("postgres://u:p%40ss@h")
            ),
            "failed for *** and ***"
        );
    }
}
