"""A real S3 server on 127.0.0.1 for the tests: moto's server mode (``moto_server``), and a
tiny HTTP proxy in front of it that injects faults (a 503, a connection dropped mid-object, a
short body, flipped bytes) into the responses to the objects a test names.

Clients reach the server the standard way: ``AWS_ENDPOINT_URL`` and dummy credentials in the
environment (:meth:`MotoServer.env`), so the trainer's ranks, started as subprocesses, find it
exactly as a user's job finds a real endpoint.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """``moto_server -H 127.0.0.1 -p PORT`` in a process of its own, stopped by its pid."""

    def __init__(self, log: Path):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        exe = shutil.which("moto_server") or sys.executable
        cmd = [exe] if exe != sys.executable else [exe, "-m", "moto.server"]
        self._log = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [*cmd, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=2)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto_server did not start: see {log}") from None
                time.sleep(0.2)

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The environment a client needs: the endpoint (this server, or a proxy in front)."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint or self.endpoint}

    def stop(self) -> None:
        """Stop the server by its pid (and the process group it leads)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def s3fs_for(endpoint: str):
    """An s3fs filesystem on ``endpoint`` (a fresh instance, no listing cache shared)."""
    import s3fs

    return s3fs.S3FileSystem(
        key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"},
        skip_instance_cache=True,
    )


def upload_folder(endpoint: str, local: Path, url: str) -> str:
    """Copy a local folder to ``url`` (``s3://bucket/prefix``, the bucket made if absent),
    the manifest last, as a user's ``aws s3 sync`` then ``cp manifest.json`` would."""
    import boto3

    fs = s3fs_for(endpoint)
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )
    if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=bucket)
    files = sorted(p for p in Path(local).rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == "manifest.json")
    for p in files:
        fs.put_file(str(p), f"{bucket}/{prefix}/{p.relative_to(local).as_posix()}")
    return url


@dataclass
class Fault:
    """What the proxy does to the responses of GETs whose path ends with ``suffix``: ``kind`` is
    503, drop (headers with the full length, half the body, then the connection closed), short
    (a well-formed response with the body cut in half), flip (one byte changed); ``times``: how
    many such responses (None: all of them)."""

    suffix: str
    kind: str
    times: int | None = 1
    served: int = 0


@dataclass
class FaultProxy:
    """An HTTP proxy to ``target`` on a free port of 127.0.0.1 (see the module doc)."""

    target: str
    faults: list[Fault] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def __post_init__(self):
        proxy = self
        host, port = self.target.removeprefix("http://").split(":")

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = f"{host}:{port}"
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                proxy.requests.append(f"{self.command} {self.path}")
                fault = proxy._fault_for(self.command, self.path)
                if fault == "503":
                    msg = b"<Error><Code>ServiceUnavailable</Code><Message>busy</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                if fault == "flip" and data:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                cut = data[: len(data) // 2]
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(cut if fault == "short" else data)))
                self.end_headers()
                if fault == "drop":
                    self.wfile.write(cut)
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(cut if fault == "short" else data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _fault_for(self, method: str, path: str) -> str | None:
        if method != "GET":
            return None
        key = path.split("?", 1)[0]
        for f in self.faults:
            if key.endswith(f.suffix) and (f.times is None or f.served < f.times):
                f.served += 1
                return f.kind
        return None

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
