"""Starts a real packsched-server on loopback for a test (port 0 + port file) and stops it."""

import pathlib
import signal
import subprocess
import time

import packsched

SERVER = pathlib.Path(packsched.__file__).resolve().parents[2] / "bin" / "packsched-server"


class Sidecar:
    """A packsched-server process; ``target`` is its "127.0.0.1:PORT". Use as a context manager."""

    def __init__(self, workdir, *flags, listen="127.0.0.1:0"):
        self._port_file = pathlib.Path(workdir) / f"port-{time.monotonic_ns()}"
        self._proc = subprocess.Popen(
            [
                str(SERVER),
                f"--listen={listen}",
                f"--port_file={self._port_file}",
                "--shutdown_grace=1s",
                "--log_level=warn",
                *flags,
            ]
        )
        deadline = time.monotonic() + 20
        while not self._port_file.exists():
            if self._proc.poll() is not None:
                raise RuntimeError(f"packsched-server exited with {self._proc.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("packsched-server did not write its port file within 20 s")
            time.sleep(0.01)
        self.port = int(self._port_file.read_text())
        self.target = f"127.0.0.1:{self.port}"

    def stop(self):
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return self._proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def free_port():
    import socket

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
