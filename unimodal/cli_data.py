"""``unimodal data``: build the embedded data sets, pack them for a GPU machine, show and check them."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _cmd_data_build(args) -> int:
    from unimodal.training.data.build import build

    out = build(args.name, n=args.n, seed=args.seed, out=args.out, speech=not args.no_speech,
                pair_fraction=args.pair_fraction, voices=args.voices, reuse=args.reuse)
    print(out)
    return 0


def _cmd_data_pack(args) -> int:
    from unimodal.training.pack import build_pack, load_pack
    from unimodal.core.paths import default_codecs_dir

    path = build_pack([d for d in args.data.split(",") if d], args.codecs or default_codecs_dir(), args.out,
                      args.max_audio_seconds, skip_bad=args.skip_bad)
    pack = load_pack(path)
    parts = pack.train_parts()
    weights = "; train weights " + ", ".join(f"{Path(s).name} x{w:g}" for s, _, w in parts) \
        if any(w != 1 for _, _, w in parts) else ""
    print(f"{path} ({path.stat().st_size / 2**20:.1f} MiB): "
          + ", ".join(f"{k} {v}" for k, v in pack.meta["counts"].items()) + weights)
    return 0


def _cmd_data_info(args) -> int:
    from unimodal.training.data.store import read_info

    print(json.dumps(read_info(args.dir), indent=2, sort_keys=True))
    return 0


def _cmd_data_check(args) -> int:
    from unimodal.training.data.folder import FolderDataset

    # every record read, each bad one listed (not the first alone), even when none is usable
    dataset = FolderDataset(args.manifest, skip_bad=True, progress=True, allow_empty=True)
    for err in dataset.skipped:
        print(f"{'skipped' if args.skip_bad else 'bad'}: {err}", file=sys.stderr)
    counts = {m: 0 for m in ("text", "image", "audio")}
    for _, record in dataset.records:
        for m in counts:
            counts[m] += bool(record.get(m))
    print(json.dumps({"manifest": str(args.manifest), "records": len(dataset),
                      "skipped" if args.skip_bad else "bad": len(dataset.skipped), "with": counts}, indent=2))
    if not len(dataset):
        print(f"error: {args.manifest}: no usable record" + (" (each bad one listed above)" if dataset.skipped
                                                              else ""), file=sys.stderr)
        return 2
    if dataset.skipped and not args.skip_bad:
        print(f"error: {args.manifest}: {len(dataset.skipped)} bad record(s), listed above; fix them, or pass "
              f"--skip-bad to unimodal train or data pack to go on without them", file=sys.stderr)
        return 2
    return 0


def add_data_commands(sub) -> None:
    data = sub.add_parser("data", help="build and inspect data sets").add_subparsers(dest="data_cmd", required=True)
    build = data.add_parser("build", help="build an embedded data set (scenes, digits) into a cache folder")
    build.add_argument("name", help="scenes or digits")
    build.add_argument("--n", type=int, default=None, help="samples in train+val+test (scenes default 2000; "
                                                          "digits default and maximum 1797)")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--out", default=None, help="output folder (default: ~/.cache/unimodal/data/NAME-nN-seedS)")
    build.add_argument("--no-speech", action="store_true", help="skip the spoken captions")
    build.add_argument("--pair-fraction", type=float, default=None, help="scenes: the share of two-object scenes "
                       "(default 0.4); the default folder then ends in -pairsF")
    build.add_argument("--voices", default="varied", help="the eSpeak voices the captions are spoken in: varied "
                       "(default; many voices, what audio inputs must understand) or clear (the few the speech judge "
                       "hears best); clear names the default folder -voicesclear")
    build.add_argument("--reuse", action="store_true", help="keep the output folder as it is when it already holds "
                       "a complete build with these settings (builds are deterministic)")
    build.set_defaults(func=_cmd_data_build)
    info = data.add_parser("info", help="print a built data set's info.json")
    info.add_argument("dir")
    info.set_defaults(func=_cmd_data_info)
    pack = data.add_parser("pack", help="tokenise every split into one small file that training reads without "
                                        "codecs (what a GPU machine trains on)")
    pack.add_argument("--data", required=True, help="comma-separated: scenes, digits, built data folders, manifests; "
                      "NAME:W draws a set's training samples W times an epoch (e.g. scenes,digits:4)")
    pack.add_argument("--codecs", default=None, help="codec folder (default: the package's shipped codecs)")
    pack.add_argument("--max-audio-seconds", type=float, default=None, help="longest audio a sample keeps")
    pack.add_argument("--out", required=True, help="the pack file, named *.pack.safetensors")
    pack.add_argument("--skip-bad", action="store_true", help="a manifest's bad records are skipped, counted and "
                      "listed on stderr, instead of refusing the pack")
    pack.set_defaults(func=_cmd_data_pack)
    check = data.add_parser("check", help="validate a JSONL manifest of your own data")
    check.add_argument("manifest")
    check.add_argument("--skip-bad", action="store_true", help="bad records are listed as skipped and the check "
                       "passes if any record is usable (as train --skip-bad would go on); without it every bad "
                       "record is listed and the check fails (exit status 2)")
    check.set_defaults(func=_cmd_data_check)


__all__ = ["add_data_commands"]
