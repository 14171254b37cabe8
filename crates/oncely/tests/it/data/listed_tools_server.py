"""A minimal stdio MCP server without an SDK, for the `oncely inventory` tests of key
arguments: it lists the tools of the JSON file named by argv[1] (a list of tool objects:
name, description, inputSchema, ...) and runs none (a `tools/call` is an error).
"""
import json
import sys

with open(sys.argv[1]) as f:
    tools = json.load(f)


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m.get("method") == "initialize":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "listed-tools", "version": "1"},
        }})
    elif m.get("method") == "tools/list":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"tools": tools}})
    else:
        send({"jsonrpc": "2.0", "id": m["id"], "error": {"code": -32601, "message": "lists only"}})
