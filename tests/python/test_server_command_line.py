"""packsched-server's command line and its exit codes (docs/operating.md#exit-status): --help
and --version print and exit 0, and the version line names the commit; a usage error (an
unknown flag, a value that does not parse, a missing value, an argument that is not a flag, an
empty --status= or --probe=) exits 2 with one line naming it, before anything is served."""

import re
import subprocess

import pytest

from sidecar import SERVER


def run(*flags):
    return subprocess.run([str(SERVER), *flags], capture_output=True, text=True, timeout=20)


def test_help_exits_zero_and_lists_the_servers_flags():
    done = run("--help")
    assert done.returncode == 0, done.stderr
    assert "--listen" in done.stdout and "--metrics_listen" in done.stdout


def test_version_prints_the_version_and_the_commit():
    done = run("--version")
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(
        r"packsched-server \d+\.\d+\.\d+ \(commit ([0-9a-f]{7,40}|unknown)\)\n", done.stdout
    ), done.stdout


@pytest.mark.parametrize(
    "flags, names",
    [
        (["--no_such_flag"], "--no_such_flag"),
        (["--rank=abc"], "--rank"),
        (["--collective_timeout=soon"], "--collective_timeout"),
        (["--listen"], "--listen"),
        (["positional"], "positional"),
        # An empty mode flag must not start a sidecar on the default address.
        (["--status="], "--status"),
        (["--status", ""], "--status"),
        (["--probe="], "--probe"),
        (["--log_level=loud"], "--log_level"),
    ],
)
def test_usage_errors_exit_two(flags, names):
    done = run(*flags)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert names in done.stderr, done.stderr
    assert "serving" not in done.stderr
