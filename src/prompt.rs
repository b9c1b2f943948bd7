//! The prompt template: the Markdown body of `WORKFLOW.md`, rendered as strict Liquid with the
//! issue record and the attempt number. An unknown variable or filter is an error naming it.

use std::fmt;

use crate::tracker::Issue;

/// A parsed template, ready to render for any issue.
pub struct Template {
    inner: liquid::Template,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError(String);

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TemplateError {}

fn describe(err: liquid::Error) -> TemplateError {
    // Liquid's messages span lines ("liquid: Unknown variable\n  with:\n    requested=..."); keep
    // them on one line so log lines and doctor output stay readable.
    let text = err.to_string();
    let one_line: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "with:" && *l != "from: {{%")
        .collect();
    TemplateError(
        one_line
            .join("; ")
            .trim_start_matches("liquid: ")
            .to_string(),
    )
}

impl Template {
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let parser = liquid::ParserBuilder::with_stdlib()
            .build()
            .map_err(describe)?;
        parser
            .parse(text)
            .map(|inner| Template { inner })
            .map_err(describe)
    }

    /// Renders for `issue`; `attempt` is `None` on the first run.
    pub fn render(&self, issue: &Issue, attempt: Option<u32>) -> Result<String, TemplateError> {
        let issue_value = serde_json::to_value(issue).map_err(|e| TemplateError(e.to_string()))?;
        let globals = liquid::object!({
            "issue": issue_value,
            "attempt": attempt,
        });
        self.inner.render(&globals).map_err(describe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issue() -> Issue {
        Issue {
            id: "id-1".into(),
            identifier: "ENG-1".into(),
            title: "Fix login".into(),
            description: Some("Steps".into()),
            state: "Todo".into(),
            state_type: Some("unstarted".into()),
            labels: vec!["bug".into(), "Svc:Backend".into()],
            url: Some("https://example.test/ENG-1".into()),
            created_at: Some("2026-11-01T00:00:00Z".into()),
            updated_at: None,
            priority: Some(2),
        }
    }

    #[test]
    fn renders_issue_fields_and_attempt() {
        let t = Template::parse(
            "{{ issue.identifier }}: {{ issue.title }} [{{ issue.state }}/{{ issue.stateType }}] {{ issue.labels | join: ',' }}{% if attempt %} retry {{ attempt }}{% endif %}",
        )
        .unwrap();
        assert_eq!(
            t.render(&issue(), None).unwrap(),
            "ENG-1: Fix login [Todo/unstarted] bug,Svc:Backend"
        );
        assert_eq!(
            t.render(&issue(), Some(2)).unwrap(),
            "ENG-1: Fix login [Todo/unstarted] bug,Svc:Backend retry 2"
        );
    }

    #[test]
    fn unknown_variable_is_an_error_naming_it() {
        let t = Template::parse("{{ issue.nope }}").unwrap();
        let err = t.render(&issue(), None).unwrap_err();
        assert!(err.0.contains("nope"), "{err}");
        let t = Template::parse("{{ ticket.title }}").unwrap();
        assert!(t.render(&issue(), None).unwrap_err().0.contains("ticket"));
    }

    #[test]
    fn unknown_filter_is_a_parse_error_naming_it() {
        let err = Template::parse("{{ issue.title | shout }}").err().unwrap();
        assert!(err.0.contains("shout"), "{err}");
    }

    #[test]
    fn unset_optional_fields_render_empty() {
        let t = Template::parse("[{{ issue.updatedAt }}]").unwrap();
        assert_eq!(t.render(&issue(), None).unwrap(), "[]");
    }
}
