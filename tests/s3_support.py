"""A real S3-compatible server for tests: moto's server mode on 127.0.0.1, reached the way an operator's cluster
reaches its object store, through the standard AWS environment variables."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import fsspec

#: The environment a node needs to reach the test server; dummy credentials (moto accepts any).
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "hubtrace-test", "AWS_SECRET_ACCESS_KEY": "hubtrace-test",
               "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    """Start ``python -m moto.server`` on a free local port; yields the AWS_* variables that point at it."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
                break
            except OSError:
                if process.poll() is not None:
                    raise RuntimeError("moto server exited at start") from None
                time.sleep(0.1)
        else:
            raise RuntimeError("moto server did not answer within 30 s")
        yield {"AWS_ENDPOINT_URL": endpoint, **CREDENTIALS}
    finally:
        process.terminate()
        process.wait(timeout=10)


def make_bucket(name: str) -> None:
    """Create a bucket on the server the current AWS_* environment points at."""
    fs, _ = fsspec.core.url_to_fs(f"s3://{name}", skip_instance_cache=True)
    fs.mkdir(name)


@contextmanager
def environment(variables: dict[str, str]) -> Iterator[None]:
    """Set these variables for the block (and for processes started in it), then restore the old values."""
    old = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class ByteCountingRelay:
    """A TCP relay in front of the S3 server that counts the bytes the server sends back: what clients downloaded
    (bodies and HTTP headers), measured outside the client library."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.downloaded = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, count: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                if count:
                    with self._lock:
                        self.downloaded += len(data)
                target.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, target):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)


@contextmanager
def counting_relay() -> Iterator[ByteCountingRelay]:
    """Route this process's S3 requests through a `ByteCountingRelay` for the block (the S3 server that
    AWS_ENDPOINT_URL names must be running); fsspec's cached S3 clients are dropped on entry and exit, so reads
    inside use the relay and reads after do not."""
    from s3fs import S3FileSystem

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    relay = ByteCountingRelay(int(endpoint.rsplit(":", 1)[1]))
    S3FileSystem.clear_instance_cache()
    try:
        with environment({"AWS_ENDPOINT_URL": relay.endpoint}):
            yield relay
    finally:
        S3FileSystem.clear_instance_cache()
        relay.close()
