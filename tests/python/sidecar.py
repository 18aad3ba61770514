"""Starts a real packsched-server for a test and stops it: the one Python helper for that (the
pytest suite, tests/deploy, tests/fault and the benchmark scripts use it).

A sidecar listens on loopback port 0 unless told otherwise and is up once the port file it was
given (--port_file) exists."""

import os
import pathlib
import signal
import socket
import subprocess
import time

import packsched

# The packsched-server of the build whose Python package is imported (BUILD/bin).
SERVER = pathlib.Path(packsched.__file__).resolve().parents[2] / "bin" / "packsched-server"


class Sidecar:
    """A packsched-server process; ``target`` is its "127.0.0.1:PORT". Use as a context manager.

    ``flags`` follow --listen, --port_file, --shutdown_grace=1s and --log_level=warn, so a flag
    given here overrides those defaults (the last value of a flag wins). ``server``: the binary
    (default: the build's); ``prefix``: a command that runs it (e.g. ``ip netns exec NS``);
    ``log``: a file its stdout and stderr are appended to (default: this process's).
    Raises RuntimeError if it exits or has not written its port file within ``start_timeout``
    seconds (the process is stopped then)."""

    def __init__(
        self,
        workdir,
        *flags,
        listen="127.0.0.1:0",
        server=None,
        prefix=(),
        log=None,
        start_timeout=20,
    ):
        self._port_file = pathlib.Path(workdir) / f"port-{time.monotonic_ns()}"
        command = [
            *prefix,
            os.fspath(server if server is not None else SERVER),
            f"--listen={listen}",
            f"--port_file={self._port_file}",
            "--shutdown_grace=1s",
            "--log_level=warn",
            *flags,
        ]
        if log is None:
            self._proc = subprocess.Popen(command)
        else:
            with open(log, "a") as output:
                self._proc = subprocess.Popen(command, stdout=output, stderr=output)
        deadline = time.monotonic() + start_timeout
        while not self._port_file.exists():
            if self._proc.poll() is not None:
                raise RuntimeError(f"packsched-server exited with {self._proc.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"packsched-server did not write its port file within {start_timeout} s"
                )
            time.sleep(0.01)
        self.port = int(self._port_file.read_text())
        self.target = f"127.0.0.1:{self.port}"

    @property
    def pid(self):
        return self._proc.pid

    def cpu_seconds(self):
        """CPU time the process has used so far (user + system), from /proc."""
        fields = pathlib.Path(f"/proc/{self._proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_bytes(self):
        """The process's peak resident set (VmHWM), from /proc."""
        for line in pathlib.Path(f"/proc/{self._proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc/PID/status")

    def poll(self):
        """The exit status, or None while it runs."""
        return self._proc.poll()

    def terminate(self, timeout=10):
        """SIGTERM, then waits up to ``timeout`` seconds; returns the exit status.
        Raises subprocess.TimeoutExpired if it is still running (it is left running)."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
        return self._proc.wait(timeout=timeout)

    def kill(self):
        """SIGCONT (a stopped process) and SIGKILL; waits for it. Returns the exit status."""
        if self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGCONT)
            self._proc.kill()
        return self._proc.wait(timeout=10)

    def stop(self):
        """SIGTERM, SIGKILL after 10 s; returns the exit status."""
        try:
            return self.terminate(timeout=10)
        except subprocess.TimeoutExpired:
            return self.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_group(workdir, world_size, *flags):
    """``world_size`` sidecars forming one rank group over Gloo on loopback (rank 0 serves the
    rendezvous store); one sidecar without group flags when world_size is 1. Returns the Sidecars
    in rank order; stop each (or use contextlib.ExitStack)."""
    if world_size == 1:
        return [Sidecar(workdir, *flags)]
    rendezvous = f"127.0.0.1:{free_port()}"
    group = []
    try:
        for rank in range(world_size):
            group.append(
                Sidecar(
                    workdir,
                    f"--rank={rank}",
                    f"--world_size={world_size}",
                    f"--rendezvous={rendezvous}",
                    "--backend=gloo",
                    *flags,
                )
            )
    except Exception:
        for sidecar in group:
            sidecar.stop()
        raise
    return group
