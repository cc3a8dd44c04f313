"""`unimodal serve --mcp` driven by the official MCP SDK's own client over stdio, as an agent would: the server is
a subprocess serving a tiny untrained model folder."""

import base64
import io
import json
import os
import sys

import anyio
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters  # noqa: E402

from conftest import write_tiny_model  # noqa: E402
from unimodal.core.grammar import known_vocabulary  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def model_with_vocabulary(tiny_codec_dir, tmp_path_factory):
    """A tiny model folder (prompts up to 32 tokens) plus the vocabulary.json the shipped model carries."""
    folder = write_tiny_model(tiny_codec_dir, tmp_path_factory.mktemp("mcp-model") / "model", max_text_len=32)
    (folder / "vocabulary.json").write_text(json.dumps({"data": ["scenes"], **known_vocabulary()}))
    return folder


def serve(model_dir, out_dir):
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": REPO, "UNIMODAL_CACHE": os.environ["UNIMODAL_CACHE"]}
    return Client(StdioServerParameters(command=sys.executable, cwd=REPO, env=env,
                                        args=["-m", "unimodal.cli", "serve", "--mcp", "--model", str(model_dir),
                                              "--out-dir", str(out_dir)]), read_timeout_seconds=120)


def texts(result):
    return [block.text for block in result.content if block.type == "text"]


def summary(result):
    return json.loads(texts(result)[-1])


async def session(model_dir, tmp_path):
    Image.new("RGB", (64, 64), (220, 40, 40)).save(tmp_path / "red.png")
    sf.write(tmp_path / "clip.wav", (0.2 * np.sin(np.arange(8000) / 6)).astype(np.float32), 16000)
    seen = {}
    async with serve(model_dir, tmp_path / "outputs") as client:
        seen["tools"] = (await client.list_tools()).tools
        seen["resources"] = [str(r.uri) for r in (await client.list_resources()).resources]
        seen["vocabulary"] = json.loads((await client.read_resource("unimodal://vocabulary")).contents[0].text)
        seen["missing file"] = await client.call_tool("generate", {"image": str(tmp_path / "nope.png"), "to": "text"})
        seen["steps 0"] = await client.call_tool("generate", {"text": "a red circle", "steps": 0})
        seen["steps true"] = await client.call_tool("generate", {"text": "a red circle", "steps": True})
        seen["cfg true"] = await client.call_tool("generate", {"text": "a red circle", "cfg": {"text": True}})
        seen["steps 2.0"] = await client.call_tool("generate", {"text": "a red circle", "steps": 2.0})
        seen["steps '0'"] = await client.call_tool("generate", {"text": "a red circle", "steps": "0"})
        seen["rivals 'no'"] = await client.call_tool("generate", {"text": "a red circle", "rivals": "no"})
        seen["repair 1"] = await client.call_tool("generate", {"text": "a red circle", "repair": 1})
        seen["misspelt"] = await client.call_tool("generate", {"text": "a red circle", "temprature": 0.5})
        seen["speech"] = await client.call_tool("generate", {"text": "a red circle", "to": "audio", "steps": 2})
        seen["bad out"] = await client.call_tool("generate", {"text": "a red circle", "out": str(tmp_path / "a.mp4")})
        seen["unknown tool"] = await client.call_tool("paint", {"text": "a red circle"})
        seen["image"] = await client.call_tool("generate", {"text": "a white hexagon", "to": "image", "steps": "2",
                                                            "rivals": "true"})  # JSON sent in strings: read
        seen["caption"] = await client.call_tool("generate", {"image": str(tmp_path / "red.png"), "to": "text",
                                                              "steps": 2, "out": str(tmp_path / "caption.txt")})
        seen["joint"] = await client.call_tool("generate", {"audio": str(tmp_path / "clip.wav"),
                                                            "to": ["text", "image"], "steps": 2,
                                                            "out": str(tmp_path / "joint")})
        seen.update(await self_critique(client, tmp_path))
    return seen


async def self_critique(client, tmp_path):
    """critique, refine and edit on a picture, each also called wrongly once, in the same session."""
    red, prompt = str(tmp_path / "red.png"), "a small red circle on the left"
    return {
        "critique": await client.call_tool("critique", {"input": red, "prompt": prompt, "threshold": 1.0}),
        "bad critique": await client.call_tool("critique", {"input": str(tmp_path / "nope.png")}),
        "refine": await client.call_tool("refine", {"input": red, "prompt": prompt, "rounds": 1,
                                                    "regions": [{"box": [0, 0, 16, 16]}],
                                                    "trace": str(tmp_path / "trace.json")}),
        "bad refine": await client.call_tool("refine", {"input": red, "critic": "psychic"}),
        "caption refine": await client.call_tool("refine", {"input": str(tmp_path / "caption.txt"), "source": red,
                                                            "model_caption": True, "rounds": 1}),
        "edit": await client.call_tool("edit", {"input": red, "box": [0, 0, 16, 16], "prompt": "a blue square",
                                                "out": str(tmp_path / "edited.png")}),
        "bad edit": await client.call_tool("edit", {"input": red, "seconds": [0, 1]}),
        "steps to critique": await client.call_tool("critique", {"input": red, "steps": 4}),
        "box of flags": await client.call_tool("edit", {"input": red, "box": [True, 0, 8, 8], "prompt": "a circle"}),
        "instructed": await client.call_tool("edit", {"input": red, "instruction": "make the square blue",
                                                      "prompt": "a large red square in the center"}),
        "bad instruction": await client.call_tool("edit", {"input": red, "instruction": "paint it blue"}),
        "margin on a picture": await client.call_tool("edit", {"input": red, "instruction": "make the square blue",
                                                               "speech_margin": 0.6}),
        "after": await client.call_tool("generate", {"text": "a red circle", "to": "image", "steps": 1}),
    }


@pytest.fixture(scope="module")
def seen(model_with_vocabulary, tmp_path_factory):
    return anyio.run(session, model_with_vocabulary, tmp_path_factory.mktemp("mcp-session"))


def test_generate_is_listed_with_a_schema_for_every_argument(seen):
    (tool,) = [t for t in seen["tools"] if t.name == "generate"]
    properties = tool.input_schema["properties"]
    expected = {"to", "text", "image", "audio", "out", "steps", "mode", "tau", "temperature", "top_k", "top_p",
                "cfg", "choice_temperature", "seed", "max_text_tokens", "max_audio_seconds", "candidates",
                "accept_confidence", "accept_agreement", "agreement", "plan", "refine", "repair", "rivals",
                "rephrase"}
    assert set(properties) == expected
    assert all(properties[name].get("description") for name in expected)
    assert {"minimum": 1, "type": "integer"} in properties["steps"]["anyOf"]
    assert {"enum": ["text", "text-only", "none"], "type": "string"} in properties["plan"]["anyOf"]
    assert {"enum": ["joint", "each"], "type": "string"} in properties["agreement"]["anyOf"]
    assert {"minimum": 0, "maximum": 32, "type": "integer"} in properties["refine"]["anyOf"]
    assert {"type": "boolean"} in properties["repair"]["anyOf"]
    for each in seen["tools"]:  # every range a JSON-schema bound (strings read as JSON must not hide them)
        schema = json.dumps(each.input_schema)
        assert not any(f'"{key}":' in schema for key in ("ge", "gt", "le", "lt")), each.name


def test_the_vocabulary_is_a_resource(seen):
    assert {"unimodal://vocabulary", "unimodal://model"} <= set(seen["resources"])
    assert seen["vocabulary"]["colors"] == known_vocabulary()["colors"]
    assert "circle" in seen["vocabulary"]["shapes"]


def test_bad_calls_are_tool_errors_that_name_the_cause(seen):
    assert seen["missing file"].is_error and "InputFileError" in texts(seen["missing file"])[0]
    assert seen["steps 0"].is_error and "greater than or equal to 1" in texts(seen["steps 0"])[0]
    # numbers and flags are strict, as in serve --stdio: a boolean or a float is not a count, a number or a word is
    # not a flag; a value JSON-encoded in a string is read as that JSON first ("0": the range check speaks)
    assert seen["steps '0'"].is_error and "greater than or equal to 1" in texts(seen["steps '0'"])[0]
    for name in ("steps true", "cfg true", "steps 2.0", "rivals 'no'", "repair 1"):
        message = texts(seen[name])[0]
        assert seen[name].is_error and name.split()[0] in message, (name, message)
        assert any(f"valid {kind}" in message for kind in ("integer", "number", "boolean")), (name, message)
    assert seen["bad out"].is_error and "OutputPathError" in texts(seen["bad out"])[0]
    # an argument the tool does not take is refused by name, not dropped (as serve --stdio refuses unknown keys)
    misspelt = texts(seen["misspelt"])[0]
    assert seen["misspelt"].is_error and misspelt.startswith("InputError: unknown argument(s) 'temprature' of "
                                                             "generate; accepted: to, text,")
    assert "temperature" in misspelt
    assert seen["unknown tool"].is_error and "paint" in texts(seen["unknown tool"])[0]


def test_the_server_keeps_serving_after_bad_calls(seen, tmp_path_factory):
    image = seen["image"]
    assert not image.is_error
    (picture,) = [block for block in image.content if block.type == "image"]
    assert picture.mime_type == "image/png"
    assert Image.open(io.BytesIO(base64.b64decode(picture.data))).size == (64, 64)
    files = summary(image)["files"]
    assert os.path.isfile(files["image"]) and os.path.isfile(files["json"])
    assert any("never saw" in w and "'white'" in w and "'hexagon'" in w for w in summary(image)["warnings"])


def test_text_comes_back_as_text_and_audio_as_a_file(seen):
    caption = seen["caption"]
    assert not caption.is_error and len(texts(caption)) == 2
    assert summary(caption)["text"] == texts(caption)[0]
    assert open(summary(caption)["files"]["text"]).read().strip() == texts(caption)[0].strip()
    assert not seen["joint"].is_error, texts(seen["joint"])
    joint = summary(seen["joint"])
    assert joint["modalities"] == ["text", "image"] and set(joint["files"]) == {"text", "image", "json"}
    speech = seen["speech"]
    assert not speech.is_error and [block.type for block in speech.content] == ["audio", "text"]  # + the summary
    (clip,) = [block for block in speech.content if block.type == "audio"]
    assert clip.mime_type == "audio/wav"
    played, rate = sf.read(io.BytesIO(base64.b64decode(clip.data)))
    assert rate == 16000 and len(played) > 0
    assert sf.info(summary(speech)["files"]["audio"]).samplerate == 16000


# ---- critique, refine, edit -------------------------------------------------------------------------------------


def test_the_self_critique_tools_have_a_schema_for_every_argument(seen):
    tools = {t.name: t for t in seen["tools"]}
    expected = {"critique": {"input", "prompt", "critic", "fraction", "threshold", "check", "out", "seed", "source",
                             "model_caption"},
                "refine": {"input", "prompt", "rounds", "budget", "critic", "fraction", "threshold", "check",
                           "regions", "out", "trace", "seed", "evaluator", "patience", "source", "model_caption",
                           "repair"},
                "edit": {"input", "prompt", "box", "seconds", "chars", "instruction", "out", "trace", "seed",
                         "candidates", "attempts", "draft", "speech_margin", "refine"}}
    for name, arguments in expected.items():
        properties = tools[name].input_schema["properties"]
        assert set(properties) == arguments, name
        assert all(properties[a].get("description") for a in arguments), name
        assert tools[name].input_schema["required"] == ["input"]
    for name in ("critique", "refine"):  # optional: the library's default (content+learned for speech on a trained head)
        critic = tools[name].input_schema["properties"]["critic"]
        assert [choice.get("enum") for choice in critic["anyOf"]] == [
            ["confidence", "content", "content+learned", "learned", "random"], None]
        assert critic.get("default") is None
    evaluator = tools["refine"].input_schema["properties"]["evaluator"]  # optional: the library's default
    assert [choice.get("enum") for choice in evaluator["anyOf"]] == [["critic", "agreement", "agreement-each"], None]


def test_refine_reads_a_caption_generate_wrote_against_its_picture(seen):
    refine = seen["caption refine"]
    assert not refine.is_error, texts(refine)
    result, trace = (json.loads(text) for text in texts(refine)[-2:])
    assert os.path.isfile(result["files"]["text"]) and trace["caption_recipe"] is True
    assert trace["evaluator"] == "agreement" and trace["thresholds"] == {"text": 0.9}


def test_critique_returns_its_heat_map_and_the_report(seen):
    critique = seen["critique"]
    assert not critique.is_error, texts(critique)
    (picture,) = [block for block in critique.content if block.type == "image"]
    assert Image.open(io.BytesIO(base64.b64decode(picture.data))).size == (512, 256)
    report = summary(critique)
    assert len(report["scores"]["image"]) == 64 and report["regions"]
    assert os.path.isfile(report["files"]["picture"])


def test_refine_returns_the_result_then_its_trace(seen):
    refine = seen["refine"]
    assert not refine.is_error, texts(refine)
    assert [block.type for block in refine.content] == ["image", "text", "text"]
    result, trace = (json.loads(text) for text in texts(refine))
    assert os.path.isfile(result["files"]["image"]) and result["settings"]["refine"]["critic"] == "confidence"
    assert json.loads(open(result["files"]["trace"]).read()) == trace
    assert trace["rounds"][0]["regions"][0]["box"] == [0, 0, 16, 16]


def test_edit_returns_the_edited_picture(seen):
    edit = seen["edit"]
    assert not edit.is_error, texts(edit)
    assert [block.type for block in edit.content] == ["image", "text"]
    assert summary(edit)["settings"]["edit"]["tokens_remasked"] == {"image": 4}
    assert os.path.isfile(summary(edit)["files"]["image"])


def test_an_instructed_edit_returns_the_picture_then_its_plan_and_verdict(seen):
    edit = seen["instructed"]
    assert not edit.is_error, texts(edit)
    assert [block.type for block in edit.content] == ["image", "text", "text"]
    result, trace = (json.loads(text) for text in texts(edit))
    assert os.path.isfile(result["files"]["image"]) and result["settings"]["verdict"] == trace["check"]["parses_to_target"]
    assert trace["plan"]["target"] == "a large blue square in the center" and trace["tokens_changed"]["outside"] == 0
    assert seen["bad instruction"].is_error and "not in the instruction language" in texts(seen["bad instruction"])[0]


def test_bad_self_critique_calls_are_tool_errors_and_the_server_goes_on(seen):
    assert seen["bad critique"].is_error and "InputFileError: input: no such file" in texts(seen["bad critique"])[0]
    assert seen["bad refine"].is_error and "psychic" in texts(seen["bad refine"])[0]
    assert seen["bad edit"].is_error and "InputError: a seconds region is for audio" in texts(seen["bad edit"])[0]
    assert seen["box of flags"].is_error and "box" in texts(seen["box of flags"])[0]
    assert seen["steps to critique"].is_error
    assert "unknown argument(s) 'steps' of critique" in texts(seen["steps to critique"])[0]
    assert "valid number" in texts(seen["box of flags"])[0]
    margin = seen["margin on a picture"]
    assert margin.is_error and "speech_margin widens the stretch an instructed speech edit" in texts(margin)[0]
    assert not seen["after"].is_error
