"""The package as a user installs it: one namespace (dane, plus Hydra's hydra_plugins), the dane command, Horovod as an extra.

The slow test builds the wheel, installs it without the extra into a fresh virtual environment and
runs ``dane`` from an empty folder outside the checkout, on this interpreter; .ci/run's smoke step
runs it on Python 3.12 as well.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from dane.experiments import cli
from dane.layout import MAPPED

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
TOP_LEVEL = {"dane", "hydra_plugins"}
CODE = ("dane", "baselines", "experiments", "synthetic", "paper_figs", "scripts", "hydra_plugins", "tests")
RUN = ["algorithm=dane", "problem=ridge_synthetic", "problem.n_samples=2000", "problem.dim=50", "workers=2", "rounds=4"]


TOP_LEVEL_IMPORT = re.compile(rf"^\s*(?:from|import)\s+((?:{'|'.join(MAPPED)})\b[\w.]*)", re.M)


def top_level_imports(path: Path) -> list[str]:
    """Modules ``path`` imports by a mapped part's top-level name (``baselines.x``), which a wheel does not have."""
    return TOP_LEVEL_IMPORT.findall(path.read_text())


def test_code_imports_the_mapped_parts_through_dane():
    """``from baselines.admm import`` works in a checkout only (and makes a second copy of the module there)."""
    bad = sorted((str(p.relative_to(REPO)), name) for part in CODE for p in (REPO / part).rglob("*.py")
                 for name in top_level_imports(p))
    assert bad == []
    targets = [line.split(":", 1)[1].strip() for p in (REPO / "conf").rglob("*.yaml")
               for line in p.read_text().splitlines() if line.strip().startswith("_target_:")]
    assert targets and [t for t in targets if t.split(".")[0] in MAPPED] == []


def checkout_packages() -> set[str]:
    """Every package of the checkout under the name the wheel gives it (dane/layout.py's mapping)."""
    found = {"dane.conf"}  # conf/ holds Hydra's groups: a package so that Hydra finds pkg://dane.conf
    for init in (REPO / "dane").rglob("__init__.py"):
        found.add(".".join(init.parent.relative_to(REPO).parts))
    for part in MAPPED:
        for init in (REPO / part).rglob("__init__.py"):
            found.add(".".join(["dane", *init.parent.relative_to(REPO).parts]))
    found |= {f"hydra_plugins.{p.parent.name}" for p in (REPO / "hydra_plugins").glob("*/__init__.py")}
    return found


def test_the_wheel_lists_every_package_of_the_checkout():
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert set(setuptools["packages"]) == checkout_packages()
    assert setuptools["package-dir"] == {f"dane.{part}": part for part in MAPPED}
    assert PYPROJECT["project"]["scripts"] == {"dane": "dane.experiments.cli:main"}


def test_horovod_is_an_extra_only():
    project = PYPROJECT["project"]
    assert [d for d in project["dependencies"] if d.startswith("horovod")] == []
    assert project["optional-dependencies"]["horovod"] == ["horovod==0.28.1"]


def test_dane_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    listed = re.findall(r"^  (\w+)  ", capsys.readouterr().out, flags=re.M)
    assert listed == ["train", "simulate", "calibrate", "data", "figures", "bench"]


@pytest.mark.parametrize("argv, expect", [
    (["trian"], "no command 'trian'; choose one of train, simulate, calibrate, data, figures, bench"),
    (["figures", "nope"], "no figure or table 'nope'; choose one of"),
    (["bench", "nope"], "no benchmark 'nope'; choose one of"),
])
def test_a_wrong_command_is_one_line_and_exit_2(argv, expect, capfd):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    err = capfd.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and expect in err


@pytest.mark.filterwarnings("ignore:.*found in sys.modules")  # runpy re-running the imported cli module
def test_python_m_cli_is_the_dane_command(capfd, monkeypatch):
    """``python -m dane.experiments.cli ARGS`` runs ``dane ARGS`` (it ran nothing and exited 0): a wrong command
    is its one line and exit 2, run as ``python -m`` runs the module (`runpy`, as ``__main__``)."""
    import runpy

    monkeypatch.setattr(sys, "argv", ["cli", "trian"])
    for name in ("_entry_command", "_entry_prog"):  # the dane command records its line: not for the tests after
        monkeypatch.setattr(f"dane.records.provenance.{name}", None)
    with pytest.raises(SystemExit) as done:
        runpy.run_module("dane.experiments.cli", run_name="__main__")
    assert done.value.code == 2
    assert capfd.readouterr().err == ("error: dane: no command 'trian'; choose one of train, simulate, calibrate, "
                                      "data, figures, bench (dane --help)\n")


def test_a_benchmarks_help_names_the_command_typed(capsys, monkeypatch):
    """``dane bench compress --help``'s usage line is ``dane bench compress``, not the runner's module."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # runpy rewrites argv: restored after the test
    monkeypatch.setattr("dane.records.provenance._entry_command", None)
    monkeypatch.setattr("dane.records.provenance._entry_prog", None)
    with pytest.raises(SystemExit) as done:
        cli.main(["bench", "compress", "--help"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: dane bench compress [-h]")


@pytest.mark.parametrize("figure, expect", [
    ("convergence", "dane figures convergence: 10 run(s) missing under {tmp} (the first: "),
    ("local_work", "dane figures local_work: no runs under {tmp}; make them with dane figures make_all"),
])
def test_a_figure_without_its_runs_is_one_line_and_exit_2(figure, expect, tmp_path, capfd, monkeypatch):
    """The figure's own message (what is missing, the command that makes it), as one line, not its traceback."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # runpy rewrites argv: restored after the test
    monkeypatch.setattr("dane.records.provenance._entry_command", None)
    monkeypatch.setattr("dane.records.provenance._entry_prog", None)
    with pytest.raises(SystemExit) as done:
        cli.main(["figures", figure, "--results", str(tmp_path), "--out", str(tmp_path / "figs")])
    err = capfd.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and f"error: {expect.format(tmp=tmp_path)}" in err


@pytest.mark.parametrize("figure", ["dane_vs_admm", "accuracy_table", "target_table"])
def test_a_figure_that_draws_nothing_says_so_and_exits_2(tmp_path, capfd, monkeypatch, figure):
    """dane_vs_admm without its network runs drew nothing and exited 0, and the two tables wrote tables of dashes
    (make_all reports those runs for all the tables; alone, each figure now says so)."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr("dane.records.provenance._entry_command", None)
    monkeypatch.setattr("dane.records.provenance._entry_prog", None)
    with pytest.raises(SystemExit) as done:
        cli.main(["figures", figure, "--results", str(tmp_path), "--out", str(tmp_path / "figs")])
    assert done.value.code == 2 and capfd.readouterr().err.splitlines()[-1] == (
        f"error: nothing drawn: the runs it reads are missing under {tmp_path}; make tables (dane figures --nn) "
        "makes them")
    assert not (tmp_path / "figs").exists()


def test_a_run_records_the_dane_command_as_typed(tmp_path, monkeypatch):
    # runpy puts the module's file (train.py) in argv[0]; the summary's provenance must say `dane train ...`
    (tmp_path / "probe_command.py").write_text(
        "import json, sys\nfrom dane.records.provenance import run_command\n"
        "open(sys.argv[1], 'w').write(json.dumps(run_command()))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.MODULES, "train", ("probe_command", "a probe"))
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # runpy rewrites argv[0]: restored after the test
    monkeypatch.setattr("dane.records.provenance._entry_command", None)  # and the command recorded, after it
    monkeypatch.setattr("dane.records.provenance._entry_prog", None)
    out = tmp_path / "command.json"
    cli.main(["train", str(out), "workers=2"])
    assert json.loads(out.read_text()) == ["dane", "train", str(out), "workers=2"]


def run(cmd: list[str], cwd: Path, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def build_wheel(out: Path) -> Path:
    """The wheel of this checkout, built as pip builds it (setuptools, no network: this environment's).

    From a copy: setuptools builds in the source tree's build/, which would leave a folder in the
    checkout and carry files a later build no longer has.
    """
    source = out.parent / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "results", "outputs", "multirun", "*.egg-info", "__pycache__", ".pytest_cache"))
    done = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                str(source)], source, os.environ)
    assert done.returncode == 0, done.stderr
    [wheel] = out.glob("dane-*.whl")
    return wheel


def wheel_top_level(wheel: Path) -> tuple[set[str], str, str]:
    """(top-level names in RECORD, top_level.txt, METADATA)."""
    with zipfile.ZipFile(wheel) as z:
        info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        record = z.read(f"{info}/RECORD").decode()
        names = {line.split(",")[0].split("/")[0] for line in record.splitlines() if line}
        return names - {info}, z.read(f"{info}/top_level.txt").decode(), z.read(f"{info}/METADATA").decode()


def linked_torch(site: Path) -> None:
    """This environment's torch and the distributions it needs, hard-linked into ``site``.

    Not from the index: on Python 3.12 pip takes the CUDA build there (several GB with its nvidia
    packages, a second copy beside .venv-3.12's, which filled CI's disk), and torch is not what this
    test tests.  Hard links, not symlinks: should pip replace one of these distributions, it removes
    the link and leaves this environment's files alone (a symlink where the two folders are on different
    file systems).  Scripts outside site-packages are not linked.
    """
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo = ["torch"]
    seen = {canonicalize_name(d.metadata["Name"]) for d in metadata.distributions(path=[str(site)])}  # venv's pip, setuptools
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue  # pip upgrades the venv's own setuptools if torch needs a newer one
        seen.add(name)
        dist = metadata.distribution(name)
        todo += [r.name for r in map(Requirement, dist.requires or []) if r.marker is None or r.marker.evaluate({"extra": ""})]
        for top in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            source, target = Path(dist.locate_file(top)), site / top
            if target.exists() or not source.exists():
                continue  # a folder two distributions share (nvidia/) is linked whole with the first
            if source.is_dir():
                shutil.copytree(source, target, symlinks=True, copy_function=link)
            else:
                link(source, target)


def link(source: str | Path, target: str | Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        os.symlink(source, target)


def fresh_venv(where: Path, wheel: Path) -> Path:
    """A new virtual environment with this one's torch (linked) and the wheel (its other dependencies from the index), no extra."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = run([sys.executable, "-m", "venv", str(where)], where.parent, env)
    assert done.returncode == 0, done.stderr
    [site] = where.glob("lib/python*/site-packages")
    linked_torch(site)
    done = run([str(where / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q", "install", str(wheel)],
               where.parent, env, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return where / "bin"


@pytest.mark.slow
def test_the_installed_wheel_runs_dane_from_an_empty_folder(tmp_path):
    wheel = build_wheel(tmp_path / "dist")
    names, top_level, metadata = wheel_top_level(wheel)
    assert names == TOP_LEVEL and set(top_level.split()) == TOP_LEVEL
    assert "Requires-Dist: horovod==0.28.1; extra == \"horovod\"" in metadata
    assert [line for line in metadata.splitlines() if line.startswith("Requires-Dist: horovod") and "extra" not in line] == []

    bin_dir = fresh_venv(tmp_path / "venv", wheel)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"

    # only dane and hydra_plugins are importable; the checkout is nowhere on the path
    probe = ("import importlib.util, json, dane.layout as l; "
             "print(json.dumps([l.CHECKOUT is None, str(l.CONF_DIR), "
             "[importlib.util.find_spec(n) is not None for n in ('baselines', 'experiments', 'synthetic', 'paper_figs', "
             "'horovod')]]))")
    done = run([str(bin_dir / "python"), "-c", probe], empty, env)
    no_checkout, conf_dir, found = json.loads(done.stdout)
    assert no_checkout and Path(conf_dir).is_relative_to(tmp_path / "venv") and found == [False] * 5

    done = run([str(bin_dir / "dane"), "train", *RUN, "out_dir=run"], empty, env)
    assert done.returncode == 0, done.stderr
    assert "dane on ridge_synthetic, 2 worker(s), simulator: max_rounds" in done.stdout
    summary = json.loads((empty / "run" / "summary.json").read_text())
    assert summary["rounds"] == 4 and summary["workers"] == 2
    assert sorted(p.name for p in empty.iterdir()) == ["run"]  # Hydra wrote nothing else into the folder

    # the same run from the checkout gives the same numbers (the simulator is deterministic)
    here = run([sys.executable, "-m", "dane.experiments.train", *RUN, f"out_dir={tmp_path / 'here'}"], REPO,
               {**os.environ, "PYTHONPATH": str(REPO)})
    assert here.returncode == 0, here.stderr
    mine = json.loads((tmp_path / "here" / "summary.json").read_text())
    assert summary["final_suboptimality"] == mine["final_suboptimality"]

    # figures from the installed package read the run
    done = run([str(bin_dir / "dane"), "figures", "summary", ".", "--json"], empty, env)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    assert row["rounds"] == 4 and row["status"] == summary["status"]

    # without the extra: comm=horovod, and a launch under horovodrun, say in one line how to add it
    for extra_env, args in (({}, ["comm=horovod"]), ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1"}, [])):
        done = run([str(bin_dir / "dane"), "train", *RUN, *args, "out_dir=hvd"], empty, {**env, **extra_env})
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "needs Horovod, which is not installed" in done.stderr and "bash scripts/setup.sh" in done.stderr
        assert not (empty / "hvd").exists()

    done = run([str(bin_dir / "dane"), "bench"], empty, env)
    assert done.returncode == 2 and "runs the benchmarks of a checkout" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["horovodrun", "torchrun"])
def test_the_dane_command_runs_under_each_launcher(tmp_path, launcher):
    """horovodrun runs the console script as its command; torchrun runs it with --no-python.  Same numbers as the simulator."""
    bin_dir = Path(sys.executable).parent
    if launcher == "horovodrun" and not (bin_dir / "horovodrun").exists():
        pytest.skip("Horovod is not installed (the extra dane[horovod])")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    prefix = (["horovodrun", "-np", "2", "--gloo"] if launcher == "horovodrun" else
              ["torchrun", "--standalone", "--nproc_per_node", "2", "--no-python"])
    run_args = [a for a in RUN if a != "workers=2"]
    done = run([*prefix, "dane", "train", *run_args, "out_dir=launched"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    done = run([str(bin_dir / "dane"), "train", *RUN, "out_dir=simulated"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    launched, simulated = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("launched", "simulated"))
    assert launched["backend"] == {"horovodrun": "horovod", "torchrun": "torch"}[launcher]
    assert launched["rounds"] == simulated["rounds"] == 4
    assert launched["final_objective"] == pytest.approx(simulated["final_objective"], rel=1e-9)


def test_figures_help_names_the_command_and_every_figure(capsys, monkeypatch):
    """``dane figures --help`` read "usage: make_all.py" and listed no figure; ``blocks`` (a helper module) was
    offered as one and drew nothing."""
    from dane.experiments.cli import figure_names

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr("dane.records.provenance._entry_command", None)
    monkeypatch.setattr("dane.records.provenance._entry_prog", None)
    names = figure_names()
    assert {"summary", "accuracy_table", "plot_runs"} <= set(names) and not {"blocks", "common", "provenance"} & set(names)
    with pytest.raises(SystemExit) as done:
        cli.main(["figures", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: dane figures [-h]")
    assert all(n in out for n in names if n != "make_all")  # make_all is what dane figures alone runs
