"""``unimodal bench recipe-curve``: judged accuracy against counted training compute, diffusion and its twin."""

import json
import math

import pytest

from unimodal.core.errors import InputError
from unimodal.core.paths import model_hash
from unimodal.recipe_curve import build_curve, format_curve, training_flops, wilson_interval
from unimodal.training.train import TrainConfig, train

TASKS = {"text->image": 1.0, "image->text": 1.0}


def _run(folder, tiny_codec_dir, tiny_scenes, **kw):
    cfg = TrainConfig(**{**dict(preset="tiny", steps=2, batch_size=4, warmup=1, val_every=2, val_samples=2,
                                checkpoint_every=2, bf16=False, task_weights=TASKS), **kw})
    train(folder, [str(tiny_scenes)], tiny_codec_dir, cfg, progress=False)
    return folder


def _recipe(folder, data, steps, variants):
    """A recipe.json beside its runs, as bench recipe leaves it (judged verdicts given): each variant (overrides,
    verdicts by direction[, validation loss at its end by direction])."""
    report = {"budget": {"data": data, "preset": "tiny", "steps": steps, "batch_size": 4, "lr": 1e-3, "tasks": TASKS,
                         "eval_n": 10, "seed": 0},
              "variants": {name: {"overrides": spec[0], "run": f"{folder.name}/{name}", "seconds": 60.0,
                                  "judged": {d: {"accuracy": sum(v) / len(v), "verdicts": v}
                                             for d, v in spec[1].items()},
                                  "probe": {}, "val": spec[2] if len(spec) > 2 else {}}
                           for name, spec in variants.items()}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipe.json").write_text(json.dumps(report))
    return folder / "recipe.json"


def test_wilson_interval():
    low, high = wilson_interval(0, 10)
    assert low == 0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(44, 64)
    assert low == pytest.approx(0.566, abs=1e-3) and high == pytest.approx(0.788, abs=1e-3)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


def test_counted_compute_follows_the_step_as_it_runs(tiny_codec_dir, tiny_scenes, tmp_path):
    data = str(tiny_scenes)
    comp = training_flops(_run(tmp_path / "comp", tiny_codec_dir, tiny_scenes), data)
    once = training_flops(_run(tmp_path / "once", tiny_codec_dir, tiny_scenes, masking="independent"), data)
    longer = training_flops(_run(tmp_path / "longer", tiny_codec_dir, tiny_scenes, steps=4), data)
    twin = training_flops(_run(tmp_path / "twin", tiny_codec_dir, tiny_scenes, objective="ar"), data)
    assert comp["objective"] == "diffusion" and twin["objective"] == "ar" and twin["masking"] is None
    assert comp["flops"] == pytest.approx(2 * comp["flops_per_step"]) and longer["steps"] == 4
    # a complementary mask trains each sample twice, its condition computed once: more than one row, under two
    assert once["flops_per_step"] < comp["flops_per_step"] < 2 * once["flops_per_step"]
    assert twin["flops_per_step"] > 0
    with pytest.raises(InputError, match="history.json"):
        training_flops(tmp_path / "nothing", data)


def test_the_curve_reads_each_objective_in_log_compute(tiny_codec_dir, tiny_scenes, tmp_path, monkeypatch):
    import unimodal.recipe_curve as rc

    flops = {"d1": 1e12, "d2": 1e13, "a1": 1e12 * 10 ** 0.5}
    monkeypatch.setattr(rc, "training_flops", lambda run, data: {
        "flops": flops[run.name], "objective": "ar" if run.name.startswith("a") else "diffusion",
        "masking": None if run.name.startswith("a") else "complementary"})
    right = lambda k: [1] * k + [0] * (10 - k)  # noqa: E731
    small = _recipe(tmp_path / "small", "scenes", 600, {"d1": ({}, {"text->image": right(1), "image->text": right(2)},
                                                               {"image->text": 0.6}),
                                                         "a1": ({"objective": "ar"}, {"text->image": right(3),
                                                                                      "image->text": right(7)},
                                                                {"image->text": 0.3})})
    large = _recipe(tmp_path / "large", "scenes", 1200, {"d2": ({}, {"text->image": right(3), "image->text": right(4)},
                                                                {"image->text": 0.5})})
    curve = build_curve([f"{small}:d1", f"{small.parent}:a1", f"{large}:d2"])
    reading = curve["analysis"]["image->text"]
    assert reading["fits"]["diffusion"]["per_tenfold"] == pytest.approx(0.2)  # 0.2 -> 0.4 over a tenfold
    assert reading["fits"]["ar"] is None and reading["crossing"] is None  # one point makes no line
    row = reading["against_twin"][0]
    assert row["diffusion_at_same_flops"] == pytest.approx(0.3)  # halfway in log compute
    assert row["compute_ratio"] == pytest.approx(10 ** ((0.7 - 0.2) / 0.2) / 10 ** 0.5) and row["extrapolated"]
    drawing = curve["analysis"]["text->image"]["against_twin"][0]
    assert drawing["compute_ratio"] == pytest.approx(10 ** 0.5) and not drawing["extrapolated"]
    point = next(p for p in curve["points"] if p["variant"] == "a1")
    assert point["judged"]["image->text"]["ci95"] == pytest.approx(list(wilson_interval(7, 10)))
    flops["a2"] = 1e13  # a second twin run: reading 0.7 -> 0.8 over half a decade, a line 0.2 a decade
    more = _recipe(tmp_path / "more", "scenes", 2400, {"a2": ({"objective": "ar"}, {"text->image": right(3),
                                                                                   "image->text": right(8)},
                                                              {"image->text": 0.5})})
    curve = build_curve([f"{small}:d1", f"{small}:a1", f"{large}:d2", f"{more}:a2"])
    # the validation loss each run ended with: diffusion's falls, the twin's rises (it repeats its data past what it
    # generalises from); a direction without the figure has none
    assert curve["analysis"]["image->text"]["validation"] == {
        "diffusion": {"ended": [[600, 0.6], [1200, 0.5]], "rises": False},
        "ar": {"ended": [[600, 0.3], [2400, 0.5]], "rises": True}}
    assert curve["analysis"]["text->image"]["validation"] == {}
    table = format_curve(curve)
    assert "image->text: ar validation loss at each run's end (steps): 0.300 (600), 0.500 (2400); it rises" in table
    assert "image->text: diffusion validation loss at each run's end (steps): 0.600 (600), 0.500 (1200)\n" in table
    assert curve["analysis"]["image->text"]["crossing"] == {"never": True}  # both climb 0.2 a decade
    crossing = curve["analysis"]["text->image"]["crossing"]  # diffusion 0.2 a decade, the twin flat at 0.3
    assert not crossing["never"] and crossing["flops"] == pytest.approx(1e13) and crossing["accuracy"] == pytest.approx(0.3)
    other = _recipe(tmp_path / "other", "scenes", 600, {"d3": ({"task_weights": {"text->image": 2.0, "image->text": 1.0}},
                                                               {"text->image": right(5), "image->text": right(5)})})
    flops["d3"] = 1e12
    with pytest.raises(InputError, match="same task mixture"):
        build_curve([f"{small}:d1", f"{other}:d3"])
    with pytest.raises(InputError, match="are the same run"):  # its folder and its recipe.json name one run
        build_curve([f"{small}:d1", f"{small.parent}:d1", f"{large}:d2"])
    assert "source" not in curve["points"][0]  # the absolute path that told runs apart stays out of the report
    monkeypatch.undo()  # a report that recorded its count draws without its runs (none exist here)
    report = json.loads(small.read_text())
    for name, value in (("d1", 1e12), ("a1", 1e12 * 10 ** 0.5)):
        report["variants"][name]["train_flops"] = value
    small.write_text(json.dumps(report))
    recorded = build_curve([f"{small}:d1", f"{small}:a1"])
    assert [(p["variant"], p["objective"], p["flops"]) for p in recorded["points"]] == \
        [("d1", "diffusion", 1e12), ("a1", "ar", 1e12 * 10 ** 0.5)]
    with pytest.raises(InputError, match="history.json"):  # neither the runs nor a recorded count
        build_curve([f"{large}:d2"])
    with pytest.raises(InputError, match="no variant 'd9'"):
        build_curve([f"{small}:d9"])
    with pytest.raises(InputError, match="RECIPE:VARIANT"):
        build_curve(["just-a-name"])


def test_an_eval_judges_a_point_only_of_its_own_model(tiny_codec_dir, tiny_scenes, tmp_path, capsys):
    from unimodal.cli import main

    folder = tmp_path / "exp"
    folder.mkdir()
    run = _run(folder / "d1", tiny_codec_dir, tiny_scenes)
    _run(folder / "a1", tiny_codec_dir, tiny_scenes, objective="ar")
    right = [1, 0, 0, 0]
    recipe = _recipe(folder, str(tiny_scenes), 2, {"d1": ({}, {"text->image": right, "image->text": right}),
                                                    "a1": ({"objective": "ar"}, {"text->image": right,
                                                                                 "image->text": [1, 1, 0, 0]})})
    ev = {"figures": {"image->text": {"accuracy": 0.5, "verdicts": [1, 0] * 8}, "text->image": {
        "accuracy": 0.25, "verdicts": [1, 0, 0, 0] * 4}}, "model_hash": model_hash(run / "model")}
    (tmp_path / "eval.json").write_text(json.dumps(ev))
    assert main(["bench", "recipe-curve", f"{recipe}:d1={tmp_path / 'eval.json'}", f"{recipe}:a1",
                 "--out", str(tmp_path / "curve")]) == 0
    curve = json.loads((tmp_path / "curve" / "curve.json").read_text())
    judged = next(p for p in curve["points"] if p["variant"] == "d1")["judged"]
    assert judged["image->text"]["n"] == 16 and judged["image->text"]["right"] == 8
    assert (tmp_path / "curve" / "curve.png").stat().st_size > 1000
    assert "PFLOP" in capsys.readouterr().out
    ev["model_hash"] = "0123456789abcdef"
    (tmp_path / "eval.json").write_text(json.dumps(ev))
    with pytest.raises(InputError, match="not d1's"):
        build_curve([f"{recipe}:d1={tmp_path / 'eval.json'}"])
    # the runs gone: a report that recorded the count and the model's hash still draws, and still checks the eval
    report = json.loads(recipe.read_text())
    report["variants"]["d1"].update(train_flops=1e9, model_hash="0123456789abcdef")
    report["variants"]["a1"]["train_flops"] = 1e9
    moved = tmp_path / "committed"
    moved.mkdir()
    (moved / "recipe.json").write_text(json.dumps(report))
    curve = build_curve([f"{moved}:d1={tmp_path / 'eval.json'}", f"{moved}:a1"])
    assert [p["flops"] for p in curve["points"]] == [1e9, 1e9]
    with pytest.raises(InputError, match="says which model"):
        build_curve([f"{moved}:a1={tmp_path / 'eval.json'}"])


def test_bench_recipe_records_each_runs_counted_compute(tiny_codec_dir, tiny_scenes, tmp_path):
    from unimodal.recipe import RecipeBudget, train_variant

    budget = RecipeBudget(data=str(tiny_scenes), preset="tiny", steps=2, batch_size=4)
    facts = train_variant(budget, "v", {"bf16": False}, tiny_codec_dir, tmp_path, False)
    assert facts["train_flops"] == pytest.approx(training_flops(tmp_path / "v", str(tiny_scenes))["flops"])
    assert facts["train_flops"] > 0 and facts["model_hash"] == model_hash(tmp_path / "v" / "model")
