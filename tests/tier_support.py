"""The test tiers, declared: what makes a test ``slow``, and a static check that no test trains a zoo or runs a
calibration study without saying so.

A test is slow when it says so (``@pytest.mark.slow`` on itself or its class, or ``pytestmark`` in its module), or
when it uses a fixture in SLOW_FIXTURES: such a fixture declares once that every test using it, through any chain of
fixtures, is slow (pytest ignores marks on fixtures, so tests/conftest.py applies the mark at collection).
``undeclared_slow_tests`` reads the test modules' source (never runs them) and lists every test that reaches a
ZOO_TRAINERS or CALIBRATION_CALLS function or a slow fixture, through helpers and fixtures of the tests package
(``request.getfixturevalue`` included), yet is neither marked nor asks for a slow fixture in its arguments;
tests/test_tiers.py asserts the list is empty.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: Fixtures that make their users slow: the trained zoos (the encoder, merge and null zoos too) and the real model
#: (minutes to build on a fresh machine), the adversary suite's briefly trained models of every kind
#: (test_adversary.py), and Ray clusters (a local one in tests/conftest.py, a ``ray start`` head in
#: test_ray_job_submit.py).
SLOW_FIXTURES = frozenset({"zoo", "independent_zoo", "chain_zoo", "seed_zoo", "local_ray", "cluster", "smollm2",
                           "trained_kinds", "encoder_zoo", "merge_zoo", "null_zoo", "null_stress_zoo", "tool_hub"})
#: Fixtures that start a Ray cluster: their tests share one pytest-xdist group (tests/conftest.py), one cluster at a
#: time on one worker rather than two clusters of 2 CPUs each on a 2-core machine.
RAY_CLUSTER_FIXTURES = frozenset({"local_ray", "cluster"})

#: Functions that train a zoo at its recipe's size: a test that calls one (or a helper or fixture that does) trains
#: for seconds to minutes. A builder called at a toy size (two steps, three models) is not in this list.
ZOO_TRAINERS = frozenset({"build_zoo", "train_independent_models", "build_chain", "build_merge_zoo",
                          "build_tool_hub"})
#: A KS test makes a test a calibration study: a statistic's p-values over a simulated null sample, hundreds of
#: draws each a full test, checked against uniform (a chi-square is not: the canonical inputs' uniformity check is
#: one cheap draw).
CALIBRATION_CALLS = frozenset({"kstest"})

TESTS = Path(__file__).resolve().parent


@dataclass
class _Module:
    """One module of the tests package: its functions (fixtures included) and the names it imports from the
    package."""

    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)
    slow_module: bool = False
    slow_classes: set[str] = field(default_factory=set)


def undeclared_slow_tests(root: Path = TESTS) -> list[str]:
    """``path::test`` of every test under ``root`` that trains a zoo or runs a calibration study without declaring
    itself slow."""
    modules = {_module_name(path, root): _parse(path, root) for path in sorted(root.rglob("*.py"))}
    checker = _Reach(modules)
    found = []
    for name, module in modules.items():
        if not name.split(".")[-1].startswith("test_"):
            continue
        for test, function, class_slow in _tests(module):
            if module.slow_module or class_slow or _marked_slow(function.decorator_list):
                continue
            if checker.uses_slow_fixture(name, function):
                continue
            if checker.reaches(name, function):
                found.append(f"{name.replace('.', '/')}.py::{test}")
    return found


def _module_name(path: Path, root: Path) -> str:
    return ".".join(("tests", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")


def _parse(path: Path, root: Path) -> _Module:
    tree = ast.parse(path.read_text(), filename=str(path))
    module = _Module()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            module.functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            if _marked_slow(node.decorator_list):
                module.slow_classes.add(node.name)
            for inner in node.body:
                if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef):
                    module.functions[f"{node.name}.{inner.name}"] = inner
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tests":
            for alias in node.names:
                module.imported[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                  for t in node.targets):
            module.slow_module = _marked_slow(_listed(node.value))
    return module


def _listed(value: ast.expr) -> list[ast.expr]:
    return list(value.elts) if isinstance(value, ast.List | ast.Tuple) else [value]


def _marked_slow(decorators: Iterable[ast.expr]) -> bool:
    """Whether one of the expressions is ``pytest.mark.slow`` (or ``mark.slow``)."""
    for node in decorators:
        target = node.func if isinstance(node, ast.Call) else node
        if isinstance(target, ast.Attribute) and target.attr == "slow" and _name(target.value) == "mark":
            return True
    return False


def _name(node: ast.expr) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


def _tests(module: _Module) -> Iterator[tuple[str, ast.FunctionDef, bool]]:
    """(test id, function, whether its class is marked slow) of the module's test functions, as pytest collects them."""
    for qualified, function in module.functions.items():
        owner, _, name = qualified.rpartition(".")
        if name.startswith("test") and (not owner or owner.startswith("Test")):
            yield qualified.replace(".", "::"), function, owner in module.slow_classes


class _Reach:
    """Whether a function reaches a trainer or a calibration call through functions and fixtures of the tests
    package (fixtures are found by their argument names in the same module or in conftest.py)."""

    def __init__(self, modules: dict[str, _Module]) -> None:
        self.modules = modules
        self.memo: dict[tuple[str, int], bool] = {}

    def uses_slow_fixture(self, module: str, function: ast.FunctionDef, seen: frozenset[str] = frozenset()) -> bool:
        for name in _arguments(function):
            if name in SLOW_FIXTURES:
                return True
            fixture = self._fixture(module, name)
            if fixture and name not in seen and self.uses_slow_fixture(fixture[0], fixture[1], seen | {name}):
                return True
        return False

    def reaches(self, module: str, function: ast.FunctionDef) -> bool:
        key = (module, function.lineno)
        if key not in self.memo:
            self.memo[key] = False  # a cycle reaches nothing new
            self.memo[key] = self._reaches(module, function)
        return self.memo[key]

    def _reaches(self, module: str, function: ast.FunctionDef) -> bool:
        called, requested = _called(function), _requested(function)
        if called & (ZOO_TRAINERS | CALIBRATION_CALLS) or requested & SLOW_FIXTURES:
            return True
        for name in called | requested:
            target = self._resolve(module, name) or (self._fixture(module, name) if name in requested else None)
            if target and self.reaches(*target):
                return True
        return False

    def _resolve(self, module: str, name: str) -> tuple[str, ast.FunctionDef] | None:
        """A function of the tests package that ``name`` means in ``module``."""
        here = self.modules[module]
        if name in here.functions:
            return module, here.functions[name]
        if name in here.imported:
            source, original = here.imported[name]
            if source in self.modules and original in self.modules[source].functions:
                return source, self.modules[source].functions[original]
        return None

    def _fixture(self, module: str, name: str) -> tuple[str, ast.FunctionDef] | None:
        """The fixture an argument ``name`` gets: the module's own, else conftest.py's (SLOW_FIXTURES stop here)."""
        if name in SLOW_FIXTURES:
            return None
        for where in (module, "tests.conftest"):
            function = self.modules.get(where, _Module()).functions.get(name)
            if function is not None and _is_fixture(function):
                return where, function
        return None


def _arguments(function: ast.FunctionDef) -> set[str]:
    """The fixtures pytest sees a function ask for at collection: its arguments."""
    return {a.arg for a in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)}


def _requested(function: ast.FunctionDef) -> set[str]:
    """The fixtures a function uses: its arguments, and the names it passes to ``request.getfixturevalue`` (looked
    up at run time, outside the closure pytest marks at collection)."""
    return _arguments(function) | {
        node.args[0].value for node in ast.walk(function)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getfixturevalue"
        and node.args and isinstance(node.args[0], ast.Constant)}


def _called(function: ast.FunctionDef) -> set[str]:
    """Names of what the function calls (``f(...)`` and ``x.f(...)`` alike) or passes on as a function."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            target = node.func
            if isinstance(target, ast.Name):
                names.add(target.id)
            elif isinstance(target, ast.Attribute):
                names.add(target.attr)
            names.update(a.id for a in node.args if isinstance(a, ast.Name))
    return names


def _is_fixture(function: ast.FunctionDef) -> bool:
    for node in function.decorator_list:
        target = node.func if isinstance(node, ast.Call) else node
        if (isinstance(target, ast.Attribute) and target.attr == "fixture") or \
                (isinstance(target, ast.Name) and target.id == "fixture"):
            return True
    return False


def fixtures_defined(root: Path = TESTS) -> set[str]:
    """Names of the fixtures defined in the tests package (to check that SLOW_FIXTURES names real ones)."""
    return {name.rpartition(".")[2] for path in root.rglob("*.py")
            for name, function in _parse(path, root).functions.items() if _is_fixture(function)}
