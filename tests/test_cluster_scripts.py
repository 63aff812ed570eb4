"""The cluster helper scripts a user types: one host file for horovodrun --hostfile and for elastic
discovery (git-ignored), and an undo for the ssh set-up.  Each is a few milliseconds of bash, run by the
session's fresh interpreter (tests/runs.py)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

import runs
from helpers import REPO

DISCOVER = REPO / "scripts" / "discover_hosts.sh"
SSH_LOCALHOST = REPO / "scripts" / "ssh_localhost.sh"


def discover(hosts_file) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(DISCOVER)], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "DANE_HOSTS_FILE": str(hosts_file)})


#: hosts files: the README's `hostA slots=2` (horovodrun --hostfile), discovery's own `host:N` lines, a bare host, a bad line
HOST_FILES = {"hosts.txt": "# two machines\nhostA slots=2\n\nhostB slots=3\n", "own.txt": "hostA:2\nhostB:3\n",
              "bare.txt": "hostC\n", "bad.txt": "hostA slots=two\n"}


def discovered(tmp) -> dict:
    """In the session's fresh interpreter (tests/runs.py): discover_hosts.sh on each of `HOST_FILES`, written
    into ``tmp/discover``: {file name: {returncode, stdout, stderr}}."""
    folder = tmp / "discover"
    folder.mkdir()
    said = {}
    for name, text in HOST_FILES.items():
        (folder / name).write_text(text)
        proc = discover(folder / name)
        said[name] = {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
    return said


def test_discovery_reads_the_hostfile_of_the_multihost_example(fresh):
    """The README's `hostA slots=2` file (horovodrun --hostfile) and discovery's own `host:N` lines give the same
    `host:slots` output, so a hosts.txt left from one command cannot break the other."""
    said = fresh["jobs"][DISCOVERED]
    assert "ok" in said, said.get("error")
    said = said["ok"]
    assert said["hosts.txt"]["stdout"] == said["own.txt"]["stdout"] == "hostA:2\nhostB:3\n"
    assert said["bare.txt"]["stdout"] == "hostC:1\n"
    bad = fresh.tmp / "discover" / "bad.txt"
    proc = said["bad.txt"]
    assert proc["returncode"] == 1 and proc["stdout"] == ""
    assert proc["stderr"] == f'discover_hosts: {bad} line 1 is neither "host slots=N" nor "host:N": hostA slots=two\n'


def git_check_ignore(tmp) -> int:
    """In the session's fresh interpreter: ``git check-ignore -q hosts.txt``'s status (0: ignored)."""
    return subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "hosts.txt"], timeout=30).returncode


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_the_host_file_is_git_ignored(fresh):
    assert fresh["jobs"][GIT_IGNORED] == {"ok": 0}


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDane dane-localhost"
MINE = "Host keep\n    User me\n"


def ssh_undo(tmp) -> dict:
    """In the session's fresh interpreter: a ~/.ssh (HOME=tmp/ssh_home) with the user's own entries and what
    ssh_localhost.sh made, as its state file records it; then ``--undo``, ``--undo`` again and ``--remove``:
    {undo, again, wrong: {returncode, stdout, stderr}, after_undo: {file: text} of ~/.ssh after the first undo}."""
    home = tmp / "ssh_home"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "id_ed25519").write_text("private\n")
    (ssh / "id_ed25519.pub").write_text(KEY + "\n")
    (ssh / "authorized_keys").write_text(f"ssh-rsa AAAAmine me@laptop\n{KEY}\n")
    block = "".join(f"{line}\n" for line in ("# dane-localhost: dane-node2", "Host dane-node2",
                                              "    StrictHostKeyChecking accept-new",
                                              f"    IdentityFile {ssh / 'id_ed25519'}", "    BatchMode yes"))
    (ssh / "config").write_text(MINE + block)
    (ssh / "dane-localhost.state").write_text("key\nconfig dane-node2\n")
    run = {"env": {**os.environ, "HOME": str(home)}, "capture_output": True, "text": True, "timeout": 30}
    said = {}
    for name, argument in (("undo", "--undo"), ("again", "--undo"), ("wrong", "--remove")):
        proc = subprocess.run(["bash", str(SSH_LOCALHOST), argument], **run)
        said[name] = {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
        if name == "undo":
            said["after_undo"] = {p.name: p.read_text() for p in sorted(ssh.iterdir())}
    return said


def test_ssh_undo_takes_back_what_the_state_file_records_and_nothing_else(fresh):
    """``ssh_localhost.sh --undo`` removes the ~/.ssh/config blocks and the key it made (as its state file
    records them) and leaves the user's own entries; with no state file it changes nothing."""
    said = fresh["jobs"][SSH_UNDO]
    assert "ok" in said, said.get("error")
    proc, again, wrong, ssh = (said["ok"][k] for k in ("undo", "again", "wrong", "after_undo"))
    assert proc["returncode"] == 0, proc["stderr"]
    assert proc["stdout"] == "ssh_localhost: undone: key;config dane-node2\n"
    assert ssh["config"] == MINE
    assert ssh["authorized_keys"] == "ssh-rsa AAAAmine me@laptop\n"
    assert sorted(ssh) == ["authorized_keys", "config"]
    assert again["returncode"] == 0 and again["stdout"].startswith("ssh_localhost: nothing to undo")
    assert wrong["returncode"] == 1 and wrong["stderr"] == ("ssh_localhost: unknown argument '--remove'; run without "
                                                            "arguments to set up, or with --undo to take it back\n")


DISCOVERED = runs.job("cluster_scripts:discover", "test_cluster_scripts:discovered")
GIT_IGNORED = runs.job("cluster_scripts:git_ignored", "test_cluster_scripts:git_check_ignore")
SSH_UNDO = runs.job("cluster_scripts:ssh_undo", "test_cluster_scripts:ssh_undo")
