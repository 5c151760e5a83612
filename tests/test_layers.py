"""The package's layout (docs/design.md, "The stages"): gemmgen/ is one package per stage, and a
stage imports only from the stages before it and the leaves. Read from the source (ast), no
import, no GPU. Also: every package says what it is, and the module paths the documents name exist.
"""

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The stages in layers, in order: a module may import from its own stage, the stages of the layers
# before its own, and the leaves. tune, torch and plot are side by side: each uses the layers
# below, and none of them imports another (plot reads what tune stored, through the store).
LAYERS = (("describe",), ("codegen",), ("build",), ("store",), ("measure",), ("selection",), ("tune", "torch", "plot"),
          ("cli",))
STAGES = tuple(stage for layer in LAYERS for stage in layer)
LAYER = {stage: i for i, layer in enumerate(LAYERS) for stage in layer}
DIAGRAM = " -> ".join(layer[0] if len(layer) == 1 else f"({' | '.join(layer)})" for layer in LAYERS)
# Top-level modules that every stage may import, and that import no stage.
LEAVES = ("errors", "paths")
# Top-level modules besides the leaves: the package itself (its version) and `python -m gemmgen` (the cli's).
TOP = {"__init__": None, "__main__": "cli", **{leaf: None for leaf in LEAVES}}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, root: Path) -> bool:
    """Whether ``name`` (gemmgen.x.y) is a module or package under ``root`` (the gemmgen folder)."""
    rel = root.parent.joinpath(*name.split("."))
    return rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()


def imported(tree: ast.AST, name: str, is_package: bool, root: Path) -> list[tuple[int, str]]:
    """(line, module) of every gemmgen module the source imports, anywhere in it (functions too).
    ``from P import x`` counts as P.x where that is a module, else as P."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == root.name]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != root.name:
                continue
            for a in node.names:
                sub = f"{module}.{a.name}"
                found.append((node.lineno, sub if is_module(sub, root) else module))
    return found


def stage_of(module: str, root: Path) -> str | None:
    """The stage ``module`` belongs to; None for a leaf or the package itself."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return TOP.get(parts[1], parts[1]) if parts[1] in TOP else parts[1]


def violations(root: Path) -> list[str]:
    """What breaks the layout under ``root`` (a gemmgen folder), one line each."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        name = module_name(path, root)
        if len(rel.parts) == 1 and path.stem not in TOP:
            found.append(f"{rel}: a top-level module; only {', '.join(LEAVES)} stay at the top, the rest goes in "
                         f"a stage's package ({', '.join(STAGES)})")
            continue
        if len(rel.parts) > 1 and rel.parts[0] not in STAGES:
            found.append(f"{rel}: package {rel.parts[0]} is no stage ({', '.join(STAGES)})")
            continue
        mine = stage_of(name, root)
        tree = ast.parse(path.read_text(), str(path))
        for line, target in imported(tree, name, path.name == "__init__.py", root):
            theirs = stage_of(target, root)
            if theirs is None:
                continue
            if theirs not in STAGES:
                found.append(f"{rel}:{line}: imports {target}, which is in no stage")
            elif mine is None:
                found.append(f"{rel}:{line}: a leaf imports {target} (stage {theirs}); leaves import no stage")
            elif LAYER[theirs] > LAYER[mine]:
                found.append(f"{rel}:{line}: {mine} imports {target}, of the later stage {theirs}")
            elif LAYER[theirs] == LAYER[mine] and theirs != mine:
                found.append(f"{rel}:{line}: {mine} imports {target}; {mine} and {theirs} are side by side, and "
                             "neither imports the other")
    return found


def test_imports_go_one_way_down_the_stages():
    assert violations(REPO / "gemmgen") == []


def test_a_back_import_a_stray_module_and_a_leaf_that_imports_are_each_named(tmp_path):
    """The checker itself, on a made-up tree: each kind of break is found, with its line."""
    root = tmp_path / "gemmgen"
    files = {
        "__init__.py": "",
        "errors.py": "from gemmgen.describe import arch\n",
        "util.py": "",
        "describe/__init__.py": "",
        "describe/arch.py": "from gemmgen.errors import GemmgenError\n",
        "tune/__init__.py": "",
        "tune/loop.py": "from gemmgen.describe.arch import X\nimport gemmgen.cli.main\n",
        "cli/__init__.py": "",
        "cli/main.py": "from gemmgen.plot import history\nfrom gemmgen import errors, __version__\n",
        "plot/__init__.py": "",
        "plot/history.py": "import os\n\n\ndef f():\n    from gemmgen.tune import loop\n",
        "plot/ladder.py": "from ..tune.loop import Y\nfrom . import history\n",
        "extra/__init__.py": "",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    assert violations(root) == [
        "errors.py:1: a leaf imports gemmgen.describe.arch (stage describe); leaves import no stage",
        "extra/__init__.py: package extra is no stage (" + ", ".join(STAGES) + ")",
        "plot/history.py:5: plot imports gemmgen.tune.loop; plot and tune are side by side, and neither "
        "imports the other",
        "plot/ladder.py:1: plot imports gemmgen.tune.loop; plot and tune are side by side, and neither imports "
        "the other",
        "tune/loop.py:2: tune imports gemmgen.cli.main, of the later stage cli",
        "util.py: a top-level module; only errors, paths stay at the top, the rest goes in a stage's package ("
        + ", ".join(STAGES) + ")",
    ]


def test_design_md_draws_the_stages_in_this_order():
    assert DIAGRAM in (REPO / "docs" / "design.md").read_text()


@pytest.mark.parametrize("package", sorted(p.parent.relative_to(REPO).as_posix()
                                           for p in (REPO / "gemmgen").rglob("__init__.py")))
def test_every_package_says_what_it_is(package):
    """A docstring of at least a sentence, the package's first paragraph (help(), farm-studio look)."""
    doc = ast.get_docstring(ast.parse((REPO / package / "__init__.py").read_text()))
    assert doc and len(doc.split("\n\n")[0].split()) >= 4, f"{package}/__init__.py: no docstring saying what it is"


DOCUMENTS = ["README.md", "results/README.md", *sorted(p.relative_to(REPO).as_posix()
                                                     for p in (REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_the_modules_a_document_names_exist(doc):
    """Paths (gemmgen/measure/verify.py, gemmgen/tune/) and dotted names (gemmgen.selection.best.best:
    the module part) of gemmgen in the prose; a name that outlived a move fails here."""
    text = (REPO / doc).read_text()
    root = REPO / "gemmgen"
    missing = [p for p in re.findall(r"(?<![\w./-])gemmgen/[\w/]*\w(?:\.py)?/?", text)
               if not (REPO / p).exists()]
    for dotted in re.findall(r"(?<![\w./-])gemmgen(?:\.\w+)+", text):
        parts = dotted.split(".")
        if not is_module(".".join(parts[:2]), root):
            missing.append(dotted)
    assert missing == []
