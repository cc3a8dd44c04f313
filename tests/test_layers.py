"""The package structure: one namespace, layers whose imports point one way, no import cycles.

Every module's imports are read from its source (``ast``, every ``import`` statement, those inside functions
too: a lazy import is still a dependency). Layers, bottom to top (docs/architecture.md):

    core            unimodal.core: errors, paths, caption grammar, weight storage, media loaders
    judges          unimodal.judges: read a picture, a digit or speech back (training and eval both use them)
    tokenizers_mm   the codecs and the layout of the shared vocabulary
    backbone        the DiT
    training, inference   siblings: neither imports the other
    face            the rest of unimodal: pipeline, CLI, servers, benchmarks that combine the layers
    demos           the public face only
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PARTS = {"backbone": "backbone", "tokenizers_mm": "tokenizers_mm", "training": "training", "inference": "inference",
         "demos": "demos"}  # unimodal.<part> -> its folder at the repository's top level
RANK = {"core": 0, "judges": 0.5, "tokenizers_mm": 1, "backbone": 2, "training": 3, "inference": 3, "face": 4, "demos": 5}


def _modules() -> dict[str, Path]:
    """Every module of the installed namespace, by dotted name."""
    found = {}
    folders = {"unimodal": REPO / "unimodal", **{f"unimodal.{p}": REPO / d for p, d in PARTS.items()}}
    for package, folder in folders.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            if package == "unimodal" and rel.parts[0] in ("default_model", "default_codecs"):
                continue
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in PARTS:
        return parts[1]
    if len(parts) > 1 and parts[1] in ("core", "judges"):
        return parts[1]
    return "face"


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """(imported project module, line) for each import in the file, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from unimodal.core import grammar` imports the module unimodal.core.grammar
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        out += [(n, node.lineno) for n in names if n.split(".")[0] in ("unimodal", *PARTS)]
    return out


def test_every_project_import_goes_through_the_unimodal_namespace():
    bare = [f"{path.relative_to(REPO)}:{line} imports {name}" for module, path in MODULES.items()
            for name, line in _imports(module, path) if name.split(".")[0] != "unimodal"]
    assert not bare, "import these as unimodal.<part>:\n" + "\n".join(bare)


def test_imports_point_down_the_layers():
    wrong = []
    for module, path in MODULES.items():
        mine = _layer(module)
        for name, line in _imports(module, path):
            if name.split(".")[0] != "unimodal":
                continue
            theirs = "face" if name == "unimodal" else _layer(name)
            up = RANK[theirs] > RANK[mine]
            sideways = RANK[theirs] == RANK[mine] and theirs != mine  # training <-> inference
            demo_internals = mine == "demos" and theirs not in ("face", "core", "demos")
            if up or sideways or demo_internals:
                wrong.append(f"{path.relative_to(REPO)}:{line} ({mine}) imports {name} ({theirs})")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def _graph() -> dict[str, set[str]]:
    graph = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for name, _ in _imports(module, path):
            while name not in MODULES and "." in name:  # `from unimodal.x import f`: f is not a module
                name = name.rpartition(".")[0]
            if name in MODULES and name != module and name != "unimodal":
                graph[module].add(name)
    return graph


def test_no_import_cycles():
    graph, state, cycles = _graph(), {}, []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]) if nxt in stack else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_an_arrow_pointing_up(tmp_path):
    """The layer rule itself: a backbone module importing the pipeline is caught."""
    bad = tmp_path / "dit.py"
    bad.write_text("def f():\n    from unimodal.pipeline import UniModal\n")
    names = [n for n, _ in _imports("unimodal.backbone.dit", bad)]
    assert names == ["unimodal.pipeline"] and RANK[_layer(names[0])] > RANK[_layer("unimodal.backbone.dit")]


@pytest.mark.slow
def test_the_wheel_installs_one_top_level_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(REPO)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("unimodal-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"unimodal"}
    for part in ("backbone/dit.py", "training/train.py", "training/data/folder.py", "inference/sampler.py",
                 "tokenizers_mm/layout.py", "core/errors.py", "default_model/layout.json",
                 "default_model/audio/vq/int8.safetensors", "default_model/backbone/int8.safetensors"):
        assert f"unimodal/{part}" in names


def test_docs_architecture_lists_every_module_and_only_real_ones():
    """docs/architecture.md has one line per module: a new module must be added there, a removed one taken out."""
    import re

    text = (REPO / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"^\| `(unimodal(?:\.[a-z_0-9]+)*)` \|", text, re.M))
    assert not set(MODULES) - listed, f"add to docs/architecture.md: {sorted(set(MODULES) - listed)}"
    assert not listed - set(MODULES), f"docs/architecture.md lists modules that do not exist: {sorted(listed - set(MODULES))}"
