#!/usr/bin/env python3
"""An ACP bridge that misbehaves on purpose, for svc's fault tests (tests/faults.rs).

It speaks ACP (JSON-RPC 2.0, one JSON object per line on stdio) well enough to get as far as
the fault it is told to commit. The fault is the first argument:

  crash-init        exit 7 when `initialize` arrives
  hang-init         never answer `initialize` (and send nothing)
  error-init        answer `initialize` with a JSON-RPC error
  crash-session     exit 8 when `session/new` arrives
  crash-mid-turn    stream three message chunks of the prompt's turn, then exit 9
  close-stdout      close stdout during the turn but keep running
  close-stdin-after-turn
                    finish the first turn after 1.5 s, then close stdin (svc's next write
                    fails) and keep running
  garbage           answer everything, but surround every answer with junk: text, binary,
                    JSON that is not an object, responses to ids never asked, a 17 MiB line
  flood             answer everything; the turn sends 20,000 updates and 5 MiB of stderr
  ok                behave

Every started bridge appends its pid to $FAULT_BRIDGE_PIDS, so tests can check none survives,
and each prompt's text (as one JSON string a line) to $FAULT_BRIDGE_PROMPTS when it is set.
"""

import json
import os
import sys
import time

FAULT = sys.argv[1] if len(sys.argv) > 1 else "ok"
out = sys.stdout.buffer


def send(obj):
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()


def junk():
    out.write(b"this is not json\n")
    out.write(b"\x00\xff\xfe binary \x80\x81\n")
    out.write(b"[1, 2, 3]\n")
    out.write(b"\"a string\"\n")
    out.write(b"{\"jsonrpc\": \"2.0\", \"id\": 987654, \"result\": {}}\n")
    out.write(b"{\"jsonrpc\": \"2.0\", \"method\": 42}\n")
    out.write(b"{truncated\n")
    out.write(b"\n\n")
    out.flush()


def huge_line():
    chunk = b"x" * (1 << 20)
    for _ in range(17):
        out.write(chunk)
    out.write(b"\n")
    out.flush()


def update(session, text):
    send({
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": session,
            "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}},
        },
    })


def main():
    pids = os.environ.get("FAULT_BRIDGE_PIDS")
    if pids:
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
    session = f"fault-{os.getpid()}"
    for raw in sys.stdin.buffer:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        method, rid = msg.get("method"), msg.get("id")
        if rid is None:
            continue
        if FAULT == "garbage":
            junk()
        if method == "initialize":
            if FAULT == "crash-init":
                sys.exit(7)
            if FAULT == "hang-init":
                while True:
                    time.sleep(3600)
            if FAULT == "error-init":
                send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": "bridge is misconfigured"}})
                continue
            if FAULT == "garbage":
                huge_line()
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": False, "mcpCapabilities": {"http": False}},
                "authMethods": [],
            }})
        elif method == "session/new":
            if FAULT == "crash-session":
                sys.exit(8)
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": session}})
        elif method == "session/prompt":
            prompts = os.environ.get("FAULT_BRIDGE_PROMPTS")
            if prompts:
                text = "".join(p.get("text", "") for p in msg.get("params", {}).get("prompt", []))
                with open(prompts, "a") as f:
                    f.write(json.dumps(text) + "\n")
            if FAULT == "close-stdin-after-turn":
                time.sleep(1.5)
                send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
                os.close(0)
                while True:
                    time.sleep(3600)
            if FAULT == "crash-mid-turn":
                for n in range(3):
                    update(session, f"chunk {n} ")
                sys.exit(9)
            if FAULT == "close-stdout":
                update(session, "closing stdout")
                os.close(1)
                while True:
                    time.sleep(3600)
            if FAULT == "flood":
                for n in range(20000):
                    update(session, f"flood {n} ")
                line = b"e" * 1023 + b"\n"
                for _ in range(5 * 1024):
                    sys.stderr.buffer.write(line)
                sys.stderr.flush()
            update(session, "done")
            if FAULT == "garbage":
                junk()
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found"}})


if __name__ == "__main__":
    main()
