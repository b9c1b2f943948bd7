#!/usr/bin/env python3
"""A fake GitHub API (REST v3 + GraphQL) for the tests of svc's `github` tracker.

It answers like api.github.com for the part of the API svc uses (shapes, status codes,
headers), keeps everything in memory behind one lock, and accounts every request against
GitHub-style rate-limit budgets, so a test can check behaviour and API economy alike.
Standard library only.

Usage: python3 tests/fake_github.py [--port N] [--ignore-stdin]
  Binds 127.0.0.1 (port 0, the default: a free port), prints `PORT <n>` on stdout and serves
  until killed or until its stdin reaches EOF (--ignore-stdin: keep serving). Nothing is
  logged per request unless FAKE_GITHUB_VERBOSE is set. REST routes also answer under
  /api/v3 (Enterprise Server style); GraphQL is POST /graphql or /api/graphql.

Auth: `Authorization: Bearer <token>` (or `token <token>`). `ghp_svc_token` is user svc-bot
with scopes "repo, project, read:org"; an unknown token gets 401 Bad credentials. Classic
tokens get x-oauth-scopes on every answer; GraphQL project fields need the project (or
read:project) scope as on GitHub, else INSUFFICIENT_SCOPES.

Rate limits: each user has a core (REST) and a graphql budget of 5000 that resets an hour
after it starts (svc-bot's at start). Every REST answer carries x-ratelimit-* and costs 1,
except 304s (every REST GET has ETag W/"<sha256 of the body>"; a matching If-None-Match
gets a bodiless 304) and GET /rate_limit. GraphQL costs GitHub's documented points: the sum
over connections (fields with first:/last:; nodes(ids:) is one of len(ids)) of the product
of the sizes of the enclosing connections, /100, rounded, at least 1; a mutation costs 1.
An empty budget answers like GitHub's primary rate limit.

REST: GET /user, /rate_limit, /repos/{o}/{r}; GET|POST /repos/{o}/{r}/issues (state,
labels, assignee, creator, sort, direction, since, per_page, page; PRs included; Link
header); GET|PATCH .../issues/{n}; GET|POST .../issues/{n}/comments; GET
.../issues/comments, .../issues/{n}/dependencies/blocked_by, .../pulls, .../pulls/{n},
.../pulls/{n}/reviews, .../pulls/{n}/comments, .../pulls/comments,
.../commits/{ref}/check-runs, .../commits/{ref}/status, .../hooks (the repository's webhooks;
a fine-grained token needs the repository_hooks permission, "Webhooks" in GitHub's settings).
GraphQL operations, by name: SvcProjectItems, SvcIssueNodes, SvcLinkedPulls, SvcSetStatus,
SvcAddItem, SvcViewer (any other: "fake: unsupported operation").

Admin API (JSON in and out, no auth, no rate limit, never in the write log):
  POST /_fake/users {token?, login, type: User|Bot, scopes: "repo"|null (null: fine-grained,
       no x-oauth-scopes; absent: "repo"), name?, association?, push?: true,
       permissions?: {issues|pull_requests|checks|statuses|metadata|repository_hooks:
       "read"|"write"}}
       (permissions: a fine-grained token's; absent: every permission. A request the token
       lacks the permission for gets GitHub's 403 "Resource not accessible by personal access
       token" with x-accepted-github-permissions; in GraphQL, a FORBIDDEN error and null for
       closedByPullRequestsReferences without pull_requests. POSTing a known token again
       replaces its scopes and permissions.)
  POST /_fake/repos {full_name, private?}
  POST /_fake/issues {repo, title, body, labels, assignees, state, state_reason, user,
       blocked_by: [{repo?, number}], association?} -> REST issue
  POST /_fake/issues/update {repo, number, <PATCH fields>} (a person's edit) -> REST issue
  POST /_fake/comments {repo, issue, user, body, association?, count?} -> REST comment
       (count: that many, "<body> <i>" each; the last is answered)
  POST|DELETE /_fake/dependencies {repo, number, blocked_by: {repo?, number}}
  POST /_fake/pulls {repo, title, body, user, head_sha?, head_ref?, base_ref?,
       closes: [n | {repo, number}], state, draft, merged?} -> REST pull request
  POST /_fake/reviews {repo, pull, user, state, body, commit_id?} -> review
  POST /_fake/review-comments {repo, pull, user, body, path, line, review?} -> comment
  POST /_fake/check-runs {repo, sha, name, status, conclusion, output, details_url?}
       (the same sha + name replaces that run)
  POST /_fake/statuses {repo, sha, context, state, description, target_url}
  POST /_fake/hooks {repo, url, events?, active?} -> the hook, as GET .../hooks lists it
  POST /_fake/project {owner, number, title, field, options} -> {id, field: {id, options}}
  POST /_fake/project/items {owner, number, repo, issue|pull|draft: "title", status,
       archived?, count?} (count: that many draft items "<draft> <i>")
  POST /_fake/project/status {owner, number, repo, issue|pull, status} (a person's move)
  GET  /_fake/issue/{o}/{r}/{n} -> {issue, comments, project_status, project_statuses,
       blocked_by}
  GET  /_fake/log, POST /_fake/log/reset: svc's writes in order: "CREATE acme/app#7 by
       svc-bot", "PATCH acme/app#3 state=closed state_reason=completed by svc-bot",
       'PATCH acme/app#3 labels=["a","b"] by ...', "COMMENT acme/app#3 <80 chars> by ...",
       "STATUS acme/app#3 In Progress by ...", "ADDITEM acme/app#7 by ..."
  GET  /_fake/stats -> {rest: {requests, not_modified, counted}, graphql: {requests,
       points, operations}, limited, limited_by_kind, routes: {"GET /repos/{owner}/{repo}/
       issues": n, ...}, budgets: {login: {core|graphql: {limit, used, remaining, reset}}}}
  POST /_fake/stats/reset (zeroes the counters; budgets go on)
  POST /_fake/limit {kind: secondary|primary|abuse429, count, seconds}: the next `count`
       authenticated API requests get that refusal (count 0 clears it)
  POST /_fake/budget {login?, resource: core|graphql, remaining?, reset_in?}
  POST /_fake/link-base {base}: the API's answers name URLs (the Link header's pages among
       them) on `base` instead of the host asked, as behind a proxy that rewrites them (null:
       the host asked again)
People named in admin calls are created on the fly (type Bot when the login ends in
"[bot]", author_association NONE unless given); token users are COLLABORATORs and the
repository owner is the OWNER. Object ids start above 2**31, as GitHub's do today.
"""

import argparse
import base64
import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

HOST = "127.0.0.1"  # never anything else
VERBOSE = bool(os.environ.get("FAKE_GITHUB_VERBOSE"))
LIMIT = 5000
DOCS = "https://docs.github.com/rest"
SECONDARY = {"message": "You have exceeded a secondary rate limit. Please wait a few minutes "
                        "before you try again.",
             "documentation_url": "https://docs.github.com/free-pro-team@latest/rest/overview/"
                                  "rate-limits-for-the-rest-api#about-secondary-rate-limits"}
PRIMARY_DOC = ("https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"
               "#about-the-primary-rate-limit")
REASONS = ("completed", "not_planned", "duplicate")
JSON_CT = ("content-type", "application/json; charset=utf-8")


def iso(ts):
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def dumps(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


class Fail(Exception):
    """An error answer in GitHub's shape: {message, errors?, documentation_url, status}."""

    def __init__(self, status, message, errors=None, doc=DOCS):
        super().__init__(message)
        self.status, self.body = status, {"message": message}
        if errors:
            self.body["errors"] = errors
        self.body.update(documentation_url=doc, status=str(status))


def invalid(resource, field, code="invalid"):
    return Fail(422, "Validation Failed", [{"resource": resource, "code": code, "field": field}])


# ---------------------------------------------------------------- GraphQL: parse and cost

class GQLError(Exception):
    pass


class Var(str):
    """A `$name` reference inside parsed arguments, resolved against the variables."""


_TOK = re.compile(r'"""[\s\S]*?"""|"(?:\\.|[^"\\])*"|\.\.\.|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?'
                  r'|[_A-Za-z]\w*|[!$():=@\[\]{}|&]|[\s,]+|#[^\n]*|.')


class Parser:
    """Enough of the GraphQL grammar to see operations, fields, arguments and nesting.

    A selection is a list of {"name", "args", "sel"} (name None: an inline fragment) or
    {"spread": name}; variables stay Var until resolve()."""

    def __init__(self, text):
        self.t = [x for x in _TOK.findall(text) if x.strip(" \t\r\n,\ufeff") and x[0] != "#"]
        self.i = 0

    def peek(self):
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, want=None, name=False):
        tok = self.peek()
        if tok is None or (want and tok != want) or (name and not re.match(r"[_A-Za-z]", tok)):
            raise GQLError(f'Parse error on "{tok or "end of query"}" '
                           f'(expected {want or ("a name" if name else "more")})')
        self.i += 1
        return tok

    def document(self):
        ops, frags = [], {}
        while self.peek() is not None:
            kind = "query" if self.peek() == "{" else self.take()
            if kind == "fragment":
                name = self.take(name=True)
                self.take("on"), self.take(name=True), self.directives()
                frags[name] = self.selection()
            elif kind in ("query", "mutation", "subscription"):
                name = self.take(name=True) if self.peek() not in ("(", "{", "@") else None
                defaults = self.var_defs() if self.peek() == "(" else {}
                self.directives()
                ops.append({"type": kind, "name": name, "defaults": defaults,
                            "sel": self.selection()})
            else:
                raise GQLError(f'Parse error on "{kind}"')
        if not ops:
            raise GQLError("No operations in the document")
        return ops, frags

    def var_defs(self):
        out = {}
        self.take("(")
        while self.peek() != ")":
            self.take("$")
            var = self.take(name=True)
            self.take(":")
            while self.peek() not in ("$", ")", "=", "@", None):  # the type: [Name!]!
                self.take()
            if self.peek() == "=":
                self.take()
                out[var] = self.value()
            self.directives()
        self.take(")")
        return out

    def directives(self):
        while self.peek() == "@":
            self.take(), self.take(name=True)
            if self.peek() == "(":
                self.arguments()

    def arguments(self):
        args = {}
        self.take("(")
        while self.peek() != ")":
            key = self.take(name=True)
            self.take(":")
            args[key] = self.value()
        self.take(")")
        return args

    def value(self):
        tok = self.take()
        if tok == "$":
            return Var(self.take(name=True))
        if tok == "[":
            out = []
            while self.peek() != "]":
                out.append(self.value())
            self.take("]")
            return out
        if tok == "{":
            out = {}
            while self.peek() != "}":
                key = self.take(name=True)
                self.take(":")
                out[key] = self.value()
            self.take("}")
            return out
        if tok.startswith('"""'):
            return tok[3:-3]
        if tok.startswith('"'):
            return json.loads(tok)
        if re.match(r"-?\d", tok):
            return float(tok) if re.search(r"[.eE]", tok) else int(tok)
        return {"true": True, "false": False, "null": None}.get(tok, tok)

    def selection(self):
        sel = []
        self.take("{")
        while self.peek() != "}":
            if self.peek() == "...":
                self.take()
                if self.peek() in ("on", "{", "@"):
                    if self.peek() == "on":
                        self.take(), self.take(name=True)
                    self.directives()
                    sel.append({"name": None, "args": {}, "sel": self.selection()})
                else:
                    sel.append({"spread": self.take(name=True)})
                    self.directives()
                continue
            name = self.take(name=True)
            if self.peek() == ":":  # an alias
                self.take()
                name = self.take(name=True)
            args = self.arguments() if self.peek() == "(" else {}
            self.directives()
            sel.append({"name": name, "args": args,
                        "sel": self.selection() if self.peek() == "{" else []})
        self.take("}")
        return sel


def resolve(v, variables):
    if isinstance(v, Var):
        return variables.get(v)
    if isinstance(v, list):
        return [resolve(x, variables) for x in v]
    if isinstance(v, dict):
        return {k: resolve(x, variables) for k, x in v.items()}
    return v


def fields(sel, frags, seen=()):
    """The fields of a selection with inline fragments and fragment spreads flattened."""
    for s in sel:
        if "spread" in s:
            if s["spread"] in frags and s["spread"] not in seen:
                yield from fields(frags[s["spread"]], frags, seen + (s["spread"],))
        elif s["name"] is None:
            yield from fields(s["sel"], frags, seen)
        else:
            yield s


def find_field(sel, frags, name):
    for f in fields(sel, frags):
        hit = f if f["name"] == name else find_field(f["sel"], frags, name)
        if hit:
            return hit
    return None


def query_cost(sel, frags, variables):
    """(points, requests, nodeCount) by GitHub's documented calculation."""
    total = [0, 0]

    def walk(sel, parents):
        for f in fields(sel, frags):
            a, size = f["args"], None
            if "first" in a or "last" in a:
                size = resolve(a["first"] if "first" in a else a["last"], variables)
            elif f["name"] == "nodes" and "ids" in a:
                ids = resolve(a["ids"], variables)
                size = len(ids) if isinstance(ids, list) else 1
            if size is None:
                walk(f["sel"], parents)
                continue
            size = max(0, int(size)) if isinstance(size, (int, float)) else 0
            total[0] += parents
            total[1] += parents * size
            walk(f["sel"], parents * size)

    walk(sel, 1)
    return max(1, int(total[0] / 100 + 0.5)), total[0], total[1]


# ---------------------------------------------------------------- the model

class Model:
    """Everything GitHub knows, in plain dicts; every method runs under `lock`."""

    def __init__(self):
        self.lock = threading.RLock()
        self.next_id, self.next_uid, self.req_no = 3_000_000_000, 5_000_000, 0
        self.users, self.tokens, self.repos, self.nodes = {}, {}, {}, {}
        self.projects, self.items, self.blocking = {}, {}, {}
        self.log, self.budgets, self.limit = [], {}, None
        self.link_base = None  # where the API's own URLs (Link headers among them) point
        self.reset_stats()
        self.add_user("svc-bot", token="ghp_svc_token", scopes="repo, project, read:org", uid=1,
                      name="svc bot")
        for res in ("core", "graphql"):
            self.budget("svc-bot", res)  # svc-bot's budgets reset an hour after start

    def reset_stats(self):
        self.stats = {"rest": {"requests": 0, "not_modified": 0, "counted": 0},
                      "graphql": {"requests": 0, "points": 0, "operations": {}},
                      "limited": 0, "limited_by_kind": {}, "routes": {}}

    def new_id(self):
        self.next_id += 1
        return self.next_id

    def add_user(self, login, typ="User", token=None, scopes="repo", uid=None, name=None,
                 association=None, push=True, permissions=None):
        if uid is None:
            self.next_uid += 1
            uid = self.next_uid
        prefix = {"Bot": "BOT_kgDO", "Organization": "O_kgDO"}.get(typ, "U_kgDO")
        u = self.users.get(login.lower()) or {"id": uid, "node_id": f"{prefix}{uid:08x}"}
        u.update(login=login, type=typ, name=name,
                 association=association or ("COLLABORATOR" if token else "NONE"))
        self.users[login.lower()] = u
        if token:
            self.tokens[token] = {"login": login, "scopes": scopes, "push": push,
                                  "permissions": permissions}
        return u

    def user(self, login):
        return self.users.get(login.lower()) or \
            self.add_user(login, "Bot" if login.endswith("[bot]") else "User")

    def user_json(self, login):
        u = self.user(login)
        return {"login": u["login"], "id": u["id"], "node_id": u["node_id"], "type": u["type"],
                "site_admin": False, "html_url": f"https://github.com/{u['login']}"}

    def budget(self, login, res):
        per = self.budgets.setdefault(login, {})
        if res not in per or time.time() >= per[res]["reset"]:
            per[res] = {"limit": LIMIT, "used": 0, "reset": int(time.time()) + 3600}
        return per[res]

    def take_limit(self):
        lim = self.limit
        if not lim or lim["count"] <= 0:
            return None, 0
        lim["count"] -= 1
        self.stats["limited"] += 1
        by = self.stats["limited_by_kind"]
        by[lim["kind"]] = by.get(lim["kind"], 0) + 1
        return lim["kind"], lim["seconds"]

    def write(self, who, text):
        self.log.append(f"{text} by {who['login']}")

    # repositories and issues (an issue dict with "pr" set is a pull request)
    def add_repo(self, full_name, private=False):
        owner, _, name = full_name.partition("/")
        if not owner or not name or "/" in name:
            raise Fail(400, "full_name must be owner/name")
        if full_name.lower() in self.repos:
            return self.repos[full_name.lower()], False
        if owner.lower() not in self.users:
            self.add_user(owner, "Organization")
        rid = self.new_id()
        r = self.repos[full_name.lower()] = {
            "id": rid, "node_id": f"R_kgDO{rid:08x}", "full_name": full_name, "owner": owner,
            "name": name, "private": private, "issues": {}, "labels": {}, "comments": [],
            "reviews": [], "review_comments": [], "check_runs": [], "statuses": [], "hooks": [], "next": 1}
        return r, True

    def repo(self, full_name):
        r = self.repos.get(str(full_name).lower())
        if r is None:
            raise Fail(404, "Not Found")
        return r

    def issue(self, r, number, pull=False):
        i = r["issues"].get(int(number)) if str(number).isdigit() else None
        if i is None or (pull and not i["pr"]):
            raise Fail(404, "Not Found")
        return i

    def by_key(self, key):
        return self.repos[key[0]]["issues"][key[1]]

    def ref(self, i):
        return f"{self.repos[i['repo']]['full_name']}#{i['number']}"

    def add_issue(self, r, title, user, body=None, pr=None, assoc=None):
        iid, n, t = self.new_id(), r["next"], int(time.time())
        r["next"] += 1
        node = f"PR_kwDO{pr['id']:08x}" if pr else f"I_kwDO{iid:08x}"
        i = r["issues"][n] = {
            "id": iid, "node_id": node, "number": n, "repo": r["full_name"].lower(),
            "title": title, "body": body, "state": "open", "state_reason": None, "labels": [],
            "assignees": [], "user": self.user(user)["login"], "created": t, "updated": t,
            "closed": None, "comments": 0, "blocked_by": [], "pr": pr, "assoc": assoc}
        self.nodes[node] = i
        return i

    def set_labels(self, r, i, labels):
        out = []
        for lab in labels:
            name = lab.get("name") if isinstance(lab, dict) else lab
            if not isinstance(name, str) or not name.strip():
                raise invalid("Label", "name")
            key = name.strip().lower()
            if key not in r["labels"]:  # unknown labels are created, as GitHub does
                lid = self.new_id()
                r["labels"][key] = {"id": lid, "node_id": f"LA_kwDO{lid:08x}",
                                    "name": name.strip(), "default": False, "description": None,
                                    "color": (lab.get("color") if isinstance(lab, dict)
                                              else None) or "ededed"}
            if r["labels"][key]["name"] not in out:
                out.append(r["labels"][key]["name"])
        i["labels"] = out

    def update_issue(self, r, i, d):
        """Apply a PATCH /issues/{n} body (422 on bad values); updated_at moves on change."""
        def snap():
            return json.dumps([i[k] for k in ("title", "body", "state", "state_reason",
                                              "labels", "assignees")])
        before = snap()
        if "title" in d:
            if not isinstance(d["title"], str) or not d["title"].strip():
                raise invalid("Issue", "title")
            i["title"] = d["title"]
        if "body" in d:
            if d["body"] is not None and not isinstance(d["body"], str):
                raise invalid("Issue", "body")
            i["body"] = d["body"]
        state, reason = d.get("state", i["state"]), d.get("state_reason")
        if state not in ("open", "closed"):
            raise invalid("Issue", "state")
        if reason is not None and reason not in REASONS + ("reopened",):
            raise invalid("Issue", "state_reason")
        if state == "closed" and i["state"] == "open":
            i["state"], i["closed"] = "closed", int(time.time())
            i["state_reason"] = reason if reason in REASONS else "completed"
        elif state == "closed" and reason in REASONS:
            i["state_reason"] = reason
        elif state == "open" and i["state"] == "closed":
            i["state"], i["closed"], i["state_reason"] = "open", None, "reopened"
        if "labels" in d:
            if not isinstance(d["labels"], list):
                raise invalid("Issue", "labels")
            self.set_labels(r, i, d["labels"])
        if "assignees" in d or "assignee" in d:
            who = d["assignees"] if "assignees" in d else [d["assignee"]] if d["assignee"] else []
            if not isinstance(who, list) or not all(isinstance(a, str) for a in who):
                raise invalid("Issue", "assignees")
            i["assignees"] = [self.user(a)["login"] for a in dict.fromkeys(who)]
        if snap() != before:
            i["updated"] = int(time.time())

    def add_comment(self, r, i, user, body, assoc=None):
        cid, t = self.new_id(), int(time.time())
        c = {"id": cid, "node_id": f"IC_kwDO{cid:08x}", "issue": i["number"], "body": body,
             "user": self.user(user)["login"], "created": t, "updated": t, "assoc": assoc}
        r["comments"].append(c)
        i["comments"] += 1
        i["updated"] = t
        return c

    def add_blocker(self, i, blocker, remove=False):
        key, bkey = (i["repo"], i["number"]), (blocker["repo"], blocker["number"])
        if remove and bkey in i["blocked_by"]:
            i["blocked_by"].remove(bkey)
            self.blocking[bkey].remove(key)
        elif remove or bkey == key or bkey in i["blocked_by"]:
            return
        else:
            i["blocked_by"].append(bkey)
            self.blocking.setdefault(bkey, []).append(key)
        i["updated"] = int(time.time())

    def assoc(self, login, r, override=None):
        if override:
            return override
        return "OWNER" if login.lower() == r["owner"].lower() else self.user(login)["association"]

    # REST rendering; base is the API root the request came in on ("http://host:port")
    def labels_json(self, r, i):
        return [dict(r["labels"][x.lower()]) for x in i["labels"]]

    def issue_json(self, i, base):
        r = self.repos[i["repo"]]
        fn, n = r["full_name"], i["number"]
        api, kind = f"{base}/repos/{fn}/issues/{n}", "pull" if i["pr"] else "issues"
        bb = [self.by_key(k) for k in i["blocked_by"]]
        bl = [self.by_key(k) for k in self.blocking.get((i["repo"], n), [])]
        d = {"url": api, "repository_url": f"{base}/repos/{fn}", "comments_url": f"{api}/comments",
             "html_url": f"https://github.com/{fn}/{kind}/{n}", "id": i["id"],
             "node_id": i["node_id"], "number": n, "title": i["title"],
             "user": self.user_json(i["user"]), "labels": self.labels_json(r, i),
             "state": i["state"], "locked": False,
             "assignee": self.user_json(i["assignees"][0]) if i["assignees"] else None,
             "assignees": [self.user_json(a) for a in i["assignees"]], "milestone": None,
             "comments": i["comments"], "created_at": iso(i["created"]),
             "updated_at": iso(i["updated"]), "closed_at": iso(i["closed"]),
             "author_association": self.assoc(i["user"], r, i["assoc"]), "body": i["body"],
             "state_reason": i["state_reason"], "issue_dependencies_summary": {
                 "blocked_by": sum(b["state"] == "open" for b in bb), "total_blocked_by": len(bb),
                 "blocking": sum(b["state"] == "open" for b in bl), "total_blocking": len(bl)}}
        if i["pr"]:
            d["draft"] = i["pr"]["draft"]
            d["pull_request"] = {"url": f"{base}/repos/{fn}/pulls/{n}",
                                 "html_url": f"https://github.com/{fn}/pull/{n}",
                                 "diff_url": f"https://github.com/{fn}/pull/{n}.diff",
                                 "patch_url": f"https://github.com/{fn}/pull/{n}.patch",
                                 "merged_at": iso(i["pr"]["merged_at"])}
        return d

    def comment_json(self, r, c, base):
        fn, n = r["full_name"], c["issue"]
        kind = "pull" if r["issues"][n]["pr"] else "issues"
        return {"url": f"{base}/repos/{fn}/issues/comments/{c['id']}",
                "html_url": f"https://github.com/{fn}/{kind}/{n}#issuecomment-{c['id']}",
                "issue_url": f"{base}/repos/{fn}/issues/{n}", "id": c["id"],
                "node_id": c["node_id"], "user": self.user_json(c["user"]),
                "created_at": iso(c["created"]), "updated_at": iso(c["updated"]),
                "author_association": self.assoc(c["user"], r, c["assoc"]), "body": c["body"]}

    def pull_json(self, i, base):
        r, p = self.repos[i["repo"]], i["pr"]
        fn, n = r["full_name"], i["number"]
        repo = {"id": r["id"], "name": r["name"], "full_name": fn}
        return {"url": f"{base}/repos/{fn}/pulls/{n}", "id": p["id"], "node_id": i["node_id"],
                "html_url": f"https://github.com/{fn}/pull/{n}",
                "issue_url": f"{base}/repos/{fn}/issues/{n}", "number": n, "state": i["state"],
                "locked": False, "title": i["title"], "user": self.user_json(i["user"]),
                "body": i["body"], "labels": self.labels_json(r, i),
                "created_at": iso(i["created"]), "updated_at": iso(i["updated"]),
                "closed_at": iso(i["closed"]), "merged_at": iso(p["merged_at"]),
                "assignees": [self.user_json(a) for a in i["assignees"]],
                "requested_reviewers": [], "draft": p["draft"], "merged": bool(p["merged_at"]),
                "head": {"label": f"{r['owner']}:{p['head_ref']}", "ref": p["head_ref"],
                         "sha": p["head_sha"], "repo": repo},
                "base": {"label": f"{r['owner']}:{p['base_ref']}", "ref": p["base_ref"],
                         "repo": repo},
                "author_association": self.assoc(i["user"], r, i["assoc"])}

    def review_json(self, r, v, base):
        fn, n = r["full_name"], v["pull"]
        return {"id": v["id"], "node_id": v["node_id"], "user": self.user_json(v["user"]),
                "body": v["body"], "state": v["state"], "commit_id": v["commit_id"],
                "html_url": f"https://github.com/{fn}/pull/{n}#pullrequestreview-{v['id']}",
                "pull_request_url": f"{base}/repos/{fn}/pulls/{n}",
                "submitted_at": iso(v["submitted"]), "author_association": self.assoc(v["user"], r)}

    def review_comment_json(self, r, c, base):
        fn, n = r["full_name"], c["pull"]
        return {"url": f"{base}/repos/{fn}/pulls/comments/{c['id']}", "id": c["id"],
                "node_id": c["node_id"], "pull_request_review_id": c["review"], "diff_hunk": "",
                "path": c["path"], "line": c["line"], "original_line": c["line"],
                "side": "RIGHT", "commit_id": c["commit_id"], "user": self.user_json(c["user"]),
                "body": c["body"], "created_at": iso(c["created"]),
                "updated_at": iso(c["updated"]),
                "html_url": f"https://github.com/{fn}/pull/{n}#discussion_r{c['id']}",
                "pull_request_url": f"{base}/repos/{fn}/pulls/{n}",
                "author_association": self.assoc(c["user"], r), "subject_type": "line"}

    def check_run_json(self, r, c, base):
        fn, out = r["full_name"], c["output"]
        return {"id": c["id"], "node_id": c["node_id"], "head_sha": c["sha"], "name": c["name"],
                "external_id": "", "url": f"{base}/repos/{fn}/check-runs/{c['id']}",
                "html_url": f"https://github.com/{fn}/runs/{c['id']}",
                "details_url": c["details_url"] or f"https://github.com/{fn}/runs/{c['id']}",
                "status": c["status"], "conclusion": c["conclusion"],
                "started_at": iso(c["started"]), "completed_at": iso(c["completed"]),
                "output": {"title": out.get("title"), "summary": out.get("summary"),
                           "text": out.get("text"), "annotations_count": 0},
                "check_suite": {"id": c["suite"]}, "pull_requests": [],
                "app": {"id": 15368, "slug": "github-actions", "name": "GitHub Actions"}}

    def status_json(self, r, s, base):
        return {"url": f"{base}/repos/{r['full_name']}/statuses/{s['sha']}", "id": s["id"],
                "node_id": s["node_id"], "state": s["state"], "description": s["description"],
                "target_url": s["target_url"], "context": s["context"], "avatar_url": None,
                "created_at": iso(s["created"]), "updated_at": iso(s["created"])}

    def repo_json(self, r, base, tok=None):
        push = bool(tok and tok["push"])
        return {"id": r["id"], "node_id": r["node_id"], "name": r["name"],
                "full_name": r["full_name"], "owner": self.user_json(r["owner"]),
                "private": r["private"], "visibility": "private" if r["private"] else "public",
                "html_url": f"https://github.com/{r['full_name']}",
                "url": f"{base}/repos/{r['full_name']}", "default_branch": "main",
                "has_issues": True, "has_projects": True, "archived": False,
                "open_issues_count": sum(i["state"] == "open" for i in r["issues"].values()),
                "permissions": {"admin": False, "maintain": False, "push": push, "triage": push,
                                "pull": True}}

    # Projects v2: item content is ("issue"|"pull", repo key, number) or ("draft", title)
    def project(self, owner, number):
        p = self.projects.get((str(owner).lower(), int(number)))
        if p is None:
            raise Fail(404, f"no project {owner}/{number}")
        return p

    def option(self, p, name):
        if name is None:
            return None
        for o in p["options"]:
            if o["name"] == name:
                return o["id"]
        raise Fail(400, f"project {p['number']} has no option {name!r}")

    def add_item(self, p, content, archived=False):
        for it in p["items"]:
            if content[0] != "draft" and it["content"] == content:
                return it
        xid = self.new_id()
        it = {"id": f"PVTI_lADO{xid:08x}", "project": p, "content": content, "status": None,
              "archived": archived}
        p["items"].append(it)
        self.items[it["id"]] = it
        return it

    def describe(self, it):
        c = it["content"]
        return f"draft {c[1]!r}" if c[0] == "draft" else self.ref(self.by_key(c[1:]))


M = Model()


# ---------------------------------------------------------------- REST routes

ROUTES = []  # (method, regex, template, handler); the first match wins


def route(method, template):
    rx = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template) + "$")

    def deco(fn):
        ROUTES.append((method, rx, template, fn))
        return fn
    return deco


class Ctx:
    """One REST request: m, user, tok, q (query dict), qlist, body, base, link_path."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def page(self, items):
        """One page of items, and GitHub's Link header (prev, next, last, first)."""
        per, page = self.q.get("per_page", ""), self.q.get("page", "")
        per = min(int(per), 100) if per.isdigit() and int(per) > 0 else 30
        page = int(page) if page.isdigit() and int(page) > 0 else 1
        last = max(1, -(-len(items) // per))

        def url(n):
            qs = [(k, v) for k, v in self.qlist if k != "page"] + [("page", str(n))]
            return f"<{self.base}{self.link_path}?{urlencode(qs)}>"
        links = [f'{url(page - 1)}; rel="prev"'] if page > 1 else []
        if page < last:
            links += [f'{url(page + 1)}; rel="next"', f'{url(last)}; rel="last"']
        if page > 1:
            links.append(f'{url(1)}; rel="first"')
        return items[(page - 1) * per:page * per], ([("link", ", ".join(links))] if links else [])

    def since(self):
        s = self.q.get("since")
        if not s:
            return None
        try:
            d = datetime.fromisoformat(s.strip().replace("Z", "+00:00"))
        except ValueError:
            raise invalid("Issue", "since")
        return (d if d.tzinfo else d.replace(tzinfo=timezone.utc)).timestamp()

    def ordered(self, items, keys, default_dir):
        """sort= one of keys (default: the first), direction= asc|desc."""
        key = keys.get(self.q.get("sort"), next(iter(keys.values())))
        return sorted(items, key=key, reverse=default_dir == "desc")


BY_TIME = {"created": lambda x: (x["created"], x["id"]),
           "updated": lambda x: (x["updated"], x["id"])}


@route("GET", "/rate_limit")
def rate_limit(c):
    """Costs nothing (serve_rest answers it before the accounting)."""
    res = {k: dict(c.m.budget(c.user["login"], k)) for k in ("core", "graphql")}
    for v in res.values():
        v["remaining"] = v["limit"] - v["used"]
    return 200, {"resources": res, "rate": res["core"]}, []


@route("GET", "/user")
def get_user(c):
    return 200, {**c.m.user_json(c.user["login"]), "name": c.user["name"], "email": None}, []


@route("GET", "/repos/{owner}/{repo}")
def get_repo(c, owner, repo):
    return 200, c.m.repo_json(c.m.repo(f"{owner}/{repo}"), c.base, c.tok), []


def list_comments(c, r, comments, render):
    """Comment lists: since (updated_at >=), sort, direction (ascending unless sort= says)."""
    since = c.since()
    items = [x for x in comments if since is None or x["updated"] >= since]
    items = c.ordered(items, BY_TIME, c.q.get("direction", "desc") if "sort" in c.q else "asc")
    chunk, link = c.page(items)
    return 200, [render(r, x, c.base) for x in chunk], link


@route("GET", "/repos/{owner}/{repo}/issues/comments")
def repo_issue_comments(c, owner, repo):
    r = c.m.repo(f"{owner}/{repo}")
    return list_comments(c, r, r["comments"], c.m.comment_json)


@route("GET", "/repos/{owner}/{repo}/issues")
def list_issues(c, owner, repo):
    r, q, since = c.m.repo(f"{owner}/{repo}"), c.q, c.since()
    state, assignee, creator = q.get("state", "open"), q.get("assignee"), q.get("creator", "")
    labels = {x.strip().lower() for x in q.get("labels", "").split(",") if x.strip()}
    out = []
    for i in r["issues"].values():
        mine = {a.lower() for a in i["assignees"]}
        if (state in ("open", "closed") and i["state"] != state
                or labels and not labels <= {x.lower() for x in i["labels"]}
                or assignee == "none" and mine or assignee == "*" and not mine
                or assignee not in (None, "", "none", "*") and assignee.lower() not in mine
                or creator and i["user"].lower() != creator.lower()
                or since is not None and i["updated"] < since):
            continue
        out.append(i)
    keys = {"created": lambda i: (i["created"], i["number"]),
            "updated": lambda i: (i["updated"], i["number"]),
            "comments": lambda i: (i["comments"], i["number"])}
    chunk, link = c.page(c.ordered(out, keys, q.get("direction", "desc")))
    return 200, [c.m.issue_json(i, c.base) for i in chunk], link


@route("POST", "/repos/{owner}/{repo}/issues")
def create_issue(c, owner, repo):
    r, d = c.m.repo(f"{owner}/{repo}"), c.body
    if not isinstance(d.get("title"), str) or not d["title"].strip():
        raise invalid("Issue", "title", "missing_field")
    i = c.m.add_issue(r, d["title"], c.user["login"], d.get("body"))
    try:
        c.m.update_issue(r, i, {k: d[k] for k in ("labels", "assignees", "assignee") if k in d})
    except Fail:
        del r["issues"][i["number"]], c.m.nodes[i["node_id"]]
        r["next"] -= 1
        raise
    c.m.write(c.user, f"CREATE {c.m.ref(i)}")
    loc = f"{c.base}/repos/{r['full_name']}/issues/{i['number']}"
    return 201, c.m.issue_json(i, c.base), [("location", loc)]


@route("GET", "/repos/{owner}/{repo}/issues/{issue_number}")
def get_issue(c, owner, repo, issue_number):
    return 200, c.m.issue_json(c.m.issue(c.m.repo(f"{owner}/{repo}"), issue_number), c.base), []


def patch_part(key, value):
    """One `key=value` of a PATCH log line (lists and strings as compact JSON)."""
    if isinstance(value, list):
        names = [x.get("name") if isinstance(x, dict) else x for x in value]
        return f"{key}={json.dumps(names, separators=(',', ':'))}"
    if key in ("state", "state_reason"):
        return f"{key}={'null' if value is None else value}"
    return f"{key}={json.dumps(value[:80] if isinstance(value, str) else value)}"


@route("PATCH", "/repos/{owner}/{repo}/issues/{issue_number}")
def patch_issue(c, owner, repo, issue_number):
    r = c.m.repo(f"{owner}/{repo}")
    i = c.m.issue(r, issue_number)
    c.m.update_issue(r, i, c.body)
    parts = [patch_part(k, c.body[k]) for k in ("title", "body", "state", "state_reason",
                                                 "labels", "assignees", "assignee") if k in c.body]
    c.m.write(c.user, " ".join([f"PATCH {c.m.ref(i)}"] + parts))
    return 200, c.m.issue_json(i, c.base), []


@route("POST", "/repos/{owner}/{repo}/issues/{issue_number}/labels")
def add_labels(c, owner, repo, issue_number):
    r = c.m.repo(f"{owner}/{repo}")
    i = c.m.issue(r, issue_number)
    new = c.body.get("labels") if isinstance(c.body, dict) else c.body
    if not isinstance(new, list):
        raise invalid("Label", "labels")
    names = [x.get("name") if isinstance(x, dict) else x for x in new]
    c.m.set_labels(r, i, i["labels"] + names)
    i["updated"] = int(time.time())
    c.m.write(c.user, f"LABEL {c.m.ref(i)} +{json.dumps(names)}")
    return 200, c.m.labels_json(r, i), []


@route("DELETE", "/repos/{owner}/{repo}/issues/{issue_number}/labels/{name}")
def remove_label(c, owner, repo, issue_number, name):
    r = c.m.repo(f"{owner}/{repo}")
    i = c.m.issue(r, issue_number)
    name = unquote(name)
    if name.lower() not in [x.lower() for x in i["labels"]]:
        raise Fail(404, "Label does not exist")
    i["labels"] = [x for x in i["labels"] if x.lower() != name.lower()]
    i["updated"] = int(time.time())
    c.m.write(c.user, f"LABEL {c.m.ref(i)} -{json.dumps([name])}")
    return 200, c.m.labels_json(r, i), []


@route("GET", "/repos/{owner}/{repo}/issues/{issue_number}/comments")
def issue_comments(c, owner, repo, issue_number):
    r = c.m.repo(f"{owner}/{repo}")
    n, since = c.m.issue(r, issue_number)["number"], c.since()
    chunk, link = c.page([x for x in r["comments"]
                          if x["issue"] == n and (since is None or x["updated"] >= since)])
    return 200, [c.m.comment_json(r, x, c.base) for x in chunk], link


@route("POST", "/repos/{owner}/{repo}/issues/{issue_number}/comments")
def post_comment(c, owner, repo, issue_number):
    r = c.m.repo(f"{owner}/{repo}")
    i, body = c.m.issue(r, issue_number), c.body.get("body")
    if not isinstance(body, str) or not body.strip():
        raise invalid("IssueComment", "body", "missing_field")
    cm = c.m.add_comment(r, i, c.user["login"], body)
    c.m.write(c.user, f"COMMENT {c.m.ref(i)} {' '.join(body[:80].split())}")
    loc = f"{c.base}/repos/{r['full_name']}/issues/comments/{cm['id']}"
    return 201, c.m.comment_json(r, cm, c.base), [("location", loc)]


@route("GET", "/repos/{owner}/{repo}/issues/{issue_number}/dependencies/blocked_by")
def blocked_by(c, owner, repo, issue_number):
    i = c.m.issue(c.m.repo(f"{owner}/{repo}"), issue_number)
    chunk, link = c.page([c.m.by_key(k) for k in i["blocked_by"]])
    return 200, [c.m.issue_json(b, c.base) for b in chunk], link


@route("GET", "/repos/{owner}/{repo}/pulls/comments")
def repo_review_comments(c, owner, repo):
    r = c.m.repo(f"{owner}/{repo}")
    return list_comments(c, r, r["review_comments"], c.m.review_comment_json)


@route("GET", "/repos/{owner}/{repo}/pulls")
def list_pulls(c, owner, repo):
    r, state = c.m.repo(f"{owner}/{repo}"), c.q.get("state", "open")
    out = [i for i in r["issues"].values() if i["pr"] and state in ("all", i["state"])]
    chunk, link = c.page(c.ordered(out, BY_TIME, c.q.get("direction", "desc")))
    return 200, [c.m.pull_json(i, c.base) for i in chunk], link


@route("GET", "/repos/{owner}/{repo}/pulls/{pull_number}")
def get_pull(c, owner, repo, pull_number):
    r = c.m.repo(f"{owner}/{repo}")
    return 200, c.m.pull_json(c.m.issue(r, pull_number, pull=True), c.base), []


@route("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews")
def pull_reviews(c, owner, repo, pull_number):
    r = c.m.repo(f"{owner}/{repo}")
    n = c.m.issue(r, pull_number, pull=True)["number"]
    chunk, link = c.page([v for v in r["reviews"] if v["pull"] == n])
    return 200, [c.m.review_json(r, v, c.base) for v in chunk], link


@route("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/comments")
def pull_comments(c, owner, repo, pull_number):
    r = c.m.repo(f"{owner}/{repo}")
    n = c.m.issue(r, pull_number, pull=True)["number"]
    return list_comments(c, r, [x for x in r["review_comments"] if x["pull"] == n],
                         c.m.review_comment_json)


def commit_sha(r, ref):
    """A ref names a commit: a pull request's head branch, or a (possibly short) sha."""
    return next((i["pr"]["head_sha"] for i in r["issues"].values()
                 if i["pr"] and i["pr"]["head_ref"] == ref), ref)


def on_commit(sha, ref):
    return sha == ref or (len(ref) >= 7 and sha.startswith(ref))


@route("GET", "/repos/{owner}/{repo}/commits/{ref}/check-runs")
def check_runs(c, owner, repo, ref):
    r = c.m.repo(f"{owner}/{repo}")
    sha = commit_sha(r, ref)
    runs = [x for x in reversed(r["check_runs"]) if on_commit(x["sha"], sha)
            and c.q.get("check_name") in (None, x["name"])
            and c.q.get("status") in (None, x["status"])]
    chunk, link = c.page(runs)
    return 200, {"total_count": len(runs),
                 "check_runs": [c.m.check_run_json(r, x, c.base) for x in chunk]}, link


def hook_json(r, h, base):
    fn = r["full_name"]
    return {"type": "Repository", "id": h["id"], "name": "web", "active": h["active"],
            "events": h["events"], "config": {"content_type": "json", "insecure_ssl": "0",
                                              "url": h["url"]},
            "updated_at": iso(h["created"]), "created_at": iso(h["created"]),
            "url": f"{base}/repos/{fn}/hooks/{h['id']}",
            "test_url": f"{base}/repos/{fn}/hooks/{h['id']}/test",
            "ping_url": f"{base}/repos/{fn}/hooks/{h['id']}/pings",
            "deliveries_url": f"{base}/repos/{fn}/hooks/{h['id']}/deliveries",
            "last_response": {"code": None, "status": "unused", "message": None}}


@route("GET", "/repos/{owner}/{repo}/hooks")
def list_hooks(c, owner, repo):
    r = c.m.repo(f"{owner}/{repo}")
    chunk, link = c.page(r["hooks"])
    return 200, [hook_json(r, h, c.base) for h in chunk], link


@route("GET", "/repos/{owner}/{repo}/commits/{ref}/status")
def combined_status(c, owner, repo, ref):
    r = c.m.repo(f"{owner}/{repo}")
    sha, fn = commit_sha(r, ref), r["full_name"]
    latest = {s["context"]: s for s in r["statuses"] if on_commit(s["sha"], sha)}
    states = [s["state"] for s in latest.values()]
    state = ("failure" if "failure" in states or "error" in states else
             "pending" if not states or "pending" in states else "success")
    return 200, {"state": state, "sha": sha, "total_count": len(latest),
                 "statuses": [c.m.status_json(r, s, c.base) for s in latest.values()],
                 "repository": {"id": r["id"], "node_id": r["node_id"], "full_name": fn},
                 "commit_url": f"{c.base}/repos/{fn}/commits/{sha}",
                 "url": f"{c.base}/repos/{fn}/commits/{sha}/status"}, []


# ---------------------------------------------------------------- GraphQL operations

class GQLTop(Exception):
    """An answer made only of errors, no data (e.g. missing token scopes)."""

    def __init__(self, errors):
        super().__init__(errors[0]["message"])
        self.errors = errors


def not_found(path, message):
    return {"type": "NOT_FOUND", "path": path, "message": message}


def no_node(path, nid):
    return not_found(path, f"Could not resolve to a node with the global id of '{nid}'")


class Gql:
    """One GraphQL request: the model, the caller, the chosen operation and its variables."""

    def __init__(self, m, user, tok, variables, op, frags):
        self.m, self.user, self.tok, self.vars, self.op, self.frags = \
            m, user, tok, variables, op, frags
        self.forbidden = []  # FORBIDDEN errors of fields the token may not read

    def arg(self, field, name, default=None):
        """The value of `name` on the first `field` of the operation (variables resolved)."""
        f = find_field(self.op["sel"], self.frags, field)
        v = resolve(f["args"].get(name), self.vars) if f else None
        return default if v is None else v

    def need(self, scope, field):
        have = self.tok["scopes"]
        have = None if have is None else [s.strip() for s in have.split(",") if s.strip()]
        if have is None or "project" in have or scope in have:
            return
        raise GQLTop([{"type": "INSUFFICIENT_SCOPES", "message": (
            "Your token has not been granted the required scopes to execute this query. The "
            f"'{field}' field requires one of the following scopes: ['{scope}'], but your token "
            f"has only been granted the: {have!r} scopes. Please modify your token's scopes at: "
            "https://github.com/settings/tokens.")}])

    def project_by_id(self, pid):
        return next((p for p in self.m.projects.values() if p["id"] == pid), None)

    def issue(self, i, items=False, field=None, linked=None):
        fn = self.m.repos[i["repo"]]["full_name"]
        d = {"__typename": "Issue", "id": i["node_id"], "number": i["number"],
             "title": i["title"], "url": f"https://github.com/{fn}/issues/{i['number']}",
             "state": i["state"].upper(),
             "stateReason": i["state_reason"].upper() if i["state_reason"] else None,
             "repository": {"nameWithOwner": fn}}
        if items:
            its = [it for p in self.m.projects.values() for it in p["items"]
                   if it["content"] == ("issue", i["repo"], i["number"])]
            d["projectItems"] = {"totalCount": len(its), "nodes": [
                {"id": it["id"], "isArchived": it["archived"], "type": "ISSUE",
                 "project": {k: it["project"][k] for k in ("id", "number", "title")},
                 "fieldValueByName": self.value(it, field)}
                for it in its[:int(self.arg("projectItems", "first", 20))]]}
        if linked and not may(self.tok, "pull_requests", "read"):
            d["closedByPullRequestsReferences"] = None
            self.forbidden.append({"type": "FORBIDDEN", "path": ["closedByPullRequestsReferences"],
                                   "extensions": {"saml_failure": False},
                                   "message": FORBIDDEN_MESSAGE})
        elif linked:
            first, closed = linked
            prs = [p for r in self.m.repos.values() for p in r["issues"].values()
                   if p["pr"] and (i["repo"], i["number"]) in p["pr"]["closes"]
                   and (closed or p["state"] == "open")]
            d["closedByPullRequestsReferences"] = {"totalCount": len(prs),
                                                   "nodes": [self.pull(p) for p in prs[:first]]}
        return d

    def pull(self, p):
        fn = self.m.repos[p["repo"]]["full_name"]
        return {"__typename": "PullRequest", "id": p["node_id"], "number": p["number"],
                "title": p["title"], "url": f"https://github.com/{fn}/pull/{p['number']}",
                "state": "MERGED" if p["pr"]["merged_at"] else p["state"].upper(),
                "isDraft": p["pr"]["draft"], "headRefOid": p["pr"]["head_sha"],
                "headRefName": p["pr"]["head_ref"], "repository": {"nameWithOwner": fn},
                "author": {"login": p["user"]},
                "authorAssociation": self.m.assoc(p["user"], self.m.repos[p["repo"]], p["assoc"])}

    def value(self, it, field_name):
        p = it["project"]
        if not it["status"] or str(field_name).lower() != p["field"]["name"].lower():
            return None
        name = next(o["name"] for o in p["options"] if o["id"] == it["status"])
        return {"__typename": "ProjectV2ItemFieldSingleSelectValue", "name": name,
                "optionId": it["status"]}


def op_viewer(g):
    u = g.user
    return {"viewer": {"__typename": u["type"], "login": u["login"], "id": u["node_id"],
                       "databaseId": u["id"], "name": u["name"]}}, []


def op_project_items(g):
    g.need("read:project", "projectV2")
    login, number = g.arg("repositoryOwner", "login"), g.arg("projectV2", "number")
    owner = g.m.users.get(str(login).lower())
    if owner is None or owner["type"] == "Bot":
        return {"repositoryOwner": None}, [not_found(
            ["repositoryOwner"], f"Could not resolve to a RepositoryOwner with the login of "
                                 f"'{login}'.")]
    o = {"__typename": owner["type"], "login": owner["login"], "id": owner["node_id"]}
    p = g.m.projects.get((owner["login"].lower(), number)) if isinstance(number, int) else None
    if p is None:
        o["projectV2"] = None
        return {"repositoryOwner": o}, [not_found(
            ["repositoryOwner", "projectV2"],
            f"Could not resolve to a ProjectV2 with the number {number}.")]
    name, f = g.arg("field", "name", g.vars.get("field")), p["field"]
    field = {"__typename": "ProjectV2SingleSelectField", "id": f["id"], "name": f["name"],
             "dataType": "SINGLE_SELECT", "options": [dict(x) for x in p["options"]]} \
        if str(name).lower() == f["name"].lower() else None
    first, after, start = max(0, min(100, int(g.arg("items", "first", 100)))), \
        g.arg("items", "after"), 0
    if after:
        try:
            start = int(base64.b64decode(after).decode().split(":")[1]) + 1
        except (ValueError, IndexError, UnicodeDecodeError):
            raise GQLTop([{"type": "INVALID_CURSOR_ARGUMENTS",
                           "path": ["repositoryOwner", "projectV2", "items"],
                           "message": f"`{after}` does not appear to be a valid cursor."}])
    chunk, value_field = p["items"][start:start + first], g.arg("fieldValueByName", "name", name)
    nodes = []
    for it in chunk:
        kind = it["content"][0]
        # only the `... on Issue` fragment selects fields; other content shows its type only
        content = g.issue(g.m.by_key(it["content"][1:])) if kind == "issue" else \
            {"__typename": "DraftIssue" if kind == "draft" else "PullRequest"}
        nodes.append({"id": it["id"], "isArchived": it["archived"], "content": content,
                      "type": {"draft": "DRAFT_ISSUE", "pull": "PULL_REQUEST"}.get(kind, "ISSUE"),
                      "fieldValueByName": g.value(it, value_field)})

    def cursor(n):
        return base64.b64encode(f"cursor:{n}".encode()).decode() if chunk else None
    end = start + len(chunk)
    o["projectV2"] = {"id": p["id"], "number": p["number"], "title": p["title"], "url": p["url"],
                      "closed": False, "field": field,
                      "items": {"totalCount": len(p["items"]), "nodes": nodes, "pageInfo": {
                          "hasNextPage": end < len(p["items"]), "hasPreviousPage": start > 0,
                          "startCursor": cursor(start), "endCursor": cursor(end - 1)}}}
    return {"repositoryOwner": o}, []


def op_nodes(g, linked):
    """SvcIssueNodes / SvcLinkedPulls: nodes(ids:) with an `... on Issue` fragment."""
    if not linked:
        g.need("read:project", "projectItems")
    ids, out, errors = g.arg("nodes", "ids", []), [], []
    field, lf = g.arg("fieldValueByName", "name", g.vars.get("field")), \
        "closedByPullRequestsReferences"
    for n, nid in enumerate(ids if isinstance(ids, list) else [ids]):
        i = g.m.nodes.get(nid) if isinstance(nid, str) else None
        if i is None:
            out.append(None)
            errors.append(no_node(["nodes", n], nid))
        elif i["pr"]:
            out.append({})  # a PullRequest: the `... on Issue` fragment selects nothing
        elif linked:
            out.append(g.issue(i, linked=(int(g.arg(lf, "first", 10)),
                                          bool(g.arg(lf, "includeClosedPrs", False)))))
            for e in g.forbidden:
                errors.append({**e, "path": ["nodes", n] + e["path"]})
            g.forbidden.clear()
        else:
            out.append(g.issue(i, items=True, field=field))
    return {"nodes": out}, errors


def op_set_status(g):
    g.need("project", "updateProjectV2ItemFieldValue")
    inp = g.arg("updateProjectV2ItemFieldValue", "input", {})
    p, it = g.project_by_id(inp.get("projectId")), g.m.items.get(inp.get("itemId"))
    opt = (inp.get("value") or {}).get("singleSelectOptionId")
    wrong = (inp.get("projectId") if p is None else
             inp.get("itemId") if it is None or it["project"] is not p else
             inp.get("fieldId") if inp.get("fieldId") != p["field"]["id"] else
             opt if opt not in [o["id"] for o in p["options"]] else None)
    if wrong is not None or p is None:
        return {"updateProjectV2ItemFieldValue": None}, [
            no_node(["updateProjectV2ItemFieldValue"], wrong)]
    it["status"] = opt
    name = next(o["name"] for o in p["options"] if o["id"] == opt)
    g.m.write(g.user, f"STATUS {g.m.describe(it)} {name}")
    return {"updateProjectV2ItemFieldValue": {"clientMutationId": None, "projectV2Item": {
        "id": it["id"], "updatedAt": iso(time.time())}}}, []


def op_add_item(g):
    g.need("project", "addProjectV2ItemById")
    inp = g.arg("addProjectV2ItemById", "input", {})
    p, i = g.project_by_id(inp.get("projectId")), g.m.nodes.get(inp.get("contentId"))
    if p is None or i is None:
        return {"addProjectV2ItemById": None}, [no_node(
            ["addProjectV2ItemById"], inp.get("projectId" if p is None else "contentId"))]
    it = g.m.add_item(p, ("pull" if i["pr"] else "issue", i["repo"], i["number"]))
    g.m.write(g.user, f"ADDITEM {g.m.ref(i)}")
    return {"addProjectV2ItemById": {"clientMutationId": None, "item": {"id": it["id"]}}}, []


GQL_OPS = {"SvcViewer": op_viewer, "SvcProjectItems": op_project_items,
           "SvcIssueNodes": lambda g: op_nodes(g, False),
           "SvcLinkedPulls": lambda g: op_nodes(g, True),
           "SvcSetStatus": op_set_status, "SvcAddItem": op_add_item}


# ---------------------------------------------------------------- admin API

ADMIN = {}  # (method, path) -> handler(m, body, base) -> (status, obj)


def admin(*keys):
    def deco(fn):
        ADMIN.update({tuple(k.split(" ", 1)): fn for k in keys})
        return fn
    return deco


def need(d, key):
    if d.get(key) is None:
        raise Fail(400, f"missing {key}")
    return d[key]


def find_issue(m, d, key="number", repo=None):
    r = m.repo(repo or need(d, "repo"))
    return r, m.issue(r, need(d, key))


@admin("POST /_fake/users")
def a_users(m, d, base):
    u = m.add_user(need(d, "login"), d.get("type", "User"), token=d.get("token"),
                   scopes=d.get("scopes", "repo"), name=d.get("name"),
                   association=d.get("association"), push=d.get("push", True),
                   permissions=d.get("permissions"))
    return 201, {**m.user_json(u["login"]), "association": u["association"]}


@admin("POST /_fake/repos")
def a_repos(m, d, base):
    r, created = m.add_repo(need(d, "full_name"), bool(d.get("private")))
    return 201 if created else 200, m.repo_json(r, base)


@admin("POST /_fake/issues")
def a_issues(m, d, base):
    r = m.repo(need(d, "repo"))
    i = m.add_issue(r, need(d, "title"), d.get("user") or "octocat", d.get("body"),
                    assoc=d.get("association"))
    m.update_issue(r, i, {k: d[k] for k in ("labels", "assignees", "state", "state_reason")
                          if k in d})
    for b in d.get("blocked_by") or []:
        m.add_blocker(i, find_issue(m, b, repo=b.get("repo") or r["full_name"])[1])
    return 201, m.issue_json(i, base)


@admin("POST /_fake/issues/update")
def a_issue_update(m, d, base):
    r, i = find_issue(m, d)
    m.update_issue(r, i, d)
    return 200, m.issue_json(i, base)


@admin("POST /_fake/comments")
def a_comments(m, d, base):
    r, i = find_issue(m, d, "issue")
    count = int(d.get("count") or 0)
    for n in range(count or 1):
        body = f"{need(d, 'body')} {n}" if count else need(d, "body")
        c = m.add_comment(r, i, d.get("user") or "octocat", body, d.get("association"))
    return 201, m.comment_json(r, c, base)


@admin("POST /_fake/dependencies", "DELETE /_fake/dependencies")
def a_dependencies(m, d, base):
    r, i = find_issue(m, d)
    b = need(d, "blocked_by")
    m.add_blocker(i, find_issue(m, b, repo=b.get("repo") or r["full_name"])[1],
                  remove=d["_method"] == "DELETE")
    return 200, m.issue_json(i, base)


@admin("POST /_fake/pulls")
def a_pulls(m, d, base):
    r, pid = m.repo(need(d, "repo")), m.new_id()
    closes = [(m.repo(x["repo"])["full_name"].lower(), int(x["number"])) if isinstance(x, dict)
              else (r["full_name"].lower(), int(x)) for x in d.get("closes") or []]
    pr = {"id": pid, "head_sha": d.get("head_sha") or hashlib.sha1(str(pid).encode()).hexdigest(),
          "head_ref": d.get("head_ref") or f"feature-{pid}", "base_ref": d.get("base_ref") or
          "main", "draft": bool(d.get("draft")), "closes": closes, "merged_at": None}
    i = m.add_issue(r, need(d, "title"), d.get("user") or "octocat", d.get("body"), pr=pr,
                    assoc=d.get("association"))
    if d.get("state") == "closed":
        m.update_issue(r, i, {"state": "closed"})
        i["state_reason"] = None  # closed pull requests carry no state_reason
        pr["merged_at"] = i["closed"] if d.get("merged") else None
    return 201, m.pull_json(i, base)


@admin("POST /_fake/reviews")
def a_reviews(m, d, base):
    r, i = find_issue(m, d, "pull")
    if not i["pr"] or need(d, "state") not in ("CHANGES_REQUESTED", "APPROVED", "COMMENTED",
                                                "DISMISSED", "PENDING"):
        raise Fail(400, "not a pull request, or a bad review state")
    vid = m.new_id()
    v = {"id": vid, "node_id": f"PRR_kwDO{vid:08x}", "pull": i["number"],
         "user": m.user(d.get("user") or "octocat")["login"], "body": d.get("body") or "",
         "state": d["state"], "submitted": int(time.time()),
         "commit_id": d.get("commit_id") or i["pr"]["head_sha"]}
    r["reviews"].append(v)
    i["updated"] = v["submitted"]
    return 201, m.review_json(r, v, base)


@admin("POST /_fake/review-comments")
def a_review_comments(m, d, base):
    r, i = find_issue(m, d, "pull")
    if not i["pr"]:
        raise Fail(400, "not a pull request")
    cid, t = m.new_id(), int(time.time())
    c = {"id": cid, "node_id": f"PRRC_kwDO{cid:08x}", "pull": i["number"],
         "user": m.user(d.get("user") or "octocat")["login"], "body": need(d, "body"),
         "path": d.get("path") or "README.md", "line": d.get("line"), "review": d.get("review"),
         "commit_id": i["pr"]["head_sha"], "created": t, "updated": t}
    r["review_comments"].append(c)
    i["updated"] = t
    return 201, m.review_comment_json(r, c, base)


@admin("POST /_fake/check-runs")
def a_check_runs(m, d, base):
    r, sha, name, t = m.repo(need(d, "repo")), need(d, "sha"), need(d, "name"), int(time.time())
    c = next((x for x in r["check_runs"] if x["sha"] == sha and x["name"] == name), None)
    if c is None:
        cid = m.new_id()
        c = {"id": cid, "node_id": f"CR_kwDO{cid:08x}", "sha": sha, "name": name,
             "suite": m.new_id(), "started": t}
        r["check_runs"].append(c)
    done = (d.get("status") or "completed") == "completed"
    c.update(status=d.get("status") or "completed", conclusion=d.get("conclusion") if done
             else None, completed=t if done else None, output=d.get("output") or {},
             details_url=d.get("details_url"))
    return 201, m.check_run_json(r, c, base)


@admin("POST /_fake/statuses")
def a_statuses(m, d, base):
    r, sid = m.repo(need(d, "repo")), m.new_id()
    if need(d, "state") not in ("failure", "error", "success", "pending"):
        raise Fail(400, "bad state")
    s = {"id": sid, "node_id": f"SC_kwDO{sid:08x}", "sha": need(d, "sha"), "state": d["state"],
         "context": d.get("context") or "default", "description": d.get("description"),
         "target_url": d.get("target_url"), "created": int(time.time())}
    r["statuses"].append(s)
    return 201, m.status_json(r, s, base)


@admin("POST /_fake/hooks")
def a_hooks(m, d, base):
    r, hid = m.repo(need(d, "repo")), m.new_id()
    h = {"id": hid, "url": need(d, "url"), "events": d.get("events") or ["push"],
         "active": d.get("active", True), "created": int(time.time())}
    r["hooks"].append(h)
    return 201, hook_json(r, h, base)


@admin("POST /_fake/project")
def a_project(m, d, base):
    owner, number, pid = need(d, "owner"), int(need(d, "number")), m.new_id()
    o = m.users.get(owner.lower()) or m.add_user(owner, "Organization")
    kind = "orgs" if o["type"] == "Organization" else "users"
    p = {"id": f"PVT_kwDO{pid:08x}", "number": number, "title": d.get("title") or "Board",
         "owner": o["login"], "items": [], "options": [],
         "url": f"https://github.com/{kind}/{o['login']}/projects/{number}",
         "field": {"id": f"PVTSSF_lADO{pid:08x}", "name": d.get("field") or "Status"}}
    for n, name in enumerate(d.get("options") or []):
        oid = "opt" + hashlib.sha1(f"{pid}:{n}:{name}".encode()).hexdigest()[:4]
        while any(x["id"] == oid for x in p["options"]):
            oid += "x"
        p["options"].append({"id": oid, "name": name})
    m.projects[(o["login"].lower(), number)] = p
    return 201, {"id": p["id"], "number": number, "title": p["title"], "url": p["url"],
                 "field": {**p["field"], "options": p["options"]}}


def project_content(m, d):
    if d.get("draft"):
        return ("draft", d["draft"])
    r = m.repo(need(d, "repo"))
    i = m.issue(r, d["pull"], pull=True) if d.get("pull") is not None else \
        m.issue(r, need(d, "issue"))
    return ("pull" if i["pr"] else "issue", i["repo"], i["number"])


@admin("POST /_fake/project/items", "POST /_fake/project/status")
def a_project_items(m, d, base):
    if d.get("count") and d.get("draft"):
        p = m.project(need(d, "owner"), need(d, "number"))
        for n in range(int(d["count"])):
            m.add_item(p, ("draft", f"{d['draft']} {n}"))
        return 200, {"items": len(p["items"])}
    p, content = m.project(need(d, "owner"), need(d, "number")), project_content(m, d)
    status = m.option(p, d.get("status"))
    if d["_path"].endswith("/items"):
        it = m.add_item(p, content, archived=bool(d.get("archived")))
    else:
        it = next((x for x in p["items"] if x["content"] == content), None)
        if it is None:
            raise Fail(404, "not on the board")
    it["status"] = status
    return 200, {"id": it["id"], "status": d.get("status")}


@admin("GET /_fake/log")
def a_log(m, d, base):
    return 200, m.log


@admin("POST /_fake/log/reset")
def a_log_reset(m, d, base):
    m.log.clear()
    return 200, {"ok": True}


@admin("GET /_fake/stats")
def a_stats(m, d, base):
    budgets = {login: {res: {**b, "remaining": b["limit"] - b["used"]} for res, b in per.items()}
               for login, per in m.budgets.items()}
    return 200, {**json.loads(json.dumps(m.stats)), "budgets": budgets}


@admin("POST /_fake/stats/reset")
def a_stats_reset(m, d, base):
    m.reset_stats()
    return 200, {"ok": True}


@admin("POST /_fake/limit")
def a_limit(m, d, base):
    if need(d, "kind") not in ("secondary", "primary", "abuse429"):
        raise Fail(400, "kind must be secondary, primary or abuse429")
    m.limit = {"kind": d["kind"], "count": int(d.get("count", 1)),
               "seconds": int(d.get("seconds", 60))}
    return 200, m.limit


@admin("POST /_fake/link-base")
def a_link_base(m, d, base):
    m.link_base = d.get("base")
    return 200, {"base": m.link_base}


@admin("POST /_fake/budget")
def a_budget(m, d, base):
    b = m.budget(d.get("login") or "svc-bot", d.get("resource") or "core")
    if d.get("remaining") is not None:
        b["used"] = b["limit"] - int(d["remaining"])
    if d.get("reset_in") is not None:
        b["reset"] = int(time.time()) + int(d["reset_in"])
    return 200, {**b, "remaining": b["limit"] - b["used"]}


def admin_issue_view(m, path, base):
    parts = [unquote(x) for x in path.split("/")[3:]]
    if len(parts) != 3:
        raise Fail(404, "use /_fake/issue/{owner}/{repo}/{number}")
    r = m.repo(f"{parts[0]}/{parts[1]}")
    i = m.issue(r, parts[2])
    statuses = {f"{p['owner']}/{p['number']}": next(
        (o["name"] for o in p["options"] if o["id"] == it["status"]), None)
        for p in m.projects.values() for it in p["items"]
        if it["content"][1:] == (i["repo"], i["number"])}
    return 200, {"issue": m.issue_json(i, base),
                 "comments": [m.comment_json(r, c, base) for c in r["comments"]
                              if c["issue"] == i["number"]],
                 "project_status": next(iter(statuses.values()), None),
                 "project_statuses": statuses,
                 "blocked_by": [m.ref(m.by_key(k)) for k in i["blocked_by"]]}


# ---------------------------------------------------------------- serving

def rl_headers(b, res, remaining=None, reset=None):
    rem = b["limit"] - b["used"] if remaining is None else remaining
    return [("x-ratelimit-limit", str(b["limit"])), ("x-ratelimit-remaining", str(rem)),
            ("x-ratelimit-used", str(b["limit"] - rem)),
            ("x-ratelimit-reset", str(reset or b["reset"])), ("x-ratelimit-resource", res)]


def common_headers(m, tok):
    m.req_no += 1
    h = [JSON_CT, ("x-github-request-id", f"FAKE:{m.req_no:08X}"),
         ("x-github-media-type", "github.v3; format=json"),
         ("x-github-api-version-selected", "2022-11-28")]
    if tok and tok["scopes"] is not None:
        h.append(("x-oauth-scopes", tok["scopes"]))
    return h


FORBIDDEN_MESSAGE = "Resource not accessible by personal access token"


def may(tok, permission, level):
    """Whether a token has a fine-grained permission at `level` (classic tokens: always)."""
    have = (tok or {}).get("permissions")
    if have is None:
        return True
    got = have.get(permission)
    return got == "write" or (got == "read" and level == "read")


def route_permission(method, template):
    """The fine-grained permission a REST route needs, as GitHub names it (None: no check)."""
    if template is None or not template.startswith("/repos/"):
        return None
    level = "read" if method == "GET" else "write"
    if template == "/repos/{owner}/{repo}":
        return "metadata", level
    if template.endswith("/check-runs"):
        return "checks", level
    if template.endswith("/status"):
        return "statuses", level
    if template.endswith("/hooks"):
        return "repository_hooks", level
    if "/pulls" in template:
        return "pull_requests", level
    return "issues", level


def authorize(m, headers, res, doc):
    """-> (token, user, headers, budget, refusal): refusal is an answer to send instead."""
    parts = (headers.get("Authorization") or "").split(None, 1)
    tok = m.tokens.get(parts[1].strip()) if len(parts) == 2 and \
        parts[0].lower() in ("bearer", "token") else None
    if tok is None:
        anon = {"limit": 60, "used": 1, "reset": int(time.time()) + 3600}
        rl = rl_headers(anon, "core") if res == "core" else []
        return None, None, None, None, (401, common_headers(m, None) + rl,
                                        dumps(Fail(401, "Bad credentials", doc=doc).body))
    user = m.users[tok["login"].lower()]
    hdrs, b = common_headers(m, tok), m.budget(user["login"], res)
    kind, secs = m.take_limit()
    msg = f"API rate limit exceeded for user ID {user['id']}."
    refusal = None
    if kind == "primary" and res == "graphql":
        refusal = 200, rl_headers(b, res, 0, int(time.time()) + secs), \
            {"errors": [{"type": "RATE_LIMITED", "message": msg}]}
    elif kind == "primary":
        refusal = 403, rl_headers(b, res, 0, int(time.time()) + secs), \
            {"message": msg, "documentation_url": PRIMARY_DOC}
    elif kind:
        refusal = 403 if kind == "secondary" else 429, \
            rl_headers(b, res) + [("retry-after", str(secs))], SECONDARY
    elif b["used"] >= b["limit"] and res == "core":
        refusal = 403, rl_headers(b, res), {"message": msg, "documentation_url": PRIMARY_DOC}
    if refusal:
        refusal = refusal[0], hdrs + refusal[1], dumps(refusal[2])
    return tok, user, hdrs, b, refusal


def serve_rest(m, method, path, link_path, qlist, raw, headers, base):
    """-> (status, headers, body); runs under the model lock."""
    m.stats["rest"]["requests"] += 1
    fn, tmpl, params = None, None, {}
    for meth, rx, t, f in ROUTES:
        mo = rx.match(path)
        if mo:
            tmpl = tmpl or t
            if meth == method:
                fn, tmpl, params = f, t, {k: unquote(v) for k, v in mo.groupdict().items()}
                break
    key = f"{method} {tmpl or '(unknown)'}"
    m.stats["routes"][key] = m.stats["routes"].get(key, 0) + 1
    tok, user, hdrs, b, refusal = authorize(m, headers, "core", DOCS)
    if refusal:
        return refusal
    extra = []
    try:
        body = {}
        if fn is None:
            raise Fail(404, "Not Found")
        if method in ("POST", "PATCH", "PUT") and raw.strip():
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            if not isinstance(body, dict):
                raise Fail(400, "Problems parsing JSON")
        need_perm = route_permission(method, tmpl)
        if need_perm and not may(tok, *need_perm):
            extra = [("x-accepted-github-permissions", "%s=%s" % need_perm)]
            raise Fail(403, FORBIDDEN_MESSAGE, doc=DOCS + "/" + need_perm[0])
        c = Ctx(m=m, user=user, tok=tok, q=dict(qlist), qlist=qlist, body=body, base=base,
                link_path=link_path)
        if fn is rate_limit:
            return 200, hdrs + rl_headers(b, "core"), dumps(rate_limit(c)[1])
        status, obj, extra = fn(c, **params)
    except Fail as e:
        status, obj = e.status, e.body
    data = dumps(obj)
    if method == "GET" and status == 200:
        etag = 'W/"%s"' % hashlib.sha256(data).hexdigest()
        extra = extra + [("etag", etag), ("cache-control", "private, max-age=60, s-maxage=60"),
                         ("vary", "Accept, Authorization, Cookie, X-GitHub-OAuth-Scopes")]
        tags = [t.strip().removeprefix("W/") for t in headers.get("If-None-Match", "").split(",")]
        if "*" in tags or etag[2:] in tags:
            m.stats["rest"]["not_modified"] += 1
            return 304, [h for h in hdrs if h != JSON_CT] + rl_headers(b, "core") + extra, b""
    b["used"] += 1
    m.stats["rest"]["counted"] += 1
    return status, hdrs + rl_headers(b, "core") + extra, data


def serve_graphql(m, raw, headers):
    st = m.stats
    st["graphql"]["requests"] += 1
    st["routes"]["POST /graphql"] = st["routes"].get("POST /graphql", 0) + 1
    tok, user, hdrs, b, refusal = authorize(m, headers, "graphql",
                                            "https://docs.github.com/graphql")
    if refusal:
        return refusal
    rl = hdrs + rl_headers(b, "graphql")
    try:
        req = json.loads(raw)
        query, variables = req["query"], req.get("variables") or {}
        if isinstance(variables, str):
            variables = json.loads(variables) if variables.strip() else {}
        if not isinstance(query, str) or not isinstance(variables, dict):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        return 400, rl, dumps(Fail(400, "Problems parsing JSON").body)
    try:
        ops, frags = Parser(query).document()
    except GQLError as e:
        return 200, rl, dumps({"errors": [{"message": str(e)}]})
    op = next((o for o in ops if o["name"] == req.get("operationName")), ops[0])
    variables = {**op["defaults"], **variables}
    cost, _, node_count = (1, 1, 0) if op["type"] == "mutation" else \
        query_cost(op["sel"], frags, variables)
    if b["used"] + cost > b["limit"]:
        return 200, rl, dumps({"errors": [{"type": "RATE_LIMITED", "message":
                                           f"API rate limit exceeded for user ID {user['id']}."}]})
    b["used"] += cost
    st["graphql"]["points"] += cost
    ops_seen = st["graphql"]["operations"]
    ops_seen[op["name"]] = ops_seen.get(op["name"], 0) + 1
    handler = GQL_OPS.get(op["name"])
    try:
        if handler is None:
            raise GQLTop([{"message": "fake: unsupported operation"}])
        data, errors = handler(Gql(m, user, tok, variables, op, frags))
        if op["type"] == "query" and any(f["name"] == "rateLimit"
                                         for f in fields(op["sel"], frags)):
            data["rateLimit"] = {"cost": cost, "limit": b["limit"],
                                 "remaining": b["limit"] - b["used"], "used": b["used"],
                                 "resetAt": iso(b["reset"]), "nodeCount": node_count}
        out = {"data": data, "errors": errors} if errors else {"data": data}
    except GQLTop as e:
        out = {"errors": e.errors}
    return 200, hdrs + rl_headers(b, "graphql"), dumps(out)


def serve_admin(m, method, path, raw, base):
    try:
        if method == "GET" and path.startswith("/_fake/issue/"):
            status, obj = admin_issue_view(m, path, base)
        elif (method, path) not in ADMIN:
            raise Fail(404, f"no admin route {method} {path}")
        else:
            try:
                d = json.loads(raw) if raw.strip() else {}
            except ValueError:
                d = None
            if not isinstance(d, dict):
                raise Fail(400, "expected a JSON object")
            status, obj = ADMIN[(method, path)](m, {**d, "_method": method, "_path": path}, base)
    except Fail as e:
        status, obj = e.status, {"message": e.body["message"]}
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        status, obj = 400, {"message": f"bad admin request: {e!r}"}
    return status, [JSON_CT], dumps(obj)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as clients pool connections
    server_version, sys_version = "GitHub.com", ""

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):
        if VERBOSE:
            sys.stderr.write("fake_github: " + (fmt % args) + "\n")

    def serve(self):
        method, url = self.command, urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        if path.startswith("/api/v3/"):
            path = path[len("/api/v3"):]
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n).decode("utf-8", "replace") if n > 0 else ""
        base = "http://" + (self.headers.get("Host") or f"{HOST}:{self.server.server_port}")
        with M.lock:
            if path == "/_fake" or path.startswith("/_fake/"):
                status, hdrs, body = serve_admin(M, method, path, raw, base)
            elif path in ("/graphql", "/api/graphql") and method == "POST":
                status, hdrs, body = serve_graphql(M, raw, self.headers)
            else:
                status, hdrs, body = serve_rest(M, method, path, url.path,
                                                parse_qsl(url.query, keep_blank_values=True),
                                                raw, self.headers, M.link_base or base)
        self.send_response(status)
        for k, v in hdrs:
            self.send_header(k, v)
        if status != 304:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if status != 304:
            self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = serve


class Server(ThreadingHTTPServer):
    daemon_threads, allow_reuse_address, request_queue_size = True, True, 128


def watch_stdin():
    """Exit as soon as the parent's end of our stdin closes (the test dropped us)."""
    try:
        while sys.stdin.buffer.read(65536):
            pass
    except (OSError, ValueError):
        pass
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description="A fake GitHub API for svc's tests.")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ignore-stdin", action="store_true",
                    help="keep serving when stdin reaches EOF (for manual runs)")
    args = ap.parse_args()
    srv = Server((HOST, args.port), Handler)
    print(f"PORT {srv.server_port}", flush=True)
    if not args.ignore_stdin:
        threading.Thread(target=watch_stdin, daemon=True).start()
    try:
        srv.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
