"""The optional parts of a stack, for every test file: a test that needs one skips, naming it and how to add it.

dane's own dependencies are always there; these are not:

- ``@pytest.mark.needs_horovod``: ``horovod.torch`` imports and ``horovodrun`` is beside this python
  (the extra ``dane[horovod]``; `make setup` builds it);
- ``@pytest.mark.needs_mlflow``, ``@pytest.mark.needs_tensorboard``: the package is installed (the extras
  ``dane[mlflow]``, ``dane[tensorboard]``; both are in ``dane[dev]``);
- the fixture ``dane_command``: the console script ``dane`` beside this python, as ``pip install`` of
  dane writes it into an environment (a checkout run by another interpreter has none).

The session fixtures ``commands`` and ``fresh`` run what the test modules registered in tests/runs.py, one
process each for the whole session.

Tests that need real data skip where they read it (``shared/data``).  `.ci/run` runs the files that
hold such tests once more in an environment without Horovod, MLflow and TensorBoard, where they must
skip, not fail.
"""
from __future__ import annotations

import functools
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

import runs


@functools.cache
def missing_horovod() -> str | None:
    """Why Horovod cannot run here, or None."""
    from dane.synthetic.launchers import have_horovod

    if not have_horovod():
        return "horovod.torch does not import"
    if not (Path(sys.executable).parent / "horovodrun").exists():
        return f"horovodrun is not beside {sys.executable}"
    return None


@functools.cache
def missing_package(name: str) -> str | None:
    return None if importlib.util.find_spec(name) is not None else f"{name} is not installed"


#: marker -> (why the part is absent or None, how to add it)
NEEDS = {
    "needs_horovod": (missing_horovod, "the extra dane[horovod]: make setup builds it"),
    "needs_mlflow": (functools.partial(missing_package, "mlflow"), "pip install 'dane[mlflow]'"),
    "needs_tensorboard": (functools.partial(missing_package, "tensorboard"), "pip install 'dane[tensorboard]'"),
}


def pytest_configure(config):
    for name, (_, fix) in NEEDS.items():
        config.addinivalue_line("markers", f"{name}: skips where this part of the stack is absent ({fix})")


def pytest_collection_modifyitems(config, items):
    """A skip marker, with every absent part and its fix, on each collected test that needs one (checked once);
    the modules with a test that reads a shared process (`SHARED`) last, each whole and in its order, so that
    the process runs beside the others' tests and module fixtures are made once."""
    last = {getattr(item, "module", None) for item in items if uses_shared(item)}
    items[:] = sorted(items, key=lambda item: getattr(item, "module", None) in last)  # a stable sort
    for item in items:
        absent = [f"{why} ({fix})" for name, (missing, fix) in NEEDS.items()
                  if item.get_closest_marker(name) is not None and (why := missing()) is not None]
        if absent:
            item.add_marker(pytest.mark.skip(reason="; ".join(absent)))


@pytest.fixture
def dane_command() -> Path:
    """The ``dane`` console script of this environment (beside ``sys.executable``)."""
    path = Path(sys.executable).with_name("dane")
    if not path.exists():
        pytest.skip(f"no dane command beside {sys.executable}: install dane into this environment "
                    f"(pip install -e . from the checkout)")
    return path


#: the fixtures of tests/runs.py: each starts its process once, in the background, when collection ends
SHARED = ("commands", "fresh")
STARTED: dict[str, runs.Started] = {}


def uses_shared(item) -> bool:
    return bool(set(SHARED) & set(getattr(item, "fixturenames", ())))


def pytest_collection_finish(session):
    """Start the shared processes the selected tests read, now: they run beside the in-process tests, and the
    modules that read them come last (`pytest_collection_modifyitems`); then learn what `computed_once` learns."""
    if not session.config.option.collectonly:
        for name in SHARED:
            if any(name in getattr(item, "fixturenames", ()) for item in session.items):
                start(name, session)
        computed_once()


def computed_once() -> None:
    """The values this process caches after starting a process to learn them, learnt here, before the first test
    (as the shared processes are started), so that no test starts a process for them: dane's git provenance (`git
    rev-parse`, `git status`: `dane.records.provenance.code_version`, for every run folder written in-process) and the
    processor's name (``uname -p``, which ``platform.platform()`` reads for a benchmark's machine record)."""
    import platform

    from dane.records.provenance import code_version

    code_version()
    platform.uname().processor  # noqa: B018 - a cached property, computed by a process on first read


def start(name: str, session) -> runs.Started:
    if name not in STARTED:
        tmp, owners = Path(tempfile.mkdtemp(prefix=f"dane-{name}-")), runs.selected_owners(session)
        STARTED[name] = (runs.start_batch(tmp, owners, runs.without_dac_override() or []) if name == "commands"
                         else runs.start_fresh(tmp, owners))
    return STARTED[name]


def pytest_sessionfinish(session):
    for started in STARTED.values():
        started.stop()
        shutil.rmtree(started.tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def commands(request) -> runs.Batch:
    """Every `runs.command` row of the selected tests' modules, run in one batch process: ``commands[name]`` is
    {rc, stdout, stderr, existed, unchanged}; ``commands.tmp`` the folder ``{tmp}`` names.  Rows run as root
    without CAP_DAC_OVERRIDE where setpriv can drop it (`runs.without_dac_override`), so that file permissions bind."""
    return start("commands", request.session).result()


@pytest.fixture(scope="session")
def fresh(request) -> runs.Batch:
    """One fresh interpreter: ``fresh["imports"]``: sys.modules after each step of `runs.FRESH_IMPORTS`;
    ``fresh["forks"]``: {value, modules} or {error} of each statement of `runs.FRESH_FORKS`;
    ``fresh["jobs"][name]``: {ok: what the `runs.job` returned} or {error: its traceback}."""
    return start("fresh", request.session).result()
