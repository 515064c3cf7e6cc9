"""Whether the scanner streams the cover3 copy's expert sites when STREAM_BYTES is 0 (counts StreamedExperts.find)."""

from __future__ import annotations

import scanner
import scanner.reading.expert_stream as expert_stream
from scanner.fingerprints.fingerprint import fingerprint_model

assert scanner.__file__.startswith("/tmp/hubtrace-cbba292/"), scanner.__file__
expert_stream.STREAM_BYTES = 0
found = []
original_find = expert_stream.StreamedExperts.find.__func__


def counting_find(cls, tree, layer, site):
    """StreamedExperts.find, recording whether it streamed the site."""
    result = original_find(cls, tree, layer, site)
    found.append((layer, site.path, result is not None))
    return result


expert_stream.StreamedExperts.find = classmethod(counting_find)
fingerprint_model("/tmp/canonical57/ds4-hash/copy-cover3-ds4-hash-streamed-float32")
print("sites (layer, path, streamed):", found)
