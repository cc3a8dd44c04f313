"""The instruction language of instructed edits: what ``UniModal.edit(content, instruction=...)`` understands.

A small, explicit language over the caption grammar (:mod:`unimodal.core.grammar`), so an instruction is either
understood exactly or refused with the list of forms, never guessed at:

- pictures, one attribute of one object: ``make the <object> <colour|size>``, ``make it <colour|size>``,
  ``turn the <object> into a <shape>``, ``move the <object> to the <position>``, where ``<object>`` is one or
  more of its colour, size and shape words ("the circle", "the red circle", "the small red circle");
- captions and speech, one word: ``replace '<old>' by '<new>'`` (or ``with``), ``say '<new>' instead of '<old>'``.

Parsing needs no model and no torch, so a server refuses a bad instruction before anything heavy runs. Applying
an instruction to a scene's attributes (:func:`apply_instruction`) or a word edit to a text (:func:`replace_word`)
is also here: both are facts about the grammar, not about the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from unimodal.core.errors import InputError
from unimodal.core.grammar import COLORS, POSITIONS, SHAPES, SIZES

FORMS = (
    "make the <object> <colour or size>   e.g. make the circle blue, make the red square large",
    "make it <colour or size>             (a picture of one object)",
    "turn the <object> into a <shape>     e.g. turn the blue cross into a triangle",
    "move the <object> to the <position>  e.g. move the square to the top (a picture of one object)",
    "replace '<old>' by '<new>'           a caption or speech: one word or phrase, e.g. replace 'small' by 'large'",
    "say '<new>' instead of '<old>'       the same, e.g. say 'green' instead of 'red'",
)
# Which content each kind of instruction applies to: attributes are read from a picture, words from a text.
MODALITIES_OF = {"attribute": ("image",), "word": ("text", "audio")}
_KINDS = {"color": COLORS, "size": SIZES, "shape": SHAPES}
_QUOTE = "['\"\u2018\u2019\u201c\u201d]"
_PATTERNS = (
    ("make", re.compile(r"^make (?:the (?P<ref>[a-z ]+?)|(?P<it>it)) (?P<value>[a-z]+)$")),
    ("turn", re.compile(r"^(?:turn|change) (?:the (?P<ref>[a-z ]+?)|(?P<it>it)) into an? (?P<value>[a-z]+)$")),
    ("move", re.compile(r"^move (?:the (?P<ref>[a-z ]+?)|(?P<it>it)) to the (?P<value>[a-z]+)$")),
    ("replace", re.compile(rf"^replace {_QUOTE}(?P<old>[^'\"]+){_QUOTE} (?:by|with) {_QUOTE}(?P<new>[^'\"]+){_QUOTE}$",
                           re.IGNORECASE)),
    ("say", re.compile(rf"^say {_QUOTE}(?P<new>[^'\"]+){_QUOTE} instead of {_QUOTE}(?P<old>[^'\"]+){_QUOTE}$",
                       re.IGNORECASE)),
)


@dataclass(frozen=True)
class Instruction:
    """One understood instruction. ``kind``: "attribute" (a picture's object) or "word" (a text's word).
    Attribute: ``ref`` the words naming the object (empty for "it"), ``key`` / ``value`` the change
    (``{"color": "blue"}``, ``{"position": "top"}``...). Word: ``old`` and ``new``."""

    text: str
    kind: str
    ref: tuple[str, ...] = ()
    key: str | None = None
    value: str | None = None
    old: str | None = None
    new: str | None = None

    def to_dict(self) -> dict:
        if self.kind == "word":
            return {"instruction": self.text, "kind": "word", "old": self.old, "new": self.new}
        return {"instruction": self.text, "kind": "attribute", "object": " ".join(self.ref) or "it",
                "change": {self.key: self.value}}


def forms_text() -> str:
    return "understood forms:\n  " + "\n  ".join(FORMS)


def parse_instruction(text) -> Instruction:
    """``text`` as an :class:`Instruction`, or an InputError that quotes it and lists the forms understood."""
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"instruction must be a non-empty string, got {text!r}; {forms_text()}")
    said = " ".join(text.strip().rstrip(".!").split())
    plain = said.lower().replace("centre", "center")
    for verb, pattern in _PATTERNS:
        match = pattern.match(plain if verb in ("make", "turn", "move") else said)  # quoted words keep their case
        if match:
            return _understood(said, verb, match.groupdict())
    raise InputError(f"instruction {text!r} is not in the instruction language; {forms_text()}")


def _understood(said: str, verb: str, parts: dict) -> Instruction:
    if verb in ("replace", "say"):
        old, new = parts["old"].strip(), parts["new"].strip()
        if old.lower() == new.lower():
            raise InputError(f"instruction {said!r} replaces {old!r} by itself: nothing to change")
        return Instruction(said, "word", old=old, new=new)
    ref = tuple(parts["ref"].split()) if parts.get("ref") else ()
    strays = [w for w in ref if not any(w in vocab for vocab in _KINDS.values())]
    if strays:
        raise InputError(f"instruction {said!r}: {strays} name no object; name it by its colour, size and/or shape "
                         f"({', '.join(COLORS)}; {', '.join(SIZES)}; {', '.join(SHAPES)}); {forms_text()}")
    key, value = _change(said, verb, parts["value"])
    return Instruction(said, "attribute", ref=ref, key=key, value=value)


def _change(said: str, verb: str, value: str) -> tuple[str, str]:
    """The attribute the verb sets: make -> colour or size, turn -> shape, move -> position."""
    allowed = {"make": ("color", "size"), "turn": ("shape",), "move": ("position",)}[verb]
    vocabularies = {**_KINDS, "position": POSITIONS}
    for key in allowed:
        if value in vocabularies[key]:
            return key, value
    expected = "; ".join(f"a {key} ({', '.join(vocabularies[key])})" for key in allowed)
    raise InputError(f"instruction {said!r}: {value!r} is not {expected}")


def require_fits(instruction: Instruction, modality: str) -> None:
    """Refuse an instruction of the wrong kind for the content: attributes of a picture, words of a text."""
    if modality not in MODALITIES_OF[instruction.kind]:
        kinds = "a picture (make / turn / move)" if instruction.kind == "attribute" else "a caption or speech " \
                                                                                          "(replace / say)"
        raise InputError(f"instruction {instruction.text!r} edits {kinds}, but the content is {modality}; "
                         f"{forms_text()}")


# ---- applying an instruction ---------------------------------------------------------------------------------


def describe(attrs: dict) -> str:
    """The objects of a scene in words, for messages: "a small red circle and a large blue square"."""
    return " and ".join(f"a {o['size']} {o['color']} {o['shape']}" for o in attrs["objects"])


def _fits(obj: dict, instruction: Instruction) -> bool:
    """Whether every word the instruction names its object by is one of ``obj``'s attributes."""
    return set(instruction.ref) <= {obj["color"], obj["size"], obj["shape"]}


def named_object(attrs: dict, instruction: Instruction, index: int | None = None) -> int:
    """Index of the one object the instruction names; an InputError when it names none or several. ``index``: the
    object the caller already knows it means (a pair whose two objects read alike, told apart by their places,
    :mod:`unimodal.repair`): kept when the instruction's words fit it, else an InputError."""
    objects = attrs["objects"]
    if index is not None:
        if not 0 <= index < len(objects):
            raise InputError(f"instruction {instruction.text!r}: object {index} of a picture of {len(objects)}")
        if not _fits(objects[index], instruction):
            raise InputError(f"instruction {instruction.text!r} names the {' '.join(instruction.ref)}, but object "
                             f"{index} of {describe(attrs)} is not one")
        return index
    if not instruction.ref:
        if len(objects) != 1:
            raise InputError(f"instruction {instruction.text!r} says 'it', but the picture shows {describe(attrs)}; "
                             f"name the object (e.g. 'make the {objects[0]['shape']} ...')")
        return 0
    hits = [i for i, obj in enumerate(objects) if _fits(obj, instruction)]
    if not hits:
        raise InputError(f"instruction {instruction.text!r} names the {' '.join(instruction.ref)}, but the picture "
                         f"shows {describe(attrs)}")
    if len(hits) > 1:
        raise InputError(f"instruction {instruction.text!r}: the picture shows {describe(attrs)}, and "
                         f"'{' '.join(instruction.ref)}' fits both; name it by another word (colour, size or shape)")
    return hits[0]


def apply_instruction(attrs: dict, instruction: Instruction, index: int | None = None) -> tuple[dict, int]:
    """The scene the instruction asks for (attributes as :func:`unimodal.core.grammar.parse_scene_caption`
    gives them) and the index of the object it changes (``index``: the one the caller means,
    :func:`named_object`). Refuses a move in a picture of two objects (their places are a relation, not
    positions) and an instruction that changes nothing."""
    index = named_object(attrs, instruction, index)
    obj = attrs["objects"][index]
    if instruction.key == "position" and len(attrs["objects"]) != 1:
        raise InputError(f"instruction {instruction.text!r}: a picture of two objects places them by their relation "
                         f"({describe(attrs)}, {attrs['relation']}); 'move' applies to a picture of one object")
    if obj.get(instruction.key) == instruction.value:
        raise InputError(f"instruction {instruction.text!r}: the {obj['shape']} is already {instruction.value}; "
                         f"nothing to change")
    objects = [dict(o) for o in attrs["objects"]]
    objects[index][instruction.key] = instruction.value
    return {"objects": objects, "relation": attrs.get("relation")}, index


def replace_word(text: str, old: str, new: str) -> tuple[str, tuple[int, int]]:
    """``text`` with the one whole-word occurrence of ``old`` (any case) replaced by ``new``, and the
    ``(start, end)`` characters ``old`` took in ``text``. An InputError when it occurs never or more than once."""
    hits = [m.span() for m in re.finditer(rf"(?<![\w]){re.escape(old)}(?![\w])", text, re.IGNORECASE)]
    if len(hits) != 1:
        found = "has no" if not hits else f"has {len(hits)} of the"
        raise InputError(f"the content reads {text!r}, which {found} word {old!r}; the instruction must name a "
                         f"word it holds exactly once")
    start, end = hits[0]
    return text[:start] + new + text[end:], (start, end)


__all__ = ["FORMS", "Instruction", "MODALITIES_OF", "apply_instruction", "describe", "forms_text", "named_object",
           "parse_instruction", "replace_word", "require_fits"]
