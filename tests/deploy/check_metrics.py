#!/usr/bin/env python3
"""The metrics' names against what a real sidecar exports: every metric an expression of the
Grafana dashboard (deploy/grafana/*.json) names is exported and filtered by the dashboard's
`job` variable, which takes its values from the `job` label; and docs/operating.md's metrics
table lists exactly the exported families.

Usage: check_metrics.py PACKSCHED_SERVER (with the packsched Python package on PYTHONPATH).
Starts the sidecar with --metrics_listen on loopback port 0, makes one Plan and one GetStatus
call (families appear with their first series), reads /metrics, stops the sidecar."""
import json
import pathlib
import re
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from packsched.client import SchedulerClient  # noqa: E402
from sidecar import Sidecar  # noqa: E402  (the tests' server-start helper)

# A metric name inside a PromQL expression: a name of ours, not a label, function or keyword.
METRIC = re.compile(r"\b((?:packsched|process|exposer)_[a-zA-Z0-9_]*)\b")
SUFFIXES = ("_bucket", "_sum", "_count")


def exported_families(binary):
    """{family name: type} from the exposition of a sidecar that has served one round."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics_file = pathlib.Path(tmp, "metrics")
        sidecar = Sidecar(
            tmp,
            "--metrics_listen=127.0.0.1:0",
            f"--metrics_port_file={metrics_file}",
            server=binary,
        )
        try:
            deadline = time.monotonic() + 20
            while not metrics_file.exists():
                if sidecar.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"packsched-server did not serve metrics (exit {sidecar.poll()})")
                time.sleep(0.01)
            with SchedulerClient(sidecar.target, timeout=20) as c:
                c.plan(0, [100, 200, 300], 1024, stream="check")
                c.status()
            url = f"http://127.0.0.1:{int(metrics_file.read_text())}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
        finally:
            sidecar.stop()
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def family_of(name, families):
    if name in families:
        return name
    for suffix in SUFFIXES:
        base = name[: -len(suffix)] if name.endswith(suffix) else None
        if base and families.get(base) in ("histogram", "summary"):
            return base
    return None


# A metric name with its label matchers, if any.
SELECTOR = re.compile(r"\b((?:packsched|process|exposer)_[a-zA-Z0-9_]*)\b(\{[^}]*\})?")
JOB = 'job=~"$job"'


def dashboards():
    for path in sorted((ROOT / "deploy" / "grafana").glob("*.json")):
        yield path.relative_to(ROOT), json.loads(path.read_text())


def job_variable_errors():
    """The `job` variable must list the jobs that export our metrics, not a fixed value."""
    errors = []
    for path, dashboard in dashboards():
        jobs = [v for v in dashboard["templating"]["list"] if v["name"] == "job"]
        query = jobs[0].get("query") if jobs else None
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        if not jobs or jobs[0].get("type") != "query" or "label_values(" not in text:
            errors.append(f"{path}: the job variable is not a label_values(..., job) query")
    return errors


def dashboard_expressions():
    for path, dashboard in dashboards():
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                yield path, panel["title"], target["expr"]


def documented():
    """The metric names in the first column of docs/operating.md's metrics table."""
    text = (ROOT / "docs" / "operating.md").read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return names


def main():
    families = exported_families(sys.argv[1])
    errors = []
    count = 0
    for path, title, expr in dashboard_expressions():
        count += 1
        names = METRIC.findall(expr)
        if not names:
            errors.append(f"{path}: '{title}': {expr} names no metric")
        for name in names:
            if family_of(name, families) is None:
                errors.append(f"{path}: '{title}': {name} is not exported")
        for name, matchers in SELECTOR.findall(expr):
            if JOB not in matchers:
                errors.append(f"{path}: '{title}': {name} is not filtered by {JOB}")
    if count == 0:
        errors.append("no dashboard expressions found under deploy/grafana")
    errors += job_variable_errors()
    docs = documented()
    for name in sorted(set(families) - docs):
        errors.append(f"docs/operating.md#metrics does not list {name}")
    for name in sorted(docs - set(families)):
        errors.append(f"docs/operating.md#metrics lists {name}, which is not exported")
    for e in errors:
        print(e, file=sys.stderr)
    print(f"check_metrics: {count} dashboard expressions, {len(families)} families exported")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
