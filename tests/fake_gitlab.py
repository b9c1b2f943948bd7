#!/usr/bin/env python3
"""A fake GitLab REST API v4 for the tests of svc's `gitlab` tracker.

It answers like gitlab.com's /api/v4 for the part of the API svc uses (shapes, status codes,
headers), keeps everything in memory behind one lock, and counts every request, so a test can
check behaviour and API economy alike. Standard library only.

Usage: python3 tests/fake_gitlab.py [--ignore-stdin]
  Binds 127.0.0.1 on a free port, prints `PORT <n>` on stdout and serves until killed or until
  its stdin reaches EOF.

Auth: `Authorization: Bearer <token>` or `PRIVATE-TOKEN: <token>`. `glpat-svc` is user svc-bot
(id 1) with scopes ["api"]; an unknown token gets 401 {"message": "401 Unauthorized"}.

Every API answer carries RateLimit-Limit (2000 a minute), RateLimit-Observed,
RateLimit-Remaining and RateLimit-Reset (the next minute), like gitlab.com. Lists are paginated by page (X-Page, X-Per-Page, X-Total,
X-Next-Page, and a Link header).

API (all under /api/v4; :id is a numeric id or the URL-encoded full path):
  GET  /user, /personal_access_tokens/self, /metadata
  GET  /projects/:id
  GET|POST /projects/:id/issues (state, labels, assignee_username, iids[], order_by, sort)
  GET|PUT  /projects/:id/issues/:iid (add_labels, remove_labels, labels, state_event, ...)
  GET|POST /projects/:id/issues/:iid/notes (GET sort, order_by)
  GET  /projects/:id/issues/:iid/links, /projects/:id/issues/:iid/closed_by
  GET  /projects/:id/labels, /projects/:id/members/all/:user_id
  GET  /projects/:id/events (action, after, sort)
  GET  /projects/:id/merge_requests (state), /projects/:id/merge_requests/:iid,
       .../merge_requests/:iid/closes_issues, .../approvals, .../reviewers
  GET  /projects/:id/pipelines (status, updated_after), /projects/:id/pipelines/:pid/jobs
       (scope[])

Admin API (JSON in and out, no auth, never counted or logged):
  POST /_fake/users {token?, username, bot?, access_level?: 30} (a member of every project)
  POST /_fake/projects {path, visibility?}
  POST /_fake/labels {project, name}
  POST /_fake/issues {project, title, description, labels, author, state?, count?} -> issue
       (count: that many, titled "<title> <i>"; the last is answered)
  POST /_fake/issues/update {project, iid, labels?, state?, description?} (a person's edit)
  POST /_fake/notes {project, issue | mr, author, body, system?, position?, created_at?, count?}
       -> note (count: that many; the last is answered)
  POST /_fake/links {project, iid, blocked_by} (a blocking link, with its system notes)
  POST /_fake/mrs {project, title, author, sha, closes: [iid], fork?} -> merge request
  POST /_fake/approvals {project, mr, user, approved}
  POST /_fake/reviewers {project, mr, user, state}
  POST /_fake/pipelines {project, sha, status, jobs: [{name, stage, status}], count?} -> pipeline
       (count: that many; the last is answered)
  POST /_fake/limit {count, retry_after}: the next `count` API requests get 429
  POST /_fake/redirect {to, count}: the next `count` API requests get 301 to `to` + the path
  POST /_fake/gate {method, path}: the next API request of `method` whose path (under /api/v4,
       no query) fully matches the regex `path` waits, unanswered, until POST /_fake/gate/open
       (a slow answer, as a busy GitLab gives); GET /_fake/gate -> {"waiting": n}
  GET  /_fake/issue/<url-encoded project>/<iid> -> the issue, its notes
  GET  /_fake/log: svc's writes in order ("PUT group/app#1 add_labels=... state_event=...",
       "NOTE group/app#1 <80 chars> by svc-bot", "CREATE group/app#3 by svc-bot")
  GET  /_fake/stats -> {requests, routes: {"GET /projects/:id/issues": n, ...}} (the open
       issue list apart from "GET /projects/:id/issues?iids[]" and "...?state=closed|all")
  POST /_fake/stats/reset
"""

import calendar
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, quote, unquote, urlsplit

HOST = "127.0.0.1"
LIMIT = 2000
LOCK = threading.RLock()


def now_iso(ts=None):
    ts = time.time() if ts is None else ts
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + ".%03dZ" % (int(ts * 1000) % 1000)


def parse_iso(s):
    s = s.replace("Z", "")
    frac = 0.0
    if "." in s:
        s, f = s.split(".", 1)
        frac = float("0." + f)
    tz = 0
    m = re.match(r"(.*)([+-]\d\d):?(\d\d)$", s)
    if m and len(s) > 19:
        s, h, mi = m.group(1), int(m.group(2)), int(m.group(3))
        tz = (abs(h) * 3600 + mi * 60) * (1 if h >= 0 else -1)
    return calendar.timegm(time.strptime(s, "%Y-%m-%dT%H:%M:%S")) + frac - tz


class Fail(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


class State:
    def __init__(self):
        self.users = {}      # username -> {id, username, name, bot, token, access}
        self.tokens = {}     # token -> username
        self.projects = {}   # path.lower() -> project
        self.next_id = 1000
        self.log = []
        self.stats = {"requests": 0, "routes": {}}
        self.limit = None    # {count, retry_after}
        self.redirect = None  # {to, count}
        self.window = [0, 0]  # [minute, requests in it]
        self.gate = None     # {method, path, open: threading.Event, waiting}
        self.add_user("svc-bot", token="glpat-svc", access=40)

    def new_id(self):
        self.next_id += 1
        return self.next_id

    def add_user(self, username, token=None, bot=False, access=30):
        u = self.users.get(username)
        if u is None:
            u = {"id": len(self.users) + 1, "username": username, "name": username.title(),
                 "bot": bot, "access": access}
            self.users[username] = u
        u["bot"], u["access"] = bot, access
        if token:
            u["token"] = token
            self.tokens[token] = username
        return u

    def user(self, username):
        return self.users.get(username) or self.add_user(username)

    def user_json(self, username):
        u = self.user(username)
        return {"id": u["id"], "username": u["username"], "name": u["name"], "state": "active",
                "avatar_url": None, "web_url": "https://gitlab.example/" + u["username"]}

    def add_project(self, path, visibility="private"):
        p = {"id": self.new_id(), "path": path, "visibility": visibility, "issues": {},
             "labels": [], "mrs": {}, "pipelines": [], "events": [], "next_iid": 1,
             "next_mr": 1}
        self.projects[path.lower()] = p
        return p

    def project(self, key):
        key = unquote(key)
        if key.isdigit():
            for p in self.projects.values():
                if p["id"] == int(key):
                    return p
        p = self.projects.get(key.lower())
        if p is None:
            raise Fail(404, "404 Project Not Found")
        return p

    def issue(self, p, iid):
        i = p["issues"].get(int(iid))
        if i is None:
            raise Fail(404, "404 Issue Not Found")
        return i

    def web(self, p):
        return "https://gitlab.example/" + p["path"]

    def issue_json(self, p, i):
        return {"id": i["id"], "iid": i["iid"], "project_id": p["id"], "title": i["title"],
                "description": i["description"], "state": i["state"],
                "created_at": i["created_at"], "updated_at": i["updated_at"],
                "closed_at": i.get("closed_at"), "labels": list(i["labels"]),
                "author": self.user_json(i["author"]),
                "assignees": [self.user_json(a) for a in i["assignees"]],
                "blocking_issues_count": sum(1 for l in i["links"] if l[1] == "blocks"),
                "web_url": "%s/-/issues/%d" % (self.web(p), i["iid"]),
                "references": {"short": "#%d" % i["iid"], "relative": "#%d" % i["iid"],
                               "full": "%s#%d" % (p["path"], i["iid"])}}

    def note_json(self, n):
        out = {"id": n["id"], "type": n["type"], "body": n["body"],
               "author": self.user_json(n["author"]), "created_at": n["created_at"],
               "updated_at": n["created_at"], "system": n["system"],
               "noteable_id": n["noteable_id"], "noteable_type": n["noteable_type"],
               "noteable_iid": n["noteable_iid"], "resolvable": False}
        if n.get("position"):
            out["position"] = n["position"]
        return out

    def mr_json(self, p, m, full=False):
        out = {"id": m["id"], "iid": m["iid"], "project_id": p["id"], "title": m["title"],
               "state": m["state"], "created_at": m["created_at"], "updated_at": m["updated_at"],
               "author": self.user_json(m["author"]), "sha": m["sha"],
               "source_project_id": m["source_project_id"], "target_project_id": p["id"],
               "source_branch": m["branch"], "target_branch": "main",
               "web_url": "%s/-/merge_requests/%d" % (self.web(p), m["iid"]),
               "references": {"full": "%s!%d" % (p["path"], m["iid"])}}
        if full:
            head = None
            for pl in p["pipelines"]:
                if pl["sha"] == m["sha"]:
                    head = {"id": pl["id"], "sha": pl["sha"], "status": pl["status"],
                            "web_url": "%s/-/pipelines/%d" % (self.web(p), pl["id"])}
            out["head_pipeline"] = head
        return out

    def touch(self, obj):
        obj["updated_at"] = now_iso()

    def add_note(self, p, target, kind, author, body, system=False, position=None):
        n = {"id": self.new_id(), "type": "DiffNote" if position else None, "body": body,
             "author": author, "created_at": now_iso(), "system": system,
             "noteable_id": target["id"], "noteable_type": kind, "noteable_iid": target["iid"],
             "position": position}
        target["notes"].append(n)
        self.touch(target)
        if not system:
            p["events"].append({"id": self.new_id(), "project_id": p["id"],
                                "action_name": "commented on", "target_id": n["id"],
                                "target_iid": n["id"], "target_type": n["type"] or "Note",
                                "target_title": target["title"], "created_at": n["created_at"],
                                "author": self.user_json(author), "author_username": author,
                                "note": n})
        return n


S = State()


def paginate(h, items, query):
    per = max(1, min(100, int(query.get("per_page", 20))))
    page = max(1, int(query.get("page", 1)))
    chunk = items[(page - 1) * per: page * per]
    total_pages = max(1, (len(items) + per - 1) // per)
    h.extra = [("X-Page", str(page)), ("X-Per-Page", str(per)), ("X-Total", str(len(items))),
               ("X-Total-Pages", str(total_pages)),
               ("X-Next-Page", str(page + 1) if page < total_pages else ""),
               ("X-Prev-Page", str(page - 1) if page > 1 else "")]
    if page < total_pages:
        q = dict(query)
        q["page"] = str(page + 1)
        url = "http://%s:%d%s?%s" % (HOST, h.server.server_port, h.path_only,
                                    "&".join("%s=%s" % (k, quote(v, safe="")) for k, v in q.items()))
        h.extra.append(("Link", '<%s>; rel="next"' % url))
    return chunk


def api(h, method, path, query, multi, body, user):
    m = re.fullmatch(r"/projects/([^/]+)(/.*)?", path)
    if path == "/user":
        return h.route("GET /user", S.user_json(user))
    if path == "/personal_access_tokens/self":
        u = S.user(user)
        return h.route("GET /personal_access_tokens/self",
                       {"id": 1, "name": "svc", "revoked": False, "active": True,
                        "scopes": u.get("scopes", ["api"]), "user_id": u["id"],
                        "expires_at": None})
    if path == "/metadata":
        return h.route("GET /metadata", {"version": "17.6.0-ee", "revision": "x",
                                         "enterprise": True, "kas": {"enabled": False}})
    if not m:
        raise Fail(404, "404 Not Found")
    p = S.project(m.group(1))
    rest = m.group(2) or ""
    if rest == "" and method == "GET":
        u = S.user(user)
        return h.route("GET /projects/:id", {
            "id": p["id"], "path_with_namespace": p["path"], "visibility": p["visibility"],
            "issues_enabled": True, "web_url": S.web(p),
            "permissions": {"project_access": {"access_level": u["access"]},
                            "group_access": None}})
    if rest == "/issues" and method == "GET":
        items = sorted(p["issues"].values(), key=lambda i: i["iid"])
        state = query.get("state", "all")
        if state in ("opened", "closed"):
            items = [i for i in items if i["state"] == state]
        if query.get("labels"):
            want = query["labels"].split(",")
            items = [i for i in items if all(w in i["labels"] for w in want)]
        if query.get("assignee_username"):
            items = [i for i in items if query["assignee_username"] in i["assignees"]]
        iids = [int(x) for x in multi.get("iids[]", [])]
        if iids:
            items = [i for i in items if i["iid"] in iids]
        key = query.get("order_by", "created_at")
        items.sort(key=lambda i: (i[key] if key in i else i["iid"], i["iid"]),
                   reverse=query.get("sort", "desc") == "desc")
        # Counted apart: the open list (one a poll), reads by iids[], closed lists.
        name = ("GET /projects/:id/issues?iids[]" if iids else
                "GET /projects/:id/issues?state=%s" % state if state != "opened" else
                "GET /projects/:id/issues")
        return h.route(name, [S.issue_json(p, i) for i in paginate(h, items, query)])
    if rest == "/issues" and method == "POST":
        iid = p["next_iid"]
        p["next_iid"] += 1
        labels = [l for l in (body.get("labels") or "").split(",") if l]
        i = {"id": S.new_id(), "iid": iid, "title": body.get("title", ""),
             "description": body.get("description", ""), "state": "opened",
             "created_at": now_iso(), "updated_at": now_iso(), "labels": labels,
             "author": user, "assignees": [], "links": [], "notes": []}
        p["issues"][iid] = i
        S.log.append("CREATE %s#%d by %s" % (p["path"], iid, user))
        return h.route("POST /projects/:id/issues", S.issue_json(p, i), 201)
    mi = re.fullmatch(r"/issues/(\d+)(/.*)?", rest)
    if mi:
        i = S.issue(p, mi.group(1))
        sub = mi.group(2) or ""
        ref = "%s#%d" % (p["path"], i["iid"])
        if sub == "" and method == "GET":
            return h.route("GET /projects/:id/issues/:iid", S.issue_json(p, i))
        if sub == "" and method == "PUT":
            parts = []
            if "labels" in body:
                i["labels"] = [l for l in body["labels"].split(",") if l]
                parts.append("labels=%s" % body["labels"])
            if body.get("remove_labels"):
                rm = body["remove_labels"].split(",")
                i["labels"] = [l for l in i["labels"] if l not in rm]
                parts.append("remove_labels=%s" % body["remove_labels"])
            if body.get("add_labels"):
                for l in body["add_labels"].split(","):
                    if l not in i["labels"]:
                        i["labels"].append(l)
                parts.append("add_labels=%s" % body["add_labels"])
            ev = body.get("state_event")
            if ev == "close":
                i["state"], i["closed_at"] = "closed", now_iso()
            elif ev == "reopen":
                i["state"], i["closed_at"] = "opened", None
            if ev:
                parts.append("state_event=%s" % ev)
            S.touch(i)
            S.log.append("PUT %s %s by %s" % (ref, " ".join(parts), user))
            return h.route("PUT /projects/:id/issues/:iid", S.issue_json(p, i))
        if sub == "/notes" and method == "GET":
            notes = sorted(i["notes"], key=lambda n: n["created_at"],
                           reverse=query.get("sort", "desc") == "desc")
            return h.route("GET /projects/:id/issues/:iid/notes",
                           [S.note_json(n) for n in paginate(h, notes, query)])
        if sub == "/notes" and method == "POST":
            n = S.add_note(p, i, "Issue", user, body.get("body", ""))
            S.log.append("NOTE %s %s by %s" % (ref, body.get("body", "")[:80], user))
            return h.route("POST /projects/:id/issues/:iid/notes", S.note_json(n), 201)
        if sub == "/links" and method == "GET":
            out = []
            for other_iid, link_type, link_id in i["links"]:
                o = S.issue(p, other_iid)
                j = S.issue_json(p, o)
                j.update(issue_link_id=link_id, link_type=link_type,
                         link_created_at=o["created_at"], link_updated_at=o["created_at"])
                out.append(j)
            return h.route("GET /projects/:id/issues/:iid/links", out)
        if sub == "/closed_by" and method == "GET":
            out = [S.mr_json(p, mr) for mr in p["mrs"].values() if i["iid"] in mr["closes"]]
            return h.route("GET /projects/:id/issues/:iid/closed_by", out)
    if rest == "/labels" and method == "GET":
        items = [{"id": n + 1, "name": l, "color": "#1f75cb"} for n, l in enumerate(p["labels"])]
        return h.route("GET /projects/:id/labels", paginate(h, items, query))
    mm = re.fullmatch(r"/members/all/(\d+)", rest)
    if mm and method == "GET":
        for u in S.users.values():
            if u["id"] == int(mm.group(1)) and u["access"] > 0:
                j = S.user_json(u["username"])
                j["access_level"] = u["access"]
                return h.route("GET /projects/:id/members/all/:user_id", j)
        h.route("GET /projects/:id/members/all/:user_id", None)
        raise Fail(404, "404 Not found")
    if rest == "/events" and method == "GET":
        items = [e for e in p["events"] if query.get("action") in (None, "commented")]
        if query.get("after"):
            day_end = parse_iso(query["after"] + "T00:00:00") + 86400
            items = [e for e in items if parse_iso(e["created_at"]) >= day_end]
        items.sort(key=lambda e: e["id"], reverse=query.get("sort", "desc") == "desc")
        out = []
        for e in paginate(h, items, query):
            e = dict(e)
            e["note"] = S.note_json(e["note"])
            out.append(e)
        return h.route("GET /projects/:id/events", out)
    if rest == "/merge_requests" and method == "GET":
        items = list(p["mrs"].values())
        if query.get("state") in ("opened", "closed", "merged"):
            items = [x for x in items if x["state"] == query["state"]]
        items.sort(key=lambda x: x["updated_at"], reverse=True)
        return h.route("GET /projects/:id/merge_requests",
                       [S.mr_json(p, x) for x in paginate(h, items, query)])
    mr_match = re.fullmatch(r"/merge_requests/(\d+)(/.*)?", rest)
    if mr_match and method == "GET":
        mr = p["mrs"].get(int(mr_match.group(1)))
        if mr is None:
            raise Fail(404, "404 Not found")
        sub = mr_match.group(2) or ""
        if sub == "":
            return h.route("GET /projects/:id/merge_requests/:iid", S.mr_json(p, mr, True))
        if sub == "/closes_issues":
            return h.route("GET /projects/:id/merge_requests/:iid/closes_issues",
                           [S.issue_json(p, S.issue(p, n)) for n in mr["closes"]])
        if sub == "/approvals":
            return h.route("GET /projects/:id/merge_requests/:iid/approvals", {
                "id": mr["id"], "iid": mr["iid"], "project_id": p["id"],
                "approved": bool(mr["approved_by"]),
                "approved_by": [{"user": S.user_json(u)} for u in mr["approved_by"]]})
        if sub == "/reviewers":
            return h.route("GET /projects/:id/merge_requests/:iid/reviewers",
                           [{"user": S.user_json(u), "state": s, "created_at": mr["created_at"]}
                            for u, s in mr["reviewers"].items()])
    if rest == "/pipelines" and method == "GET":
        items = list(p["pipelines"])
        if query.get("status"):
            items = [x for x in items if x["status"] == query["status"]]
        if query.get("updated_after"):
            t = parse_iso(query["updated_after"])
            items = [x for x in items if parse_iso(x["updated_at"]) > t]
        items.sort(key=lambda x: x["updated_at"], reverse=True)
        return h.route("GET /projects/:id/pipelines", [
            {"id": x["id"], "iid": x["id"], "project_id": p["id"], "sha": x["sha"],
             "ref": "feature", "status": x["status"], "source": "merge_request_event",
             "created_at": x["created_at"], "updated_at": x["updated_at"],
             "web_url": "%s/-/pipelines/%d" % (S.web(p), x["id"])}
            for x in paginate(h, items, query)])
    mp = re.fullmatch(r"/pipelines/(\d+)/jobs", rest)
    if mp and method == "GET":
        pl = next((x for x in p["pipelines"] if x["id"] == int(mp.group(1))), None)
        if pl is None:
            raise Fail(404, "404 Not found")
        scopes = multi.get("scope[]", [])
        jobs = [j for j in pl["jobs"] if not scopes or j["status"] in scopes]
        return h.route("GET /projects/:id/pipelines/:pipeline_id/jobs", [
            {"id": j["id"], "name": j["name"], "stage": j["stage"], "status": j["status"],
             "web_url": "%s/-/jobs/%d" % (S.web(p), j["id"])} for j in jobs])
    raise Fail(404, "404 Not Found")


def admin(h, method, path, body):
    if path == "/_fake/gate" and method == "GET":
        return {"waiting": S.gate["waiting"] if S.gate else 0}
    if path == "/_fake/gate/open":
        if S.gate:
            S.gate["open"].set()
            S.gate = None
        return {}
    if path == "/_fake/gate":
        S.gate = {"method": body["method"], "path": body["path"], "open": threading.Event(),
                  "waiting": 0, "armed": True}
        return {}
    if path == "/_fake/log":
        return list(S.log)
    if path == "/_fake/stats":
        return S.stats
    if path == "/_fake/stats/reset":
        S.stats = {"requests": 0, "routes": {}, "failed": {}}
        return {}
    if path.startswith("/_fake/issue/"):
        proj, iid = path[len("/_fake/issue/"):].rsplit("/", 1)
        p = S.project(proj)
        i = S.issue(p, iid)
        return {"issue": S.issue_json(p, i), "notes": [S.note_json(n) for n in i["notes"]]}
    d = body or {}
    if path == "/_fake/users":
        u = S.add_user(d["username"], d.get("token"), d.get("bot", False),
                       d.get("access_level", 30))
        if "scopes" in d:
            u["scopes"] = d["scopes"]
        return S.user_json(u["username"])
    if path == "/_fake/projects":
        p = S.add_project(d["path"], d.get("visibility", "private"))
        return {"id": p["id"], "path_with_namespace": p["path"]}
    if path == "/_fake/labels":
        S.project(d["project"])["labels"].append(d["name"])
        return {}
    if path == "/_fake/limit":
        S.limit = {"count": d["count"], "retry_after": d.get("retry_after", 1)}
        return {}
    if path == "/_fake/redirect":
        S.redirect = {"to": d["to"], "count": d["count"]}
        return {}
    p = S.project(d["project"])
    if path == "/_fake/issues":
        for n in range(d.get("count", 1)):
            iid = p["next_iid"]
            p["next_iid"] += 1
            title = d["title"] if "count" not in d else "%s %d" % (d["title"], n + 1)
            i = {"id": S.new_id(), "iid": iid, "title": title,
                 "description": d.get("description", ""), "state": d.get("state", "opened"),
                 "created_at": now_iso(), "updated_at": now_iso(),
                 "labels": list(d.get("labels", [])), "author": d.get("author", "alice"),
                 "assignees": d.get("assignees", []), "links": [], "notes": []}
            p["issues"][iid] = i
        return S.issue_json(p, i)
    if path == "/_fake/issues/update":
        i = S.issue(p, d["iid"])
        for k in ("labels", "state", "description", "title"):
            if k in d:
                i[k] = d[k]
        S.touch(i)
        return S.issue_json(p, i)
    if path == "/_fake/notes":
        if "mr" in d:
            target, kind = p["mrs"][int(d["mr"])], "MergeRequest"
        else:
            target, kind = S.issue(p, d["issue"]), "Issue"
        for _ in range(d.get("count", 1)):
            n = S.add_note(p, target, kind, d["author"], d["body"], d.get("system", False),
                           d.get("position"))
        if "created_at" in d:
            n["created_at"] = d["created_at"]  # the note's own; its event keeps the real one
        return S.note_json(n)
    if path == "/_fake/links":
        i, b = S.issue(p, d["iid"]), S.issue(p, d["blocked_by"])
        link = S.new_id()
        i["links"].append((b["iid"], "is_blocked_by", link))
        b["links"].append((i["iid"], "blocks", link))
        S.add_note(p, i, "Issue", "alice", "marked this issue as blocked by #%d" % b["iid"], True)
        S.add_note(p, b, "Issue", "alice", "marked this issue as blocking #%d" % i["iid"], True)
        return {}
    if path == "/_fake/mrs":
        iid = p["next_mr"]
        p["next_mr"] += 1
        mr = {"id": S.new_id(), "iid": iid, "title": d["title"], "state": "opened",
              "created_at": now_iso(), "updated_at": now_iso(), "author": d["author"],
              "sha": d["sha"], "closes": d.get("closes", []), "branch": "feature-%d" % iid,
              "source_project_id": p["id"] + (7 if d.get("fork") else 0),
              "approved_by": [], "reviewers": {}, "notes": []}
        p["mrs"][iid] = mr
        return S.mr_json(p, mr)
    if path == "/_fake/approvals":
        mr = p["mrs"][int(d["mr"])]
        if d.get("approved", True):
            mr["approved_by"].append(d["user"])
            S.add_note(p, mr, "MergeRequest", d["user"], "approved this merge request", True)
        else:
            mr["approved_by"].remove(d["user"])
            S.add_note(p, mr, "MergeRequest", d["user"], "unapproved this merge request", True)
        return {}
    if path == "/_fake/reviewers":
        mr = p["mrs"][int(d["mr"])]
        mr["reviewers"][d["user"]] = d["state"]
        if d["state"] == "requested_changes":
            S.add_note(p, mr, "MergeRequest", d["user"], "requested changes", True)
        else:
            S.touch(mr)
        return {}
    if path == "/_fake/pipelines":
        for _ in range(d.get("count", 1)):
            pl = {"id": S.new_id(), "sha": d["sha"], "status": d["status"],
                  "created_at": now_iso(), "updated_at": now_iso(),
                  "jobs": [dict(j, id=S.new_id()) for j in d.get("jobs", [])]}
            p["pipelines"].append(pl)
        return {"id": pl["id"]}
    raise Fail(404, "no such admin route")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def route(self, name, value, status=200):
        S.stats["routes"][name] = S.stats["routes"].get(name, 0) + 1
        return status, value

    def send(self, status, value, headers=()):
        data = b"" if value is None and status == 204 else json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def handle_any(self, method):
        split = urlsplit(self.path)
        self.path_only = split.path
        pairs = parse_qsl(split.query, keep_blank_values=True)
        query = dict(pairs)
        multi = {}
        for k, v in pairs:
            multi.setdefault(k, []).append(v)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        self.extra = []
        gate = None
        with LOCK:
            g = S.gate
            if (g and g["armed"] and method == g["method"] and split.path.startswith("/api/v4/")
                    and re.fullmatch(g["path"], split.path[len("/api/v4"):])):
                g["armed"], g["waiting"], gate = False, 1, g["open"]
        if gate is not None:
            gate.wait()
        with LOCK:
            try:
                if split.path.startswith("/_fake/"):
                    return self.send(200, admin(self, method, split.path, body))
                if not split.path.startswith("/api/v4/"):
                    raise Fail(404, "404 Not Found")
                path = split.path[len("/api/v4"):]
                S.stats["requests"] += 1
                if S.redirect and S.redirect["count"] > 0:
                    S.redirect["count"] -= 1
                    target = S.redirect["to"].rstrip("/") + self.path
                    return self.send(301, {"message": "moved"}, [("Location", target)])
                auth = self.headers.get("Authorization", "")
                token = auth[7:] if auth.startswith("Bearer ") else self.headers.get("PRIVATE-TOKEN", "")
                user = S.tokens.get(token)
                if user is None:
                    raise Fail(401, "401 Unauthorized")
                # A budget of LIMIT requests a minute, as gitlab.com counts them.
                minute = int(time.time()) // 60
                if S.window[0] != minute:
                    S.window = [minute, 0]
                S.window[1] += 1
                reset = str((minute + 1) * 60)
                observed = S.window[1]
                limits = [("RateLimit-Limit", str(LIMIT)),
                          ("RateLimit-Observed", str(observed)),
                          ("RateLimit-Remaining", str(max(0, LIMIT - observed))),
                          ("RateLimit-Reset", reset)]
                if S.limit and S.limit["count"] > 0:
                    S.limit["count"] -= 1
                    return self.send(429, {"message": "Retry later"},
                                     limits + [("Retry-After", str(S.limit["retry_after"]))])
                status, value = api(self, method, path, query, multi, body, user)
                return self.send(status, value, limits + self.extra)
            except Fail as e:
                S.stats.setdefault("failed", {})
                key = "%d %s %s" % (e.status, method, split.path)
                S.stats["failed"][key] = S.stats["failed"].get(key, 0) + 1
                return self.send(e.status, {"message": e.message})
            except (KeyError, ValueError, TypeError) as e:
                return self.send(400, {"error": "bad request: %s" % e})

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_PUT(self):
        self.handle_any("PUT")

    def do_DELETE(self):
        self.handle_any("DELETE")


def main():
    server = ThreadingHTTPServer((HOST, 0), Handler)
    server.daemon_threads = True
    print("PORT %d" % server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if "--ignore-stdin" in sys.argv:
        threading.Event().wait()
    else:
        sys.stdin.read()


if __name__ == "__main__":
    main()
