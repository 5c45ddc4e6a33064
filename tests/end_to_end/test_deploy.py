"""deploy/: systemd units pass `systemd-analyze verify` with no output, the Grafana dashboard is
provisionable (a `datasource` variable, no `__inputs`), the dashboard and the alerts use exactly the
metrics documented in docs/DEPLOY.md, and the YAML and TOML files parse and agree with each other
(ports, socket path, memory cap)."""

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from proto.sizes import parse_size
from tests.paths import REPO_ROOT

try:  # not a dependency: when present, it cross-checks the small YAML reader below
    import yaml
except ImportError:
    yaml = None

DEPLOY = REPO_ROOT / "deploy"
SYSTEMD = DEPLOY / "systemd"
DASHBOARD = DEPLOY / "grafana" / "megabatch-dashboard.json"
YAML_FILES = ["prometheus/prometheus.yml", "prometheus/alerts.yml", "prometheus/alerts_test.yml",
              "grafana/provisioning/datasources.yml", "grafana/provisioning/dashboards.yml"]
DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}
EXECUTABLE = "/usr/local/bin/megabatch"
DAEMON_OVERHEAD = 320 << 20
"""The fixed overhead over [memory] budget that docs/DEPLOY.md states for sizing MemoryMax=."""


# --- docs/DEPLOY.md: the one list of metric names ---------------------------------------------------

def documented_metrics() -> dict[str, str]:
    """Name -> type (Counter, Gauge, Histogram, Info) from the tables under "## Metrics reference"."""
    text = (REPO_ROOT / "docs" / "DEPLOY.md").read_text()
    section = text.split("\n## Metrics reference\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (\w+) \|", section, flags=re.MULTILINE)
    metrics = dict(rows)
    assert len(metrics) == len(rows), "a metric is listed twice in docs/DEPLOY.md"
    return metrics


METRIC_RE = re.compile(r"(?<![A-Za-z0-9_:])((?:megabatch|process)_[A-Za-z0-9_:]*)")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
GAUGES_NAMED_TOTAL: set[str] = set()
"""Gauges whose name ends in _total against the convention: none."""


def check_names(exprs: list[str], metrics: dict[str, str], where: str) -> set[str]:
    """Documented metrics that ``exprs`` reference; fail on any other ``megabatch_``/``process_`` name."""
    used = set()
    for expr in exprs:
        for name in METRIC_RE.findall(expr):
            suffix = next((s for s in HISTOGRAM_SUFFIXES if name.endswith(s)), "")
            base = name[: len(name) - len(suffix)]
            if suffix and metrics.get(base) == "Histogram":
                used.add(base)
            elif name in metrics and metrics[name] != "Histogram":
                used.add(name)
            else:
                raise AssertionError(f"{where}: {name!r} is not a documented series (docs/DEPLOY.md, Metrics "
                                     f"reference; a histogram is queried as _bucket, _sum or _count) in {expr!r}")
    return used


def test_metrics_table_follows_naming_conventions():
    metrics = documented_metrics()
    assert len(metrics) >= 30
    for name, kind in metrics.items():
        assert kind in ("Counter", "Gauge", "Histogram", "Info"), (name, kind)
        assert name.startswith(("megabatch_", "process_")), name
        if name not in GAUGES_NAMED_TOTAL:
            assert name.endswith("_total") == (kind == "Counter"), f"{name}: only counters end in _total"
        assert name.endswith("_info") == (kind == "Info"), f"{name}: only Info metrics end in _info"
    for required in ("megabatch_build_info", "megabatch_disk_read_seconds", "megabatch_stage_busy_seconds_total",
                     "megabatch_trainer_data_wait_ratio", "process_resident_memory_bytes"):
        assert required in metrics


def test_name_check_rejects_unknown_and_bare_histogram_names():
    metrics = documented_metrics()
    used = check_names(["rate(megabatch_disk_read_seconds_bucket[1m])"], metrics, "t")
    assert used == {"megabatch_disk_read_seconds"}
    for bad in ["megabatch_disk_read_seconds", "megabatch_disk_read_byte_total", "megabatch_epoch_bucket"]:
        with pytest.raises(AssertionError, match="not a documented series"):
            check_names([bad], metrics, "t")


def test_dashboard_and_alerts_use_every_documented_metric_and_nothing_else():
    metrics = documented_metrics()
    used = check_names(dashboard_exprs(), metrics, DASHBOARD.name)
    alerts = read_yaml(DEPLOY / "prometheus" / "alerts.yml")
    used |= check_names([rule["expr"] for group in alerts["groups"] for rule in group["rules"]], metrics, "alerts.yml")
    # Annotations may name metrics too; they must be real names as well.
    check_names([(DEPLOY / "prometheus" / "alerts.yml").read_text()], metrics, "alerts.yml text")
    assert set(metrics) - used == set(), "documented but neither on the dashboard nor in an alert"


# --- Grafana dashboard ------------------------------------------------------------------------------

def all_panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Panels, including those nested in collapsed rows."""
    out = []
    for panel in panels:
        out.append(panel)
        out.extend(all_panels(panel.get("panels", [])))
    return out


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in all_panels(dashboard()["panels"]) for target in panel.get("targets", [])]


def test_dashboard_is_provisionable():
    text = DASHBOARD.read_text()
    dash = json.loads(text)
    assert "${DS_" not in text and "__inputs" not in dash and "__requires" not in dash, (
        "export-for-sharing placeholders break file provisioning (grafana#10786)")
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert dash["schemaVersion"] >= 36  # datasource references as {type, uid} objects
    assert dash["uid"] and dash.get("id") is None


def test_every_panel_and_target_uses_the_datasource_variable():
    panels = all_panels(dashboard()["panels"])
    assert len(panels) >= 20
    for panel in panels:
        assert panel.get("datasource") == DATASOURCE_REF, f"panel {panel.get('title')!r}: {panel.get('datasource')}"
        for target in panel.get("targets", []):
            assert target.get("datasource") == DATASOURCE_REF, f"panel {panel['title']!r} target {target['refId']}"
            assert target["expr"].strip(), f"panel {panel['title']!r} has an empty query"


def test_dashboard_layout():
    panels = all_panels(dashboard()["panels"])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    rows = [p["title"] for p in panels if p["type"] == "row"]
    for title in ("Throughput", "I/O", "Pipeline", "Caches", "Training", "Process"):
        assert title in rows
    taken: dict[tuple[int, int], str] = {}
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = ((x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"]))
        for cell in cells:
            assert cell not in taken, f"panels {taken[cell]!r} and {panel['title']!r} overlap"
            taken[cell] = panel["title"]
    for expr in dashboard_exprs():
        assert expr.count("(") == expr.count(")") and expr.count("[") == expr.count("]"), expr
        if "histogram_quantile" in expr:
            assert re.search(r"_bucket(\{[^}]*\})?\[", expr) and re.search(r"by \(le\b", expr), (
                f"quantile without buckets by le: {expr}")


OVERVIEW_STATS = {
    "up": ["up{"],
    "batches/s": ["megabatch_batches_published_total"],
    "samples/s": ["megabatch_seeds_published_total", "megabatch_trainer_samples_total"],
    "live data-wait share": ["megabatch_trainer_data_wait_seconds_total", "megabatch_trainer_step_seconds_sum"],
    "hit ratio by cache": ["megabatch_feature_cache_lookups_total", "megabatch_neighbor_cache_lookups_total",
                           "megabatch_trainer_cache_rows_total"],
    "disk bytes/s": ["megabatch_disk_read_bytes_total"],
    "RSS vs memory budget": ["process_resident_memory_bytes", "megabatch_memory_budget_bytes",
                             "megabatch_memory_plan_bytes"],
    "slots full": ["megabatch_slots_in_use", "megabatch_slots_capacity"],
}
"""What the at-a-glance line under the Overview row shows (issue 30) -> the series its stat panel queries."""


def test_overview_row_comes_first_with_the_at_a_glance_stats():
    panels = dashboard()["panels"]
    assert panels[0]["type"] == "row" and panels[0]["title"] == "Overview" and panels[0]["gridPos"]["y"] == 0
    first_line = [p for p in panels if p["gridPos"]["y"] == 1]
    assert first_line and all(p["type"] == "stat" for p in first_line)
    assert sum(p["gridPos"]["w"] for p in first_line) == 24
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in first_line}
    for what, names in OVERVIEW_STATS.items():
        assert any(all(name in expr for name in names) for expr in exprs.values()), (
            f"no stat panel in the overview line shows {what} ({names})")


UNITS = {"s", "ms", "Bps", "bytes", "percentunit", "short", "ops", "opm"}
"""Grafana unit ids the dashboard uses ("none" is not among them: every number has a unit or is a plain count)."""


def test_every_timeseries_and_stat_panel_has_a_unit():
    for panel in all_panels(dashboard()["panels"]):
        if panel["type"] in ("timeseries", "stat"):
            unit = panel["fieldConfig"]["defaults"].get("unit")
            assert unit in UNITS, f"panel {panel['title']!r}: unit {unit!r}"
            for override in panel["fieldConfig"]["overrides"]:
                for prop in override["properties"]:
                    if prop["id"] == "unit":
                        assert prop["value"] in UNITS, f"panel {panel['title']!r}: override unit {prop['value']!r}"
            assert panel.get("description"), f"panel {panel['title']!r} has no description"


def test_job_and_instance_variables():
    """Two trainers on one host differ by instance; every panel narrows by both (test_dashboard_queries checks each
    selector)."""
    variables = dashboard()["templating"]["list"]
    assert [v["name"] for v in variables] == ["datasource", "job", "instance"]
    for variable in variables[1:]:
        assert variable["type"] == "query" and variable["datasource"] == DATASOURCE_REF
        assert variable["multi"] is True and variable["includeAll"] is True
        assert "allValue" not in variable, "All must mean the values found, not every job of the Prometheus"
        assert variable["query"] == variable["definition"]
    assert variables[1]["query"] == 'label_values(up{job=~"megabatch-.*"}, job)'
    assert variables[2]["query"] == 'label_values(up{job=~"$job"}, instance)'
    for panel in all_panels(dashboard()["panels"]):
        for target in panel.get("targets", []):
            assert 'job=~"$job"' in target["expr"] and 'instance=~"$instance"' in target["expr"], (
                f"panel {panel['title']!r}: {target['expr']}")


# --- YAML (Prometheus, Grafana provisioning) ---------------------------------------------------------
# PyYAML is not a dependency. read_yaml() reads the block-style subset these files use (mappings,
# sequences, quoted and plain scalars, flow lists and maps of scalars, `|` block scalars) and raises on
# anything else (anchors, tags, tabs, `>` folding, yes/no booleans), so a file it accepts means the same
# to Prometheus and Grafana. When PyYAML is installed the test also compares both readers' results.

class YamlSubsetError(ValueError):
    pass


_PLAIN_FORBIDDEN_START = tuple("&*!|>%@`{[]}'\"#,?:-")


def _strip_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"" and (i == 0 or line[i - 1] in " [{,:"):
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] == " "):
            return line[:i].rstrip()
    return line.rstrip()


def _split_flow(body: str, where: str) -> list[str]:
    parts, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(body):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[start:i].strip())
            start = i + 1
    if quote or depth:
        raise YamlSubsetError(f"{where}: unbalanced flow collection")
    last = body[start:].strip()
    return parts + [last] if last else parts


def _split_key(text: str) -> tuple[str, str] | None:
    match = re.match(r"^([A-Za-z0-9_][A-Za-z0-9_.-]*):(?: (.*))?$", text)
    return (match.group(1), (match.group(2) or "").strip()) if match else None


def _scalar(text: str, where: str) -> Any:
    if text.startswith('"'):
        if not text.endswith('"') or len(text) < 2:
            raise YamlSubsetError(f"{where}: unterminated string {text!r}")
        return json.loads(text)
    if text.startswith("'"):
        if not text.endswith("'") or len(text) < 2:
            raise YamlSubsetError(f"{where}: unterminated string {text!r}")
        return text[1:-1].replace("''", "'")
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(item, where) for item in _split_flow(text[1:-1], where)]
    if text.startswith("{") and text.endswith("}"):
        out = {}
        for item in _split_flow(text[1:-1], where):
            pair = _split_key(item)
            if pair is None or not pair[1]:
                raise YamlSubsetError(f"{where}: flow map item {item!r}")
            out[pair[0]] = _scalar(pair[1], where)
        return out
    if text in ("", "~", "null"):
        return None
    if text in ("true", "false"):
        return text == "true"
    if text.lower() in ("yes", "no", "on", "off", "y", "n", "true", "false", "null"):
        raise YamlSubsetError(f"{where}: ambiguous boolean {text!r}; write true/false")
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    if re.fullmatch(r"-?[0-9]+\.[0-9]*(e[-+]?[0-9]+)?", text):
        return float(text)
    if text.startswith(_PLAIN_FORBIDDEN_START) or ": " in text or " #" in text:
        raise YamlSubsetError(f"{where}: quote the scalar {text!r}")
    return text


class _YamlReader:
    def __init__(self, text: str, name: str):
        if "\t" in text:
            raise YamlSubsetError(f"{name}: tab character")
        self.raw = text.splitlines()
        self.name = name

    def _next(self, i: int) -> tuple[int, int, str]:
        """Index, indent and comment-free content of the next line with content at or after ``i``."""
        while i < len(self.raw):
            content = _strip_comment(self.raw[i])
            if content.strip():
                return i, len(content) - len(content.lstrip(" ")), content.strip()
            i += 1
        return i, -1, ""

    def document(self) -> Any:
        i, indent, content = self._next(0)
        if content == "---":
            i, indent, content = self._next(i + 1)
        value, i = self._block(i, indent)
        i, _, rest = self._next(i)
        if rest:
            raise YamlSubsetError(f"{self.name}:{i + 1}: unexpected {rest!r}")
        return value

    def _block(self, i: int, indent: int, first: str | None = None) -> tuple[Any, int]:
        """The collection starting at line ``i`` at ``indent``; ``first`` replaces that line's content."""
        _, _, content = self._next(i)
        content = first if first is not None else content
        if content == "-" or content.startswith("- "):
            return self._sequence(i, indent, first)
        return self._mapping(i, indent, first)

    def _sequence(self, i: int, indent: int, first: str | None) -> tuple[list[Any], int]:
        items: list[Any] = []
        while True:
            j, ind, content = self._next(i)
            if first is not None:
                content, first = first, None
            if ind != indent or not (content == "-" or content.startswith("- ")):
                return items, j
            rest = content[1:].strip()
            where = f"{self.name}:{j + 1}"
            if not rest:
                k, sub, _ = self._next(j + 1)
                if sub <= indent:
                    raise YamlSubsetError(f"{where}: empty sequence item")
                value, i = self._block(k, sub)
            elif _split_key(rest) is not None:
                value, i = self._mapping(j, indent + 2, rest)
            else:
                value, i = _scalar(rest, where), j + 1
            items.append(value)

    def _mapping(self, i: int, indent: int, first: str | None) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        while True:
            j, ind, content = self._next(i)
            if first is not None:
                ind, content, first = indent, first, None
            if ind < indent or j >= len(self.raw):
                return out, j
            where = f"{self.name}:{j + 1}"
            pair = _split_key(content)
            if ind > indent or pair is None:
                raise YamlSubsetError(f"{where}: expected 'key: value' at indent {indent}, got {content!r}")
            key, rest = pair
            if key in out:
                raise YamlSubsetError(f"{where}: duplicate key {key!r}")
            if rest in ("|", "|-"):
                out[key], i = self._literal(j + 1, indent, keep_newline=rest == "|")
            elif rest:
                out[key], i = _scalar(rest, where), j + 1
            else:
                k, sub, nxt = self._next(j + 1)
                if sub > indent or (sub == indent and (nxt == "-" or nxt.startswith("- "))):
                    out[key], i = self._block(k, sub)
                else:
                    out[key], i = None, j + 1

    def _literal(self, i: int, indent: int, keep_newline: bool) -> tuple[str, int]:
        lines, block_indent = [], None
        while i < len(self.raw):
            line = self.raw[i]
            if line.strip():
                ind = len(line) - len(line.lstrip(" "))
                if ind <= indent:
                    break
                block_indent = ind if block_indent is None else block_indent
                if ind < block_indent:
                    raise YamlSubsetError(f"{self.name}:{i + 1}: literal block dedented")
                lines.append(line[block_indent:])
            else:
                lines.append("")
            i += 1
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines) + ("\n" if keep_newline and lines else ""), i


def read_yaml(path: Path) -> Any:
    return _YamlReader(path.read_text(), path.name).document()


@pytest.mark.parametrize("name", YAML_FILES)
def test_yaml_files_parse(name):
    path = DEPLOY / name
    data = read_yaml(path)
    assert isinstance(data, dict) and data
    if yaml is not None:
        assert data == yaml.safe_load(path.read_text())


def test_yaml_reader_rejects_what_it_does_not_understand():
    for bad in ["a: 1\n\tb: 2\n", "a: &x 1\n", "a: yes\n", "a: b: c\n", "a:\n  - 1\n b: 2\n", "a: 1\na: 2\n",
                "a: >\n  folded\n", "a: [1, 2\n", "- a\nb: 1\n"]:
        with pytest.raises(YamlSubsetError):
            _YamlReader(bad, "t").document()
    nested = "a:\n  - b: 1\n    c: [x, 'y z']\n  -\n    - 2\nd: |\n  l1\n\n  l2 # kept\ne: {k: \"v\"}\n"
    assert _YamlReader(nested, "t").document() == {
        "a": [{"b": 1, "c": ["x", "y z"]}, [2]], "d": "l1\n\nl2 # kept\n", "e": {"k": "v"}}


def loader_config() -> dict[str, Any]:
    with open(DEPLOY / "config" / "loader.toml", "rb") as f:
        return tomllib.load(f)


def test_prometheus_scrapes_the_configured_ports_and_loads_the_alerts():
    prom = read_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    assert prom["global"]["scrape_interval"] == "5s"
    for rule_file in prom["rule_files"]:
        assert (DEPLOY / "prometheus" / rule_file).is_file(), rule_file
    assert "alerts.yml" in prom["rule_files"]
    targets = {job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
               for job in prom["scrape_configs"]}
    metrics = loader_config()["metrics"]
    trainer_env = (DEPLOY / "config" / "trainer-example.env").read_text()
    trainer_port = re.search(r"--metrics-port (\d+)", trainer_env)
    assert trainer_port is not None
    assert targets == {"megabatch-loader": [f"{metrics['address']}:{metrics['port']}"],
                       "megabatch-trainer": [f"127.0.0.1:{trainer_port.group(1)}"]}
    assert metrics["port"] == 9450 and trainer_port.group(1) == "9451"
    # The dashboard and the alerts select process metrics by these job names.
    assert 'job="megabatch-loader"' in " ".join(dashboard_exprs())
    datasource = read_yaml(DEPLOY / "grafana" / "provisioning" / "datasources.yml")["datasources"][0]
    assert datasource["type"] == "prometheus"
    assert datasource["jsonData"]["timeInterval"] == prom["global"]["scrape_interval"]
    provider = read_yaml(DEPLOY / "grafana" / "provisioning" / "dashboards.yml")["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")


def test_alert_rules():
    groups = read_yaml(DEPLOY / "prometheus" / "alerts.yml")["groups"]
    rules = {rule["alert"]: rule for group in groups for rule in group["rules"]}
    assert sum(len(group["rules"]) for group in groups) == len(rules), "alert names repeat"
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert rule["expr"].count("(") == rule["expr"].count(")"), name
    assert rules["MegabatchLoaderDown"]["expr"] == 'up{job="megabatch-loader"} == 0'
    # live counters (issue 30): the per-epoch gauge made the alert an epoch late
    wait = "rate(megabatch_trainer_data_wait_seconds_total[5m])"
    assert rules["MegabatchTrainerStarved"]["expr"] == (
        f"{wait} / ({wait} + rate(megabatch_trainer_step_seconds_sum[5m])) > 0.5")
    assert rules["MegabatchTrainerStarved"]["for"] == "10m"
    assert rules["MegabatchLoaderMemoryOverBudget"]["expr"] == (
        'process_resident_memory_bytes{job="megabatch-loader"} > megabatch_memory_budget_bytes + 384 * 1024 * 1024')
    stalled = rules["MegabatchNoBatchesPublished"]["expr"]
    assert "megabatch_clients > 0" in stalled and "megabatch_batches_published_total[5m]" in stalled
    for name in ("MegabatchConnectionsRefused", "MegabatchSessionsEvicted", "MegabatchDataCorrupt"):
        assert "by (job, instance, " in rules[name]["expr"], f"{name}: one alert per loader and reason or file"
    tests = read_yaml(DEPLOY / "prometheus" / "alerts_test.yml")
    assert tests["rule_files"] == ["alerts.yml"]
    tested = {case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"]}
    assert tested == set(rules), "every alert has a promtool unit test in alerts_test.yml"
    for name in rules:  # each test shows the alert firing, not only staying quiet
        assert any(case["alertname"] == name and case["exp_alerts"] for test in tests["tests"]
                   for case in test["alert_rule_test"]), f"{name}: no unit test sees it fire"


def deploy_doc_section(title: str) -> str:
    text = (REPO_ROOT / "docs" / "DEPLOY.md").read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_alert_table_lists_every_alert_with_its_severity():
    groups = read_yaml(DEPLOY / "prometheus" / "alerts.yml")["groups"]
    rules = {rule["alert"]: rule for group in groups for rule in group["rules"]}
    section = deploy_doc_section("Prometheus and Grafana")
    rows = re.findall(r"^\| `(Megabatch\w+)` \| (\w+) \| [^|]+ \| ([0-9, ]+) \|$", section, flags=re.MULTILINE)
    assert [name for name, _, _ in rows] == list(rules), "docs/DEPLOY.md's alert table, in alerts.yml's order"
    runbook = deploy_doc_section("When something goes wrong")
    problems = re.findall(r"^### (\d)\. ", runbook, flags=re.MULTILINE)
    assert problems == ["1", "2", "3", "4", "5"]
    for name, severity, where in rows:
        assert severity == rules[name]["labels"]["severity"], name
        assert {n.strip() for n in where.split(",")} <= set(problems), name
        for number in where.split(","):
            part = runbook.split(f"\n### {number.strip()}. ", 1)[1].split("\n### ", 1)[0]
            assert f"`{name}`" in part, f"{name}: not in problem {number.strip()} of the runbook"


def test_runbook_says_what_each_problem_looks_like_and_what_to_do():
    runbook = deploy_doc_section("When something goes wrong")
    parts = runbook.split("\n### ")[1:]
    assert len(parts) == 5
    dashboard_titles = {p["title"] for p in all_panels(dashboard()["panels"])}
    text = (REPO_ROOT / "docs" / "DEPLOY.md").read_text()
    headings = set(re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)) | set(re.findall(r"\*\*([^*]+?)\.?\*\*", text))
    for part in parts:
        title = part.splitlines()[0]
        for what in ("status", "logs", "dashboard", "alert", "what to do"):
            assert what in part.lower(), f"runbook {title!r}: says nothing about {what}"
        # what it quotes is a panel or row of the dashboard or a section of docs/DEPLOY.md, by its name
        for quoted in re.findall(r'"([A-Z][^"]*)"', part):
            assert any(name.startswith(quoted) for name in dashboard_titles | headings), (
                f"runbook {title!r} names {quoted!r}: neither a dashboard panel nor a section of docs/DEPLOY.md")


# --- loader.toml ------------------------------------------------------------------------------------

def test_loader_toml_example():
    """The shipped example parses with the daemon's own validation and sets what production needs."""
    from loader.daemon.config import config_from_mapping
    cfg = loader_config()
    assert set(cfg) == {"dataset", "memory", "hierarchy", "sampler", "link", "io", "publisher", "server", "metrics",
                        "log"}
    parsed = config_from_mapping(cfg)
    assert parsed.dataset.path.is_absolute()
    assert parsed.memory.budget == 8 << 30
    assert parsed.io.direct_io and parsed.io.check_reads
    assert parsed.server.socket_mode == 0o660
    assert parsed.server.socket == Path("/run/megabatch/loader.sock")
    # every key the example sets is a key the daemon knows (config_from_mapping refuses unknown ones) and
    # every [server] key is shown, so an operator sees the hardening knobs
    from loader.daemon.config import ServerConfig
    assert set(cfg["server"]) == set(ServerConfig.__dataclass_fields__) - {"max_frame_bytes"}


# --- systemd ----------------------------------------------------------------------------------------

def read_unit(name: str) -> dict[str, list[tuple[str, str]]]:
    """Section -> [(key, value)] of a unit file (no line continuations in ours)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in (SYSTEMD / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"{name}: line continuation"
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        else:
            assert current is not None, f"{name}: {line!r} before a section"
            key, _, value = line.partition("=")
            current.append((key, value))
    return sections


def settings(name: str, section: str = "Service") -> dict[str, str]:
    pairs = read_unit(name)[section]
    out = dict(pairs)
    repeated = {k for k, _ in pairs if [p[0] for p in pairs].count(k) > 1} - {"SystemCallFilter", "Environment"}
    assert not repeated, f"{name}: {repeated} set more than once"
    return out


def test_loader_unit_settings():
    svc = settings("megabatch-loader.service")
    expected = {"Type": "notify", "NotifyAccess": "main", "WatchdogSec": "30s", "Restart": "on-failure",
                "RestartSec": "2s", "RuntimeDirectory": "megabatch", "RuntimeDirectoryMode": "0750",
                "User": "megabatch", "Group": "megabatch", "TimeoutStopSec": "30s", "KillSignal": "SIGTERM",
                "ProtectSystem": "strict", "ProtectHome": "read-only", "PrivateTmp": "yes",
                "PrivateDevices": "yes", "NoNewPrivileges": "yes",
                "ExecStart": f"{EXECUTABLE} serve --config /etc/megabatch/loader.toml"}
    assert {k: svc.get(k) for k in expected} == expected
    for absent in ("ExecReload", "DynamicUser", "MemoryDenyWriteExecute"):
        assert absent not in svc, f"{absent}= must not be set (see the unit's comments)"
    assert Path(loader_config()["server"]["socket"]).parent == Path("/run") / svc["RuntimeDirectory"]
    # numba's cache=True needs a writable directory under ProtectSystem=strict, or the import fails.
    assert svc["Environment"] == f"NUMBA_CACHE_DIR=/var/cache/{svc['CacheDirectory']}/numba"


def test_loader_unit_does_not_restart_a_config_error_forever():
    from loader.cli import EX_CONFIG

    svc = settings("megabatch-loader.service")
    # a config or dataset error exits EX_CONFIG before serving: not retried; 130 is a stop during start-up
    assert svc["RestartPreventExitStatus"] == str(EX_CONFIG) == "78"
    assert svc["SuccessExitStatus"] == "130"
    # start limits live in [Unit] (systemd ignores them, with a warning, in [Service])
    unit = settings("megabatch-loader.service", "Unit")
    assert unit["StartLimitIntervalSec"] == "10min" and int(unit["StartLimitBurst"]) >= 2
    assert not {"StartLimitIntervalSec", "StartLimitBurst"} & svc.keys()
    deploy_doc = (REPO_ROOT / "docs" / "DEPLOY.md").read_text()
    for code in ("| 0 |", "| 78 |", "| 130 |"):
        assert code in deploy_doc, f"docs/DEPLOY.md: exit code row {code} missing"


def test_memory_cap_example_is_budget_plus_stated_overhead():
    text = (SYSTEMD / "megabatch-loader.service").read_text()
    examples = set(re.findall(r"^#\s*MemoryMax=(\S+)$", text, flags=re.MULTILINE))
    assert len(examples) == 1, examples
    assert parse_size(examples.pop()) == parse_size(loader_config()["memory"]["budget"]) + DAEMON_OVERHEAD
    assert "MemoryMax = budget + 320M" in (REPO_ROOT / "docs" / "DEPLOY.md").read_text()


def test_trainer_unit_settings():
    name = "megabatch-trainer@.service"
    unit = settings(name, "Unit")
    assert unit["Requires"] == unit["After"] == "megabatch-loader.service"
    svc = settings(name)
    expected = {"Type": "exec", "Restart": "no", "EnvironmentFile": "/etc/megabatch/trainer-%i.env",
                "StateDirectory": "megabatch/%i", "User": "megabatch"}
    assert {k: svc.get(k) for k in expected} == expected
    socket = loader_config()["server"]["socket"]
    assert svc["ExecStart"] == f"{EXECUTABLE} train --socket {socket} $MEGABATCH_TRAIN_ARGS"
    assert "PrivateDevices" not in svc, "PrivateDevices= hides /dev/nvidia*"
    # The loader's RuntimeDirectory=; a job owning it too would delete the loader's socket when it stops.
    assert "RuntimeDirectory" not in svc
    env = (DEPLOY / "config" / "trainer-example.env").read_text()
    args = re.search(r'^MEGABATCH_TRAIN_ARGS="([^"]*)"$', env, flags=re.MULTILINE)
    assert args is not None
    assert "--checkpoint /var/lib/megabatch/example/checkpoint.pt --resume" in args.group(1)
    assert "--socket" not in args.group(1), "the unit passes --socket"


def verify(tmp_path: Path, unit_text: dict[str, str], target: str) -> subprocess.CompletedProcess[str]:
    """Run ``systemd-analyze verify`` on copies of the units in ``tmp_path``.

    The units name /usr/local/bin/megabatch, which the test machine lacks, and verify reports a missing
    ExecStart binary; the copies point at `true` instead (the arguments are not checked). Only that
    path changes: User=megabatch stays, as verify does not resolve users (systemd 252). The directory of
    the given file is on verify's unit search path, so the trainer's Requires= finds the loader copy.
    """
    true = shutil.which("true")
    assert true is not None
    for name, text in unit_text.items():
        assert text.count(EXECUTABLE + " ") == 1, f"{name}: expected one ExecStart with {EXECUTABLE}"
        (tmp_path / name).write_text(text.replace(EXECUTABLE + " ", true + " "))
    return subprocess.run(["systemd-analyze", "verify", str(tmp_path / target)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def unit_texts() -> dict[str, str]:
    return {name: (SYSTEMD / name).read_text() for name in ("megabatch-loader.service", "megabatch-trainer@.service")}


needs_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                           reason="systemd-analyze is not installed (CI has it)")


@needs_systemd_analyze
@pytest.mark.parametrize("target", ["megabatch-loader.service", "megabatch-trainer@ci.service"])
def test_systemd_analyze_verify(tmp_path, target):
    # verify exits 0 on many mistakes (unknown keys, bad values) and reports them on stderr only.
    result = verify(tmp_path, unit_texts(), target)
    assert result.returncode == 0 and result.stderr == "" and result.stdout == "", (
        f"systemd-analyze verify {target}: rc={result.returncode}\n{result.stderr}{result.stdout}")


@needs_systemd_analyze
@pytest.mark.parametrize("target", ["megabatch-loader.service", "megabatch-trainer@ci.service"])
def test_systemd_analyze_verify_catches_a_mistake(tmp_path, target):
    # The check above is only as good as verify's reading of our copies: a misspelt key must show.
    texts = unit_texts()
    template = target.replace("@ci.", "@.")
    texts[template] = texts[template].replace("\n[Service]\n", "\n[Service]\nRestartSecs=2s\n", 1)
    result = verify(tmp_path, texts, target)
    assert "RestartSecs" in result.stderr


def test_every_metric_the_daemon_exports_is_documented():
    """The daemon's registry against docs/DEPLOY.md's table (a counter is documented by its ``_total``
    series, an info by its ``_info`` one), so a new metric cannot ship without a line there."""
    from loader.daemon.metrics import DaemonMetrics

    metrics = DaemonMetrics()
    documented = documented_metrics()
    exported = set()
    for family in metrics.registry.collect():
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        exported.add(family.name + suffix)
    missing = {name for name in exported if name not in documented and not name.startswith("process_")}
    assert not missing, f"exported but not in docs/DEPLOY.md, Metrics reference: {sorted(missing)}"
