"""The package's shape: no import cycle among the project's modules (function-level imports included, and
annotation-only ones too), the layers between `pipeline` and `tasks` one way, and every raw write or unbounded
wait on another process inside the I/O layer (`pipeline/files.py`) or allowed with its reason."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "tasks")


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for file in (ROOT / package).rglob("*.py"):
            parts = list(file.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def runtime_nodes(tree: ast.AST, annotations: bool = False):
    """Every node that runs (the bodies of ``if TYPE_CHECKING:``, annotations only, left out), or every node."""
    for node in ast.iter_child_nodes(tree):
        if not annotations and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for other in node.orelse:
                yield other
                yield from runtime_nodes(other)
            continue
        yield node
        yield from runtime_nodes(node, annotations)


def imports(name: str, file: Path, known: dict[str, Path], annotations: bool = False) -> set[str]:
    """The project modules ``name`` imports anywhere in its file at run time (``annotations``: those it imports
    for annotations only too; a package's own submodules left out: an ``__init__`` that re-exports them is not a
    cycle)."""
    package = name.split(".") if file.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in runtime_nodes(ast.parse(file.read_text()), annotations):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""])
            else:
                base = node.module
            targets = [f"{base.rstrip('.')}.{a.name}" for a in node.names] + [base.rstrip(".")]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not target.startswith(name + "."):
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


# Where a module is imported by its name as a string, the imports drawn above miss an arrow: none is, but the
# proposers' and the ensembles' folders importing their own modules (each registers itself; the same room).
IMPORTED_BY_NAME_ALLOWED = {"pipeline/decoding/proposers/__init__.py", "pipeline/decoding/ensembles/__init__.py"}


def imported_by_name(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls of ``importlib.import_module``/``__import__`` and ``module:function`` strings naming a project module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if called in ("import_module", "__import__"):
                found.append((node.lineno, called))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"(pipeline|tasks)(\.\w+)+:\w+", node.value)
        ):
            found.append((node.lineno, node.value))
    return found


def test_no_module_is_imported_by_a_string():
    found = [
        f"{rel}:{line}: {what}"
        for file in sorted((ROOT / "pipeline").rglob("*.py"))
        if (rel := file.relative_to(ROOT).as_posix()) not in IMPORTED_BY_NAME_ALLOWED
        for line, what in imported_by_name(ast.parse(file.read_text()))
    ]
    assert found == [], "a module named by a string, an arrow the house does not draw:\n" + "\n".join(found)


def test_a_hook_named_by_a_string_is_found():
    tree = ast.parse('RUNS = "pipeline.job.generate:our_runs"\nimport importlib\nimportlib.import_module(RUNS)\n')
    assert imported_by_name(tree) == [(1, "pipeline.job.generate:our_runs"), (3, "import_module")]


def test_no_import_cycles():
    known = modules()
    graph = {name: imports(name, file, known) for name, file in known.items()}
    assert "pipeline.job.generate" in graph["pipeline.cli.jobs"]  # a function-level import is seen
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_counting_annotation_only_imports():
    """A module imported for annotations only is still one a reader must read first: the decoder's modules (a loop,
    what it holds of each model, its proposers, its concurrent forwards, the token tree's loop that a method hands
    the Decoder) form no circle that way either, with no exception listed."""
    known = modules()
    graph = {name: imports(name, file, known, annotations=True) for name, file in known.items()}
    assert "pipeline.decoding.member" in graph["pipeline.decoding.proposers.base"]  # a type-only import is seen
    assert "pipeline.decoding.member" in graph["pipeline.decoding.parallel"]
    assert "pipeline.decoding.loop" in graph["pipeline.decoding.tree.loop"]  # the loop annotates the Decoder it runs
    assert cycles(graph) == []


BASE = {
    "pipeline.errors",
    "pipeline.files",
    "pipeline.hub",
    "pipeline.records",
    "pipeline.provenance",
}  # the base layer, under `tasks` and the rest of `pipeline`
NO_TASKS = ("pipeline.decoding", "pipeline.models")  # the decoder and the models know nothing of benchmarks


def layer_breaks(graph: dict[str, set[str]]) -> list[str]:
    """Imports against the layers: the base layer imports no other project module; `tasks` (what a benchmark is)
    imports only the base layer of `pipeline`; the decoder and the models import nothing of `tasks`."""
    out = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            if name in BASE and target not in BASE and target != "pipeline":
                out.append(f"{name} (the base layer) imports {target}")
            elif name.startswith("tasks") and target.startswith("pipeline.") and target not in BASE:
                out.append(f"{name} imports {target}, above the base layer {sorted(BASE)}")
            elif name.startswith(NO_TASKS) and target.startswith("tasks"):
                out.append(f"{name} imports {target}")
    return out


def test_layers_go_one_way():
    known = modules()
    graph = {name: imports(name, file, known, annotations=True) for name, file in known.items()}
    assert "pipeline.hub" in graph["pipeline.models.sources"] and "pipeline.errors" in graph["tasks.base"]
    assert layer_breaks(graph) == []


def test_the_layer_rule_finds_a_break():
    graph = {"pipeline.models.sources": {"tasks"}, "tasks.base": {"pipeline.files", "pipeline.experiment.checks"}}
    assert layer_breaks({**graph, "pipeline.files": {"pipeline.errors", "tasks"}}) == [
        "pipeline.files (the base layer) imports tasks",
        "pipeline.models.sources imports tasks",
        f"tasks.base imports pipeline.experiment.checks, above the base layer {sorted(BASE)}",
    ]


# The rooms of `pipeline/` (and `tasks/`), bottom floor first: a module imports only its own room and the floors
# below (docs/extending.md, "Layout"). A token tree (`decoding/tree/`) is part of the decoder.
FLOORS = (
    *("base", "tasks", "decoding", "models", "vllm", "engines"),
    *("measure", "experiment", "job", "report", "bench", "cli"),
)


def room(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "tasks":
        return "tasks"
    if len(parts) == 1 or module in BASE:
        return "base"
    return "cli" if parts[1] == "__main__" else parts[1]


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{name} ({room(name)}) imports {target} ({room(target)}), a floor above"
        for name, targets in sorted(graph.items())
        for target in sorted(targets)
        if FLOORS.index(room(target)) > FLOORS.index(room(name))
    ]


def test_rooms_import_only_their_own_and_the_floors_below():
    known = modules()
    assert {room(name) for name in known} == set(FLOORS)  # every room has its floor, every floor a room
    graph = {name: imports(name, file, known, annotations=True) for name, file in known.items()}
    assert "pipeline.experiment.cell" in graph["pipeline.job.generate"]  # a job reads its cell, a floor below
    assert arrows_up(graph) == []


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each room's floor as the imports make it: one above the highest room it imports (the base is floor 1)."""
    below: dict[str, set[str]] = {}
    for name, targets in graph.items():
        below.setdefault(room(name), set()).update(room(t) for t in targets if room(t) != room(name))

    def floor(r: str, seen: tuple[str, ...] = ()) -> int:
        assert r not in seen, f"rooms import each other: {' -> '.join((*seen, r))}"
        return 1 + max((floor(b, (*seen, r)) for b in below.get(r, ())), default=0)

    return {r: floor(r) for r in below}


def test_the_house_has_at_most_nine_floors():
    """Rooms that import nothing of each other share a floor: the house is as tall as its longest chain of imports.
    Nine, every dependency drawn: the config check asks an engine's behaviour (``engines/``) whether it can run a
    model's head, and vLLM's behaviour reads vLLM's checkpoints (``vllm/``), so the experiment stands on the engines,
    the engines on vLLM. What a machine and its versions made (``provenance.py``) sits on the base floor, so the
    benchmarks read it without standing on the job's and the report's floors."""
    known = modules()
    graph = {name: imports(name, file, known, annotations=True) for name, file in known.items()}
    found = floors(graph)
    assert max(found.values()) <= 9, found
    on_top = {d for n, deps in graph.items() if n.startswith("pipeline.bench.") for d in deps}
    assert not {d for d in on_top if d.startswith(("pipeline.job.", "pipeline.report."))}  # the benchmarks stand
    assert found["bench"] <= found["job"]  # on neither the jobs nor the report


def test_the_floor_count_follows_the_longest_chain():
    graph = {"pipeline.report.a": {"pipeline.job.b"}, "pipeline.job.b": {"pipeline.files"}, "pipeline.bench.c": set()}
    assert floors(graph) == {"report": 3, "job": 2, "bench": 1}


def test_the_floor_rule_finds_an_arrow_up():
    graph = {"pipeline.experiment.estimate": {"pipeline.bench.runners", "pipeline.measure.cost"}}
    assert arrows_up(graph) == [
        "pipeline.experiment.estimate (experiment) imports pipeline.bench.runners (bench), a floor above"
    ]


def defines(file: Path) -> bool:
    """Whether a file defines a function or a class (a package's ``__init__`` that only names its folder does not)."""
    return any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in ast.parse(file.read_text()).body)


def test_every_module_has_a_home_in_the_tests_readme():
    """tests/README.md maps each module of pipeline/ to the files that test it: every module is there, every file
    it names exists, and every test file is named."""
    import re

    readme = (ROOT / "tests" / "README.md").read_text()
    rows = dict(re.findall(r"^\| `([\w/]+\.py)` \| (.*) \|$", readme, re.M))
    modules = {
        p.relative_to(ROOT / "pipeline").as_posix()
        for p in (ROOT / "pipeline").rglob("*.py")
        if p.name != "__main__.py" and (p.name != "__init__.py" or defines(p))
    }
    assert modules - set(rows) == set(), f"modules without a row in tests/README.md: {sorted(modules - set(rows))}"
    assert set(rows) - modules == set(), f"rows for modules that are gone: {sorted(set(rows) - modules)}"
    named = set(re.findall(r"`((?:test_\w+|\w+)\.py)`", readme)) - {Path(m).name for m in modules}
    files = {p.name for p in (ROOT / "tests").glob("*.py") if p.name != "__init__.py"}
    assert named - files == set(), f"tests/README.md names files that do not exist: {sorted(named - files)}"
    tests = {f for f in files if f.startswith("test_")}
    assert tests - named == set(), f"test files tests/README.md does not name: {sorted(tests - named)}"


def cell_file_literals(text: str, python: bool) -> list[str]:
    """String literals that spell a cell file's suffix as a path (``".speed.json"``, ``f"{id}.scores.jsonl"``),
    prose with spaces left out; in Python, docstrings left out."""
    from pipeline.experiment.paths import CELL_FILES

    suffixes = [s for s in CELL_FILES.values() if s != ".jsonl"]  # the samples' is every JSONL file's
    if python:
        tree = ast.parse(text)
        docstrings = {
            id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
        }
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in docstrings]
    else:
        import re

        strings = re.findall(r'"([^"\n]*)"', text)
    return [s for s in strings if isinstance(s, str) and " " not in s and s.endswith(tuple(suffixes))]


def test_a_cells_file_names_are_written_in_one_place():
    """pipeline/experiment/paths.py names a cell's files; the rules and the modules take them from there."""
    found = {}
    for file in [*ROOT.glob("pipeline/**/*.py"), *ROOT.glob("workflow/rules/*.smk"), ROOT / "Snakefile"]:
        if file.name != "paths.py" and (hits := cell_file_literals(file.read_text(), file.suffix == ".py")):
            found[file.relative_to(ROOT).as_posix()] = hits
    assert found == {}
    assert cell_file_literals('x = base.with_suffix(".speed.json")\n', True) == [".speed.json"]
    assert cell_file_literals('        f"{GEN}/{{cell}}.summary.json",\n', False) == ["{GEN}/{{cell}}.summary.json"]


def test_every_declared_subcommand_is_listed_once():
    """The command's subcommands are listed in cli/__init__.py: a function declared with ``@command`` in any module
    of cli/ and left out of the list would never run."""
    import importlib
    import inspect
    import pkgutil

    from pipeline import cli

    declared = set()
    for info in pkgutil.iter_modules(cli.__path__, "pipeline.cli."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        declared |= {f for _, f in inspect.getmembers(module, inspect.isfunction) if hasattr(f, "command")}
    assert len(declared) >= 18 and declared == set(cli.SUBCOMMANDS)
    assert len({f.command.name for f in cli.SUBCOMMANDS}) == len(cli.SUBCOMMANDS)


def test_every_name_the_scripts_import_from_the_project_exists():
    """benchmarks/ and scripts/ run outside the tests (on a GPU machine, by hand): each name they import from
    `pipeline` or `tasks`, at the top or inside a function, exists, so a move or a rename cannot strand them."""
    import importlib

    missing, seen = [], 0
    for file in [*ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("scripts/*.py")]:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] in PACKAGES:
                module = importlib.import_module(node.module)
                for alias in node.names:
                    seen += 1
                    if not hasattr(module, alias.name):
                        try:
                            importlib.import_module(f"{node.module}.{alias.name}")
                        except ImportError:
                            missing.append(f"{file.relative_to(ROOT)}: from {node.module} import {alias.name}")
    assert seen >= 5 and missing == []


# ---- one I/O layer (pipeline/files.py) ------------------------------------------------------------------------

RAW_CALLS = ("torch.save", "shutil.rmtree", "shutil.move", "os.replace", "os.rename")
UNBOUNDED = ("subprocess.run", "subprocess.check_output", "subprocess.check_call", "subprocess.call")
# (file, enclosing function, what): why this raw write or unbounded wait is safe where it is. Every other one goes
# through pipeline/files.py (write_atomic, atomic_path, open_own, read_user_*, read_tail) or takes a timeout.
IO_ALLOWED = {
    ("pipeline/models/cache.py", "write_dir", ".write_text()"): "into a fresh mkdtemp directory of its own",
    ("pipeline/models/cache.py", "write_dir", "Path.rename()"): "the finished directory takes its place whole",
    ("pipeline/models/cache.py", "write_dir", "shutil.rmtree"): "the cache entry it replaces (a link is unlinked)",
    ("pipeline/models/teacher.py", "stored_teacher_data", "torch.save"): "into atomic_path's fresh temporary name",
    ("pipeline/report/status.py", "rerun_unstable", "shutil.move"): "inside the results directory, checked first",
    ("pipeline/report/status.py", "rerun_unstable", "shutil.rmtree"): "its own copy, cut short across filesystems",
    ("pipeline/report/status.py", "_put_back", "shutil.move"): "back where rerun moved it from",
    ("pipeline/report/tracking.py", "_forget_fallback", "shutil.rmtree"): "a W&B offline run dir of its own only",
    ("pipeline/report/tracking.py", "_log_run", "shutil.rmtree"): "the stub W&B made for this attempt",
    ("pipeline/vllm/env.py", "ensure", "shutil.rmtree"): "its own half-built environment, under the cache lock",
    ("pipeline/vllm/engine.py", "stop", ".wait() without timeout"): "after kill(): returns at once",
    ("pipeline/vllm/engine.py", "close", ".wait() without timeout"): "after kill(): returns at once",
    ("pipeline/measure/competitors.py", "measure", ".wait() without timeout"): "after kill(): returns at once",
    ("pipeline/cli/setup.py", "lm_eval_in_vllm", "subprocess.run without timeout"): "the user's own evaluation",
    ("tasks/sandbox.py", "_kill", ".wait() without timeout"): "after SIGKILL to its group: returns at once",
    ("tasks/sandbox.py", "_workdir", "shutil.rmtree"): "the sandbox's own mkdtemp directory",
    ("tasks/sandbox.py", "_cgroup", ".write_text()"): "cgroup control files (the kernel's, not a user's)",
    ("tasks/sandbox.py", "_remove_cgroup", ".write_text()"): "cgroup.kill (the kernel's)",
    ("tasks/sandbox.py", "_cgroup_parent", ".write_text()"): "cgroup.subtree_control (the kernel's)",
    ("tasks/sandbox_judge.py", "judge", "open(..., 'w')"): "cgroup.procs (the kernel's)",
    ("tasks/sandbox_judge.py", "judge", ".wait() without timeout"): "after kill(): returns at once",
    # files the project ships and reads itself (version-controlled, never a user's, a cache's or a job's)
    ("pipeline/bench/doc.py", "load_notes", "yaml.safe_load of a file read raw"): "benchmarks/notes.yaml",
    ("pipeline/experiment/config.py", "load_schema", "yaml.safe_load of a file read raw"): "the config's schema",
    ("pipeline/experiment/config_doc.py", "render_page", "yaml.safe_load of a file read raw"): "the config's schema",
    ("pipeline/models/spec.py", "default_entries", "yaml.safe_load of a file read raw"): "the default config",
    ("pipeline/report/results_file.py", "load_reported", "yaml.safe_load of a file read raw"): "the paper's figures",
}


def findings(tree: ast.AST, match) -> list[tuple[str, str, int]]:
    """(enclosing function, what, line) for each node of ``tree`` that ``match`` names (what it names it)."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            found.extend((function, what, child.lineno) for what in match(child))
            visit(child, inner)

    visit(tree, "<module>")
    return found


def outside_the_layer(match, allowed: dict) -> tuple[list[str], set]:
    """What ``match`` finds outside pipeline/files.py and ``allowed`` does not explain, and what ``allowed``
    names that is no longer there."""
    seen, unexplained = set(), []
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            rel = file.relative_to(ROOT).as_posix()
            if rel == "pipeline/files.py":
                continue
            for function, what, line in findings(ast.parse(file.read_text()), match):
                if (rel, function, what) in allowed:
                    seen.add((rel, function, what))
                else:
                    unexplained.append(f"{rel}:{line} ({function}): {what}")
    return unexplained, set(allowed) - seen


def raw_io(tree: ast.AST) -> list[tuple[str, str, int]]:
    """(enclosing function, what, line) for each raw write, move, removal or unbounded wait in ``tree``."""
    return findings(tree, raw_io_of)


def raw_io_of(node: ast.AST) -> list[str]:
    return [what] if isinstance(node, ast.Call) and (what := raw_call(node)) else []


def reads_a_file(arg: ast.AST) -> bool:
    """Whether a parser's argument reads a file itself (``p.read_text()``, ``p.read_bytes()``, ``open(p)``)."""
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute):
        return arg.func.attr in ("read_text", "read_bytes")
    return isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id == "open"


def raw_call(node: ast.Call) -> str | None:
    f, name = node.func, ast.unparse(node.func)
    keywords = {k.arg for k in node.keywords}
    if isinstance(f, ast.Name) and f.id == "open":
        mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
            return f"open(..., {mode.value!r})"
    elif isinstance(f, ast.Attribute) and f.attr in ("write_text", "write_bytes"):
        return f".{f.attr}()"
    elif name in RAW_CALLS:
        return name
    elif (
        name in ("json.loads", "json.load", "torch.load", "yaml.safe_load", "yaml.load")
        and node.args
        and reads_a_file(node.args[0])
    ):
        return f"{name} of a file read raw"  # an unchecked record: read_record / read_user_* check it where it enters
    elif isinstance(f, ast.Attribute) and f.attr in ("rename", "replace") and len(node.args) == 1 and not keywords:
        return None if isinstance(f.value, ast.Constant) else f"Path.{f.attr}()"  # str.replace takes two
    elif name in UNBOUNDED and "timeout" not in keywords:
        return f"{name} without timeout"
    elif (
        isinstance(f, ast.Attribute)
        and f.attr in ("wait", "communicate")
        and not node.args
        and "timeout" not in keywords
    ):
        return f".{f.attr}() without timeout"
    return None


def test_every_write_and_wait_goes_through_the_io_layer_or_is_allowed_with_its_reason():
    """pipeline/files.py is where files are written (atomically, never through a link) and read (never waiting
    on a pipe): a raw write, move or removal elsewhere (``open(.., "w")``, ``Path.write_*``, ``torch.save``,
    ``shutil.rmtree``, ``os.replace``, ...) or a wait on another process without a time limit fails this test,
    unless IO_ALLOWED names it with the reason it is safe there. Entries that no longer match fail it too."""
    unexplained, gone = outside_the_layer(raw_io_of, IO_ALLOWED)
    assert not unexplained, "raw I/O outside pipeline/files.py:\n" + "\n".join(unexplained)
    assert not gone, f"allowed but not found (remove them): {sorted(gone)}"


def test_the_io_rule_finds_a_raw_write_and_an_unbounded_wait():
    code = (
        "def f(p, proc):\n    open(p, 'w').write('x')\n    p.write_text('x')\n    proc.wait()\n    s.replace('a', 'b')"
        "\n    json.loads(p.read_text())\n    json.loads(read_user_bytes(p))\n    yaml.safe_load(open(p))"
    )
    assert [(w, n) for _, w, n in raw_io(ast.parse(code))] == [
        ("open(..., 'w')", 2),
        (".write_text()", 3),
        (".wait() without timeout", 4),
        ("json.loads of a file read raw", 6),
        ("yaml.safe_load of a file read raw", 8),
    ]


# ---- engines: a name compared only in its record ------------------------------------------------------------------
# An engine (pipeline/decoding/engines.py: ours, transformers', vLLM's) is asked through its record, never told
# apart by its name: a comparison with an engine's name, its own standard method (vLLM's ``vllm``) or the kind of
# its methods (``vllm_peer``; transformers' ``peer`` is the word every peer kind shares, ``ours`` a feature head's
# layout too), or the old ``VLLM`` constant, fails this test anywhere but in the table and the engine's own package
# (``pipeline/<engine>/``), unless ENGINE_NAMES_ALLOWED names it with its reason.
ENGINE_TABLE = "pipeline/decoding/engines.py"
ENGINE_NAMES_ALLOWED = {
    ("pipeline/cli/setup.py", "compares 'vllm'"): "lm-eval's own model name (`lm_eval --model vllm`), not a method",
}


def engine_words() -> set[str]:
    from pipeline.decoding.engines import ENGINES

    words = set(ENGINES) | {e.standard for e in ENGINES.values() if e.standard}
    words |= {e.peer_kind for e in ENGINES.values() if e.peer_kind and e.peer_kind != "peer"}
    return words - {"ours"}


def engine_comparisons(tree: ast.AST, words: set[str]) -> list[tuple[str, int]]:
    """(what, line) for each comparison of a value with an engine's word, and each use of a name ``VLLM``."""

    def constants(node: ast.AST) -> set[str]:
        found = {node.value} if isinstance(node, ast.Constant) and isinstance(node.value, str) else set()
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            for element in node.elts:
                found |= constants(element)
        return found

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            hit = set().union(*(constants(n) for n in (node.left, *node.comparators))) & words
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("eq", "ne", "isin")
        ):
            hit = set().union(set(), *(constants(a) for a in node.args)) & words
        elif isinstance(node, ast.Name) and node.id == "VLLM":
            hit = {"VLLM"}
        else:
            continue
        out += [(f"compares {word!r}", node.lineno) for word in sorted(hit)]
    return out


def rule_lines(text: str, words: set[str]) -> list[int]:
    """The lines of a rule file (Snakemake's Python, not parsed here) that compare a value with an engine's word."""
    named = "|".join(map(re.escape, sorted(words)))
    pattern = re.compile(rf"""(==|!=|\bin\b)\s*[(\[{{]?[^#\n]*?["']({named})["']""")
    return [i for i, line in enumerate(text.splitlines(), 1) if pattern.search(line.split("#")[0])]


def test_no_engine_is_told_apart_by_its_name_outside_its_record():
    from pipeline.decoding.engines import ENGINES

    words, found = engine_words(), []
    own = (*(f"pipeline/{name}/" for name in ENGINES), "pipeline/engines/")  # an engine's own code, its behaviour
    for file in sorted((ROOT / "pipeline").rglob("*.py")):
        rel = file.relative_to(ROOT).as_posix()
        if rel == ENGINE_TABLE or rel.startswith(own):
            continue
        for what, line in engine_comparisons(ast.parse(file.read_text()), words):
            if (rel, what) not in ENGINE_NAMES_ALLOWED:
                found.append(f"{rel}:{line}: {what}")
    for file in sorted([ROOT / "Snakefile", *(ROOT / "workflow").rglob("*.smk")]):
        found += [
            f"{file.relative_to(ROOT).as_posix()}:{i}: compares an engine's name"
            for i in rule_lines(file.read_text(), words)
        ]
    assert not found, "an engine told apart by its name (ask its record, pipeline/decoding/engines.py):\n" + "\n".join(
        found
    )


def test_the_engine_rule_finds_a_name_compared():
    code = (
        "def f(spec, cells):\n    if spec.engine.name == 'vllm':\n        pass\n    x = m in ('large_model', 'vllm')\n"
        "    cells['kind'].eq('vllm_peer')\n    return VLLM\n    y = spec.engine.title == 'x'"
    )
    assert engine_comparisons(ast.parse(code), engine_words()) == [
        ("compares 'vllm'", 2),
        ("compares 'vllm'", 4),
        ("compares 'vllm_peer'", 5),
        ("compares 'VLLM'", 6),
    ]
    rules = "CELLS = [c for c in X if e.dims.spec.engine == 'vllm']\ninput: f'{RESULTS}/envs/vllm.json'  # == 'vllm'"
    assert rule_lines(rules, engine_words()) == [1]


# ---- the results directory: its paths written once - ------------------------------------------------------------
# Every file of a results directory is named by pipeline/experiment/paths.py (``Results``, a cell's CELL_FILES):
# a module that joins a results path by hand (``results / "tables"``, ``"grid.json"``) or a rule that writes one
# (``f"{RESULTS}/..."``) or counts its way back to the results root (``Path(input[0]).parents[1]``) fails here: a
# rule takes the root from one of its files with ``PATHS.root_of`` (the paths' own inverse, as Snakemake's
# linter asks of a path prefix: storage without a shared filesystem hands a job paths of its own).
RESULTS_DIRS = {"cells", "models", "tables", "plots", "logs", "likelihood", "journal", "rerun", "envs", "generations"}
RESULTS_FILES = {"grid.json", "timing.json", "results.json", "wandb.json", "analysis.ipynb", "summary.md", "cells.csv"}
RESULTS_ALLOWED = {  # (file, what): why it is no results path
    ("pipeline/experiment/cell.py", "'grid.json'"): "the grid index's record type, as messages name it",
    ("pipeline/vllm/env.py", '/ "envs"'): "workflow/envs (vLLM's locks) and the model cache's envs/, no results",
}


def results_paths(tree: ast.AST) -> list[tuple[str, int]]:
    """(what, line) for each results path joined by hand: ``x / "tables"`` or a results file's name."""
    out = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Div)
            and isinstance(node.right, ast.Constant)
            and node.right.value in RESULTS_DIRS
        ):
            out.append((f'/ "{node.right.value}"', node.lineno))
        elif isinstance(node, ast.Constant) and node.value in RESULTS_FILES:
            out.append((repr(node.value), node.lineno))
    return out


def rule_results_lines(text: str) -> list[int]:
    """Lines of a rule file that write a results path by hand or work the root back out of a path."""
    by_hand = re.compile(r"\{RESULTS\}/|\.parents?\b.*results|results\s*=.*\.parents?\b")
    return [i for i, line in enumerate(text.splitlines(), 1) if by_hand.search(line.split("#")[0])]


def test_the_results_paths_are_written_once():
    found = []
    for file in sorted((ROOT / "pipeline").rglob("*.py")):
        rel = file.relative_to(ROOT).as_posix()
        if rel == "pipeline/experiment/paths.py":
            continue
        for what, line in results_paths(ast.parse(file.read_text())):
            if (rel, what) not in RESULTS_ALLOWED:
                found.append(f"{rel}:{line}: {what}")
    for file in sorted([ROOT / "Snakefile", *(ROOT / "workflow").rglob("*.smk")]):
        found += [f"{file.relative_to(ROOT).as_posix()}:{i}" for i in rule_results_lines(file.read_text())]
    assert not found, "a results path outside pipeline/experiment/paths.py (use Results):\n" + "\n".join(found)


def test_the_paths_rule_finds_a_path_by_hand():
    code = "def f(results):\n    a = results / 'tables'\n    b = results / 'grid.json'\n    c = x / name\n"
    code += "    d = {'models': 0}"
    assert results_paths(ast.parse(code)) == [('/ "tables"', 2), ("'grid.json'", 3)]
    rules = (
        'output:\n    f"{RESULTS}/grid.json",\nparams:\n    results=lambda w, input: str(Path(input.grid).parent),\n'
        "    results=RESULTS,\n    journal=lambda w: str(PATHS.journal(str(Path(w.cell).parent))),"
    )
    assert rule_results_lines(rules) == [2, 4]


# ---- one JSON and tensor reader (pipeline/files.py) ---------------------------------------------------------------
# JSON and torch.save files are read through the I/O layer's bounded readers (``parse_json``, ``read_user_json``,
# ``read_jsonl``, ``read_record``: nesting and integer length bounded; ``read_tensors``: no pickle run): a reference
# to ``json.loads``, ``json.load`` or ``torch.load`` (a call, ``type=json.loads``, ``from json import loads``)
# elsewhere in pipeline/ or tasks/, or in a rule file, fails this test unless LOADS_ALLOWED names it with its reason.
LOADS = {"json.loads", "json.load", "torch.load"}
LOADS_ALLOWED = {
    ("pipeline/decoding/union.py", "convention", "json.loads"): "a tokenizer's own JSON, made in this process",
    ("pipeline/bench/union.py", "sentencepiece_twin", "json.loads"): "a tokenizer's own JSON, made in this process",
    ("pipeline/models/feature_head.py", "__init__", "json.loads"): "the target's config, made here by transformers",
    ("pipeline/models/eagle3.py", "__init__", "json.loads"): "the target's config, made here by transformers",
    ("pipeline/vllm/worker.py", "main", "json.loads"): "runs in vLLM's environment, where the project is not",
    ("tasks/sandbox_child.py", "receive", "json.loads"): "standard library only (python -I -S); MAX_DEPTH its own",
    ("tasks/sandbox_judge.py", "main", "json.loads"): "standard library only (python -I -S); the scorer's own line",
    ("tasks/sandbox.py", "_judge", "json.loads"): "standard library only (copied out, run alone); the judge's line",
}


def loads_of(node: ast.AST) -> list[str]:
    """The raw JSON or tensor loaders ``node`` names (an attribute, or an import of one)."""
    if isinstance(node, ast.Attribute) and ast.unparse(node) in LOADS:
        return [ast.unparse(node)]
    if isinstance(node, ast.ImportFrom) and node.module in ("json", "torch"):
        return [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in LOADS]
    return []


def raw_loads(tree: ast.AST) -> list[tuple[str, str, int]]:
    """(enclosing function, what, line) for each reference to a raw JSON or tensor loader in ``tree``."""
    return findings(tree, loads_of)


def test_json_and_tensors_are_read_only_through_the_io_layer():
    """Every JSON value and tensor file read is bounded by pipeline/files.py: no raw loader elsewhere."""
    unexplained, gone = outside_the_layer(loads_of, LOADS_ALLOWED)
    rules = [ROOT / "Snakefile", *sorted(ROOT.glob("workflow/**/*.smk")), *sorted(ROOT.glob("workflow/**/*.py"))]
    for file in rules:
        for n, line in enumerate(file.read_text().splitlines(), 1):
            if re.search(r"\b(json\.loads?|torch\.load)\b", line.split("#")[0]):
                unexplained.append(f"{file.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not unexplained, "raw JSON or tensor loads outside pipeline/files.py:\n" + "\n".join(unexplained)
    assert not gone, f"allowed but not found (remove them): {sorted(gone)}"


def test_the_loads_rule_finds_every_raw_loader():
    code = (
        "from json import loads\ndef f(p, parser):\n    json.loads(p)\n    json.load(open(p))\n"
        "    torch.load(p, weights_only=True)\n    parser.add_argument('--x', type=json.loads)\n"
        "    parse_json(p, 'w')\n    json.dumps(p)\n"
    )
    assert [(w, n) for _, w, n in raw_loads(ast.parse(code))] == [
        ("json.loads", 1),
        ("json.loads", 3),
        ("json.load", 4),
        ("torch.load", 5),
        ("json.loads", 6),
    ]
