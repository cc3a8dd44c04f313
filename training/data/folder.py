"""``folder``: a user's own data from a JSONL manifest.

One JSON object per line with any non-empty subset of ``text`` (string), ``image`` (path) and ``audio``
(path); relative paths are resolved against the manifest's folder. Images are converted to RGB, centre-
cropped to a square and resized; audio is mixed to mono and resampled to 16 kHz. Blank lines and lines
starting with ``#`` are ignored.

Every problem is reported with its line number. By default bad records raise
:class:`~unimodal.core.errors.BadRecordsError` (a :class:`~unimodal.core.errors.ManifestError` naming the first
one, how many there are and on which lines: every record is read before it is raised, so one run of ``unimodal
data check`` shows them all); with ``skip_bad=True`` bad records are skipped, counted and listed in
:attr:`FolderDataset.skipped` — never dropped silently.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from unimodal.training.data.store import Sample
from unimodal.core.errors import BadRecordsError, DataError, ManifestError
from unimodal.core.grammar import IMAGE_SIZE
from unimodal.core.media import SAMPLE_RATE, load_audio, load_image, resample, square_resize  # noqa: F401 (used by the manifest readers)

FIELDS = ("text", "image", "audio")


class FolderDataset:
    """A user's JSONL manifest as an indexable data set of :class:`Sample` (files are read on access)."""

    def __init__(self, manifest: str | os.PathLike, skip_bad: bool = False, image_size: int = IMAGE_SIZE,
                 sample_rate: int = SAMPLE_RATE, check_files: bool = True, progress: bool = False,
                 allow_empty: bool = False):
        """``check_files``: read every record's files now (a bad one is found before any training);
        ``progress``: a bar over the manifest's records while they are read; ``allow_empty``: a manifest with no
        usable record is not refused (``data check`` lists its bad records instead)."""
        from tqdm.auto import tqdm

        self.manifest = Path(manifest)
        if not self.manifest.is_file():
            raise DataError(f"manifest {self.manifest} does not exist or is not a file")
        self.root = self.manifest.parent
        self.image_size, self.sample_rate = image_size, sample_rate
        self.records: list[tuple[int, dict]] = []
        self.skipped: list[ManifestError] = []
        lines = self._parse_lines()
        if progress:
            with open(self.manifest, "rb") as f:
                total = sum(1 for line in f if line.strip() and not line.lstrip().startswith(b"#"))
            lines = tqdm(lines, total=total, desc=f"reading {self.manifest.name}", unit="record", leave=False)
        for line_no, record in lines:
            try:
                record = self._check_record(line_no, record)
                if check_files:
                    self._load(line_no, record)
                self.records.append((line_no, record))
            except ManifestError as err:
                self.skipped.append(err)
            if progress:
                lines.set_postfix(bad=len(self.skipped), refresh=False)
        if progress:
            lines.close()
        if self.skipped and not skip_bad:
            raise BadRecordsError(self.manifest, self.skipped)
        if not self.records and not allow_empty:
            raise DataError(f"manifest {self.manifest} has no usable record"
                            + (f" ({len(self.skipped)} skipped, first: {self.skipped[0]})" if self.skipped else ""))

    def _parse_lines(self):
        with open(self.manifest, "rb") as f:
            for line_no, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    yield line_no, ManifestError(self.manifest, line_no, f"not UTF-8 text (byte {exc.start})")
                    continue
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    yield line_no, ManifestError(self.manifest, line_no, f"not valid JSON ({exc.msg})")
                    continue
                yield line_no, record

    def _check_record(self, line_no: int, record) -> dict:
        if isinstance(record, ManifestError):
            raise record
        if not isinstance(record, dict):
            raise ManifestError(self.manifest, line_no, f"expected a JSON object, got {type(record).__name__}")
        fields = {k: v for k, v in record.items() if k in FIELDS and v not in (None, "")}
        if not fields:
            raise ManifestError(self.manifest, line_no, f"no usable field: a record needs one of {FIELDS}")
        for key, value in fields.items():
            if not isinstance(value, str):
                raise ManifestError(self.manifest, line_no, f"field {key!r} must be a string, got {value!r}")
        return record

    def _load(self, line_no: int, record: dict) -> Sample:
        sample = Sample(sample_rate=self.sample_rate, meta={"line": line_no, **{k: v for k, v in record.items()
                                                                                 if k not in FIELDS}})
        sample.text = record.get("text") or None
        try:
            if record.get("image"):
                sample.image = load_image(self.root / record["image"], self.image_size)
            if record.get("audio"):
                sample.audio = load_audio(self.root / record["audio"], self.sample_rate)
        except DataError as exc:
            raise ManifestError(self.manifest, line_no, str(exc)) from exc
        return sample

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> Sample:
        line_no, record = self.records[index]
        return self._load(line_no, record)
