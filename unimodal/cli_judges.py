"""``unimodal judges``: calibrate the independent judges that ``unimodal eval`` scores with."""

from __future__ import annotations

import json


def _default_scenes_dir():
    from unimodal.core.paths import data_dir

    return data_dir("scenes", 2000, 0)


def _cmd_judges(args) -> int:
    from unimodal.judges import calibrate
    from unimodal.training.data import BuiltDataset

    data = BuiltDataset(args.data or _default_scenes_dir(), args.split)
    scenes = [data[i] for i in range(min(args.n, len(data)))]
    speech = [s for s in scenes[: args.speech_n] if s.audio is not None]
    report = {"data": str(data.data_dir), "split": args.split, **calibrate(scenes, speech, digit_split=args.split)}
    print(f"scene judge : {report['scene']['object_accuracy']:.1%} of {report['scene']['objects']} objects, "
          f"{report['scene']['scene_accuracy']:.1%} of {report['scene']['scenes']} scenes fully right")
    print(f"digit judge : {report['digit']['accuracy']:.1%} on the real digits' {args.split} split")
    if "speech" in report:
        print(f"speech judge: WER {report['speech']['wer']:.3f} on {report['speech']['clips']} real eSpeak "
              f"captions ({report['speech']['seconds_per_clip']:.2f} s per clip)")
        if "heard_right" in report["speech"]:
            speech = report["speech"]
            parts = lambda key: ", ".join(f"{k} {v['heard_right']:.1%} of {v['clips']}" for k, v in speech[key].items())
            print(f"              heard right (the transcript parses to the scene; the ceiling of text->audio, "
                  f"image->audio and joint speech): {speech['heard_right']:.1%}")
            print(f"              by objects: {parts('heard_right_by_objects')}")
            print(f"              by voice: {parts('heard_right_by_voice')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


def add_judge_commands(sub) -> None:
    judges = sub.add_parser("judges", help="measure the independent judges on ground truth (needs unimodal[eval])")
    judges.add_argument("--data", default=None, help="a built scenes set (default: the cached scenes-n2000-seed0)")
    judges.add_argument("--split", default="test", choices=["val", "test"])
    judges.add_argument("--n", type=int, default=200, help="scenes to judge")
    judges.add_argument("--speech-n", type=int, default=100, help="spoken captions to transcribe")
    judges.add_argument("--json", default=None, help="also write the figures to this JSON file")
    judges.set_defaults(func=_cmd_judges)


__all__ = ["add_judge_commands"]
