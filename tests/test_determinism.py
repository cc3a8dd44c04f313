"""Same model, inputs, settings and seed -> the same tokens: twice in one process (whatever ran in between), in
two fresh processes (another hash seed, another load of the folder), and in one ``generate_batch`` call vs one
request at a time. Sampling at temperature 1 with guidance, so the seed and every guidance row matter."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = dict(steps=4, temperature=1.0, cfg=2.0, seed=3)


@pytest.fixture(scope="module")
def pipe(tiny_model_dir):
    from unimodal import UniModal

    return UniModal.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def requests(tmp_path_factory):
    """text->image, image->text and a joint request (text->image+audio), as JSON so a subprocess reads the same."""
    image = np.zeros((64, 64, 3), np.uint8)
    image[16:40, 8:30] = (220, 40, 40)
    path = tmp_path_factory.mktemp("determinism") / "red.png"
    Image.fromarray(image).save(path)
    return {"text->image": {"text": "a small red circle on the left", "to": "image"},
            "image->text": {"image": str(path), "to": "text"},
            "text->image+audio": {"text": "a blue square", "to": ["image", "audio"]}}


def tokens(pipe, request, **settings):
    return pipe.generate(**request, **{**SETTINGS, **settings}).token_ids


def disturb_global_state():
    """What a caller might do between two calls: use the global generators of torch and numpy."""
    torch.manual_seed(12345)
    torch.rand(7)
    np.random.seed(99)
    np.random.rand(3)


def test_twice_in_one_process(pipe, requests):
    first = {name: tokens(pipe, request) for name, request in requests.items()}
    disturb_global_state()
    for name, request in reversed(list(requests.items())):  # another order: nothing carries over between calls
        assert tokens(pipe, request) == first[name], name
    assert all(first.values())
    assert tokens(pipe, requests["text->image"], seed=4) != first["text->image"]  # the seed does matter


def test_a_second_load_of_the_folder_gives_the_same_tokens(pipe, requests, tiny_model_dir):
    from unimodal import UniModal

    again = UniModal.from_pretrained(tiny_model_dir)
    for name, request in requests.items():
        assert tokens(again, request) == tokens(pipe, request), name


SCRIPT = """
import json, sys
from unimodal import UniModal
pipe = UniModal.from_pretrained(sys.argv[1])
requests, settings = json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(json.dumps({name: pipe.generate(**request, **settings).token_ids for name, request in requests.items()}))
"""


def in_fresh_process(model_dir, requests, hash_seed: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(model_dir), json.dumps(requests), json.dumps(SETTINGS)],
                          capture_output=True, text=True, env=env, cwd=REPO, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_two_processes_and_this_one_agree(pipe, requests, tiny_model_dir):
    """Another PYTHONHASHSEED in each process: no set or dict order of strings may reach the tokens."""
    here = {name: {m: ids for m, ids in tokens(pipe, request).items()} for name, request in requests.items()}
    assert in_fresh_process(tiny_model_dir, requests, "1") == here
    assert in_fresh_process(tiny_model_dir, requests, "2") == here


def test_the_cli_gives_the_tokens_the_api_gives(pipe, requests, tiny_model_dir, tmp_path):
    request = requests["text->image+audio"]
    argv = ["generate", "--model", str(tiny_model_dir), "--text", request["text"], "--to", "image,audio",
            "--out", str(tmp_path / "out"), "--json", "--quiet", "--steps", "4", "--temperature", "1",
            "--cfg", "2", "--seed", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    done = subprocess.run([sys.executable, "-m", "unimodal.cli", *argv], capture_output=True, text=True, env=env,
                          cwd=REPO, check=True)
    assert json.loads(done.stdout)["token_ids"] == tokens(pipe, request)


def test_batch_equals_one_by_one(pipe, requests):
    """Two requests of each kind (so some share a sampler call, prompts of other lengths padded together) plus
    one with its own seed; request i without a seed gets seed + i, as generate(seed=seed + i) would."""
    batch = [requests["text->image"], {"text": "a green cross", "to": "image"}, requests["image->text"],
             {**requests["image->text"], "seed": 40}, requests["text->image+audio"],
             {"text": "two", "to": ["image", "audio"]}]
    together = pipe.generate_batch(batch, **SETTINGS)
    for index, (request, result) in enumerate(zip(batch, together)):
        seed = request.get("seed", SETTINGS["seed"] + index)
        alone = tokens(pipe, {k: v for k, v in request.items() if k != "seed"}, seed=seed)
        assert result.token_ids == alone, (index, request)
        assert result.settings["seed"] == seed
