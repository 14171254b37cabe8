"""A minimal stdio MCP server without an SDK, for `oncely mcp`'s wire tests: it answers
`initialize` with the revision it was asked for, lists two tools (`render`, paid, and
`lookup`, readOnlyHint), runs `tools/call` (appending one JSON line per execution to
the file named by argv[1], sleeping `arguments.seconds`, writing `arguments.spam`
notifications of 1 KB first), answers a JSON-RPC batch with a
batch, and asks the client for `roots/list` when a call's arguments say `"roots": true`.
Every message it reads is appended to argv[1] + ".in" (to check what reached it).
"""
import json
import sys
import threading
import time

log_path = sys.argv[1]
lock = threading.Lock()
count = 0
waiting = {}


def write(message):
    with lock:
        text = message if isinstance(message, str) else json.dumps(message)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def log(path, entry):
    with lock:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def answer(message):
    global count
    method = message.get("method")
    mid = message.get("id")
    params = message.get("params") or {}
    if method == "initialize":
        return {"jsonrpc": "2.0", "id": mid, "result": {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}}, "serverInfo": {"name": "wire", "version": "1"}}}
    if method == "tools/list":
        return {"jsonrpc": "2.0", "id": mid, "result": {"tools": [
            {"name": "render", "inputSchema": {"type": "object"}},
            {"name": "lookup", "inputSchema": {"type": "object"},
             "annotations": {"readOnlyHint": True}}]}}
    if method == "tools/call":
        args = params.get("arguments") or {}
        if args.get("roots"):
            event = threading.Event()
            waiting["roots-1"] = event
            write({"jsonrpc": "2.0", "id": "roots-1", "method": "roots/list"})
            event.wait(10)
        time.sleep(float(args.get("seconds", 0)))
        line = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                           "params": {"level": "info", "data": "x" * 1000}}) + "\n"
        for _ in range(int(args.get("spam", 0))):
            with lock:
                sys.stdout.write(line)
        sys.stdout.flush()
        with lock:
            count += 1
            n = count
        meta = params.get("_meta") or {}
        log(log_path, {"tool": params.get("name"), "args": args, "wire_id": mid,
                       "key": meta.get("dev.oncely/idempotency-key")})
        result = {"content": [{"type": "text", "text": f"{params.get('name')} #{n}"}]}
        if args.get("huge"):
            # A number past a double, as a server may write it.
            text = json.dumps({"jsonrpc": "2.0", "id": mid, "result": result})
            return text[:-2] + ', "structuredContent": {"n": 1e400}}}'
        return {"jsonrpc": "2.0", "id": mid, "result": result}
    if method == "ping":
        return {"jsonrpc": "2.0", "id": mid, "result": {}}
    if mid is not None and method is not None:
        return {"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no such method"}}
    return None


def handle(message):
    if isinstance(message, list):
        out = [a for a in (answer(m) for m in message) if a is not None]
        if out:
            write(out)
        return
    if "method" not in message and message.get("id") in waiting:
        log(log_path + ".in", {"response": message})
        waiting.pop(message["id"]).set()
        return
    a = answer(message)
    if a is not None:
        write(a)


for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    message = json.loads(line)
    log(log_path + ".in", message)
    threading.Thread(target=handle, args=(message,), daemon=True).start()
