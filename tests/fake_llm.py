#!/usr/bin/env python3
"""A fake model server for offline checks of the real ACP bridges (scripts/real-bridge-check).

It speaks just enough of two real APIs for a bridge to complete one turn that answers with a
short text and ends the turn, with no credentials and no traffic off the machine:

  POST <any prefix>/v1/messages               Anthropic Messages API: SSE when the request has
                                              "stream": true (claude-agent-acp's SDK always
                                              streams the real turn), else one JSON message
  POST <any prefix>/v1/messages/count_tokens  Anthropic token count
  POST <any prefix>/v1/responses              OpenAI Responses API: SSE when "stream" is true or
                                              the body cannot be read (codex always streams),
                                              else one JSON response
  GET  <any prefix>/v1/models                 an empty model list
  anything else                               404 with an error body in the Anthropic shape

Every answer is the same assistant text (--reply) with stop reason end_turn / status completed,
whatever the request asks for, so a bridge that tries to call a tool simply gets text back.

Usage: python3 tests/fake_llm.py [PORT] [--time-limit SECONDS] [--reply TEXT]
  PORT 0 (the default) picks a free port. When ready it prints "listening <port>" on stdout.
  One line per request goes to stderr ("fake_llm: POST /v1/messages model=... stream=...").
  It binds 127.0.0.1 only, and exits 0 by itself after --time-limit seconds (default 300), or
  at once on SIGTERM / SIGINT. Python standard library only.
"""

import argparse
import gzip
import json
import signal
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOST = "127.0.0.1"  # never anything else: this server must not be reachable from elsewhere
DEFAULT_REPLY = "hi from fake model"
MAX_BODY = 64 * 1024 * 1024  # a real turn's request is ~50 KB; refuse absurd sizes


def sse(events):
    """Server-sent events, one per dict, named by its "type" (both APIs do this)."""
    return "".join(
        f"event: {ev['type']}\ndata: {json.dumps(ev, separators=(',', ':'))}\n\n" for ev in events
    ).encode()


def anthropic_message(model, text):
    """The complete (non-streaming) Messages API answer."""
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def anthropic_stream(model, text):
    """The same answer as the Messages API streams it: start, one text block, delta, stop."""
    start = dict(anthropic_message(model, ""), content=[], stop_reason=None)
    return [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 1},
        },
        {"type": "message_stop"},
    ]


def openai_response(model, text, status="completed"):
    """A Responses API response object holding one assistant message."""
    item = {
        "type": "message",
        "id": "msg_fake",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return {
        "id": "resp_fake",
        "object": "response",
        "model": model,
        "status": status,
        "output": [item] if status == "completed" else [],
        "usage": {
            "input_tokens": 1,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 1,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 2,
        },
    }


def openai_stream(model, text):
    """The Responses API event stream codex reads: created, the item, its text, completed."""
    done = openai_response(model, text)
    item = done["output"][0]
    return [
        {"type": "response.created", "response": openai_response(model, text, "in_progress")},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": dict(item, status="in_progress", content=[]),
        },
        {
            "type": "response.output_text.delta",
            "item_id": item["id"],
            "output_index": 0,
            "content_index": 0,
            "delta": text,
        },
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": done},
    ]


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never keeps the process alive
    request_queue_size = 64


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    reply = DEFAULT_REPLY  # set from the command line

    def log_message(self, fmt, *args):  # the default access log is noise; see note()
        pass

    def note(self, text):
        sys.stderr.write(f"fake_llm: {text}\n")
        sys.stderr.flush()

    def send(self, code, ctype, body):
        """One complete answer; the connection is closed after it (clients reconnect)."""
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        if ctype == "text/event-stream":
            self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.close_connection = True

    def send_json(self, code, obj):
        self.send(code, "application/json", json.dumps(obj).encode())

    def not_found(self):
        self.send_json(404, {
            "type": "error",
            "error": {"type": "not_found_error", "message": f"fake_llm: no route {self.path}"},
        })

    def read_body(self):
        """The request body: Content-Length or chunked, gzip/deflate undone. None if unreadable."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raw = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():  # trailers
                        pass
                    break
                raw += self.rfile.read(size)
                self.rfile.readline()  # CRLF after each chunk
                if len(raw) > MAX_BODY:
                    return None
        else:
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                return None
            raw = self.rfile.read(n) if n > 0 else b""
        encoding = (self.headers.get("Content-Encoding") or "").lower()
        try:
            if encoding == "gzip":
                raw = gzip.decompress(raw)
            elif encoding == "deflate":
                raw = zlib.decompress(raw)
            elif encoding not in ("", "identity"):
                return None  # e.g. zstd: not in the standard library; answer with defaults
        except (OSError, zlib.error):
            return None
        return raw

    def do_HEAD(self):
        self.send(200, "text/plain", b"")

    def do_GET(self):
        self.note(f"GET {self.path}")
        if self.path.split("?")[0].rstrip("/").endswith("/models"):
            self.send_json(200, {"object": "list", "data": [], "models": [], "has_more": False})
        else:
            self.not_found()

    def do_POST(self):
        raw = self.read_body()
        req = {}
        if raw:
            try:
                parsed = json.loads(raw)
                req = parsed if isinstance(parsed, dict) else {}
            except ValueError:
                pass
        path = self.path.split("?")[0].rstrip("/")
        for needle in self.server.watch:
            if raw and needle.encode() in raw:
                self.note(f"saw {needle}")
        self.note(
            f"POST {self.path} model={req.get('model')} stream={req.get('stream')} "
            f"bytes={'unreadable' if raw is None else len(raw)}"
        )
        if path.endswith("/messages/count_tokens"):
            self.send_json(200, {"input_tokens": 1})
        elif path.endswith("/messages"):
            model = req.get("model") or "claude-fake"
            if req.get("stream"):
                self.send(200, "text/event-stream", sse(anthropic_stream(model, self.reply)))
            else:
                self.send_json(200, anthropic_message(model, self.reply))
        elif path.endswith("/responses"):
            model = req.get("model") or "gpt-fake"
            if raw is None or req.get("stream", True):
                self.send(200, "text/event-stream", sse(openai_stream(model, self.reply)))
            else:
                self.send_json(200, openai_response(model, self.reply))
        else:
            self.not_found()


def main():
    ap = argparse.ArgumentParser(description="Fake Anthropic / OpenAI model server on 127.0.0.1.")
    ap.add_argument("port", nargs="?", type=int, default=0, help="TCP port; 0 picks a free one")
    ap.add_argument("--time-limit", type=float, default=300.0,
                    help="exit after this many seconds (default 300)")
    ap.add_argument("--reply", default=DEFAULT_REPLY, help="the assistant text of every answer")
    ap.add_argument("--watch", action="append", default=[],
                    help="log `fake_llm: saw TEXT` when a request body contains TEXT (repeatable)")
    args = ap.parse_args()

    Handler.reply = args.reply
    srv = Server((HOST, args.port), Handler)
    srv.watch = args.watch
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=srv.serve_forever, args=(0.1,), name="serve", daemon=True).start()
    print(f"listening {srv.server_address[1]}", flush=True)

    if not stop.wait(args.time_limit):
        sys.stderr.write(f"fake_llm: time limit of {args.time_limit:g} s reached, exiting\n")
    srv.shutdown()
    srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
