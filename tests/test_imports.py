"""The modules (*.py at the root and in data/ and the library folders) import each other without a cycle, and none
of them, nor any file under data/ or config/, imports from experiments/ (the research harness).

A cycle works until someone imports the modules in another order, or imports inside a function (a lazy import
counts here too: it closes the circle as soon as it runs). The files are parsed, never imported.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("data", "plumbing", "evaluation", "embeddings")  # the folders of modules the scripts import


def module_name(path, root):
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root):
    """{module: set of the local modules it imports anywhere in its file}, for root/*.py and the .py files of
    LIBRARIES."""
    files = {module_name(p, root): p for p in [*root.glob("*.py"), *(p for d in LIBRARIES for p in root.glob(f"{d}/*.py"))]}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # from .x import y, inside a package
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(filter(None, [*anchor, base]))
                # `from data import tokenizer` imports the module data.tokenizer; `from model import MODELS` a name
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names)
        graph[name] = {m for m in found if m in files and m != name}
    return graph


def find_cycle(graph):
    """One import cycle as [a, b, ..., a], or None: depth-first search, a back edge closes a cycle."""
    state, stack = {}, []  # state: 1 = on the current path, 2 = done

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle():
    graph = import_graph(ROOT)
    assert {"probe", "evaluation.features", "embeddings.vectors", "plumbing.run", "data.tasks"} <= graph.keys()  # it found the files
    assert "probe" in set().union(*graph.values())  # and the run's lazy import of the probes, inside a function
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def script_imports(root, scripts):
    """[(file, module)] for every import of one of `scripts` (root modules) by a .py file of root, data/,
    experiments/ or hf/, lazy imports included."""
    found = []
    for path in [*root.glob("*.py"), *(p for d in ("data/**", "experiments", "hf", *LIBRARIES) for p in root.glob(f"{d}/*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [(str(path.relative_to(root)), n) for n in names if n in scripts]
    return found


def scripts(root):
    """The module names of the files run as `python x.py`: train.py, and every file with a __main__ block, but for
    the two core modules that also have a command line (probe.py's probes and flops.py's counts are libraries)."""
    files = [*root.glob("*.py"), *(p for d in ("data/**", "experiments", "hf", "embeddings") for p in root.glob(f"{d}/*.py"))]
    found = {p.relative_to(root).with_suffix("").as_posix().replace("/", ".") for p in files
             if 'if __name__ == "__main__":' in p.read_text()}
    found |= {name.rsplit(".", 1)[-1] for name in found if name.startswith(("experiments.", "hf.", "embeddings."))}
    return found - {"probe", "flops"} | {"train"}


def test_scripts_do_not_import_scripts(tmp_path):
    """What two scripts share lives in a library module (evaluation/ for the evaluators, experiments/runs.py for
    the harness, data/corpus.py for the prepare scripts), so no file imports a script."""
    found = scripts(ROOT)
    assert {"train", "embed", "sample", "export", "bench", "sweep", "data.tinybooks.prepare"} <= found
    assert not {"probe", "flops", "evaluation.features", "embeddings.vectors", "runs", "report", "data.corpus"} & found
    assert script_imports(ROOT, found) == []
    (tmp_path / "sample.py").write_text("def f():\n    from embed import search  # lazy, still an import\n")
    assert script_imports(tmp_path, {"embed"}) == [("sample.py", "embed")]


def test_library_modules_read_no_command_line():
    """The command line is the scripts': the library modules (plumbing/, evaluation/, embeddings/vectors.py, data/'s
    readers) take settings as values and raise configurator.UserError, the one rule for bad input, but never call
    configure(); only the two core modules with a command line of their own (probe.py, flops.py) do, in main()."""
    found = scripts(ROOT) | {"probe", "flops"}
    callers = set()
    for path in [*ROOT.glob("*.py"), *(p for d in ("data/**", *LIBRARIES) for p in ROOT.glob(f"{d}/*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "configurator" and \
                    "configure" in [a.name for a in node.names]:
                callers.add(path.relative_to(ROOT).with_suffix("").as_posix().replace("/", "."))
    assert "train" in callers and callers <= found, callers - found


def test_the_cycle_finder_sees_lazy_and_package_imports(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("import os\nfrom data import b\n")
    (tmp_path / "data" / "b.py").write_text("from .c import f\n")
    (tmp_path / "data" / "c.py").write_text("def f():\n    from a import g  # lazy, inside a function\n")
    (tmp_path / "d.py").write_text("import a\n")
    graph = import_graph(tmp_path)
    assert graph == {"a": {"data.b"}, "data": set(), "data.b": {"data.c"}, "data.c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "data.b", "data.c", "a"]
    (tmp_path / "data" / "c.py").write_text("def f():\n    import os\n")
    assert find_cycle(import_graph(tmp_path)) is None


def harness_imports(root):
    """[(file, module)] for every import of experiments/ (the folder, or a module in it) by a file of the core: the
    root's *.py, and every .py file under data/ and config/."""
    harness = {"experiments", *(p.stem for p in (root / "experiments").glob("*.py"))}
    found = []
    for path in [*root.glob("*.py"), *root.glob("data/**/*.py"), *root.glob("config/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [(str(path.relative_to(root)), n) for n in names if n.split(".")[0] in harness]
    return found


def test_the_core_does_not_import_the_experiments(tmp_path):
    assert {"sweep.py", "report.py", "stats.py", "noise.py", "acceptance.py"} <= {
        p.name for p in (ROOT / "experiments").glob("*.py")}
    assert harness_imports(ROOT) == []
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "stats.py").write_text("T = 1\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "train.py").write_text("def f():\n    from stats import T  # lazy, still an import\n")
    (tmp_path / "data" / "x.py").write_text("import experiments.stats\nfrom . import y\n")
    assert harness_imports(tmp_path) == [("train.py", "stats"), ("data/x.py", "experiments.stats")]
