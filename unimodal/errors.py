"""One exception hierarchy for everything the library reports to its users.

Every error a user can cause (a bad argument, an unreadable file, a malformed manifest line, a missing
optional dependency) is raised as a subclass of :class:`UnimodalError` with a message that names the input
and says what was expected. Catch ``UnimodalError`` to handle them all.
"""

from __future__ import annotations


class UnimodalError(Exception):
    """Base class of every error raised on purpose by unimodal."""


class InputError(UnimodalError, ValueError):
    """An argument or input value is not what the function accepts."""


class DataError(UnimodalError):
    """A data set, file or record could not be read or built."""


class ManifestError(DataError):
    """A line of a JSONL manifest is malformed or points at an unreadable file."""

    def __init__(self, path, line: int, reason: str):
        self.path = str(path)
        self.line = line
        self.reason = reason
        super().__init__(f"{self.path}, line {line}: {reason}")


class MissingDependencyError(UnimodalError, ImportError):
    """An optional dependency (an extra such as ``unimodal[eval]``) is not installed."""

    def __init__(self, package: str, extra: str, purpose: str):
        self.package = package
        self.extra = extra
        super().__init__(
            f"{purpose} needs the package '{package}', which is not installed. "
            f"Install it with: pip install 'unimodal[{extra}]'"
        )


class SpeechSynthesisError(DataError):
    """eSpeak NG could not be loaded or did not produce speech."""
