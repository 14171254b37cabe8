"""Validates JSON-RPC messages oncely wrote with the official Python SDK's own wire types
(`mcp_types` of the `mcp` package: pydantic models generated from each revision's schema).

Run: validate.py FILE
  FILE: a JSON list of {"name": ..., "era": "2025-11-25"|"2026-07-28", "message": {...},
  "kind": "tool_result"|"error"|"task"|"get_task"|"cancel_task"}.
Prints a JSON list of {"name", "era", "ok", "error"}.
"""

import json
import sys

import pydantic
from mcp_types import _v2025_11_25 as v2025
from mcp_types import _v2026_07_28 as v2026


def check(item: dict) -> None:
    types = v2026 if item["era"] == "2026-07-28" else v2025
    message = item["message"]
    kind = item.get("kind", "tool_result")
    if kind == "error":
        types.JSONRPCErrorResponse.model_validate(message, strict=False)
        return
    types.JSONRPCResultResponse.model_validate(message)
    if kind == "tool_result":
        types.CallToolResult.model_validate(message["result"])
        if types is v2026:
            types.CallToolResultResponse.model_validate(message)
    else:
        # Tasks-extension results: at least a valid Result of the revision.
        types.Result.model_validate(message["result"])


def main() -> None:
    items = json.load(open(sys.argv[1], encoding="utf-8"))
    out = []
    for item in items:
        try:
            check(item)
            out.append({"name": item["name"], "era": item["era"], "ok": True})
        except (pydantic.ValidationError, KeyError, TypeError) as e:
            out.append({"name": item["name"], "era": item["era"], "ok": False, "error": str(e)})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
