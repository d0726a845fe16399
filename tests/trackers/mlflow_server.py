#!/usr/bin/python3
"""A small MLflow tracking server for the tests: the REST endpoints of ../shared/FORMATS.md §8
(mlflow/protos/service.proto), with every request checked against the protocol, and faults on
demand. Not MLflow: it keeps runs in memory and implements only what the MLFlowLogger uses.

Usage: mlflow_server.py --port 0      (prints "PORT <n>" on stdout once it listens)

Checks (a breach is recorded in "violations" and answered 400 INVALID_PARAMETER_VALUE, as MLflow
answers a bad request):
  - paths under /api/2.0/mlflow/, the method of each endpoint, Content-Type: application/json on
    POST, a JSON object body with only the endpoint's fields, each of its type (int64 fields as a
    JSON integer or a decimal string, as the protobuf JSON mapping allows; doubles as numbers or
    "NaN" / "Infinity" / "-Infinity");
  - names (metric, param, tag keys) as mlflow/utils/validation.py: ^[/\\w.\\- ]*$, no path
    tricks, at most 250 characters; param values at most 6000, tag values at most 5000;
  - runs/log-batch: at most 1000 metrics, 100 params, 100 tags, 1000 items in all, 1 MB of JSON;
    one value per param key in a request; a param never changes value; the run exists;
  - the Authorization header, when one is expected (POST /_test/config {"auth": "Bearer x"}).

Control API (for the tests, outside /api):
  GET  /_test/state   -> {"experiments", "runs", "requests", "violations"}
  POST /_test/faults  {"rules": [{"path": "runs/log-batch", "status": 503, "count": 2,
                       "after": 0, "retry_after": 0, "delay": 0.0, "drop": false}, ...]}
        after letting `after` matching requests through, the next `count` requests whose endpoint
        matches ("*": any) get the fault: an HTTP status (with an MLflow error body), a delay
        before answering (for timeouts), or a dropped connection
  POST /_test/config  {"auth": "Bearer token" | "Basic ..." | null}
"""
import argparse
import json
import math
import posixpath
import re
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

NAME_RE = re.compile(r"^[/\w.\- ]*$")
API = "/api/2.0/mlflow/"

LOCK = threading.Lock()
STATE = {"experiments": {}, "runs": {}, "requests": [], "violations": []}
FAULTS = []
CONFIG = {"auth": None}
NEXT_EXP = [1]

# endpoint -> (method, {field: type}) ; types: str, int64, double, list:<item>, obj
ENDPOINTS = {
    "experiments/get-by-name": ("GET", {"experiment_name": "str"}),
    "experiments/create": ("POST", {"name": "str", "artifact_location": "str", "tags": "tags"}),
    "runs/create": ("POST", {"experiment_id": "str", "user_id": "str", "run_name": "str", "start_time": "int64",
                             "tags": "tags"}),
    "runs/update": ("POST", {"run_id": "str", "run_uuid": "str", "status": "str", "end_time": "int64",
                             "run_name": "str"}),
    "runs/log-batch": ("POST", {"run_id": "str", "metrics": "metrics", "params": "params", "tags": "tags"}),
    "runs/search": ("POST", {"experiment_ids": "strlist", "filter": "str", "run_view_type": "str",
                             "max_results": "int", "order_by": "strlist", "page_token": "str"}),
    "runs/get": ("GET", {"run_id": "str", "run_uuid": "str"}),
}
STATUSES = {"RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED"}


class Bad(Exception):
    pass


def path_not_unique(name):
    norm = posixpath.normpath(name)
    return norm != name or norm == "." or norm.startswith("..") or norm.startswith("/")


def check_name(kind, name):
    if not isinstance(name, str):
        raise Bad(f"{kind} name {name!r} is not a string")
    if not NAME_RE.match(name):
        raise Bad(f"Invalid {kind} name: '{name}'. Names may only contain alphanumerics, underscores (_), "
                  f"dashes (-), periods (.), spaces ( ), and slashes (/).")
    if path_not_unique(name):
        raise Bad(f"Invalid {kind} name: '{name}'. Names may be treated as files in certain cases")
    if len(name) > 250 or len(name) == 0:
        raise Bad(f"{kind} name '{name[:50]}' has length {len(name)} (1 to 250)")


def as_int64(field, v):
    if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, str) and re.fullmatch(r"-?\d+", v))):
        raise Bad(f"{field}: {v!r} is not an int64 (a JSON integer or a decimal string)")
    x = int(v)
    if not -(2 ** 63) <= x < 2 ** 63:
        raise Bad(f"{field}: {x} is out of int64 range")
    return x


def as_double(field, v):
    if isinstance(v, bool):
        raise Bad(f"{field}: {v!r} is a bool, not a double")
    if isinstance(v, (int, float)):
        return float(v)
    if v in ("NaN", "Infinity", "-Infinity"):
        return float(v.replace("Infinity", "inf"))
    raise Bad(f"{field}: {v!r} is not a double (a number, or \"NaN\", \"Infinity\", \"-Infinity\")")


def check_kv_list(field, v, value_limit, kind):
    if not isinstance(v, list):
        raise Bad(f"{field} must be a list")
    out = []
    for i, item in enumerate(v):
        if not isinstance(item, dict) or set(item) - {"key", "value"}:
            raise Bad(f"{field}[{i}] must be an object with key and value, got {item!r}")
        check_name(kind, item.get("key"))
        val = item.get("value", "")
        if not isinstance(val, str):
            raise Bad(f"{field}[{i}].value must be a string, got {val!r}")
        if len(val) > value_limit:
            raise Bad(f"{kind} value of '{item['key']}' had length {len(val)}, which exceeded length limit of "
                      f"{value_limit}")
        out.append((item["key"], val))
    return out


def check_fields(endpoint, body):
    _, fields = ENDPOINTS[endpoint]
    extra = set(body) - set(fields)
    if extra:
        raise Bad(f"{endpoint}: unknown field(s) {sorted(extra)} (the protocol has {sorted(fields)})")
    for k, t in fields.items():
        if k not in body:
            continue
        v = body[k]
        if t == "str" and not isinstance(v, str):
            raise Bad(f"{endpoint}: {k} must be a string, got {v!r}")
        if t == "int64":
            as_int64(f"{endpoint}: {k}", v)
        if t == "int" and (isinstance(v, bool) or not isinstance(v, int)):
            raise Bad(f"{endpoint}: {k} must be an integer, got {v!r}")
        if t == "strlist" and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
            raise Bad(f"{endpoint}: {k} must be a list of strings, got {v!r}")


def clean(x):
    """A copy that strict JSON parsers read: non-finite floats as the strings protobuf JSON uses."""
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def error(code, message):
    return {"error_code": code, "message": message}


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
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def handle_any(self, method):
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if url.path.startswith("/_test/"):
            return self.control(method, url.path, raw)
        if not url.path.startswith(API):
            with LOCK:
                STATE["violations"].append(f"{method} {url.path}: not under {API}")
            return self.reply(404, error("ENDPOINT_NOT_FOUND", f"no endpoint {url.path}"))
        endpoint = url.path[len(API):]
        rec = {"method": method, "endpoint": endpoint, "query": parse_qs(url.query), "raw_len": len(raw),
               "time": time.time(), "headers": {k.lower(): v for k, v in self.headers.items()}}
        # faults first: they stand for a server in trouble, whatever the request
        with LOCK:
            rule = None
            for r in FAULTS:
                if r["count"] <= 0 or r["path"] not in (endpoint, "*"):
                    continue
                if r.get("after", 0) > 0:  # let this many matching requests through first
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
                return self.reply(rule["status"], error("TEMPORARILY_UNAVAILABLE" if rule["status"] >= 500
                                                        else "REQUEST_LIMIT_EXCEEDED", "injected fault"),
                                  rule.get("retry_after"))
        try:
            status, obj = self.serve(method, endpoint, url, raw, rec)
        except Bad as e:
            with LOCK:
                STATE["violations"].append(f"{method} {endpoint}: {e}")
            status, obj = 400, error("INVALID_PARAMETER_VALUE", str(e))
        rec["status"] = status
        self.reply(status, obj)

    def serve(self, method, endpoint, url, raw, rec):
        if endpoint not in ENDPOINTS:
            raise Bad(f"no endpoint {endpoint}")
        want, _ = ENDPOINTS[endpoint]
        if method != want:
            raise Bad(f"{endpoint} is {want}, not {method}")
        auth = CONFIG["auth"]
        if auth is not None and self.headers.get("Authorization") != auth:
            return 401, error("UNAUTHENTICATED", f"bad credentials: {self.headers.get('Authorization')!r}")
        if method == "GET":
            q = {k: v[-1] for k, v in parse_qs(url.query).items()}
            check_fields(endpoint, q)
            body = q
        else:
            ctype = self.headers.get("Content-Type", "")
            if not ctype.startswith("application/json"):
                raise Bad(f"Content-Type is {ctype!r}, not application/json")
            if endpoint == "runs/log-batch" and len(raw) > 1_000_000:
                raise Bad(f"Batched logging API requests must be at most 1000000 bytes, got a request of size "
                          f"{len(raw)}.")
            try:
                body = json.loads(raw)
            except ValueError as e:
                raise Bad(f"body is not JSON: {e}")
            if not isinstance(body, dict):
                raise Bad("body is not a JSON object")
            check_fields(endpoint, body)
        rec["body"] = body
        with LOCK:
            return getattr(self, "ep_" + endpoint.replace("/", "_").replace("-", "_"))(body)

    # ---- endpoints (called with LOCK held) ----

    def ep_experiments_get_by_name(self, q):
        name = q.get("experiment_name")
        if not name:
            raise Bad("experiment_name is required")
        for e in STATE["experiments"].values():
            if e["name"] == name:
                return 200, {"experiment": e}
        return 404, error("RESOURCE_DOES_NOT_EXIST", f"Could not find experiment with name '{name}'")

    def ep_experiments_create(self, b):
        name = b.get("name")
        if not name or len(name) > 500:
            raise Bad(f"Invalid experiment name: '{name}'")
        if any(e["name"] == name for e in STATE["experiments"].values()):
            return 400, error("RESOURCE_ALREADY_EXISTS", f"Experiment '{name}' already exists.")
        eid = str(NEXT_EXP[0])
        NEXT_EXP[0] += 1
        STATE["experiments"][eid] = {"experiment_id": eid, "name": name, "artifact_location": f"mlflow-artifacts:/{eid}",
                                     "lifecycle_stage": "active"}
        return 200, {"experiment_id": eid}

    def run_of(self, b):
        rid = b.get("run_id") or b.get("run_uuid")
        if not rid:
            raise Bad("run_id is required")
        run = STATE["runs"].get(rid)
        if run is None:
            return None, (404, error("RESOURCE_DOES_NOT_EXIST", f"Run '{rid}' not found"))
        return run, None

    def ep_runs_create(self, b):
        eid = b.get("experiment_id")
        if eid not in STATE["experiments"]:
            return 404, error("RESOURCE_DOES_NOT_EXIST", f"No Experiment with id={eid} exists")
        tags = check_kv_list("tags", b.get("tags", []), 5000, "tag")
        start = as_int64("start_time", b["start_time"]) if "start_time" in b else None
        if start is not None and abs(start / 1000 - time.time()) > 3600:
            raise Bad(f"start_time {start} is not milliseconds since the epoch near now")
        rid = uuid.uuid4().hex
        info = {"run_id": rid, "run_uuid": rid, "experiment_id": eid, "run_name": b.get("run_name", ""),
                "user_id": b.get("user_id", ""), "status": "RUNNING", "start_time": start,
                "artifact_uri": f"mlflow-artifacts:/{eid}/{rid}/artifacts", "lifecycle_stage": "active"}
        STATE["runs"][rid] = {"info": info, "data": {"metrics": [], "params": {}, "tags": dict(tags)},
                              "status_history": ["RUNNING"]}
        return 200, {"run": {"info": info, "data": {"tags": [{"key": k, "value": v} for k, v in tags]}}}

    def ep_runs_update(self, b):
        run, err = self.run_of(b)
        if err:
            return err
        if "status" in b:
            if b["status"] not in STATUSES:
                raise Bad(f"status {b['status']!r} is not one of {sorted(STATUSES)}")
            run["info"]["status"] = b["status"]
            run["status_history"].append(b["status"])
        if "end_time" in b:
            run["info"]["end_time"] = as_int64("end_time", b["end_time"])
        return 200, {"run_info": run["info"]}

    def ep_runs_log_batch(self, b):
        run, err = self.run_of(b)
        if err:
            return err
        metrics = b.get("metrics", [])
        params = check_kv_list("params", b.get("params", []), 6000, "param")
        tags = check_kv_list("tags", b.get("tags", []), 5000, "tag")
        if not isinstance(metrics, list):
            raise Bad("metrics must be a list")
        if len(metrics) > 1000 or len(params) > 100 or len(tags) > 100 or len(metrics) + len(params) + len(tags) > 1000:
            raise Bad(f"A batch logging request can contain at most 1000 metrics, 100 params, 100 tags and 1000 "
                      f"items; got {len(metrics)}, {len(params)}, {len(tags)}")
        parsed = []
        for i, m in enumerate(metrics):
            if not isinstance(m, dict) or set(m) - {"key", "value", "timestamp", "step"}:
                raise Bad(f"metrics[{i}] must have only key, value, timestamp, step: {m!r}")
            for f in ("key", "value", "timestamp"):
                if f not in m:
                    raise Bad(f"metrics[{i}] has no {f}")
            check_name("metric", m["key"])
            ts = as_int64(f"metrics[{i}].timestamp", m["timestamp"])
            if ts < 0:
                raise Bad(f"metrics[{i}].timestamp {ts} is negative")
            parsed.append({"key": m["key"], "value": as_double(f"metrics[{i}].value", m["value"]), "timestamp": ts,
                           "step": as_int64(f"metrics[{i}].step", m.get("step", 0)),
                           "value_json": m["value"]})
        keys = [k for k, _ in params]
        if len(set(keys)) != len(keys):
            raise Bad(f"Duplicate parameter keys have been submitted: {keys}")
        for k, v in params:
            old = run["data"]["params"].get(k)
            if old is not None and old != v:
                raise Bad(f"Changing param values is not allowed. Param with key='{k}' was already logged with "
                          f"value='{old}' for run ID='{run['info']['run_id']}'. Attempted logging new value '{v}'.")
        for k, v in params:
            run["data"]["params"][k] = v
        run["data"]["tags"].update(dict(tags))
        run["data"]["metrics"].extend(parsed)
        return 200, {}

    def ep_runs_search(self, b):
        ids = b.get("experiment_ids") or []
        flt = b.get("filter", "")
        m = re.fullmatch(r"\s*tags\.(\w+)\s*=\s*[\"']([^\"']*)[\"']\s*", flt) if flt else None
        if flt and not m:
            raise Bad(f"filter {flt!r}: this server understands only tags.<key> = \"value\"")
        runs = [r for r in STATE["runs"].values() if r["info"]["experiment_id"] in ids and
                (not m or r["data"]["tags"].get(m.group(1)) == m.group(2))]
        runs = runs[: b.get("max_results", 1000)]
        return 200, ({"runs": [{"info": r["info"]} for r in runs]} if runs else {})

    def ep_runs_get(self, q):
        run, err = self.run_of(q)
        if err:
            return err
        d = run["data"]
        return 200, {"run": {"info": run["info"], "data": {
            "params": [{"key": k, "value": v} for k, v in d["params"].items()],
            "tags": [{"key": k, "value": v} for k, v in d["tags"].items()]}}}

    # ---- control ----

    def control(self, method, path, raw):
        body = json.loads(raw) if raw else {}
        with LOCK:
            if path == "/_test/state":
                return self.reply(200, clean(json.loads(json.dumps(STATE, default=str))))
            if path == "/_test/faults":
                FAULTS.extend(body.get("rules", []))
                return self.reply(200, {"ok": True})
            if path == "/_test/config":
                CONFIG.update(body)
                return self.reply(200, {"ok": True})
        self.reply(404, {"error": f"no control path {path}"})


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
