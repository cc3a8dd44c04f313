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


# One type per cause a request can fail for, so a caller (an agent above all) can branch on the type instead of
# parsing messages. Input causes subclass InputError, so code that catches InputError keeps working.


class TextEncodingError(InputError):
    """Text that is not valid Unicode: non-UTF-8 bytes, or a lone surrogate (what a shell's undecodable bytes
    become in a Python string)."""


class InputFileError(InputError):
    """An input file (image, audio) is missing, unreadable or not decodable as that kind of file."""


class EmptyInputError(InputError):
    """An input with nothing in it: a 0x0 image, audio without samples."""


class SampleRateError(InputError):
    """Audio given with a sample rate that is not a positive whole number of samples per second."""


class SettingError(InputError):
    """A sampling setting (steps, tau, cfg, ...) has the wrong type or lies outside its range."""


class OutputPathError(InputError):
    """An output path has no known extension, or its folder cannot be written (read-only, /proc, ...)."""


class DeviceError(UnimodalError):
    """The device asked for (``cuda``, ``cuda:3``, ``mps``) does not exist on this machine."""


class ModelFolderError(DataError):
    """A model folder is missing a part or holds a damaged file (a truncated weights file, bad JSON)."""


class UnknownWordsWarning(UserWarning):
    """A prompt uses words the model never saw in training; they are likely to be drawn as something else."""


class StepsCappedWarning(UserWarning):
    """More steps were asked for than there are tokens to commit; the steps actually run are reported."""


class ManifestError(DataError):
    """A line of a JSONL manifest is malformed or points at an unreadable file."""

    def __init__(self, path, line: int, reason: str):
        self.path = str(path)
        self.line = line
        self.reason = reason
        super().__init__(f"{self.path}, line {line}: {reason}")


class BadRecordsError(ManifestError):
    """A manifest holds bad records: the first one's line and reason (as :class:`ManifestError`), how many there are
    in all and where (``errors``: each record's :class:`ManifestError`), and how to go on without them."""

    LISTED = 10  # line numbers named in the message; ``errors`` holds them all

    def __init__(self, path, errors: list):
        self.errors = list(errors)
        first = self.errors[0]
        lines = ", ".join(str(e.line) for e in self.errors[:self.LISTED])
        more = f" and {len(self.errors) - self.LISTED} more" if len(self.errors) > self.LISTED else ""
        super().__init__(path, first.line, f"{first.reason} ({len(self.errors)} bad record"
                         f"{'s' if len(self.errors) != 1 else ''} in all, line{'s' if len(self.errors) != 1 else ''} "
                         f"{lines}{more}; `unimodal data check {path}` lists each; `unimodal train` and `unimodal data "
                         f"pack` take --skip-bad to go on without them)")


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
