#!/usr/bin/python3
"""A loopback proxy in front of s3rver for the storage tests.

s3rver does not check AWS Signature Version 4, so this proxy does, with its own signer written
from AWS's description (hashlib + hmac, nothing shared with the C code): a request whose
signature, access key or payload hash is wrong is refused with S3's error (403
SignatureDoesNotMatch / InvalidAccessKeyId, 400 XAmzContentSHA256Mismatch) and never reaches the
server. It also injects faults on request: HTTP errors, slow responses, connections cut in the
middle of a response body. Control requests (not signed) go to /__proxy/<command>?...:

  fail?status=500&count=2[&match=S]   the next `count` requests (whose "METHOD path?query" contains
                                      S) get that status with an S3 error body
  delay?seconds=2&count=1[&match=S]   wait before answering them
  cut?after=1000&count=1[&match=S]    send headers and `after` body bytes, then drop the connection
  stats                               JSON: counters and the request lines seen
  clear                               forget the pending faults

Usage: s3proxy.py UPSTREAM_PORT ACCESS_KEY SECRET_KEY PORT_FILE
Listens on 127.0.0.1 on a free port, written to PORT_FILE once it is listening. Exits when its
parent (the test) is gone.
"""
import hashlib
import hmac
import http.client
import http.server
import json
import os
import socket
import sys
import threading
import time
import urllib.parse

UPSTREAM = int(sys.argv[1])
ACCESS = sys.argv[2]
SECRET = sys.argv[3]
PORT_FILE = sys.argv[4]

lock = threading.Lock()
faults = []  # dicts: kind, count, match, params
stats = {"requests": 0, "refused": 0, "faults": 0, "lines": [], "by_method": {}}


def quote(s):
    return urllib.parse.quote(s, safe="-_.~")


def canonical_query(q):
    if not q:
        return ""
    pairs = []
    for part in q.split("&"):
        if not part:
            continue
        k, _, v = part.partition("=")
        pairs.append((quote(urllib.parse.unquote(k)), quote(urllib.parse.unquote(v))))
    pairs.sort()
    return "&".join(f"{k}={v}" for k, v in pairs)


def hmac256(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def check_signature(method, raw_path, headers, body):
    """None when the request is signed correctly, else (status, code, message)."""
    auth = headers.get("authorization", "")
    if not auth.startswith("AWS4-HMAC-SHA256 "):
        return (403, "AccessDenied", "no SigV4 Authorization header")
    fields = {}
    for item in auth[len("AWS4-HMAC-SHA256 "):].split(","):
        k, _, v = item.strip().partition("=")
        fields[k] = v
    cred = fields.get("Credential", "").split("/")
    if len(cred) != 5 or cred[4] != "aws4_request":
        return (403, "AuthorizationHeaderMalformed", "bad Credential")
    if cred[0] != ACCESS:
        return (403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.")
    signed = fields.get("SignedHeaders", "").split(";")
    for need in ("host", "x-amz-date", "x-amz-content-sha256"):
        if need not in signed:
            return (403, "AccessDenied", f"header {need} is not signed")
    payload = headers.get("x-amz-content-sha256", "")
    if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(body).hexdigest():
        return (400, "XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match what was computed.")
    path, _, query = raw_path.partition("?")
    lines = []
    for h in signed:
        v = headers.get(h)
        if v is None:
            return (403, "AccessDenied", f"signed header {h} is missing")
        lines.append(h + ":" + " ".join(v.split()))
    creq = "\n".join([method, path, canonical_query(query), "\n".join(lines) + "\n", ";".join(signed), payload])
    date = headers["x-amz-date"]
    scope = "/".join(cred[1:])
    sts = "\n".join(["AWS4-HMAC-SHA256", date, scope, hashlib.sha256(creq.encode()).hexdigest()])
    k = hmac256(("AWS4" + SECRET).encode(), cred[1])
    for part in cred[2:]:
        k = hmac256(k, part)
    want = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, fields.get("Signature", "")):
        return (403, "SignatureDoesNotMatch", "The request signature we calculated does not match the signature you provided. Check your key and signing method.")
    return None


def take_fault(line):
    with lock:
        for f in faults:
            if f["count"] > 0 and f["match"] in line:
                f["count"] -= 1
                stats["faults"] += 1
                return dict(f)
    return None


def error_body(code, message):
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error>").encode()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_simple(self, status, body, ctype="application/xml"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def control(self):
        u = urllib.parse.urlsplit(self.path)
        cmd = u.path[len("/__proxy/"):]
        q = dict(urllib.parse.parse_qsl(u.query))
        with lock:
            if cmd in ("fail", "delay", "cut"):
                faults.append({"kind": cmd, "count": int(q.get("count", "1")), "match": q.get("match", ""),
                               "status": int(q.get("status", "500")), "seconds": float(q.get("seconds", "0")),
                               "after": int(q.get("after", "0"))})
                body = b"ok"
            elif cmd == "clear":
                faults.clear()
                body = b"ok"
            elif cmd == "stats":
                body = json.dumps(stats).encode()
            else:
                body = b"unknown command"
        self.send_simple(200, body, "text/plain")

    def handle_any(self):
        if self.path.startswith("/__proxy/"):
            return self.control()
        n = int(self.headers.get("Content-Length", "0") or "0")
        body = self.rfile.read(n) if n else b""
        line = f"{self.command} {self.path}"
        with lock:
            stats["requests"] += 1
            stats["lines"].append(line)
            stats["by_method"][self.command] = stats["by_method"].get(self.command, 0) + 1
        hdrs = {k.lower(): v for k, v in self.headers.items()}
        bad = check_signature(self.command, self.path, hdrs, body)
        if bad:
            with lock:
                stats["refused"] += 1
            return self.send_simple(bad[0], error_body(bad[1], bad[2]))
        f = take_fault(line)
        if f and f["kind"] == "delay":
            time.sleep(f["seconds"])
        if f and f["kind"] == "fail":
            code = {500: "InternalError", 503: "SlowDown", 429: "SlowDown"}.get(f["status"], "InjectedError")
            return self.send_simple(f["status"], error_body(code, "injected by the test proxy"))
        try:
            conn = http.client.HTTPConnection("127.0.0.1", UPSTREAM, timeout=60)
            fwd = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "expect")}
            conn.request(self.command, self.path, body=body if (body or self.command in ("PUT", "POST")) else None,
                         headers=fwd)
            r = conn.getresponse()
            data = r.read()
            status, rh = r.status, r.getheaders()
            conn.close()
        except OSError:
            # the server is down: drop the connection without an answer, as a dead server would
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self.send_response(status)
        for k, v in rh:
            if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                self.send_header(k, v)
        length = int(dict((k.lower(), v) for k, v in rh).get("content-length", len(data))) \
            if self.command == "HEAD" else len(data)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command == "HEAD":
            return
        if f and f["kind"] == "cut":
            self.wfile.write(data[: f["after"]])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = handle_any


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def watch_parent(ppid):
    while True:
        if os.getppid() != ppid:
            os._exit(0)
        time.sleep(0.5)


def main():
    srv = Server(("127.0.0.1", 0), Handler)
    tmp = PORT_FILE + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(tmp, PORT_FILE)
    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    srv.serve_forever()


if __name__ == "__main__":
    main()
