"""Two "hosts" on one machine for the doctor and multi-host tests: 127.0.0.1 and 127.0.0.2
served by an sshd of the test's own (own config, host key, client key, authorized_keys and pid
file in a temporary folder, never ~/.ssh). Connections stay on loopback.

The second host runs every command through `node2.sh` (sshd `ForceCommand`), which the tests
rewrite to simulate a broken node: an older package, a missing data folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

HOSTS = ("127.0.0.1", "127.0.0.2")
SSHD = "/usr/sbin/sshd"
NORMAL_NODE2 = '#!/bin/sh\nexec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n'


def missing_requirements() -> str | None:
    """Why the harness cannot run here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (an sshd of its own listening on 127.0.0.2)"
    missing = [t for t in (SSHD, "ssh", "ssh-keygen", "pdsh") if not shutil.which(t)]
    if missing:
        return (
            f"missing {', '.join(missing)}: apt-get install -y openssh-server pdsh "
            "(CI does this in .ci/run)"
        )
    try:  # 127.0.0.2 is loopback on Linux, but a container could lack it
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
    except OSError:
        return "cannot bind 127.0.0.2 (no loopback range)"
    return None


def _free_port() -> int:
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.2", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no TCP port free on both 127.0.0.1 and 127.0.0.2")


class LoopbackSSH:
    """Start with `LoopbackSSH(tmp)`, stop with `.close()` (also kills what it started)."""

    def __init__(self, tmp: Path):
        self.dir = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.key = tmp / "id_ed25519"
        host_key = tmp / "ssh_host_ed25519_key"
        for k in (self.key, host_key):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)], check=True
            )
        (tmp / "authorized_keys").write_text((tmp / "id_ed25519.pub").read_text())
        self.node2 = tmp / "node2.sh"
        self.set_node2(NORMAL_NODE2)
        self.pidfile = tmp / "sshd.pid"
        self.log = tmp / "sshd.log"
        (tmp / "sshd_config").write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    *(f"ListenAddress {h}" for h in HOSTS),
                    f"HostKey {host_key}",
                    f"PidFile {self.pidfile}",
                    f"AuthorizedKeysFile {tmp / 'authorized_keys'}",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "PermitRootLogin prohibit-password",
                    "StrictModes no",
                    "PrintMotd no",
                    "Match LocalAddress 127.0.0.2",
                    f"    ForceCommand {self.node2}",
                    "",
                ]
            )
        )
        self.client_config = tmp / "ssh_config"
        self.client_config.write_text(
            f"Host {' '.join(HOSTS)} 127.0.0.3\n  Port {self.port}\n  IdentityFile {self.key}\n"
            "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n  BatchMode yes\n"
        )
        # `ssh` as the DeepSpeed launcher and pdsh call it, with this config (not ~/.ssh/config).
        self.bin = tmp / "bin"
        self.bin.mkdir(exist_ok=True)
        wrapper = self.bin / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {self.client_config} "$@"\n')
        wrapper.chmod(0o755)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation dir
        subprocess.run([SSHD, "-f", str(tmp / "sshd_config"), "-E", str(self.log)], check=True)
        self._wait_ready()

    @property
    def ssh_args(self) -> str:
        """Extra ssh options for the doctor (--ssh_args) and pdsh (PDSH_SSH_ARGS_APPEND)."""
        return f"-F {self.client_config}"

    def env(self) -> dict[str, str]:
        """Environment for a launcher on this machine: the ssh wrapper first on PATH."""
        return {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "PDSH_SSH_ARGS_APPEND": self.ssh_args,
            "PDSH_RCMD_TYPE": "ssh",
        }

    def set_node2(self, script: str) -> None:
        """What 127.0.0.2 runs for every command ($SSH_ORIGINAL_COMMAND holds the command)."""
        tmp = self.node2.with_suffix(".tmp")
        tmp.write_text(script)
        tmp.chmod(0o755)
        os.replace(tmp, self.node2)

    def run(self, host: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """`ssh host command` through the test's config."""
        return subprocess.run(
            ["ssh", "-F", str(self.client_config), host, command],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.pidfile.exists() and all(
                self.run(h, "true", 10).returncode == 0 for h in HOSTS
            ):
                return
            time.sleep(0.2)
        log = self.log.read_text() if self.log.exists() else ""
        self.close()
        raise RuntimeError(f"sshd on port {self.port} did not accept the test key:\n{log}")

    def close(self) -> None:
        """Stop the sshd (by its pid file) and whatever its sessions still run (leftover ranks)."""
        import psutil

        if not self.pidfile.exists():
            return
        try:
            sshd = psutil.Process(int(self.pidfile.read_text().strip()))
            procs = sshd.children(recursive=True) + [sshd]
        except (psutil.NoSuchProcess, ValueError):
            procs = []
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=10)
        for p in alive:
            p.kill()
        self.pidfile.unlink(missing_ok=True)
