"""Run `hubtrace test A B` through the archive's CLI (jobs.cli.app), asserting scanner and jobs come from it."""
import sys

import jobs
import scanner

assert scanner.__file__.startswith("/tmp/hubtrace-8303dba/"), scanner.__file__
assert jobs.__file__.startswith("/tmp/hubtrace-8303dba/"), jobs.__file__
from jobs.cli import app  # noqa: E402

print("$ hubtrace test " + " ".join(sys.argv[1:]), flush=True)
try:
    app(["test", *sys.argv[1:]])
except SystemExit:
    pass
