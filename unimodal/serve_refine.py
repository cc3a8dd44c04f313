"""One ``critique`` / ``refine`` / ``edit`` request, checked by :func:`unimodal.checks_refine.check_refine_request`,
run on a loaded pipeline and saved: the part ``serve --stdio`` and the MCP server share.

Every file is written whole or not at all (a temporary file, then a rename): results and critiques save that way
themselves, and the trace goes through :func:`unimodal.core.paths.atomic_write`.
"""

from __future__ import annotations

import json
from pathlib import Path

from unimodal.checks_refine import CheckedRefine
from unimodal.core.paths import atomic_write


def run_critique(pipe, checked: CheckedRefine):
    """The critique report and ``files``: {"picture" | "json": absolute path} when ``out`` is set."""
    report = pipe.critique(checked.content, **checked.options)
    if checked.out is None:
        return report, {}
    kind = "json" if checked.out.suffix.lower() == ".json" else "picture"
    return report, {kind: str(report.save(checked.out).resolve())}


def run_refine(pipe, checked: CheckedRefine):
    """The refined result, ``files`` ({modality: path}, plus "trace") and the trace of every round."""
    from unimodal.results import save_outputs

    fixed, trace = pipe.refine(checked.content, **checked.options)
    files = save_outputs(fixed, {checked.modality: checked.out}) if checked.out else {}
    if checked.trace is not None:
        files["trace"] = str(write_trace(trace, checked.trace).resolve())
    return fixed, files, trace


def run_edit(pipe, checked: CheckedRefine):
    """The edited result, ``files`` ({modality: absolute path} when ``out`` is set, plus "trace") and the trace
    of an instructed edit (None for a described one)."""
    from unimodal.results import save_outputs

    options, trace = dict(checked.options), None
    if "instruction" in options:
        edited, trace = pipe.edit(checked.content, **options)
    else:
        edited = pipe.edit(checked.content, options.pop("region"), **options)
    files = save_outputs(edited, {checked.modality: checked.out}) if checked.out else {}
    if checked.trace is not None:
        files["trace"] = str(write_trace(trace, checked.trace).resolve())
    return edited, files, trace


def write_trace(trace: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda temporary: temporary.write_text(json.dumps(trace, indent=2) + "\n",
                                                                     encoding="utf-8"))


def answer(pipe, checked: CheckedRefine) -> dict:
    """The JSON-ready answer of ``serve --stdio``: the scores and regions (critique) or the result (refine,
    edit; refine and an instructed edit add their trace), with ``files``."""
    if checked.op == "critique":
        report, files = run_critique(pipe, checked)
        return {**report.to_dict(), "files": files}
    if checked.op == "refine":
        fixed, files, trace = run_refine(pipe, checked)
        return {**fixed.to_dict(), "files": files, "trace": trace}
    edited, files, trace = run_edit(pipe, checked)
    return {**edited.to_dict(), "files": files, **({"trace": trace} if trace is not None else {})}


__all__ = ["answer", "run_critique", "run_edit", "run_refine", "write_trace"]
