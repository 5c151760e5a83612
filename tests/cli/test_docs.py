"""Every shell command the documentation shows is run here, so that the docs stay true.

The documents are README.md, every docs/*.md (files added later included: the folder is scanned)
and results/README.md. docs/README.md states the convention for their fenced blocks:

- ```sh       commands that need no GPU. Run by test_commands_run, in CI.
- ```sh slow  commands that need no GPU but more CPU than the README's test run should spend on
              one (a dispatcher of dozens of kernels: its emit, its nvcc; a Hopper harness's nvcc).
              Run in the document's order with its ```sh and ```console blocks by
              test_slow_commands_run (marked slow: `pytest -m slow`, which CI runs too); their
              gemmgen arguments are parsed in every run.
- ```sh gpu   commands that need a GPU (bench, tune, running a built program). Run, in the
              document's order with its other blocks, by test_gpu_commands_run (marked gpu: it
              skips without a GPU), one test per `## ` section that has any, after the ```sh
              and ```console blocks of the sections before it. Here, without a GPU, their
              gemmgen arguments are parsed, so a misspelt option fails.
- ```console  a transcript: `$ command` lines, each followed by its exact output (stdout and stderr
              together). Run like ```sh, and the output compared.
- any other block that holds shell commands (```bash, ```shell, an untagged block with `$ ` or
  `gemmgen ...` lines) fails test_no_untested_commands: nobody can add a command no test runs.
  Blocks of other languages are not commands; ```sql blocks are run against results/h100.db.

How a command runs: one line (with its `\\` continuations) is one command, run by bash from a
scratch folder of the document's own that holds copies of results/ and workloads/ (so that the
paths in the docs work and nothing lands in the checkout), with this interpreter's bin folder
first on PATH (`gemmgen`, `python`), the test session's build cache (conftest's build_cache, or
the folder GEMMGEN_DOCS_CACHE names: the cache is keyed by the source and nvcc, so one shared with
an earlier run only saves compiles), an `nvcc` before the real one that runs each distinct call
once in the session (NVCC_CACHED) and no GEMMGEN_DB. It must exit 0. Its wall time is printed (pytest shows
it with -rA or -s), so that a slow command is found. The steps of a line joined by `&&` are
classified first:

- set-up steps are checked against CI instead of being run again: `python3 -m venv .venv` and
  `. .venv/bin/activate` must be what .ci/run does; `pip install` must install this checkout
  (`.`, `-e .`) with extras pyproject.toml declares, and `pip install '.[test]'` must be .ci/run's;
- `python -m pytest -q` must be .ci/run's test command (that is the run this test is part of);
  any other pytest command is collected (`--collect-only`) from the repository root, and must
  select at least one test;
- every other step is run.
"""

import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest
from conftest import nvcc_missing

from gemmgen.build.nvcc import find_tool

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / ".ci" / "run"
SHELL_LANGS = {"sh", "bash", "shell", "zsh", "console", "shell-session", "shellsession"}
KINDS = {"sh": "sh", "sh gpu": "gpu", "sh slow": "slow", "console": "console"}
SHELL_WORDS = re.compile(r"^\s*(\$ |gemmgen |python3? |pip3? |nvcc |\./|\. \.venv|source |optuna-dashboard |cd |export |git )")
COMMAND_TIMEOUT_S = 600


def documents() -> list[Path]:
    """README.md, docs/*.md (whatever is there) and results/README.md."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "results" / "README.md"]
    return [d for d in docs if d.is_file()]


@dataclass
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    info: str  # the fence's info string, e.g. "sh gpu"
    lines: list[str]

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


def blocks(doc: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, their indentation (list items) removed."""
    found, lines, i = [], doc.read_text().splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), m.group(3).strip()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        found.append(Block(doc, i + 1, " ".join(info.split()), body))
        i = j + 1
    return found


def commands(block: Block) -> list[str]:
    """A sh block's commands: a line with its backslash continuations, blank and comment lines left out."""
    out, current = [], ""
    for raw in block.lines:
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip() and not current.lstrip().startswith("#"):
            out.append(current.strip())
        current = ""
    assert not current.strip(), f"{block.where}: a command ends with a backslash"
    return out


def transcript(block: Block) -> list[tuple[str, str]]:
    """A console block's (command, expected output) pairs."""
    pairs = []
    for raw in block.lines:
        if raw.startswith("$ "):
            pairs.append((raw[2:].strip(), []))
        else:
            assert pairs, f"{block.where}: a console block starts with `$ command`"
            pairs[-1][1].append(raw.rstrip())
    return [(cmd, "\n".join(out).strip("\n")) for cmd, out in pairs]


def split_steps(command: str) -> list[str]:
    """The steps of a command joined by `&&` (outside quotes)."""
    steps, current, quote = [], "", None
    i = 0
    while i < len(command):
        c = command[i]
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif command.startswith("&&", i):
            steps.append(current.strip())
            current, i = "", i + 2
            continue
        current += c
        i += 1
    steps.append(current.strip())
    return steps


# ---- set-up steps: checked against .ci/run and pyproject.toml -----------------------------------

def _ci_lines() -> list[list[str]]:
    """.ci/run's commands (continuations joined), each split into words; lines shlex cannot split
    (bash syntax beyond simple commands) left out."""
    out = []
    for line in CI.read_text().replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if words:
            out.append(words)
    return out


def _in_ci(words: list[str]) -> bool:
    return any(line == words for line in _ci_lines())


def _extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def check_setup(words: list[str], where: str) -> bool:
    """True where ``words`` is a set-up step (then checked here and not run), False otherwise."""
    if words[:3] in (["python3", "-m", "venv"], ["python", "-m", "venv"]) or words[:1] in (["."], ["source"]):
        assert _in_ci(words) or _in_ci(["."] + words[1:]), f"{where}: `{shlex.join(words)}` is not what .ci/run does"
        return True
    if words[:2] == ["pip", "install"] or words[:4] == ["python", "-m", "pip", "install"]:
        args = [w for w in words[words.index("install") + 1:] if w not in ("-q", "--quiet")]
        targets = [w for w in args if w != "-e"]
        assert targets, f"{where}: `{shlex.join(words)}` installs nothing"
        for target in targets:
            m = re.fullmatch(r"\.(?:\[([a-z0-9_,-]+)\])?", target)
            assert m, f"{where}: `{shlex.join(words)}`: the docs install only this checkout (`.` or `'.[extra]'`)"
            unknown = set((m.group(1) or "").split(",")) - {""} - _extras()
            assert not unknown, f"{where}: pyproject.toml declares no extra {sorted(unknown)}"
        if targets == [".[test]"]:
            assert _in_ci(["pip", "install", "-q", ".[test]"]), f"{where}: .ci/run no longer runs `pip install '.[test]'`"
        return True
    return False


def pytest_args(words: list[str]) -> list[str] | None:
    """The arguments of a pytest command (`python -m pytest ...`, `pytest ...`), else None."""
    if words[:3] in (["python", "-m", "pytest"], ["python3", "-m", "pytest"]):
        return words[3:]
    if words[:1] == ["pytest"]:
        return words[1:]
    return None


# ---- running -----------------------------------------------------------------------------------

# nvcc as the documents' commands call it, through a cache: the same call on the same source
# (README.md, docs/usage.md and docs/results.md each build v4's --harness program) runs nvcc once
# and copies its output file after that (each process through a part file of its own: sections
# that run the same build at once both keep it). A call it cannot read (not one .cu file and an
# output) goes to nvcc.
NVCC_CACHED = """#!{python}
import hashlib, os, shutil, subprocess, sys
nvcc, cache, args = {nvcc!r}, {cache!r}, sys.argv[1:]
sources = [a for a in args if a.endswith(".cu")]
out = args[args.index("-o") + 1] if "-o" in args[:-1] else None
if out is None and "-c" in args and len(sources) == 1:
    out = os.path.basename(sources[0])[:-3] + ".o"
if len(sources) != 1 or out is None:
    os.execv(nvcc, [nvcc, *args])
words = [hashlib.sha256(open(a, "rb").read()).hexdigest() if a in sources else a
         for i, a in enumerate(args) if a != "-o" and (i == 0 or args[i - 1] != "-o")]
kept = os.path.join(cache, hashlib.sha256("\\0".join(words).encode()).hexdigest())
if not os.path.isfile(kept):
    status = subprocess.run([nvcc, *args]).returncode
    if status:
        sys.exit(status)
    os.makedirs(cache, exist_ok=True)
    part = "%s.%d.part" % (kept, os.getpid())
    shutil.copy2(out, part)
    os.replace(part, kept)
else:
    shutil.copy2(kept, out)
"""


@pytest.fixture(scope="session")
def docs_env(build_cache):
    env = {k: v for k, v in os.environ.items() if k not in ("GEMMGEN_DB", "VIRTUAL_ENV")}
    cached = build_cache / "docs-bin"
    cached.mkdir(exist_ok=True)
    if not nvcc_missing():
        script = cached / "nvcc"
        script.write_text(NVCC_CACHED.format(python=sys.executable, nvcc=find_tool("nvcc"),
                                             cache=str(build_cache / "docs-nvcc")))
        script.chmod(0o755)
    env["PATH"] = os.pathsep.join([str(cached), os.path.dirname(sys.executable), env.get("PATH", "")])
    env["GEMMGEN_CACHE"] = os.environ.get("GEMMGEN_DOCS_CACHE") or str(build_cache)
    return env


def scratch(tmp_path: Path) -> Path:
    """A folder to run a document's commands in, with copies of results/ and workloads/."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("results", "workloads"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, work / name)
    return work


@lru_cache(maxsize=None)
def collected(args: tuple[str, ...], env: tuple[tuple[str, str], ...]) -> tuple[int, str, int]:
    """`pytest ARGS --collect-only -q` from the repository root in ``env`` (each distinct command
    once: the README and docs/measuring.md both show `-m gpu`): (exit status, the output's end,
    the number of tests selected). It collects in one process (-n0) without rewriting the
    asserts (--assert=plain), which only running them needs: half the time of the plain command."""
    proc = subprocess.run([sys.executable, "-m", "pytest", *args, "--collect-only", "-q", "-n0", "--assert=plain"],
                          cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    selected = sum("::" in line for line in proc.stdout.splitlines())
    return proc.returncode, proc.stdout[-3000:] + proc.stderr[-3000:], selected


def run_command(command: str, where: str, cwd: Path, env: dict) -> tuple[int, str]:
    """Runs one documented command as the module docstring says (set-up steps checked, pytest
    commands checked or collected, the rest run by bash). Returns the exit status and the output
    (stdout and stderr together) of what ran."""
    runnable = []
    for step in split_steps(command):
        words = shlex.split(step, comments=True)
        assert words, f"{where}: empty step in `{command}`"
        if check_setup(words, where):
            continue
        args = pytest_args(words)
        if args is not None:
            if args == ["-q"]:
                assert _in_ci(["python", "-m", "pytest", "-q"]), f"{where}: .ci/run does not run `{step}`"
                continue
            returncode, output, selected = collected(tuple(a for a in args if a not in ("-q", "--quiet")),
                                                     tuple(sorted(env.items())))
            assert returncode == 0 and selected, f"{where}: `{step}` selects no test:\n{output}"
            continue
        runnable.append(step)
    if not runnable:
        return 0, ""
    start = time.monotonic()
    proc = subprocess.run(["bash", "-c", "set -o pipefail; " + " && ".join(runnable)], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=COMMAND_TIMEOUT_S, check=False)
    print(f"{time.monotonic() - start:7.1f} s  {where}: {command}")
    return proc.returncode, proc.stdout


def run_block(block: Block, cwd: Path, env: dict) -> None:
    kind = KINDS[block.info]
    if kind == "console":
        for command, expected in transcript(block):
            _, got = run_command(command, block.where, cwd, env)
            got = "\n".join(line.rstrip() for line in got.splitlines()).strip("\n")
            assert got == expected, f"{block.where}: `{command}` printed\n{got}\nnot\n{expected}"
        return
    for command in commands(block):
        rc, out = run_command(command, block.where, cwd, env)
        assert rc == 0, f"{block.where}: `{command}` exited {rc}:\n{out[-4000:]}"


def shell_blocks(doc: Path) -> list[Block]:
    return [b for b in blocks(doc) if b.info in KINDS]


DOCS = documents()
IDS = [str(d.relative_to(ROOT)) for d in DOCS]


def test_the_documents_are_found():
    names = {d.relative_to(ROOT).as_posix() for d in DOCS}
    assert {"README.md", "docs/README.md"} <= names
    assert sum(len(shell_blocks(d)) for d in DOCS) >= 10


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_no_untested_commands(doc):
    for block in blocks(doc):
        lang = block.info.split()[0].lower() if block.info else ""
        if block.info in KINDS:
            continue
        assert lang not in SHELL_LANGS, (f"{block.where}: a ```{block.info} block: shell commands go in ```sh "
                                         "(no GPU), ```sh slow, ```sh gpu or ```console blocks, which "
                                         "tests/cli/test_docs.py runs")
        if not lang:
            shellish = [line for line in block.lines if SHELL_WORDS.match(line)]
            assert not shellish, (f"{block.where}: an untagged block with commands ({shellish[0].strip()!r}): "
                                  "tag it ```sh, ```sh gpu or ```console so that tests/cli/test_docs.py runs it, or "
                                  "```text if it is not a command")


def parse_gemmgen_arguments(block: Block) -> None:
    """Fails the test where a gemmgen command of ``block`` (one not run here) has arguments its
    parser refuses."""
    from gemmgen.cli.main import build_parser

    for command in commands(block):
        for step in split_steps(command):
            words = shlex.split(step, comments=True)
            if check_setup(words, block.where) or pytest_args(words) is not None:
                continue
            words = shlex.split(re.split(r"\s(?:\d?>|\|)", step)[0], comments=True)  # up to a redirect or pipe
            if words[0] == "gemmgen":
                try:
                    build_parser().parse_args(words[1:])
                except SystemExit:
                    pytest.fail(f"{block.where}: gemmgen does not take `{step}`")


def run_blocks(doc: Path, tmp_path: Path, env: dict, kinds: set[str]) -> None:
    """The document's blocks of ``kinds``, in order, in a scratch folder of its own; the
    gemmgen arguments of its other shell blocks parsed."""
    cwd = scratch(tmp_path)
    for block in shell_blocks(doc):
        if KINDS[block.info] in kinds:
            run_block(block, cwd, env)
        else:
            parse_gemmgen_arguments(block)


@pytest.mark.nvcc
@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_commands_run(doc, tmp_path, docs_env):
    """The ```sh and ```console blocks, in order; the ```sh gpu and ```sh slow blocks' gemmgen
    arguments parsed."""
    if not shell_blocks(doc):
        pytest.skip(f"{doc.name} shows no commands")
    run_blocks(doc, tmp_path, docs_env, {"sh", "console"})


SLOW_DOCS = [d for d in DOCS if any(KINDS[b.info] == "slow" for b in shell_blocks(d))]


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("doc", SLOW_DOCS, ids=[str(d.relative_to(ROOT)) for d in SLOW_DOCS])
def test_slow_commands_run(doc, tmp_path, docs_env):
    """The ```sh slow blocks, in order with the ```sh and ```console ones."""
    run_blocks(doc, tmp_path, docs_env, {"sh", "slow", "console"})


def sections(doc: Path) -> list[list[Block]]:
    """The document's shell blocks by section: those before its first `## ` heading, then those
    under each `## ` heading (its `###` subsections included)."""
    heads, fenced = [], None
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if m:  # a fence opens a block, or closes the open one (a fence of its character)
            fenced = None if fenced and m.group(2)[0] == fenced else fenced or m.group(2)[0]
        elif not fenced and line.startswith("## "):
            heads.append(n)
    out = [[] for _ in range(len(heads) + 1)]
    for block in shell_blocks(doc):
        out[sum(h < block.line for h in heads)].append(block)
    return out


# (document, section index, the line of its first block: the test's id)
GPU_SECTIONS = [(doc, i, found[0].line) for doc in DOCS for i, found in enumerate(sections(doc))
                if any(KINDS[b.info] == "gpu" for b in found)]


@pytest.mark.gpu
@pytest.mark.parametrize("doc, section", [(d, i) for d, i, _ in GPU_SECTIONS],
                         ids=[f"{d.relative_to(ROOT)}:{line}" for d, _, line in GPU_SECTIONS])
def test_gpu_commands_run(doc, section, tmp_path, docs_env):
    """The blocks of one section that has ```sh gpu blocks, in order, all kinds, after the ```sh and
    ```console blocks of the sections before it: a section with GPU commands reads on its own,
    given the set-up commands before it, and the sections of a long page run in parallel (xdist)."""
    cwd, parts = scratch(tmp_path), sections(doc)
    for before in parts[:section]:
        for block in before:
            if KINDS[block.info] in ("sh", "console"):
                run_block(block, cwd, docs_env)
    for block in parts[section]:
        run_block(block, cwd, docs_env)


def _with_blocks(test) -> list[Path]:
    return [d for d in DOCS if any(test(b) for b in blocks(d))]


def _is_workload(block: Block) -> bool:
    return block.info == "toml" and any(line.startswith("[[shape]]") for line in block.lines)


SQL_DOCS, WORKLOAD_DOCS = _with_blocks(lambda b: b.info == "sql"), _with_blocks(_is_workload)


@pytest.mark.parametrize("doc", SQL_DOCS, ids=[str(d.relative_to(ROOT)) for d in SQL_DOCS])
def test_sql_runs_on_the_shipped_results(doc, tmp_path):
    queries = [b for b in blocks(doc) if b.info == "sql"]
    db = ROOT / "results" / "h100.db"
    if not db.is_file():
        pytest.skip("results/h100.db is not in this checkout")
    copy = tmp_path / "h100.db"
    shutil.copy(db, copy)
    with sqlite3.connect(copy) as con:
        for block in queries:
            try:
                con.execute("\n".join(block.lines)).fetchall()
            except sqlite3.Error as err:
                pytest.fail(f"{block.where}: {err}")


@pytest.mark.parametrize("doc", WORKLOAD_DOCS, ids=[str(d.relative_to(ROOT)) for d in WORKLOAD_DOCS])
def test_workload_examples_load(doc, tmp_path):
    """A ```toml block with [[shape]] tables is a workload file: gemmgen.describe.workload must load it."""
    from gemmgen.describe.workload import load_workload

    examples = [b for b in blocks(doc) if _is_workload(b)]
    for i, block in enumerate(examples):
        path = tmp_path / f"example{i}.toml"
        path.write_text("\n".join(block.lines) + "\n")
        load_workload(str(path))
