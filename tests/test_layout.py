"""The package's shape: no import cycles, no oversized module, hooks documented,
and importing tmpi_adapters changes nothing in the interpreter."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tmpi_adapters"
#: A module longer than this is split (the architecture issue's bar).
MAX_LINES = 600


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules():
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def for_type_checkers(tree):
    """The nodes under ``if TYPE_CHECKING:``: names for annotations, never
    imported at run time (a hook's annotation names the Session that calls it)."""
    return {id(inner) for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
            for statement in node.body for inner in ast.walk(statement)}


def imported(path, name, known):
    """Every tmpi_adapters module ``path`` imports, at any depth of the file."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skipped = for_type_checkers(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            # ``from package import submodule`` imports the submodule, not
            # anything of the package's own.
            subs = ["%s.%s" % (base, alias.name) for alias in node.names]
            targets = [t for t in subs if t in known] or [base]
        for target in targets:
            if target in known and target != name:
                found.add(target)
    return found


def graph():
    known = modules()
    return {name: imported(path, name, known) for name, path in known.items()}


def find_cycle(edges):
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_no_import_cycles():
    # Imports inside functions count: a cycle there is a cycle in the design.
    edges = graph()
    edges["tmpi_adapters"] = set()  # the package's lazy public names import downwards only
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


#: The floors of the package, from the top: a module may import modules of its
#: own folder and of the floors below its own, never above nor beside it
#: (docs/architecture.md has the same table).  A folder stands for its
#: modules; the top-level modules stand for themselves.
FLOORS = [
    ("bench", "testing", "pytest_plugin"),              # tools
    ("tmpi_adapters", "plugin"),                         # the public faces
    ("launch",),                                         # the front doors
    ("frameworks", "reliability", "recording"),          # what hooks into a run
    ("rules",),                                          # synchronisation rules
    ("core",),                                           # the training step
    ("graphs", "exchangers"),                            # reading graphs; moving bytes
    ("process",),                                        # one process's plumbing
    ("options", "pluginmanager", "datasets", "files", "native"),
    ("errors", "hookspecs", "version", "pickles"),
]


def room(name):
    """The entry of :data:`FLOORS` that module ``name`` belongs to."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_module_has_a_floor():
    floors = {entry for floor in FLOORS for entry in floor}
    assert {room(name) for name in modules()} <= floors, \
        {room(name) for name in modules()} - floors


def upward_imports(edges):
    """``"a -> b"`` for every import in ``edges`` that does not point down."""
    floor_of = {entry: k for k, floor in enumerate(FLOORS) for entry in floor}
    return sorted("%s -> %s" % (name, target) for name, targets in edges.items()
                  for target in targets if room(name) != room(target)
                  and floor_of[room(target)] <= floor_of[room(name)])


def test_imports_only_point_down():
    upward = upward_imports(graph())
    assert not upward, "imports that do not point down (see docs/architecture.md):\n" + \
        "\n".join(upward)


def test_the_direction_test_finds_an_import_up_or_beside():
    edges = {"tmpi_adapters.core.session": {"tmpi_adapters.launch.cli",
                                            "tmpi_adapters.core.function",
                                            "tmpi_adapters.graphs.layout"},
             "tmpi_adapters.reliability.plugin": {"tmpi_adapters.recording.plot"}}
    assert upward_imports(edges) == [
        "tmpi_adapters.core.session -> tmpi_adapters.launch.cli",
        "tmpi_adapters.reliability.plugin -> tmpi_adapters.recording.plot"]


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_is_oversized():
    long = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    over = {name: n for name, n in long.items() if n > MAX_LINES}
    assert not over, over


def test_every_hook_is_documented_in_the_plugin_guide():
    from tmpi_adapters import hookspecs
    hooks = sorted(n for n in vars(hookspecs) if n.startswith("tmpi_"))
    guide = (ROOT / "docs" / "plugins.md").read_text()
    documented = set(re.findall(r"^### `(tmpi_\w+)", guide, re.M))
    assert set(hooks) == documented, (set(hooks) ^ documented)
    for name in hooks:
        assert getattr(hookspecs, name).__doc__, name


def test_architecture_hook_table_matches_hookspecs():
    from tmpi_adapters import hookspecs
    hooks = {n for n in vars(hookspecs) if n.startswith("tmpi_")}
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Extension points", 1)[1]
    assert set(re.findall(r"`(tmpi_\w+)`", table)) == hooks


def test_importing_the_package_changes_nothing():
    # `from tmpi_adapters import datasets` must not patch the interpreter.
    code = ("import collections, os, sys; os.environ.pop('THEANO_FLAGS', None); "
            "import tmpi_adapters, tmpi_adapters.datasets, tmpi_adapters.options; "
            "assert not hasattr(collections, 'Iterable'), 'collections aliased'; "
            "assert 'THEANO_FLAGS' not in os.environ, 'flags set'; "
            "assert 'theano' not in sys.modules, 'theano imported'; "
            "assert 'theano.tensor.signal.downsample' not in sys.modules; print('clean')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=str(ROOT))
    assert result.stdout.strip() == "clean", result.stderr


def test_building_the_plugin_manager_imports_no_theano():
    # Every plugin is imported when the manager is built (`tmpi plugins`, the
    # command line): Theano must wait until a rank has set its flags.
    code = ("import sys; from tmpi_adapters.pluginmanager import make_plugin_manager; "
            "make_plugin_manager(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('theano', 'keras', "
            "'lasagne', 'blocks')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=str(ROOT))
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


@pytest.mark.parametrize("name", ["distributed", "wrap", "Rule", "Knob", "Exchanger",
                                  "ModelProtocol", "hookimpl", "TmpiError", "ConfigError"])
def test_public_names(name):
    import tmpi_adapters
    assert getattr(tmpi_adapters, name) is not None
    assert name in tmpi_adapters.__all__
