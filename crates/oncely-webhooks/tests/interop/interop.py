"""Signs and verifies webhook deliveries with the providers' own libraries.

Run through scripts/webhook-interop.sh, which provides a venv with `standardwebhooks`
and `stripe`. Driven by the Rust test `interop` in tests/it/interop.rs.

    interop.py sign     prints {"standard": [...], "stripe": [...]}: deliveries signed
                        now by the official libraries, with fresh random secrets
    interop.py verify   reads [{"name", "scheme", "secret", "headers", "payload"}] on
                        stdin and prints [{"name", "ok", "error", "event_id"}]: what the
                        official libraries make of each (tolerance 5 minutes)
"""

import base64
import json
import secrets
import sys
import time
from datetime import datetime, timezone

import standardwebhooks
import stripe

PAYLOADS = [
    '{"test": 2432232314}',
    '{"id":"evt_1","object":"event","type":"invoice.paid","data":{"object":{"id":"in_1"}}}',
    '{"id":"evt_2","object":"event","note":"caf\u00e9 \u2603 \U0001F680","n":[1,2.5,null,true]}',
    '{"id":"evt_3","object":"event","blob":"' + "x" * 5000 + '"}',
    '{\n  "id": "evt_4",\n  "object": "event",\n  "spaced" :  "  keep my whitespace  "\n}\n',
]


def standard_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def stripe_secret() -> str:
    return "whsec_" + secrets.token_hex(16)


def sign() -> dict:
    now = int(time.time())
    standard = []
    for i, payload in enumerate(PAYLOADS):
        secret = standard_secret()
        if i == 0:
            # The library also takes a secret without its whsec_ prefix.
            secret = secret[len("whsec_"):]
        msg_id = f"msg_{secrets.token_hex(8)}"
        at = datetime.fromtimestamp(now, tz=timezone.utc)
        signature = standardwebhooks.Webhook(secret).sign(msg_id, at, payload)
        standard.append(
            {"secret": secret, "id": msg_id, "timestamp": now, "payload": payload,
             "signature": signature}
        )
    stripe_cases = []
    for payload in PAYLOADS[1:]:
        secret = stripe_secret()
        header = stripe.WebhookSignature.generate_signature_header(payload, secret, now)
        stripe_cases.append(
            {"secret": secret, "timestamp": now, "payload": payload, "header": header}
        )
    return {"standard": standard, "stripe": stripe_cases}


def verify_one(case: dict) -> dict:
    result = {"name": case["name"], "ok": False, "error": None, "event_id": None}
    try:
        if case["scheme"] == "standard":
            standardwebhooks.Webhook(case["secret"]).verify(
                case["payload"], case["headers"], json_parse=False
            )
            result["event_id"] = case["headers"].get("webhook-id")
        elif case["scheme"] == "stripe":
            event = stripe.Webhook.construct_event(
                case["payload"], case["headers"].get("Stripe-Signature"), case["secret"],
                tolerance=300,
            )
            result["event_id"] = event.id
        else:
            raise ValueError(f"unknown scheme {case['scheme']!r}")
        result["ok"] = True
    except (standardwebhooks.webhooks.WebhookVerificationError,
            stripe.SignatureVerificationError) as e:
        result["error"] = f"{type(e).__name__}: {e}"
    return result


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "sign":
        json.dump(sign(), sys.stdout)
    elif command == "verify":
        json.dump([verify_one(case) for case in json.load(sys.stdin)], sys.stdout)
    else:
        sys.exit("usage: interop.py sign|verify")


if __name__ == "__main__":
    main()
