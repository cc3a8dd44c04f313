"""The ``unimodal`` command line: the parser assembled from the command groups, and ``main``.

Each command group is one module (``cli_data``, ``cli_codec``, ``cli_judges``, ``cli_train``, ``cli_bench``,
``cli_eval``, ``cli_generate``, ``cli_serve``, ``cli_refine``) whose ``add_*`` function registers its parsers;
``cli_common`` holds what they share.

Errors a user can cause are printed as one line (``error: ...``) with exit status 2, never a traceback;
``unimodal --debug ...`` (or ``UNIMODAL_DEBUG=1``) shows the traceback too. An unexpected error (a bug) is one
line with exit status 1. The parser imports no torch: commands whose options live beside torch code (train,
bench, eval) are built only when named, so ``--help``, ``--version`` and a refused request answer at once.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import warnings

from unimodal.cli_bench import add_bench_commands
from unimodal.cli_codec import add_codec_commands
from unimodal.cli_common import EVAL_HELP
from unimodal.cli_data import add_data_commands
from unimodal.cli_eval import add_eval_command as add_eval_commands
from unimodal.cli_generate import add_generate_commands
from unimodal.cli_judges import add_judge_commands
from unimodal.cli_refine import add_refine_commands
from unimodal.cli_serve import add_serve_command
from unimodal.cli_train import EXPORT_MODEL_HELP, MERGE_MODELS_HELP, TRAIN_HELP, add_train_command
from unimodal.core.errors import UnimodalError
from unimodal.demo import add_demo_command


# Groups whose parsers import torch (their defaults live beside the code) are built only when their command is
# named; otherwise each gets a stub with its help line, so `unimodal --help` lists it without the import.
HEAVY_GROUPS = {add_train_command: {"train": TRAIN_HELP, "export-model": EXPORT_MODEL_HELP,
                                    "merge-models": MERGE_MODELS_HELP},
                add_bench_commands: {"bench": "benchmarks"}, add_eval_commands: {"eval": EVAL_HELP}}
COMMAND_GROUPS = [add_data_commands, add_codec_commands, add_judge_commands, add_train_command, add_bench_commands,
                  add_eval_commands, add_generate_commands, add_serve_command, add_refine_commands, add_demo_command]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser for the command ``argv`` names (None: every command, the heavy ones included)."""
    from unimodal import __version__

    parser = argparse.ArgumentParser(prog="unimodal", description="One masked-diffusion model for text, images "
                                     "and audio, any-to-any.")
    parser.add_argument("--version", action="version", version=f"unimodal {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    command = _command_of(argv)
    for add in COMMAND_GROUPS:
        stubs = HEAVY_GROUPS.get(add, {})
        if argv is None or not stubs or command in stubs:
            add(sub)
        else:
            for name, help_line in stubs.items():
                sub.add_parser(name, help=help_line)
    return parser


def _command_of(argv: list[str] | None) -> str | None:
    """The command word of ``argv`` (top-level options take no values, so it is the first non-option)."""
    return next((word for word in argv or [] if not word.startswith("-")), None)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    # A user-facing warning is one line, not the source location and code line Python shows by default.
    print(f"warning: {message}", file=sys.stderr if file is None else file)


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll reports an error on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll() (Windows) or no real stdout: trust the error
        return True


def _internal_error(err: Exception, debug: bool) -> int:
    """A bug still answers in one line; ``--debug`` shows where."""
    if debug:
        raise err
    print(f"error: internal error {type(err).__name__}: {err} (run with --debug for the traceback, and "
          f"please report it)", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(word) for word in argv]
    debug = "--debug" in argv or bool(os.environ.get("UNIMODAL_DEBUG"))  # anywhere: before or after the command
    args = build_parser(argv).parse_args([word for word in argv if word != "--debug"])
    shown, warnings.showwarning = warnings.showwarning, (warnings.showwarning if debug else _show_warning)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a reader that went away shows here, where it is handled, not at interpreter exit
        return code
    except UnimodalError as err:
        if debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError as err:
        if not _stdout_closed():  # another pipe (a worker's) broke: that is a bug, not a reader going away
            return _internal_error(err, debug)
        # The reader went away (`unimodal ... | head`): stop quietly, as other command-line tools do. Point stdout
        # at /dev/null so that flushing it at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by the closed pipe
    except Exception as err:  # noqa: BLE001 - a bug still answers in one line; --debug shows where
        return _internal_error(err, debug)
    finally:
        warnings.showwarning = shown


if __name__ == "__main__":
    sys.exit(main())
