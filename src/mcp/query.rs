//! The read-only query language shared by every `*_query` tool: a `where` filter of predicates
//! and `and`/`or`/`not` nodes, `select`, stable `order_by`, `limit` and `offset`, run in memory
//! over JSON records. No regex, no eval, no paths: it cannot mutate anything.

use std::cmp::Ordering;

use serde_json::{Map, Value};

pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;
pub const MAX_DEPTH: usize = 12;
pub const MAX_NODES: usize = 200;

#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    Pred {
        field: String,
        op: Op,
        value: Value,
        ci: bool,
    },
    And(Vec<Filter>),
    Or(Vec<Filter>),
    Not(Box<Filter>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Lte,
    Gt,
    Gte,
    In,
    Nin,
    Contains,
    Exists,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Query {
    pub filter: Option<Filter>,
    pub select: Option<Vec<String>>,
    pub order_by: Vec<(String, bool)>,
    pub limit: usize,
    pub offset: usize,
}

fn is_scalar(v: &Value) -> bool {
    !matches!(v, Value::Array(_) | Value::Object(_))
}

struct Parser {
    nodes: usize,
}

impl Parser {
    fn filter(&mut self, v: &Value, depth: usize) -> Result<Filter, String> {
        if depth > MAX_DEPTH {
            return Err(format!(
                "where is nested too deeply (at most {MAX_DEPTH} levels)"
            ));
        }
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(format!("where has too many nodes (at most {MAX_NODES})"));
        }
        let obj = v
            .as_object()
            .ok_or("where: each filter must be an object")?;
        let combinators: Vec<&str> = ["and", "or", "not"]
            .into_iter()
            .filter(|k| obj.contains_key(*k))
            .collect();
        if !combinators.is_empty() {
            if combinators.len() > 1 || obj.len() > 1 {
                return Err(
                    "where: a combinator node holds exactly one of and, or, not and nothing else"
                        .into(),
                );
            }
            return match combinators[0] {
                "not" => Ok(Filter::Not(Box::new(self.filter(&obj["not"], depth + 1)?))),
                kind => {
                    let list = obj[kind]
                        .as_array()
                        .filter(|a| !a.is_empty())
                        .ok_or_else(|| {
                            format!("where.{kind} must be a non-empty array of filters")
                        })?;
                    let children = list
                        .iter()
                        .map(|c| self.filter(c, depth + 1))
                        .collect::<Result<Vec<_>, _>>()?;
                    Ok(if kind == "and" {
                        Filter::And(children)
                    } else {
                        Filter::Or(children)
                    })
                }
            };
        }
        for key in obj.keys() {
            if !["field", "op", "value", "ci"].contains(&key.as_str()) {
                return Err(format!(
                    "where: unknown key {key:?} (a predicate has field, op, value and optional ci)"
                ));
            }
        }
        let field = obj
            .get("field")
            .and_then(Value::as_str)
            .ok_or("where: a predicate needs a string field")?
            .to_string();
        let op_name = obj
            .get("op")
            .and_then(Value::as_str)
            .ok_or("where: a predicate needs a string op")?;
        let op = match op_name {
            "eq" => Op::Eq,
            "ne" => Op::Ne,
            "lt" => Op::Lt,
            "lte" => Op::Lte,
            "gt" => Op::Gt,
            "gte" => Op::Gte,
            "in" => Op::In,
            "nin" => Op::Nin,
            "contains" => Op::Contains,
            "exists" => Op::Exists,
            other => {
                return Err(format!(
                    "where: unknown op {other:?} (eq, ne, lt, lte, gt, gte, in, nin, contains, exists)"
                ));
            }
        };
        let value = obj
            .get("value")
            .cloned()
            .ok_or_else(|| format!("where: op {op_name} needs a value"))?;
        let ok = match op {
            Op::In | Op::Nin => value.as_array().is_some_and(|a| a.iter().all(is_scalar)),
            Op::Contains => value.is_string(),
            Op::Exists => value.is_boolean(),
            _ => is_scalar(&value),
        };
        if !ok {
            let want = match op {
                Op::In | Op::Nin => "an array of scalars",
                Op::Contains => "a string",
                Op::Exists => "a boolean",
                _ => "a scalar (string, number, boolean or null)",
            };
            return Err(format!("where: op {op_name} needs {want} as value"));
        }
        let ci = match obj.get("ci") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err("where: ci must be a boolean".into()),
        };
        Ok(Filter::Pred {
            field,
            op,
            value,
            ci,
        })
    }
}

/// Reads `where`, `select`, `order_by`, `limit` and `offset` from tool arguments.
pub fn parse(args: &Value) -> Result<Query, String> {
    let filter = match args.get("where") {
        None | Some(Value::Null) => None,
        Some(w) => Some(Parser { nodes: 0 }.filter(w, 1)?),
    };
    let select = match args.get("select") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or("select must be an array of field names")?,
        ),
        Some(_) => return Err("select must be an array of field names".into()),
    };
    let mut order_by = Vec::new();
    match args.get("order_by") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for o in a {
                let field = o
                    .get("field")
                    .and_then(Value::as_str)
                    .ok_or("order_by entries need a string field")?;
                let desc = match o
                    .get("dir")
                    .and_then(|d| if d.is_null() { None } else { Some(d) })
                {
                    None => false,
                    Some(Value::String(d)) if d == "asc" => false,
                    Some(Value::String(d)) if d == "desc" => true,
                    Some(_) => return Err("order_by dir must be asc or desc".into()),
                };
                order_by.push((field.to_string(), desc));
            }
        }
        Some(_) => return Err("order_by must be an array of {field, dir}".into()),
    }
    let limit = match args.get("limit") {
        None | Some(Value::Null) => DEFAULT_LIMIT,
        Some(v) => match v.as_i64() {
            Some(n) if n > 0 => (n as usize).min(MAX_LIMIT),
            _ => return Err("limit must be a positive integer".into()),
        },
    };
    let offset = match args.get("offset") {
        None | Some(Value::Null) => 0,
        Some(v) => match v.as_i64() {
            Some(n) if n >= 0 => n as usize,
            _ => return Err("offset must be a non-negative integer".into()),
        },
    };
    Ok(Query {
        filter,
        select,
        order_by,
        limit,
        offset,
    })
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// Strict equality: same type and value (numbers compare numerically).
fn strict_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => num(a) == num(b) || x == y,
        _ => a == b,
    }
}

/// Order of two values of the same kind (number-number or string-string), else `None`.
fn ordered(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Number(_), Value::Number(_)) => num(a)?.partial_cmp(&num(b)?),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

fn contains(haystack: &Value, needle: &str, ci: bool) -> bool {
    let matches = |s: &str| {
        if ci {
            s.to_lowercase().contains(&needle.to_lowercase())
        } else {
            s.contains(needle)
        }
    };
    match haystack {
        Value::String(s) => matches(s),
        Value::Array(items) => items.iter().any(|i| i.as_str().is_some_and(matches)),
        _ => false,
    }
}

pub fn matches(filter: &Filter, record: &Map<String, Value>) -> bool {
    match filter {
        Filter::And(list) => list.iter().all(|f| matches(f, record)),
        Filter::Or(list) => list.iter().any(|f| matches(f, record)),
        Filter::Not(f) => !matches(f, record),
        Filter::Pred {
            field,
            op,
            value,
            ci,
        } => {
            let Some(actual) = record.get(field) else {
                // Absent: only `exists: false` matches.
                return *op == Op::Exists && value == &Value::Bool(false);
            };
            match op {
                Op::Exists => value == &Value::Bool(true),
                Op::Eq => strict_eq(actual, value),
                Op::Ne => !strict_eq(actual, value),
                Op::Lt => ordered(actual, value) == Some(Ordering::Less),
                Op::Lte => matches!(
                    ordered(actual, value),
                    Some(Ordering::Less | Ordering::Equal)
                ),
                Op::Gt => ordered(actual, value) == Some(Ordering::Greater),
                Op::Gte => matches!(
                    ordered(actual, value),
                    Some(Ordering::Greater | Ordering::Equal)
                ),
                Op::In => value
                    .as_array()
                    .is_some_and(|a| a.iter().any(|v| strict_eq(actual, v))),
                Op::Nin => value
                    .as_array()
                    .is_some_and(|a| !a.iter().any(|v| strict_eq(actual, v))),
                Op::Contains => value.as_str().is_some_and(|n| contains(actual, n, *ci)),
            }
        }
    }
}

fn kind_rank(v: &Value) -> u8 {
    match v {
        Value::Number(_) => 0,
        Value::String(_) => 1,
        Value::Bool(_) => 2,
        _ => 3,
    }
}

/// Sort key comparison, a total order: numbers, then strings, then booleans, then the rest;
/// absent and null sort last.
fn compare_field(a: Option<&Value>, b: Option<&Value>) -> Ordering {
    fn present(v: Option<&Value>) -> Option<&Value> {
        v.filter(|v| !v.is_null())
    }
    match (present(a), present(b)) {
        (Some(x), Some(y)) => kind_rank(x).cmp(&kind_rank(y)).then_with(|| match (x, y) {
            (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
            _ => ordered(x, y).unwrap_or(Ordering::Equal),
        }),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

/// Filters, sorts, counts, pages and projects `records`. Returns (rows, total before paging).
pub fn run(
    records: Vec<Map<String, Value>>,
    q: &Query,
    default_select: &[&str],
) -> (Vec<Value>, usize) {
    let mut rows: Vec<Map<String, Value>> = match &q.filter {
        Some(f) => records.into_iter().filter(|r| matches(f, r)).collect(),
        None => records,
    };
    if !q.order_by.is_empty() {
        rows.sort_by(|a, b| {
            for (field, desc) in &q.order_by {
                let mut o = compare_field(a.get(field), b.get(field));
                if *desc {
                    // Absent values stay last either way.
                    let present =
                        |r: &Map<String, Value>| r.get(field).is_some_and(|v| !v.is_null());
                    if present(a) && present(b) {
                        o = o.reverse();
                    }
                }
                if o != Ordering::Equal {
                    return o;
                }
            }
            Ordering::Equal
        });
    }
    let total = rows.len();
    let fields: Vec<String> = q
        .select
        .clone()
        .unwrap_or_else(|| default_select.iter().map(|s| s.to_string()).collect());
    let page = rows
        .into_iter()
        .skip(q.offset)
        .take(q.limit)
        .map(|r| {
            let mut out = Map::new();
            for f in &fields {
                if let Some(v) = r.get(f) {
                    out.insert(f.clone(), v.clone());
                }
            }
            Value::Object(out)
        })
        .collect();
    (page, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn records() -> Vec<Map<String, Value>> {
        [
            json!({"id": "B-1", "title": "Login bug", "state": "Todo", "priority": 2, "labels": ["bug", "UI"], "done": false}),
            json!({"id": "B-2", "title": "Docs", "state": "Done", "priority": 1, "labels": [], "done": true}),
            json!({"id": "B-3", "title": "login page", "state": "Todo", "labels": ["feature"], "estimate": null}),
            json!({"id": "B-4", "title": "Perf", "state": "In Progress", "priority": "high", "labels": ["bug"]}),
        ]
        .into_iter()
        .map(|v| v.as_object().unwrap().clone())
        .collect()
    }

    fn ids(args: Value) -> Vec<String> {
        let q = parse(&args).unwrap();
        let (rows, _) = run(records(), &q, &["id"]);
        rows.iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn every_op() {
        let rows: &[(Value, &[&str])] = &[
            (
                json!({"field": "state", "op": "eq", "value": "Todo"}),
                &["B-1", "B-3"],
            ),
            (
                json!({"field": "state", "op": "ne", "value": "Todo"}),
                &["B-2", "B-4"],
            ),
            (
                json!({"field": "priority", "op": "eq", "value": 2.0}),
                &["B-1"],
            ),
            (json!({"field": "priority", "op": "eq", "value": "2"}), &[]),
            (
                json!({"field": "priority", "op": "lt", "value": 2}),
                &["B-2"],
            ),
            (
                json!({"field": "priority", "op": "lte", "value": 2}),
                &["B-1", "B-2"],
            ),
            (
                json!({"field": "priority", "op": "gt", "value": 1}),
                &["B-1"],
            ),
            (
                json!({"field": "priority", "op": "gte", "value": "a"}),
                &["B-4"],
            ),
            (
                json!({"field": "state", "op": "in", "value": ["Done", "In Progress"]}),
                &["B-2", "B-4"],
            ),
            (
                json!({"field": "state", "op": "nin", "value": ["Done", "In Progress"]}),
                &["B-1", "B-3"],
            ),
            (
                json!({"field": "title", "op": "contains", "value": "login"}),
                &["B-3"],
            ),
            (
                json!({"field": "title", "op": "contains", "value": "login", "ci": true}),
                &["B-1", "B-3"],
            ),
            (
                json!({"field": "labels", "op": "contains", "value": "ui", "ci": true}),
                &["B-1"],
            ),
            (
                json!({"field": "labels", "op": "contains", "value": "bug"}),
                &["B-1", "B-4"],
            ),
            (
                json!({"field": "priority", "op": "exists", "value": true}),
                &["B-1", "B-2", "B-4"],
            ),
            (
                json!({"field": "priority", "op": "exists", "value": false}),
                &["B-3"],
            ),
            (
                json!({"field": "estimate", "op": "exists", "value": true}),
                &["B-3"],
            ),
            (
                json!({"field": "estimate", "op": "eq", "value": null}),
                &["B-3"],
            ),
            (
                json!({"field": "done", "op": "eq", "value": false}),
                &["B-1"],
            ),
            // An absent field fails every predicate but exists:false, ne and nin included.
            (
                json!({"field": "priority", "op": "ne", "value": 5}),
                &["B-1", "B-2", "B-4"],
            ),
            (
                json!({"field": "priority", "op": "nin", "value": [5]}),
                &["B-1", "B-2", "B-4"],
            ),
            (json!({"field": "nope", "op": "ne", "value": 1}), &[]),
            (
                json!({"and": [{"field": "state", "op": "eq", "value": "Todo"}, {"field": "labels", "op": "contains", "value": "bug"}]}),
                &["B-1"],
            ),
            (
                json!({"or": [{"field": "id", "op": "eq", "value": "B-2"}, {"field": "id", "op": "eq", "value": "B-4"}]}),
                &["B-2", "B-4"],
            ),
            (
                json!({"not": {"field": "state", "op": "eq", "value": "Todo"}}),
                &["B-2", "B-4"],
            ),
        ];
        for (filter, expected) in rows {
            assert_eq!(ids(json!({"where": filter})), *expected, "{filter}");
        }
    }

    #[test]
    fn select_order_limit_offset_and_total() {
        let q = parse(&json!({"order_by": [{"field": "priority", "dir": "desc"}, {"field": "id"}], "limit": 2, "offset": 1, "select": ["id", "priority", "missing"]})).unwrap();
        let (rows, total) = run(records(), &q, &["id"]);
        assert_eq!(total, 4);
        // Descending: "high" (strings rank after numbers), 2, 1, then the absent one.
        assert_eq!(
            rows,
            vec![
                json!({"id": "B-1", "priority": 2}),
                json!({"id": "B-2", "priority": 1})
            ]
        );
        let q =
            parse(&json!({"where": {"field": "state", "op": "eq", "value": "Todo"}, "limit": 1}))
                .unwrap();
        let (rows, total) = run(records(), &q, &["id", "title"]);
        assert_eq!(
            (rows, total),
            (vec![json!({"id": "B-1", "title": "Login bug"})], 2)
        );
        assert_eq!(
            ids(json!({"order_by": [{"field": "title"}]})),
            ["B-2", "B-1", "B-4", "B-3"]
        );
    }

    #[test]
    fn limits_clamp_and_bad_arguments_are_clear_errors() {
        assert_eq!(parse(&json!({})).unwrap().limit, 100);
        assert_eq!(parse(&json!({"limit": 5000})).unwrap().limit, 1000);
        let errors: &[(Value, &str)] = &[
            (json!({"limit": 0}), "limit must be a positive integer"),
            (json!({"limit": "5"}), "limit must be a positive integer"),
            (
                json!({"offset": -1}),
                "offset must be a non-negative integer",
            ),
            (json!({"select": "id"}), "select must be an array"),
            (
                json!({"order_by": [{"field": "id", "dir": "up"}]}),
                "order_by dir must be asc or desc",
            ),
            (
                json!({"where": {"field": "x", "op": "like", "value": "a"}}),
                "unknown op",
            ),
            (
                json!({"where": {"field": "x", "op": "in", "value": "a"}}),
                "needs an array of scalars",
            ),
            (
                json!({"where": {"field": "x", "op": "eq", "value": [1]}}),
                "needs a scalar",
            ),
            (
                json!({"where": {"field": "x", "op": "contains", "value": 1}}),
                "needs a string",
            ),
            (
                json!({"where": {"field": "x", "op": "exists", "value": "yes"}}),
                "needs a boolean",
            ),
            (
                json!({"where": {"and": []}}),
                "where.and must be a non-empty array",
            ),
            (
                json!({"where": {"and": [{"field": "x", "op": "exists", "value": true}], "or": []}}),
                "exactly one of and, or, not",
            ),
            (
                json!({"where": {"field": "x", "op": "eq"}}),
                "needs a value",
            ),
        ];
        for (args, expected) in errors {
            let err = parse(args).unwrap_err();
            assert!(err.contains(expected), "{args}: {err}");
        }
    }

    #[test]
    fn depth_and_node_limits() {
        let mut f = json!({"field": "id", "op": "exists", "value": true});
        for _ in 0..11 {
            f = json!({"not": f});
        }
        assert!(
            parse(&json!({"where": f.clone()})).is_ok(),
            "12 levels are allowed"
        );
        let deeper = json!({"not": f});
        assert!(
            parse(&json!({"where": deeper}))
                .unwrap_err()
                .contains("nested too deeply")
        );
        let many: Vec<Value> = (0..199)
            .map(|_| json!({"field": "id", "op": "exists", "value": true}))
            .collect();
        assert!(
            parse(&json!({"where": {"or": many}})).is_ok(),
            "200 nodes are allowed"
        );
        let too_many: Vec<Value> = (0..200)
            .map(|_| json!({"field": "id", "op": "exists", "value": true}))
            .collect();
        assert!(
            parse(&json!({"where": {"or": too_many}}))
                .unwrap_err()
                .contains("too many nodes")
        );
    }
}
