"""Errors that hubtrace reports as a clear message (CLI) or an error row (scans), never as a traceback."""


class HubtraceError(Exception):
    """Base class for every refusal or failure that is the input's fault, not hubtrace's."""


class CheckpointError(HubtraceError):
    """The checkpoint cannot be read as claimed: missing config, corrupt or truncated file, wrong shapes."""


class UnsafeCheckpointError(CheckpointError):
    """The checkpoint would need code execution to load (pickle weights, remote code); hubtrace refuses it."""


class UnsupportedArchitectureError(CheckpointError):
    """No adapter maps this architecture's tensor names to the canonical roles."""


class FingerprintError(CheckpointError):
    """A fingerprint file is missing, truncated, altered or from an unknown format version."""


class IncomparableError(HubtraceError):
    """Two models (or fingerprints) cannot be compared with the requested statistic, and the message says why."""
