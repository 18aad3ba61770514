"""Every flag of packsched-server and of `packsched plan` with a bad value, run on the real binaries
(docs/operating.md#exit-status): each exits 2 at once with one line on stderr naming the flag,
prints nothing on stdout, and (the server) writes no port file.

The flags are read from each binary's --helpfull, so a new flag fails this test until it has a
row in BAD_SERVER / BAD_PLAN, or is named in NO_BAD_VALUE with the reason it has none."""

import os
import pathlib
import re
import shutil
import socket
import subprocess
import time

import pytest

from sidecar import SERVER

PLAN = SERVER.parent / "packsched"

# A usage error is found before anything starts: well within this.
QUICK_SECONDS = 5

# Flags that no value makes a usage error, and why.
NO_BAD_VALUE = {
    "undefok": "lists flags that may be unknown: any list is valid",
    "progress": "packsched plan: a bool that applies to every run",
}

# packsched-server: flag -> lists of flags, each a command line that must be refused naming the
# flag ("{d}" is a directory holding `token`, a non-PEM `junk.pem` and, with openssl, the
# certificates of `certs`). Each runs after --listen=127.0.0.1:0 --port_file=... so the flag in
# the row is the one at fault.
BAD_SERVER = {
    "listen": [["--listen=127.0.0.1:99999"], ["--listen=localhost"]],
    "port_file": [["--port_file={d}/none/port"], ["--port_file={d}"]],
    "log_level": [["--log_level=loud"]],
    "tls_cert": [["--tls_cert={d}/none.pem", "--tls_key={d}/token"]],
    "tls_key": [["--tls_key={d}/token"]],
    "tls_client_ca": [["--tls_client_ca={d}/junk.pem"]],
    "auth_token_file": [
        ["--auth_token_file={d}"],
        ["--auth_token_file={d}/none"],
        ["--auth_token_file={d}/token", "--listen=0.0.0.0:0"],
    ],
    "max_sequences_per_request": [["--max_sequences_per_request=0"]],
    "max_micro_batches": [["--max_micro_batches=0"], ["--max_micro_batches=67108865"]],
    "max_streams": [["--max_streams=0"], ["--max_streams=100000"]],
    "stream_idle_timeout": [["--stream_idle_timeout=-1s"], ["--stream_idle_timeout=inf"]],
    "max_cached_rounds": [["--max_cached_rounds=-1"]],
    "max_cached_bytes": [["--max_cached_bytes=-1"]],
    "max_inflight_bytes": [["--max_inflight_bytes=-1"]],
    "max_outstanding_rounds": [["--max_outstanding_rounds=0"]],
    "collective_timeout": [["--collective_timeout=0"], ["--collective_timeout=soon"]],
    "rank": [["--rank=1"], ["--rank=-1"], ["--rank=abc"]],
    "world_size": [["--world_size=0"], ["--world_size=2"]],
    "rendezvous": [["--rendezvous=127.0.0.1:99999", "--world_size=2"]],
    "rendezvous_listen": [
        ["--rendezvous_listen=127.0.0.1:1"],
        ["--rendezvous=127.0.0.1:1", "--rendezvous_listen=127.0.0.1:70000"],
    ],
    "rendezvous_tls": [["--rendezvous=127.0.0.1:1", "--rendezvous_tls"]],
    "rendezvous_tls_ca": [["--rendezvous=127.0.0.1:1", "--rendezvous_tls_ca={d}/junk.pem"]],
    "backend": [["--backend=carrier-pigeon"], ["--backend=gloo"]],
    "gloo_hostname": [["--gloo_hostname=192.0.2.1"]],  # TEST-NET-1: never this machine's
    "gloo_iface": [["--gloo_iface=no-such-if0"]],
    "local_gpu": [["--local_gpu=-2"]],
    "max_receive_message_bytes": [["--max_receive_message_bytes=2147483648"]],
    "max_concurrent_streams": [["--max_concurrent_streams=0"]],
    "resource_quota_bytes": [["--resource_quota_bytes=1"]],
    "max_threads": [["--max_threads=1"]],
    "planning_threads": [["--planning_threads=9223372036854775807"], ["--planning_threads=-1"]],
    "planning_queue": [["--planning_queue=-1"]],
    "probe": [["--probe=127.0.0.1:99999"], ["--probe="]],
    "probe_service": [["--probe=127.0.0.1:1", "--probe_service=Scheduler"]],
    "probe_tls_ca": [["--probe=127.0.0.1:1", "--probe_tls_ca={d}/junk.pem"]],
    "probe_tls_server_name": [["--probe=127.0.0.1:1", "--probe_tls_server_name=a b"]],
    "status": [["--status=127.0.0.1:0"], ["--status="]],
    "status_json": [["--status_json"]],
    "metrics_listen": [["--metrics_listen=127.0.0.1:99999"]],
    "metrics_port_file": [["--metrics_port_file={d}/metrics-port"]],
    "shutdown_grace": [["--shutdown_grace=-1s"], ["--shutdown_grace=2h"]],
    # Abseil's own.
    "flagfile": [["--flagfile={d}/none"], ["--flagfile={d}/bad-flagfile"]],
    "fromenv": [["--fromenv=rank"]],
    "tryfromenv": [["--tryfromenv=world_size"]],
}

# packsched plan: flag -> command lines after `plan --max_token_len=10`, the lengths on stdin.
BAD_PLAN = {
    "lengths": [["--lengths={d}"], ["--lengths={d}/none"]],
    "tree": [["--tree={d}/none"]],
    "length_field": [["--length_field=n", "--token_field=ids"]],
    "token_field": [["--tree=-", "--token_field=ids"]],
    "num_parts": [["--num_parts=-1"], ["--num_parts=1000001"]],
    "max_token_len": [["--max_token_len=-1"], ["--max_token_len=2147483648"]],
    "cap_mode": [["--cap_mode=rows"]],
    "max_seqs_per_micro_batch": [["--max_seqs_per_micro_batch=-1"]],
    "min_micro_batches": [["--min_micro_batches=0"]],
    "divisible_by": [["--divisible_by=0"]],
    "align_to": [["--align_to=0"], ["--align_to=3", "--context_parallel=2"]],
    "align_total_to": [["--align_total_to=0"], ["--align_total_to=1048577"]],
    "algorithm": [["--algorithm=best"]],
    "cost": [["--cost=flops"]],
    "attention_cost": [
        ["--attention_cost=1,2"],
        ["--cost=attention", "--attention_cost=-1,2"],
        ["--cost=attention", "--attention_cost=1"],
    ],
    "overlong": [["--overlong=truncate"]],
    "order": [["--order=random"]],
    "max_micro_batches": [["--max_micro_batches=0"]],
    "equal_size": [["--equal_size"]],
    "context_parallel": [["--context_parallel=0"]],
    "tensor_parallel": [["--tensor_parallel=2000000"]],
    "format": [["--format=yaml"]],
    "world_size": [["--world_size=-1"], ["--world_size=1048577"]],
    "sync": [["--world_size=2", "--sync=always"], ["--sync=micro_batch"]],
    "micro_batch_cost": [["--world_size=2", "--micro_batch_cost=-1"]],
    "model_config": [["--model_config={d}/none"], ["--model_config={d}/junk.pem"]],
    "dynamic_cp": [["--dynamic_cp"], ["--dynamic_cp", "--world_size=4", "--micro_batch_cost=5"]],
    "cp_sizes": [["--cp_sizes=any"], ["--dynamic_cp", "--world_size=4", "--cp_sizes=odd"]],
    "min_cp": [["--min_cp=2"], ["--dynamic_cp", "--world_size=4", "--min_cp=0"]],
    "max_cp": [
        ["--max_cp=2"],
        ["--dynamic_cp", "--world_size=4", "--max_cp=3"],
        ["--dynamic_cp", "--world_size=4", "--max_cp=-1"],
    ],
    "cp_linear": [["--cp_linear=2"], ["--dynamic_cp", "--world_size=4", "--cp_linear=-1"]],
    "cp_quadratic": [["--cp_quadratic=2"], ["--dynamic_cp", "--world_size=4", "--cp_quadratic=-1"]],
    "cp_comm": [["--cp_comm=2"], ["--dynamic_cp", "--world_size=4", "--cp_comm=-1"]],
    "cp_micro_batch_cost": [
        ["--cp_micro_batch_cost=2"],
        ["--dynamic_cp", "--world_size=4", "--cp_micro_batch_cost=-1"],
    ],
    "cp_node_ranks": [
        ["--cp_node_ranks=2"],
        ["--dynamic_cp", "--world_size=4", "--cp_node_ranks=-1"],
    ],
    "cp_comm_across_nodes": [
        ["--cp_comm_across_nodes=2"],
        ["--dynamic_cp", "--world_size=4", "--cp_comm_across_nodes=-1"],
    ],
    "cp_flops_per_byte": [
        ["--cp_flops_per_byte=2"],
        ["--dynamic_cp", "--world_size=4", "--cp_flops_per_byte=2"],
    ],
    "cp_flops_per_byte_across_nodes": [
        ["--dynamic_cp", "--world_size=4", "--cp_flops_per_byte_across_nodes=2"]
    ],
    "cp_bytes_per_element": [["--dynamic_cp", "--world_size=4", "--cp_bytes_per_element=4"]],
    "flagfile": [["--flagfile={d}/none"], ["--flagfile={d}/bad-flagfile"]],
    "fromenv": [["--fromenv=num_parts"]],
    "tryfromenv": [["--tryfromenv=world_size"]],
}


def helpfull_flags(binary):
    """The flags `binary --helpfull` lists."""
    done = subprocess.run([str(binary), "--helpfull"], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    flags = set(re.findall(r"^\s+--([a-z_0-9]+) \(", done.stdout, re.MULTILINE))
    assert "flagfile" in flags, done.stdout[:2000]
    return flags


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("flags")
    (d / "token").write_text("s3cret\n")
    (d / "junk.pem").write_text("not pem\n")
    (d / "bad-flagfile").write_text("# a flagfile with one bad line\n--rank=abc\n")
    return d


def environment():
    env = dict(os.environ)
    env.pop("FLAGS_rank", None)  # --fromenv=rank: not set
    env.pop("FLAGS_num_parts", None)
    env["FLAGS_world_size"] = "many"  # --tryfromenv=world_size: set, and not a number
    return env


def assert_usage_error(done, flag, took):
    lines = done.stderr.splitlines()
    assert done.returncode == 2, (flag, done.returncode, done.stderr)
    assert len(lines) == 1, (flag, done.stderr)
    assert f"--{flag}" in lines[0], (flag, lines[0])
    assert done.stdout == "", (flag, done.stdout)
    assert took < QUICK_SECONDS, (flag, took)


def params(table):
    return [
        pytest.param(flag, args, id=f"{flag}-{i}")
        for flag, rows in table.items()
        for i, args in enumerate(rows)
    ]


def test_every_server_flag_has_a_bad_value_or_a_reason():
    flags = helpfull_flags(SERVER)
    assert flags - set(BAD_SERVER) - set(NO_BAD_VALUE) == set()
    assert set(BAD_SERVER) - flags == set(), "a row for a flag the server does not have"


def test_every_plan_flag_has_a_bad_value_or_a_reason():
    flags = helpfull_flags(PLAN)
    assert flags - set(BAD_PLAN) - set(NO_BAD_VALUE) == set()
    assert set(BAD_PLAN) - flags == set(), "a row for a flag packsched plan does not have"


@pytest.mark.parametrize("flag, args", params(BAD_SERVER))
def test_a_bad_server_flag_exits_two_naming_it_and_writes_nothing(flag, args, files, tmp_path):
    port_file = tmp_path / "port"
    command = [str(SERVER), "--listen=127.0.0.1:0", f"--port_file={port_file}", "--log_level=warn"]
    command += [a.replace("{d}", str(files)) for a in args]
    start = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=20, env=environment(), cwd=tmp_path
    )
    assert_usage_error(done, flag, time.monotonic() - start)
    assert not port_file.exists()
    assert not (files / "metrics-port").exists()


@pytest.mark.parametrize("flag, args", params(BAD_PLAN))
def test_a_bad_plan_flag_exits_two_naming_it(flag, args, files):
    command = [str(PLAN), "plan", "--max_token_len=10"]
    command += [a.replace("{d}", str(files)) for a in args]
    start = time.monotonic()
    done = subprocess.run(
        command, input="5\n7\n", capture_output=True, text=True, timeout=20, env=environment()
    )
    assert_usage_error(done, flag, time.monotonic() - start)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """Two self-signed certificates and their keys (a.pem/a.key, b.pem/b.key)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    d = tmp_path_factory.mktemp("certs")
    for name in ("a", "b"):
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                f"{name}.key",
                "-out",
                f"{name}.pem",
                "-days",
                "1",
                "-subj",
                f"/CN={name}",
            ],
            cwd=d,
            check=True,
            capture_output=True,
            timeout=60,
        )
    return d


def test_a_key_of_another_certificate_names_both_files(certs, tmp_path):
    port_file = tmp_path / "port"
    tls = [f"--tls_cert={certs}/a.pem", f"--tls_key={certs}/b.key"]
    command = [str(SERVER), "--listen=127.0.0.1:0", f"--port_file={port_file}", *tls]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    assert_usage_error(done, "tls_key", time.monotonic() - start)
    assert f"--tls_cert={certs}/a.pem" in done.stderr
    assert "is not the private key of" in done.stderr
    assert not port_file.exists()


def test_a_metrics_address_in_use_fails_before_the_port_file(tmp_path):
    """A metrics port that cannot be bound is a failure at run time (exit 1): the port file,
    which says the sidecar serves, is never written."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port_file = tmp_path / "port"
        command = [
            str(SERVER),
            "--listen=127.0.0.1:0",
            f"--port_file={port_file}",
            f"--metrics_listen=127.0.0.1:{taken.getsockname()[1]}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    assert done.returncode == 1, done.stderr
    assert not port_file.exists()


def test_every_bad_value_is_refused_before_the_lengths_are_read(files):
    """A usage error with the lengths on a pipe nobody writes to: found without reading it."""
    read, write = os.pipe()
    try:
        done = subprocess.run(
            [str(PLAN), "plan", "--max_token_len=10", "--min_micro_batches=0"],
            stdin=read,
            capture_output=True,
            text=True,
            timeout=20,
        )
    finally:
        os.close(read)
        os.close(write)
    assert done.returncode == 2, done.stderr
    assert "--min_micro_batches" in done.stderr


def test_good_values_still_serve(files, tmp_path):
    """The rows' flags with good values: the server starts and writes its port file."""
    port_file = tmp_path / "port"
    metrics_port_file = tmp_path / "metrics-port"
    command = [
        str(SERVER),
        "--listen=127.0.0.1:0",
        f"--port_file={port_file}",
        "--log_level=warn",
        f"--auth_token_file={files}/token",
        "--metrics_listen=127.0.0.1:0",
        f"--metrics_port_file={metrics_port_file}",
        "--planning_threads=2",
        "--gloo_iface=lo",
        "--shutdown_grace=1s",
    ]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert int(port_file.read_text()) > 0
        assert metrics_port_file.exists()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert proc.returncode == 0
    pathlib.Path(port_file).unlink()
