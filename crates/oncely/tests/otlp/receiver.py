"""An OTLP receiver for oncely's telemetry tests: the collector side of the protocol,
built on the opentelemetry-proto messages and grpcio (no code of oncely's).

It serves OTLP/gRPC (TraceService, MetricsService) and OTLP/HTTP (any POST path; protobuf
or JSON bodies, gzip or not) on 127.0.0.1, and appends one JSON line per export to OUT:

    {"signal": "traces" | "metrics", "transport": "grpc" | "http", "path": ...,
     "content_type": ..., "content_encoding": ..., "headers": {name: value},
     "raw": base64 of the bytes as they arrived (HTTP) or as decoded (gRPC),
     "body": base64 of the request re-encoded as protobuf}

so that the Rust tests decode every export with one set of types, whatever it came as.
When both ports are bound it writes {"grpc": PORT, "http": PORT} to READY.

    python receiver.py --out OUT --ready READY [--mode ok|refuse|hang] [--forever]

--mode refuse answers every export with an error (HTTP 503, gRPC UNAVAILABLE); --mode
hang never answers (a collector that accepts and stalls).
"""

import argparse
import base64
import gzip
import json
import re
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)

LOCK = threading.Lock()
ARGS = None
HEX = re.compile(r"^[0-9a-fA-F]*$")
ID_KEYS = {"traceId", "spanId", "parentSpanId"}


def record(signal, transport, path, content_type, encoding, headers, raw, message):
    line = json.dumps(
        {
            "signal": signal,
            "transport": transport,
            "path": path,
            "content_type": content_type,
            "content_encoding": encoding,
            "headers": headers,
            "raw": base64.b64encode(raw).decode(),
            "body": base64.b64encode(message.SerializeToString()).decode(),
        }
    )
    with LOCK:
        with open(ARGS.out, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def stall():
    # A collector that took the connection and never answers.
    time.sleep(3600)


def hex_ids_to_base64(value):
    """OTLP/JSON writes trace and span ids as hex (not protobuf JSON's base64)."""
    if isinstance(value, dict):
        return {
            k: (
                base64.b64encode(bytes.fromhex(v)).decode()
                if k in ID_KEYS and isinstance(v, str) and HEX.match(v)
                else hex_ids_to_base64(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [hex_ids_to_base64(v) for v in value]
    return value


class Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        return grpc_export("traces", request, context, trace_service_pb2.ExportTraceServiceResponse)


class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def Export(self, request, context):
        return grpc_export(
            "metrics", request, context, metrics_service_pb2.ExportMetricsServiceResponse
        )


def grpc_export(signal, request, context, response):
    if ARGS.mode == "hang":
        stall()
    headers = {k.lower(): v for k, v in context.invocation_metadata() if isinstance(v, str)}
    raw = request.SerializeToString()
    record(signal, "grpc", "", "application/grpc", headers.get("grpc-encoding", ""), headers, raw, request)
    if ARGS.mode == "refuse":
        context.abort(grpc.StatusCode.UNAVAILABLE, "refusing on purpose")
    return response()


class Http(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        raw = self.rfile.read(length)
        if ARGS.mode == "hang":
            stall()
        encoding = self.headers.get("content-encoding", "")
        body = gzip.decompress(raw) if encoding == "gzip" else raw
        content_type = self.headers.get("content-type", "")
        signal = "metrics" if "metrics" in self.path else "traces"
        if signal == "metrics":
            message = metrics_service_pb2.ExportMetricsServiceRequest()
            answer = metrics_service_pb2.ExportMetricsServiceResponse()
        else:
            message = trace_service_pb2.ExportTraceServiceRequest()
            answer = trace_service_pb2.ExportTraceServiceResponse()
        try:
            if content_type.startswith("application/json"):
                json_format.ParseDict(hex_ids_to_base64(json.loads(body)), message)
            else:
                message.ParseFromString(body)
        except Exception as e:  # a body that is not OTLP is the test's failure
            self.answer(400, "text/plain", f"not OTLP: {e}".encode())
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        record(signal, "http", self.path, content_type, encoding, headers, raw, message)
        if ARGS.mode == "refuse":
            self.answer(503, "text/plain", b"refusing on purpose")
        elif content_type.startswith("application/json"):
            self.answer(200, "application/json", json_format.MessageToJson(answer).encode())
        else:
            self.answer(200, "application/x-protobuf", answer.SerializeToString())

    def answer(self, status, content_type, body):
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--mode", choices=["ok", "refuse", "hang"], default="ok")
    parser.add_argument("--forever", action="store_true", help="run until killed, not until stdin closes")
    ARGS = parser.parse_args()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    http = ThreadingHTTPServer(("127.0.0.1", 0), Http)
    http.daemon_threads = True
    threading.Thread(target=http.serve_forever, daemon=True).start()

    with open(ARGS.ready + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"grpc": grpc_port, "http": http.server_address[1]}, f)
    import os

    os.replace(ARGS.ready + ".tmp", ARGS.ready)
    # Until the test kills it (or its standard input closes).
    if ARGS.forever:
        threading.Event().wait()
    sys.stdin.read()
    os._exit(0)


if __name__ == "__main__":
    main()
