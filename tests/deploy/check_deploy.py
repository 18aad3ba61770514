#!/usr/bin/env python3
"""Checks the deploy files against the real server binary.

    check_deploy.py PATH/TO/packsched-server

- every --flag passed by deploy/Dockerfile, deploy/k8s/*.yaml and deploy/systemd/*.service
  exists in `packsched-server --helpfull`;
- the Kubernetes manifest: StatefulSet replicas == --world_size, packsched is a native sidecar
  (an init container with restartPolicy: Always), the rendezvous address is rank 0's pod behind
  the headless service (clusterIP: None, not-ready addresses published), and its probes reach
  the loopback port (exec `packsched-server --probe=...`; readiness = the group has formed);
- the systemd unit: every ${VAR} it uses is defined in deploy/config/packsched.env, every
  PACKSCHED_* variable there names a real flag, and `systemd-analyze verify` accepts the unit
  (skipped when systemd-analyze is not installed).
"""
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
FLAG = re.compile(r"^--([a-z_0-9]+)(?:=(.*))?$")


def server_flags(binary):
    out = subprocess.run([binary, "--helpfull"], capture_output=True, text=True, timeout=30)
    text = out.stdout + out.stderr
    flags = set(re.findall(r"^\s+--([a-z_0-9]+) ", text, re.MULTILINE))
    if "rendezvous" not in flags or "listen" not in flags:
        raise SystemExit(f"cannot read the flags of {binary} --helpfull:\n{text[:2000]}")
    return flags


def flags_in(words):
    """{name: value} of the --name=value words."""
    found = {}
    for word in words:
        match = FLAG.match(word.strip())
        if match:
            found[match.group(1)] = match.group(2)
    return found


def check_flags(where, used, known, errors):
    if not used:
        errors.append(f"{where}: passes no flags at all")
    for name in used:
        if name not in known:
            errors.append(f"{where}: --{name} is not a flag of packsched-server")


def check_dockerfile(known, errors):
    words = []
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith(("CMD ", "ENTRYPOINT ")):
            words += json.loads(line.split(" ", 1)[1])
    check_flags("deploy/Dockerfile", flags_in(words), known, errors)


def check_manifest(known, errors):
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        where = str(path.relative_to(ROOT))
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
        sets = [d for d in docs if d["kind"] == "StatefulSet"]
        if not sets:
            errors.append(f"{where}: no StatefulSet")
        for sts in sets:
            spec = sts["spec"]
            pod = spec["template"]["spec"]
            sidecars = [c for c in pod.get("initContainers", []) if "packsched" in c["image"]]
            if len(sidecars) != 1:
                errors.append(
                    f"{where}: expected one packsched init container, got {len(sidecars)}"
                )
                continue
            sidecar = sidecars[0]
            if sidecar.get("restartPolicy") != "Always":
                errors.append(
                    f"{where}: the packsched init container needs restartPolicy: Always "
                    "(a native sidecar)"
                )
            flags = flags_in(sidecar.get("args", []) + sidecar.get("command", []))
            check_flags(where, flags, known, errors)
            if str(spec["replicas"]) != flags.get("world_size"):
                errors.append(
                    f"{where}: replicas {spec['replicas']} != --world_size "
                    f"{flags.get('world_size')}"
                )
            if flags.get("rank") != "$(RANK)":
                errors.append(f"{where}: --rank must come from the pod index")
            service = services.get(spec["serviceName"])
            if service is None or service["spec"].get("clusterIP") != "None":
                errors.append(
                    f"{where}: serviceName {spec['serviceName']} is not a headless "
                    "service in the manifest"
                )
            elif not service["spec"].get("publishNotReadyAddresses"):
                errors.append(f"{where}: the headless service must publish not-ready addresses")
            rank0 = f"{sts['metadata']['name']}-0.{spec['serviceName']}:"
            if not (flags.get("rendezvous") or "").startswith(rank0):
                errors.append(f"{where}: --rendezvous should be {rank0}PORT (rank 0's pod)")
            check_probes(where, sidecar, flags, known, errors)
            if not any(c["name"] != sidecar["name"] for c in pod["containers"]):
                errors.append(f"{where}: no trainer container")


def check_probes(where, sidecar, flags, known, errors):
    """Kubelet's grpc, tcpSocket and httpGet probes dial the pod IP: a sidecar listening on
    loopback answers them only through an exec probe, `packsched-server --probe=<--listen>`."""
    listen = flags.get("listen") or "127.0.0.1:50051"
    probes = {
        kind: sidecar.get(kind)
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
        if sidecar.get(kind)
    }
    if "readinessProbe" not in probes:
        errors.append(f"{where}: the packsched sidecar has no readinessProbe (group readiness)")
    for kind, probe in probes.items():
        command = (probe.get("exec") or {}).get("command")
        if listen.startswith(("127.", "localhost", "[::1]")) and not command:
            errors.append(
                f"{where}: {kind} must be an exec probe: the sidecar listens on "
                f"{listen}, which kubelet's network probes cannot reach"
            )
            continue
        if command:
            probe_flags = flags_in(command)
            check_flags(f"{where} {kind}", probe_flags, known, errors)
            if probe_flags.get("probe") != listen:
                errors.append(
                    f"{where}: {kind} probes {probe_flags.get('probe')}, "
                    f"not the --listen address {listen}"
                )
    ready = (probes.get("readinessProbe", {}).get("exec") or {}).get("command", [])
    if ready and flags_in(ready).get("probe_service") != "packsched.v1.Scheduler":
        errors.append(
            f"{where}: the readinessProbe should check --probe_service="
            "packsched.v1.Scheduler (the rank group has formed)"
        )


def env_file(path):
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = value
    return values


def check_systemd(binary, known, errors):
    config = DEPLOY / "config" / "packsched.env"
    env = env_file(config)
    for name in env:
        if not name.startswith("PACKSCHED_") or name[len("PACKSCHED_") :].lower() not in known:
            errors.append(f"deploy/config/packsched.env: {name} names no flag")
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        where = str(unit.relative_to(ROOT))
        text = unit.read_text()
        exec_start = re.search(r"^ExecStart=(.*?)(?<!\\)$", text, re.MULTILINE | re.DOTALL)
        if not exec_start:
            errors.append(f"{where}: no ExecStart")
            continue
        words = exec_start.group(1).replace("\\\n", " ").split()
        check_flags(where, flags_in(words), known, errors)
        for var in re.findall(r"\$\{([A-Z_0-9]+)\}", exec_start.group(1)):
            if var not in env:
                errors.append(f"{where}: ${{{var}}} is not set in deploy/config/packsched.env")
        if shutil.which("systemd-analyze") is None:
            print(f"{where}: systemd-analyze not installed; verify skipped")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            copy = pathlib.Path(tmp) / unit.name
            copy.write_text(
                text.replace("/usr/local/bin/packsched-server", str(binary)).replace(
                    "/etc/packsched/packsched.env", str(config)
                )
            )
            result = subprocess.run(
                ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
            )
            if result.returncode != 0:
                errors.append(f"{where}: systemd-analyze verify failed:\n{result.stderr}")


def main():
    binary = pathlib.Path(sys.argv[1]).resolve()
    known = server_flags(binary)
    errors = []
    check_dockerfile(known, errors)
    check_manifest(known, errors)
    check_systemd(binary, known, errors)
    for error in errors:
        print(error)
    print(f"deploy: {len(known)} server flags; {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
