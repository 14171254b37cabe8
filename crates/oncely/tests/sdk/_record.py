"""Shared by the SDK client scripts: what each HTTP attempt looked like, and one result
per call, printed as one JSON line.

The scripts are run by crates/oncely/tests/it/sdk_clients.rs with the venv that
crates/oncely/tests/setup.sh makes; each reads a JSON plan from argv[1]:
{"calls": [{...}, ...]} and prints {"sdk", "version", "results": [...]}.
"""

import json
import sys
import traceback

# The headers of an answer that the tests look at.
HEADERS = (
    "oncely-status",
    "oncely-problem",
    "x-should-retry",
    "stripe-should-retry",
    "idempotent-replayed",
    "content-type",
)


def attempt_of(headers_in):
    """What the request of one attempt carried that the tests look at."""
    content_type = headers_in.get("content-type") or ""
    boundary = None
    if "boundary=" in content_type:
        boundary = content_type.split("boundary=", 1)[1].strip('"')
    return {
        "idempotency_key": headers_in.get("idempotency-key"),
        "content_type": content_type.split(";", 1)[0] or None,
        "boundary": boundary,
        "retry_count": headers_in.get("x-stainless-retry-count"),
    }


def answer_into(record, status, headers):
    record["status"] = status
    for name in HEADERS:
        value = headers.get(name)
        if value is not None:
            record[name] = value


def plan():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} PLAN_JSON")
    return json.loads(sys.argv[1])


def run(sdk, version, calls, one):
    """Runs `one(call)` for each call of the plan; `one` returns a dict (the result).
    An exception a call did not expect becomes {"harness_error": ...} so that the test
    shows it instead of a missing line."""
    results = []
    for call in calls:
        try:
            results.append(one(call))
        except Exception as e:  # noqa: BLE001 - reported to the test as data
            results.append(
                {
                    "harness_error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc(),
                }
            )
    print(json.dumps({"sdk": sdk, "version": version, "results": results}))
