"""A real S3-compatible server for tests: moto's server mode on 127.0.0.1, reached the way an operator's cluster
reaches its object store, through the standard AWS environment variables."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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
