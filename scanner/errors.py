"""Errors that hubtrace reports as a clear message (CLI) or an error row (scans), never as a traceback."""


class HubtraceError(Exception):
    """Base class for every refusal or failure that is the input's fault, not hubtrace's."""

    def lines(self) -> list[str]:
        """The refusal as a person reads it: one line, or one per problem where there are several."""
        return [str(self)]


class CheckpointError(HubtraceError):
    """The checkpoint cannot be read as claimed: missing config, corrupt or truncated file, wrong shapes."""


class UnsafeCheckpointError(CheckpointError):
    """The checkpoint would need code execution to load (pickle weights, remote code); hubtrace refuses it."""


class UnsupportedArchitectureError(CheckpointError):
    """No adapter maps this architecture's tensor names to the canonical roles."""


class UnsupportedAdapterError(CheckpointError):
    """A PEFT adapter of a method or variant hubtrace does not read (anything but plain LoRA)."""


class MissingBaseError(CheckpointError):
    """A PEFT adapter's base model is nowhere hubtrace looks: not in the scanned hub, a local folder or the Hugging
    Face cache."""


class FingerprintError(CheckpointError):
    """A fingerprint file is missing, truncated, altered or from an unknown format version."""


class RetrievalIndexError(HubtraceError):
    """The candidate-retrieval index beside a database cannot be used (damaged, of another dimension or kind)."""


class IncomparableError(HubtraceError):
    """Two models (or fingerprints) cannot be compared with the requested statistic, and the message says why."""


def one_line(error: BaseException | str, limit: int | None = 500) -> str:
    """An error message flattened to one line, cut at ``limit`` characters (None: whole), for scan_errors rows and
    CLI refusals; an exception with no message is named by its type."""
    text = " ".join(str(error).split())
    if not text and isinstance(error, BaseException):
        return type(error).__name__
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"  # says it was cut, never cut silently


def without_sql_excerpt(error: BaseException) -> str:
    """The message on one line, without the ``LINE 1: ... ^`` excerpt DuckDB adds (it only reads on several)."""
    return one_line(str(error).split("\nLINE ")[0], limit=None)
