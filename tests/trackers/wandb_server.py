#!/usr/bin/python3
"""A small W&B server for the tests: the two parts of the protocol the wandb client speaks for a
run — the GraphQL UpsertBucket mutation (POST /graphql; wandb/core/api/graphql/
mutation_run.graphql) and the run's file stream (POST /files/<entity>/<project>/<run>/file_stream;
wandb/core/internal/filestream) — with every request checked, and faults on demand. Not W&B: it
keeps runs in memory and implements only what the WandBLogger uses.

Usage: wandb_server.py --port 0      (prints "PORT <n>" on stdout once it listens)

Checks (a breach is recorded in "violations" and answered 400):
  - HTTP Basic credentials "api:<key>" (the key set with POST /_test/config {"api_key": ...};
    a wrong key is 401);
  - /graphql: a JSON object {"query", "variables", "operationName"}; the query is the client's
    UpsertBucket mutation (same operation, variables and input fields); variables only those the
    mutation declares, each of its GraphQL type (String, Boolean, [String!], JSONString: a string
    holding a JSON object, for config {"key": {"value": ...}});
  - file_stream: the run was upserted; a JSON object with only "files", "complete", "exitcode",
    "uploaded", "preempting"; files named wandb-history.jsonl, wandb-summary.json,
    wandb-events.jsonl or output.log, each {"offset": int >= 0, "content": [str]}; history lines
    at the offset the server has (a resend of lines it has is allowed), each a JSON object without
    duplicate keys (NaN and Infinity allowed, as wandb's JSON has them) with an integer "_step" increasing from line
    to line, numeric "_runtime" and "_timestamp"; the summary one JSON object at offset 0; a line
    at most 10 MiB - 100 KiB, a request at most 10 MiB; "exitcode" an integer with "complete".

Control API: GET /_test/state, POST /_test/faults (as mlflow_server.py: path "graphql",
"file_stream" or "*", status / delay / drop / retry_after, count, after), POST /_test/config
{"api_key": "...", "viewer_entity": "..."}.
"""
import argparse
import base64
import json
import math
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

LOCK = threading.Lock()
STATE = {"runs": {}, "requests": [], "violations": []}
FAULTS = []
CONFIG = {"api_key": "test-key", "viewer_entity": "test-entity"}

MUTATION_VARS = {"id": "String", "name": "String", "project": "String", "entity": "String", "groupName": "String",
                 "description": "String", "displayName": "String", "notes": "String", "commit": "String",
                 "config": "JSONString", "host": "String", "debug": "Boolean", "program": "String", "repo": "String",
                 "jobType": "String", "state": "String", "sweep": "String", "tags": "[String!]",
                 "summaryMetrics": "JSONString"}
INPUT_FIELDS = ["id: $id", "name: $name", "groupName: $groupName", "modelName: $project", "entityName: $entity",
                "description: $description", "displayName: $displayName", "notes: $notes", "config: $config",
                "commit: $commit", "host: $host", "debug: $debug", "jobProgram: $program", "jobRepo: $repo",
                "jobType: $jobType", "state: $state", "sweep: $sweep", "tags: $tags",
                "summaryMetrics: $summaryMetrics"]
FILES = {"wandb-history.jsonl", "wandb-summary.json", "wandb-events.jsonl", "output.log"}
MAX_LINE = (10 << 20) - (100 << 10)


class Bad(Exception):
    pass


def no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise Bad(f"duplicate keys {dup} in one JSON object")
    return dict(pairs)


def clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def check_query(q):
    norm = " ".join(q.split())
    if not norm.startswith("mutation UpsertBucket("):
        raise Bad("the query is not the UpsertBucket mutation")
    decl = norm[len("mutation UpsertBucket("):norm.index(")")]
    declared = {}
    for part in decl.split(","):
        m = re.fullmatch(r"\s*\$(\w+)\s*:\s*(\S+)\s*", part)
        if not m:
            raise Bad(f"bad variable declaration {part!r}")
        declared[m.group(1)] = m.group(2)
    if declared != MUTATION_VARS:
        raise Bad(f"the mutation declares {declared}, the client's declares {MUTATION_VARS}")
    m = re.search(r"upsertBucket\(input: \{(.*?)\}\)", norm)
    if not m or [f.strip() for f in m.group(1).split(",")] != INPUT_FIELDS:
        raise Bad("the upsertBucket input fields are not the client's")
    for sel in ("bucket {", "project {", "entity {", "inserted"):
        if sel not in norm:
            raise Bad(f"the mutation does not select {sel!r}")


def check_var(name, v):
    t = MUTATION_VARS.get(name)
    if t is None:
        raise Bad(f"variable ${name} is not declared by the mutation")
    if v is None:
        return
    if t == "String" and not isinstance(v, str):
        raise Bad(f"${name} must be a String, got {v!r}")
    if t == "Boolean" and not isinstance(v, bool):
        raise Bad(f"${name} must be a Boolean, got {v!r}")
    if t == "[String!]" and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
        raise Bad(f"${name} must be a list of strings, got {v!r}")
    if t == "JSONString":
        if not isinstance(v, str):
            raise Bad(f"${name} must be a JSON string, got {v!r}")
        try:
            obj = json.loads(v)
        except ValueError as e:
            raise Bad(f"${name} is not JSON: {e}")
        if not isinstance(obj, dict):
            raise Bad(f"${name} must hold a JSON object")
        if name == "config":
            for k, item in obj.items():
                if not isinstance(item, dict) or set(item) - {"value", "desc"} or "value" not in item:
                    raise Bad(f"config[{k!r}] must be {{\"value\": ...}}, got {item!r}")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, obj, retry_after=None):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/_test/state":
            with LOCK:
                return self.reply(200, clean(json.loads(json.dumps(STATE, default=str))))
        self.reply(404, {"error": "not found"})

    def do_POST(self):
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if url.path.startswith("/_test/"):
            body = json.loads(raw) if raw else {}
            with LOCK:
                if url.path == "/_test/faults":
                    FAULTS.extend(body.get("rules", []))
                elif url.path == "/_test/config":
                    CONFIG.update(body)
            return self.reply(200, {"ok": True})
        kind = "graphql" if url.path == "/graphql" else "file_stream" if url.path.endswith("/file_stream") else None
        rec = {"path": url.path, "kind": kind, "raw_len": len(raw), "time": time.time()}
        with LOCK:
            rule = None
            for r in FAULTS:
                if r["count"] <= 0 or r["path"] not in (kind, "*"):
                    continue
                if r.get("after", 0) > 0:
                    r["after"] -= 1
                    continue
                rule = r
                r["count"] -= 1
                break
            rec["fault"] = dict(rule) if rule else None
            STATE["requests"].append(rec)
        if rule:
            if rule.get("delay"):
                time.sleep(rule["delay"])
            if rule.get("drop"):
                self.close_connection = True
                return
            if rule.get("status"):
                return self.reply(rule["status"], {"error": "injected fault"}, rule.get("retry_after"))
        try:
            status, obj = self.serve(kind, url, raw, rec)
        except Bad as e:
            with LOCK:
                STATE["violations"].append(f"POST {url.path}: {e}")
            status, obj = 400, {"error": str(e)}
        rec["status"] = status
        self.reply(status, obj)

    def serve(self, kind, url, raw, rec):
        if kind is None:
            raise Bad(f"no endpoint {url.path}")
        auth = self.headers.get("Authorization", "")
        want = "Basic " + base64.b64encode(f"api:{CONFIG['api_key']}".encode()).decode()
        if auth != want:
            return 401, {"errors": [{"message": "user is not logged in"}]}
        if not self.headers.get("Content-Type", "").startswith("application/json"):
            raise Bad("Content-Type is not application/json")
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise Bad(f"body is not JSON: {e}")
        if not isinstance(body, dict):
            raise Bad("body is not a JSON object")
        rec["body"] = body
        with LOCK:
            return self.graphql(body) if kind == "graphql" else self.file_stream(url, body, len(raw))

    def graphql(self, body):
        extra = set(body) - {"query", "variables", "operationName"}
        if extra or not isinstance(body.get("query"), str) or not isinstance(body.get("variables"), dict):
            raise Bad(f"a GraphQL request is {{query, variables, operationName}}, got keys {sorted(body)}")
        if body.get("operationName") not in (None, "UpsertBucket"):
            raise Bad(f"operationName {body.get('operationName')!r}")
        check_query(body["query"])
        v = body["variables"]
        for k, x in v.items():
            check_var(k, x)
        if not v.get("name"):
            raise Bad("$name (the run id) is required")
        entity = v.get("entity") or CONFIG["viewer_entity"]
        project = v.get("project") or "uncategorized"
        key = f"{entity}/{project}/{v['name']}"
        run = STATE["runs"].get(key)
        inserted = run is None
        if inserted:
            run = {"entity": entity, "project": project, "name": v["name"], "config": {}, "history": [],
                   "summary": None, "complete": False, "exitcode": None, "upserts": 0}
            STATE["runs"][key] = run
        run["upserts"] += 1
        for f in ("displayName", "groupName", "notes", "host", "jobType", "program", "tags"):
            if v.get(f) is not None:
                run[f] = v[f]
        if v.get("config") is not None:
            run["config"] = json.loads(v["config"])
        return 200, {"data": {"upsertBucket": {"bucket": {
            "id": "storage-" + v["name"], "name": v["name"], "displayName": run.get("displayName"),
            "description": None, "config": json.dumps(run["config"]), "sweepName": None,
            "project": {"id": "p1", "name": project, "entity": {"id": "e1", "name": entity}},
            "historyLineCount": len(run["history"])}, "inserted": inserted}}}

    def file_stream(self, url, body, size):
        parts = [unquote(p) for p in url.path.split("/")]
        if len(parts) != 6 or parts[1] != "files":
            raise Bad(f"file_stream path {url.path} is not /files/<entity>/<project>/<run>/file_stream")
        key = "/".join(parts[2:5])
        run = STATE["runs"].get(key)
        if run is None:
            return 404, {"error": f"run {key} was not upserted"}
        if size > 10 << 20:
            raise Bad(f"a file_stream request of {size} bytes is over 10 MiB")
        extra = set(body) - {"files", "complete", "exitcode", "uploaded", "preempting"}
        if extra:
            raise Bad(f"unknown field(s) {sorted(extra)}")
        files = body.get("files", {})
        if not isinstance(files, dict) or set(files) - FILES:
            raise Bad(f"files must name {sorted(FILES)}, got {files!r:.200}")
        for name, chunk in files.items():
            if not isinstance(chunk, dict) or set(chunk) != {"offset", "content"}:
                raise Bad(f"files[{name}] must be {{offset, content}}")
            off, content = chunk["offset"], chunk["content"]
            if isinstance(off, bool) or not isinstance(off, int) or off < 0:
                raise Bad(f"files[{name}].offset {off!r} is not an integer >= 0")
            if not isinstance(content, list) or not all(isinstance(x, str) for x in content):
                raise Bad(f"files[{name}].content must be a list of strings")
            if any(len(x.encode()) > MAX_LINE for x in content):
                raise Bad(f"a line of {name} is over {MAX_LINE} bytes")
            if name == "wandb-history.jsonl":
                hist = run["history"]
                if off > len(hist):
                    raise Bad(f"history offset {off}, but the server has {len(hist)} lines (a gap)")
                rows = []
                for i, line in enumerate(content):
                    try:
                        row = json.loads(line, object_pairs_hook=no_duplicate_keys)
                    except ValueError as e:
                        raise Bad(f"history line {off + i} is not JSON: {e}")
                    if not isinstance(row, dict):
                        raise Bad(f"history line {off + i} is not an object")
                    if isinstance(row.get("_step"), bool) or not isinstance(row.get("_step"), int):
                        raise Bad(f"history line {off + i}: _step {row.get('_step')!r} is not an integer")
                    for f in ("_runtime", "_timestamp"):
                        if not isinstance(row.get(f), (int, float)) or isinstance(row.get(f), bool):
                            raise Bad(f"history line {off + i}: {f} is not a number")
                    rows.append(row)
                merged = hist[:off] + rows
                steps = [r["_step"] for r in merged]
                if any(b <= a for a, b in zip(steps, steps[1:])):
                    raise Bad(f"history steps do not increase: {steps[-10:]}")
                run["history"] = merged + hist[off + len(rows):]
            elif name == "wandb-summary.json":
                if off != 0 or len(content) != 1:
                    raise Bad(f"the summary is one line at offset 0, got offset {off}, {len(content)} lines")
                try:
                    summ = json.loads(content[0], object_pairs_hook=no_duplicate_keys)
                except ValueError as e:
                    raise Bad(f"the summary is not JSON: {e}")
                if not isinstance(summ, dict):
                    raise Bad("the summary is not a JSON object")
                run["summary"] = summ
        if "complete" in body:
            if not isinstance(body["complete"], bool):
                raise Bad("complete must be a bool")
            ec = body.get("exitcode")
            if isinstance(ec, bool) or not isinstance(ec, int):
                raise Bad(f"exitcode {ec!r} must be an integer with complete")
            run["complete"], run["exitcode"] = body["complete"], ec
        elif "exitcode" in body:
            raise Bad("exitcode without complete")
        return 200, {"exitcode": None, "limits": {}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    srv.daemon_threads = True
    print(f"PORT {srv.server_address[1]}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    import signal
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    main()
