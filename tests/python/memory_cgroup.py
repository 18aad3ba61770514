"""A memory cgroup for one process under test: the deploy manifest's limit made real on a test
machine. A child of this process's own memory cgroup (cgroup v2, else the v1 memory controller),
removed on exit; ``MemoryCgroup.open`` returns None where neither can be made (no controller, no
permission), and the caller falls back to watching the process's peak resident set.

    with MemoryCgroup.open(512 << 20) as group:   # or None
        Sidecar(tmp, prefix=group.prefix)          # the process joins it before exec
        ... group.oom_kills() ...
"""

import os
import pathlib
import time

_ROOT = pathlib.Path("/sys/fs/cgroup")


def _own_path(controller_line):
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if controller_line(hierarchy, controllers.split(",")):
            return path.lstrip("/")
    return None


class MemoryCgroup:
    def __init__(self, path, version, limit):
        self.path = path
        self.version = version
        self.limit = limit

    @classmethod
    def open(cls, limit):
        """A new cgroup limited to ``limit`` bytes (no swap), or None where none can be made."""
        name = f"packsched-test-{os.getpid()}-{time.monotonic_ns()}"
        candidates = []
        if (_ROOT / "cgroup.controllers").exists():
            own = _own_path(lambda h, c: h == "0")
            if own is not None:
                candidates.append((2, _ROOT / own / name))
        if (_ROOT / "memory" / "memory.limit_in_bytes").exists():
            own = _own_path(lambda h, c: "memory" in c)
            if own is not None:
                candidates.append((1, _ROOT / "memory" / own / name))
        for version, path in candidates:
            try:
                path.mkdir()
            except OSError:
                continue
            group = cls(path, version, limit)
            try:
                if version == 2:
                    (path / "memory.max").write_text(str(limit))
                    if (path / "memory.swap.max").exists():
                        (path / "memory.swap.max").write_text("0")
                else:
                    (path / "memory.limit_in_bytes").write_text(str(limit))
                    swap = path / "memory.memsw.limit_in_bytes"
                    if swap.exists():
                        swap.write_text(str(limit))
                return group
            except OSError:
                group.remove()
        return None

    @property
    def prefix(self):
        """A command prefix that moves the process into the group, then execs the command."""
        procs = self.path / "cgroup.procs"
        return ("sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh")

    def oom_kills(self):
        """Processes the kernel killed in this group for want of memory."""
        if self.version == 2:
            for line in (self.path / "memory.events").read_text().splitlines():
                key, value = line.split()
                if key == "oom_kill":
                    return int(value)
            return 0
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            key, value = line.split()
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self):
        """Removes the group once its processes have ended (waits up to 10 s for them)."""
        deadline = time.monotonic() + 10
        while self.path.exists():
            try:
                self.path.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
