"""Validates JSON-RPC messages oncely wrote with the official Python SDK's own wire types
(`mcp_types` of the `mcp` package: pydantic models generated from each revision's schema).

Run: validate.py FILE
  FILE: a JSON list of {"name": ..., "era": "2025-11-25"|"2026-07-28", "message": {...},
  "kind": "tool_result"|"error"|"task"|"get_task"|"cancel_task"|"update_task"|"discover"|
  "input_required"}.
Task results (kinds task, get_task, cancel_task, update_task) are also checked against the
published JSON Schema of the tasks extension (../schema/ext-tasks.schema.json:
CreateTaskResult, GetTaskResult, CancelTaskResult, UpdateTaskResult), a completed task's
`result` as a CallToolResult, and a failed task's `error` as a JSON-RPC error object.
Prints a JSON list of {"name", "era", "ok", "error"}.
"""

import json
import pathlib
import sys

import jsonschema

import pydantic
from mcp_types import _v2025_11_25 as v2025
from mcp_types import _v2026_07_28 as v2026


TASKS_SCHEMA = json.loads(
    (pathlib.Path(__file__).parent.parent / "schema" / "ext-tasks.schema.json").read_text(encoding="utf-8")
)
TASK_DEFS = {
    "task": "CreateTaskResult",
    "get_task": "GetTaskResult",
    "cancel_task": "CancelTaskResult",
    "update_task": "UpdateTaskResult",
}


def check_task(kind: str, result: dict) -> None:
    schema = dict(TASKS_SCHEMA)
    schema["$ref"] = "#/$defs/" + TASK_DEFS[kind]
    jsonschema.Draft202012Validator(schema).validate(result)


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
    elif kind == "discover":
        v2026.DiscoverResultResponse.model_validate(message)
    elif kind == "input_required":
        v2026.InputRequiredResult.model_validate(message["result"])
    else:
        types.Result.model_validate(message["result"])
        check_task(kind, message["result"])
        if kind == "get_task" and "result" in message["result"]:
            types.CallToolResult.model_validate(message["result"]["result"])
        if kind == "get_task" and "error" in message["result"]:
            types.JSONRPCErrorResponse.model_validate(
                {"jsonrpc": "2.0", "id": 0, "error": message["result"]["error"]}, strict=False
            )


def main() -> None:
    items = json.load(open(sys.argv[1], encoding="utf-8"))
    out = []
    for item in items:
        try:
            check(item)
            out.append({"name": item["name"], "era": item["era"], "ok": True})
        except (pydantic.ValidationError, jsonschema.ValidationError, KeyError, TypeError) as e:
            out.append({"name": item["name"], "era": item["era"], "ok": False, "error": str(e)})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
