"""Horovod's multi-host path on one machine: ``horovodrun -H localhost:1,dane-node2:1`` and ``--hostfile``.

``dane-node2`` is an /etc/hosts alias for 127.0.0.2 (scripts/ssh_localhost.sh), an address on
no interface, so horovodrun takes it for a remote host: it checks ssh to it, starts rank 1
there over ssh, and the gloo rendezvous and allreduces cross "hosts" over TCP.  The run must
see two hosts of one process each and give the in-process simulator's iterates.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from dane.records.results import read_rounds, read_summary
import helpers
from helpers import BIN, REPO, env, horovodrun

pytestmark = pytest.mark.slow

REMOTE = "dane-node2"
SMALL = ["algorithm=dane", "problem=ridge_synthetic", "problem.n_samples=2000", "problem.dim=50",
         "problem.covariance=decay", "rounds=5", "dtype=float64", "quiet=true"]


@pytest.fixture(scope="module")
def ssh_alias():
    """Prompt-free ssh to `REMOTE`, set up by scripts/ssh_localhost.sh (idempotent); skip with its reason."""
    horovodrun()  # skips when Horovod is not built
    proc = subprocess.run(["bash", str(REPO / "scripts" / "ssh_localhost.sh")], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "DANE_SSH_HOSTS": REMOTE})
    if proc.returncode != 0:
        pytest.skip(f"no prompt-free ssh to {REMOTE}: {proc.stderr.strip().splitlines()[-1:]}")
    return REMOTE


@pytest.fixture(scope="module")
def simulated_run(tmp_path_factory):
    return helpers.simulated_run(tmp_path_factory.mktemp("sim"), *SMALL)


def multihost_run(hosts: list[str], out_dir) -> subprocess.CompletedProcess:
    """horovodrun with ``hosts`` on ``python -m experiments.train``: `python` as each host finds it on PATH
    (horovodrun forwards the launching shell's environment, PATH included, on the ssh command line)."""
    cmd = [str(BIN / "horovodrun"), "-np", "2", *hosts, "--gloo", "--verbose",
           "python", "-m", "experiments.train", *SMALL, f"out_dir={out_dir}"]
    run_env = {**env(), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(cmd, cwd=REPO, env=run_env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("way", ["hosts", "hostfile"])
def test_two_hosts_give_the_simulators_iterates(way, ssh_alias, simulated_run, tmp_path):
    if way == "hosts":
        hosts = ["-H", f"localhost:1,{ssh_alias}:1", "--network-interface", "lo"]
    else:  # no --network-interface: horovodrun probes the interfaces of both hosts over ssh
        hostfile = tmp_path / "hostfile"
        hostfile.write_text(f"localhost slots=1\n{ssh_alias} slots=1\n")
        hosts = ["--hostfile", str(hostfile)]
    out = tmp_path / "run"
    proc = multihost_run(hosts, out)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    # horovodrun took the alias for a remote host and started rank 1 over ssh
    assert f"Remote host found: {ssh_alias}" in proc.stdout
    assert any(line.startswith("ssh ") and f" {ssh_alias} " in line and "HOROVOD_RANK=1" in line
               for line in proc.stdout.splitlines())

    summary = read_summary(out)
    assert summary["backend"] == "horovod" and summary["workers"] == 2
    launch = summary["provenance"]["launch"]
    assert launch["launcher"] == "horovodrun"
    assert (launch["size"], launch["local_size"], launch["cross_size"]) == (2, 1, 2)  # two hosts, one process each
    assert launch["hostname"] == "localhost"  # rank 0's host

    real, sim = read_rounds(out), read_rounds(simulated_run)
    assert len(real) == len(sim) == 6
    for a, b in zip(real, sim):
        assert a["round"] == b["round"] and a["bytes_sent"] == b["bytes_sent"]
        assert a["objective"] == pytest.approx(b["objective"], rel=1e-10, abs=0)
        # the last rounds' suboptimality (~1e-14) is at the round-off of the objective (~1.2): abs=1e-14 there
        assert a["suboptimality"] == pytest.approx(b["suboptimality"], rel=1e-10, abs=1e-14)
    assert sim[-1]["suboptimality"] < 1e-3 * sim[0]["suboptimality"]  # the rounds compared made progress
