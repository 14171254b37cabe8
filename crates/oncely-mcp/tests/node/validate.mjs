// Validates JSON-RPC messages oncely wrote with the official TypeScript SDK's own zod
// schemas (@modelcontextprotocol/sdk/types.js). The SDK models revisions up to
// 2025-11-25; a 2026-07-28 message is checked with the same schemas (what this SDK's
// client would parse it with).
//
// Run: node validate.mjs FILE   (the format of ../py/validate.py)
// Prints a JSON list of {name, era, ok, error}.

import { readFileSync } from "node:fs";
import {
  CallToolResultSchema,
  JSONRPCErrorResponseSchema,
  JSONRPCResultResponseSchema,
  ResultSchema,
} from "@modelcontextprotocol/sdk/types.js";

const items = JSON.parse(readFileSync(process.argv[2], "utf8"));
const out = items.map((item) => {
  const kind = item.kind ?? "tool_result";
  const checks =
    kind === "error"
      ? [[JSONRPCErrorResponseSchema, item.message]]
      : [
          [JSONRPCResultResponseSchema, item.message],
          // A result of the 2026-07-28 extensions is a Result to this SDK.
          [kind === "tool_result" ? CallToolResultSchema : ResultSchema, item.message.result],
        ];
  for (const [schema, value] of checks) {
    const r = schema.safeParse(value);
    if (!r.success) {
      return { name: item.name, era: item.era, ok: false, error: String(r.error) };
    }
  }
  return { name: item.name, era: item.era, ok: true };
});
console.log(JSON.stringify(out));
