"""The cluster helper scripts a user types: one host file for horovodrun --hostfile and for elastic
discovery (git-ignored), and an undo for the ssh set-up.  Each is a few milliseconds of bash."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from helpers import REPO

DISCOVER = REPO / "scripts" / "discover_hosts.sh"
SSH_LOCALHOST = REPO / "scripts" / "ssh_localhost.sh"


def discover(hosts_file) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(DISCOVER)], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "DANE_HOSTS_FILE": str(hosts_file)})


def test_discovery_reads_the_hostfile_of_the_multihost_example(tmp_path):
    """The README's `hostA slots=2` file (horovodrun --hostfile) and discovery's own `host:N` lines give the same
    `host:slots` output, so a hosts.txt left from one command cannot break the other."""
    hostfile, own = tmp_path / "hosts.txt", tmp_path / "own.txt"
    hostfile.write_text("# two machines\nhostA slots=2\n\nhostB slots=3\n")
    own.write_text("hostA:2\nhostB:3\n")
    assert discover(hostfile).stdout == discover(own).stdout == "hostA:2\nhostB:3\n"
    bare = tmp_path / "bare.txt"
    bare.write_text("hostC\n")
    assert discover(bare).stdout == "hostC:1\n"
    bad = tmp_path / "bad.txt"
    bad.write_text("hostA slots=two\n")
    proc = discover(bad)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == f'discover_hosts: {bad} line 1 is neither "host slots=N" nor "host:N": hostA slots=two\n'


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_the_host_file_is_git_ignored():
    proc = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "hosts.txt"], timeout=30)
    assert proc.returncode == 0


def test_ssh_undo_takes_back_what_the_state_file_records_and_nothing_else(tmp_path):
    """``ssh_localhost.sh --undo`` removes the ~/.ssh/config blocks and the key it made (as its state file
    records them) and leaves the user's own entries; with no state file it changes nothing."""
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDane dane-localhost"
    (ssh / "id_ed25519").write_text("private\n")
    (ssh / "id_ed25519.pub").write_text(key + "\n")
    (ssh / "authorized_keys").write_text(f"ssh-rsa AAAAmine me@laptop\n{key}\n")
    mine = "Host keep\n    User me\n"
    block = "".join(f"{line}\n" for line in ("# dane-localhost: dane-node2", "Host dane-node2",
                                              "    StrictHostKeyChecking accept-new",
                                              f"    IdentityFile {ssh / 'id_ed25519'}", "    BatchMode yes"))
    (ssh / "config").write_text(mine + block)
    (ssh / "dane-localhost.state").write_text("key\nconfig dane-node2\n")
    run = {"env": {**os.environ, "HOME": str(tmp_path)}, "capture_output": True, "text": True, "timeout": 30}
    proc = subprocess.run(["bash", str(SSH_LOCALHOST), "--undo"], **run)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ssh_localhost: undone: key;config dane-node2\n"
    assert (ssh / "config").read_text() == mine
    assert (ssh / "authorized_keys").read_text() == "ssh-rsa AAAAmine me@laptop\n"
    assert sorted(p.name for p in ssh.iterdir()) == ["authorized_keys", "config"]
    again = subprocess.run(["bash", str(SSH_LOCALHOST), "--undo"], **run)
    assert again.returncode == 0 and again.stdout.startswith("ssh_localhost: nothing to undo")
    wrong = subprocess.run(["bash", str(SSH_LOCALHOST), "--remove"], **run)
    assert wrong.returncode == 1 and wrong.stderr == ("ssh_localhost: unknown argument '--remove'; run without "
                                                      "arguments to set up, or with --undo to take it back\n")
