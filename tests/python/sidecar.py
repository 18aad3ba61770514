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
            [str(SERVER), f"--listen={listen}", f"--port_file={self._port_file}",
             "--shutdown_grace=1s", "--log_level=warn", *flags])
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
