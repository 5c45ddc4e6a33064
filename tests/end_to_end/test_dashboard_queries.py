"""Every query of the Grafana dashboard and every alert expression against what a real daemon and trainer export.

A daemon (the default, hierarchical mode) serves one training epoch and its evaluation to a real trainer
(``trainer.loop.train`` through ``DaemonSource``, in this process); both are scraped over HTTP. Then each
expression of ``deploy/grafana/megabatch-dashboard.json`` (Grafana's ``$__rate_interval``, ``$job``, ... put in
first) and of ``deploy/prometheus/alerts.yml`` must parse as PromQL (the small parser below: tokens, balanced
brackets, known functions and aggregations, argument types, well-formed label matchers, durations), and every
series it names must be in one of the two expositions, or in ``NOT_IN_THIS_RUN``: the few series that only
another mode, or an event this run does not cause, exports, each with its reason. So a panel that names a metric
nobody exports fails here, not on an operator's screen. Where ``promtool`` is installed (not in CI) the same test
also has Prometheus's own parser check the alert rules and every dashboard query, and runs the alerts' unit tests.
"""

import json
import re
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.end_to_end.test_deploy import DASHBOARD, DEPLOY, all_panels, read_yaml

ALERTS = DEPLOY / "prometheus" / "alerts.yml"


# --- a PromQL parser, small but strict --------------------------------------------------------------------------

class PromQLError(ValueError):
    pass


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<duration>(?:[0-9]+(?:ms|[smhdwy]))+)(?![A-Za-z0-9_.])
  | (?P<number>0[xX][0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)(?![A-Za-z_])
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_:]*)
  | (?P<op>==|!=|<=|>=|=~|!~|[-+*/%^<>=@])
  | (?P<punct>[(){}\[\],:])
""", re.VERBOSE)


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    pos: int


def tokenize(expr: str) -> list[Token]:
    tokens, pos = [], 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None:
            raise PromQLError(f"unexpected character {expr[pos]!r} at {pos}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "ws":
            tokens.append(Token(kind, match.group(), pos))
        pos = match.end()
    return tokens + [Token("end", "", len(expr))]


AGGREGATIONS: dict[str, str | None] = {
    "sum": None, "min": None, "max": None, "avg": None, "group": None, "stddev": None, "stdvar": None, "count": None,
    "count_values": "string", "bottomk": "scalar", "topk": "scalar", "quantile": "scalar"}
"""Aggregation operator -> the type of its parameter (None: it takes none)."""

_INSTANT = ["vector"]
FUNCTIONS: dict[str, tuple[list[str], int, str]] = {
    # name: (argument types, how many of the last ones may be left out, result type)
    **{name: (["matrix"], 0, "vector") for name in (
        "rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets", "absent_over_time",
        "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "last_over_time",
        "stddev_over_time", "stdvar_over_time", "present_over_time")},
    **{name: (_INSTANT, 0, "vector") for name in (
        "abs", "absent", "ceil", "floor", "exp", "ln", "log2", "log10", "sqrt", "sgn", "sort", "sort_desc",
        "timestamp")},
    **{name: (_INSTANT, 1, "vector") for name in (
        "day_of_month", "day_of_week", "day_of_year", "days_in_month", "hour", "minute", "month", "year")},
    "round": (["vector", "scalar"], 1, "vector"),
    "clamp": (["vector", "scalar", "scalar"], 0, "vector"),
    "clamp_min": (["vector", "scalar"], 0, "vector"),
    "clamp_max": (["vector", "scalar"], 0, "vector"),
    "predict_linear": (["matrix", "scalar"], 0, "vector"),
    "quantile_over_time": (["scalar", "matrix"], 0, "vector"),
    "histogram_quantile": (["scalar", "vector"], 0, "vector"),
    "label_replace": (["vector", "string", "string", "string", "string"], 0, "vector"),
    "scalar": (["vector"], 0, "scalar"),
    "vector": (["scalar"], 0, "vector"),
    "time": ([], 0, "scalar"),
}
"""The PromQL functions this parser knows (those of Prometheus 2.x that a dashboard or alert is likely to use)."""

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
            "atan2"}
_PRECEDENCE = {"or": 1, "and": 2, "unless": 2, "==": 3, "!=": 3, "<": 3, ">": 3, "<=": 3, ">=": 3, "+": 4, "-": 4,
               "*": 5, "/": 5, "%": 5, "atan2": 5, "^": 6}
_COMPARISONS = {"==", "!=", "<", ">", "<=", ">="}
_SET_OPS = {"and", "or", "unless"}
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Selector:
    """One vector selector: its metric name (None for ``{...}`` without one) and label matchers."""

    name: str | None
    matchers: list[tuple[str, str, str]]
    """(label, operator, value), the value unquoted."""


@dataclass
class Query:
    type: str
    """The result's type: vector, scalar, matrix or string."""
    selectors: list[Selector] = field(default_factory=list)

    @property
    def metric_names(self) -> set[str]:
        return {s.name for s in self.selectors if s.name is not None}


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "\\": "\\",
            '"': '"', "'": "'"}


def _unquote(token: Token) -> str:
    """A string token's value (Go's escapes; those beyond the one-letter ones fail)."""
    if token.text[0] == "`":
        return token.text[1:-1]
    body, out, i = token.text[1:-1], [], 0
    while i < len(body):
        if body[i] == "\\":
            escaped = body[i + 1]  # the tokenizer saw a character after every backslash
            if escaped not in _ESCAPES:
                raise PromQLError(f"unsupported escape \\{escaped} in {token.text} at {token.pos}")
            out.append(_ESCAPES[escaped])
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


class _Parser:
    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.tokens = tokenize(expr)
        self.i = 0
        self.selectors: list[Selector] = []

    # token helpers
    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def take(self) -> Token:
        token = self.peek()
        self.i += 1
        return token

    def fail(self, what: str, token: Token | None = None) -> PromQLError:
        token = token or self.peek()
        return PromQLError(f"{what} at {token.pos} ({token.text or 'end of expression'!r}) in {self.expr!r}")

    def expect(self, text: str) -> Token:
        token = self.take()
        if token.text != text or token.kind == "string":
            raise self.fail(f"expected {text!r}", token)
        return token

    def is_word(self, token: Token, *words: str) -> bool:
        return token.kind == "ident" and token.text.lower() in words

    # grammar
    def parse(self) -> Query:
        kind = self.binary(0)
        if self.peek().kind != "end":
            raise self.fail("unexpected token")
        return Query(kind, self.selectors)

    def operator(self) -> str | None:
        token = self.peek()
        if token.kind == "op" and token.text in _PRECEDENCE:
            return token.text
        if self.is_word(token, "and", "or", "unless", "atan2"):
            return token.text.lower()
        return None

    def binary(self, min_precedence: int) -> str:
        """Precedence climbing: operators binding at least as tightly as ``min_precedence``."""
        left = self.unary()
        while (op := self.operator()) is not None and _PRECEDENCE[op] >= min_precedence:
            op_token = self.take()
            is_bool = False
            if self.is_word(self.peek(), "bool"):
                if op not in _COMPARISONS:
                    raise self.fail("bool after a non-comparison operator")
                self.take()
                is_bool = True
            matching = False
            if self.is_word(self.peek(), "on", "ignoring"):
                self.take()
                self.label_list()
                matching = True
                if self.is_word(self.peek(), "group_left", "group_right"):
                    self.take()
                    if self.peek().text == "(":
                        self.label_list()
            # ^ is right-associative, the others left-associative
            right = self.binary(_PRECEDENCE[op] + (0 if op == "^" else 1))
            left = self.combine(left, op, right, op_token, is_bool, matching)
        return left

    def combine(self, left: str, op: str, right: str, token: Token, is_bool: bool, matching: bool) -> str:
        for side in (left, right):
            if side not in ("vector", "scalar"):
                raise self.fail(f"operator {op} on a {side} (a range vector needs a function such as rate())", token)
        if op in _SET_OPS and (left, right) != ("vector", "vector"):
            raise self.fail(f"set operator {op} needs two instant vectors", token)
        if matching and (left, right) != ("vector", "vector"):
            raise self.fail("on()/ignoring() needs vectors on both sides", token)
        if op in _COMPARISONS and (left, right) == ("scalar", "scalar") and not is_bool:
            raise self.fail("a comparison of two scalars needs bool", token)
        return "vector" if "vector" in (left, right) else "scalar"

    def unary(self) -> str:
        token = self.peek()
        if token.kind == "op" and token.text in "+-":
            self.take()
            kind = self.unary()
            if kind not in ("vector", "scalar"):
                raise self.fail(f"unary {token.text} on a {kind}", token)
            return kind
        return self.postfix(self.primary())

    def postfix(self, kind_and_plain: tuple[str, bool]) -> str:
        kind, plain_selector = kind_and_plain
        if self.peek().text == "[" and self.peek().kind == "punct":
            open_token = self.take()
            self.duration("range")
            if self.peek().text == ":":
                self.take()
                if self.peek().kind == "duration":
                    self.duration("subquery step")
                if kind != "vector":
                    raise self.fail("a subquery of something that is not an instant vector", open_token)
            elif not plain_selector:
                raise self.fail("a range on something that is not a vector selector", open_token)
            self.expect("]")
            kind = "matrix"
        while self.is_word(self.peek(), "offset") or self.peek().text == "@":
            token = self.take()
            if token.text == "@":
                number = self.take()
                if number.kind != "number" and not self.is_word(number, "start", "end"):
                    raise self.fail("@ needs a timestamp", number)
                if number.kind == "ident":
                    self.expect("(")
                    self.expect(")")
            else:
                if self.peek().text == "-":
                    self.take()
                self.duration("offset")
        return kind

    def duration(self, what: str) -> None:
        token = self.take()
        if token.kind != "duration":
            raise self.fail(f"expected a duration for the {what}", token)

    def primary(self) -> tuple[str, bool]:
        """The expression's type, and whether it is a plain vector selector (a range may follow)."""
        token = self.peek()
        if token.kind == "number":
            self.take()
            return "scalar", False
        if token.kind == "string":
            self.take()
            return "string", False
        if token.text == "(" and token.kind == "punct":
            self.take()
            kind = self.binary(0)
            self.expect(")")
            return kind, False
        if token.text == "{" and token.kind == "punct":
            return self.selector(None), True
        if token.kind == "ident":
            word = token.text
            if word.lower() in ("inf", "nan"):
                self.take()
                return "scalar", False
            if word in AGGREGATIONS and (self.peek(1).text == "(" or self.is_word(self.peek(1), "by", "without")):
                return self.aggregation(), False
            if self.peek(1).text == "(" and self.peek(1).kind == "punct":
                return self.function(), False
            if word.lower() in KEYWORDS:
                raise self.fail(f"keyword {word!r} where an expression belongs")
            self.take()
            return self.selector(word), True
        raise self.fail("expected an expression")

    def label_list(self) -> list[str]:
        self.expect("(")
        labels: list[str] = []
        while self.peek().text != ")":
            token = self.take()
            if token.kind != "ident" or not _LABEL_NAME.fullmatch(token.text):
                raise self.fail("expected a label name", token)
            labels.append(token.text)
            if self.peek().text == ",":
                self.take()
            elif self.peek().text != ")":
                raise self.fail("expected ',' or ')' in a label list")
        self.expect(")")
        return labels

    def aggregation(self) -> str:
        op = self.take().text
        if self.is_word(self.peek(), "by", "without"):
            self.take()
            self.label_list()
            grouped = True
        else:
            grouped = False
        self.expect("(")
        param = AGGREGATIONS[op]
        if param is not None:
            kind = self.binary(0)
            if kind != param:
                raise self.fail(f"{op}() takes a {param} parameter first, got a {kind}")
            self.expect(",")
        kind = self.binary(0)
        if kind != "vector":
            raise self.fail(f"{op}() aggregates an instant vector, got a {kind}")
        self.expect(")")
        if self.is_word(self.peek(), "by", "without"):
            if grouped:
                raise self.fail(f"{op}() grouped twice")
            self.take()
            self.label_list()
        return "vector"

    def function(self) -> str:
        name_token = self.take()
        name = name_token.text
        if name not in FUNCTIONS:
            raise self.fail(f"unknown function {name}()", name_token)
        types, optional, result = FUNCTIONS[name]
        self.expect("(")
        args: list[str] = []
        while self.peek().text != ")":
            args.append(self.binary(0))
            if self.peek().text == ",":
                self.take()
            elif self.peek().text != ")":
                raise self.fail(f"expected ',' or ')' in the arguments of {name}()")
        self.expect(")")
        if not len(types) - optional <= len(args) <= len(types):
            raise self.fail(f"{name}() takes {len(types)} arguments, got {len(args)}", name_token)
        for position, (want, got) in enumerate(zip(types, args), 1):
            if want != got:
                raise self.fail(f"argument {position} of {name}() must be a {want}, got a {got}", name_token)
        return result

    def selector(self, name: str | None) -> str:
        matchers: list[tuple[str, str, str]] = []
        if self.peek().text == "{" and self.peek().kind == "punct":
            self.take()
            while self.peek().text != "}":
                label = self.take()
                if label.kind != "ident" or not _LABEL_NAME.fullmatch(label.text):
                    raise self.fail("expected a label name in a matcher", label)
                op = self.take()
                if op.text not in ("=", "!=", "=~", "!~") or op.kind != "op":
                    raise self.fail("expected =, !=, =~ or !~ in a matcher", op)
                value = self.take()
                if value.kind != "string":
                    raise self.fail("a matcher's value must be a quoted string", value)
                text = _unquote(value)
                if op.text in ("=~", "!~"):
                    try:
                        re.compile(text)
                    except re.error as err:
                        raise self.fail(f"bad regular expression {text!r}: {err}", value) from None
                matchers.append((label.text, op.text, text))
                if self.peek().text == ",":
                    self.take()
                elif self.peek().text != "}":
                    raise self.fail("expected ',' or '}' after a matcher")
            self.expect("}")
        if name is not None and ":" not in name and name.startswith("__"):
            raise self.fail(f"reserved metric name {name}")
        names = [value for label, op, value in matchers if label == "__name__" and op == "="]
        if name is None and len(names) == 1:
            name = names[0]
        matches_empty = [(op == "=" and value == "") or (op == "!=" and value != "")
                         or (op == "=~" and re.fullmatch(value, "") is not None)
                         or (op == "!~" and re.fullmatch(value, "") is None) for _, op, value in matchers]
        if name is None and all(matches_empty):
            raise self.fail("a vector selector needs a metric name or a matcher that does not match the empty string")
        self.selectors.append(Selector(name, matchers))
        return "vector"


def parse(expr: str) -> Query:
    """``expr`` parsed (PromQLError names what is wrong and where)."""
    return _Parser(expr).parse()


# --- Grafana's variables -----------------------------------------------------------------------------------------

GRAFANA_INTERVALS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h", "__range_s": "3600"}
"""Grafana's built-in variables, as a typical value: what the dashboard uses must still parse once replaced."""


def marker(variable: str) -> str:
    """What a template variable (``$job``) becomes before parsing: a literal regex that names it."""
    return f"__var_{variable}__"


def substitute(expr: str, template_variables: set[str]) -> str:
    """``expr`` with Grafana's intervals and the dashboard's template variables replaced; other ``$`` fail."""
    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in GRAFANA_INTERVALS:
            return GRAFANA_INTERVALS[name]
        if name in template_variables:
            return marker(name)
        raise PromQLError(f"unknown variable ${name} in {expr!r}")
    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", replace, expr)


# --- the dashboard and the alerts ----------------------------------------------------------------------------------

def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def template_variables(dash: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dash["templating"]["list"] if v["type"] != "datasource"}


def dashboard_queries() -> Iterator[tuple[dict[str, Any], dict[str, Any], str]]:
    """(panel, target, expression with the variables replaced) for every query of the dashboard."""
    dash = dashboard()
    variables = set(template_variables(dash))
    for panel in all_panels(dash["panels"]):
        for target in panel.get("targets", []):
            yield panel, target, substitute(target["expr"], variables)


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in read_yaml(ALERTS)["groups"] for rule in group["rules"]]


LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[A-Za-z_][A-Za-z0-9_]*)\)$")


# --- what a real daemon and trainer export ----------------------------------------------------------------------

@dataclass
class Exposition:
    """Series name -> label name -> the values seen, of one or more scrapes."""

    series: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    nonzero: set[str] = field(default_factory=set)

    def add(self, text: str) -> None:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = self.series.setdefault(sample.name, {})
                for key, value in sample.labels.items():
                    labels.setdefault(key, set()).add(value)
                if sample.value:
                    self.nonzero.add(sample.name)


def registered_series() -> set[str]:
    """Every series name the daemon's registry may export, whether it has a sample now or not."""
    from loader.daemon.metrics import DaemonMetrics

    suffixes = {"counter": ("_total",), "info": ("_info",), "histogram": ("_bucket", "_sum", "_count")}
    return {family.name + suffix for family in DaemonMetrics().registry.collect()
            for suffix in suffixes.get(family.type, ("",))}


NOT_IN_THIS_RUN: dict[str, str] = {
    "up": "Prometheus's own series, one per scrape target: no exporter has it",
    "megabatch_staging_written_bytes_total": "mode staged only (its staging writes, labelled by kind): no series in "
                                             "the other modes",
    "megabatch_staging_file_bytes": "mode staged only (its scratch files, labelled by kind)",
    "megabatch_read_check_failures_total": "labelled by file: no series until a read fails its check (this run's "
                                           "dataset is sound; tests/loader covers corrupt ones)",
}
"""Series the dashboard or the alerts may name although this run's expositions lack them, each with the reason."""

DEFAULT_MODE_SILENT: dict[str, tuple[str, ...]] = {
    "megabatch_staging_written_bytes_total": ("staged",),
    "megabatch_staging_file_bytes": ("staged",),
    "megabatch_feature_cache_lookups_total": ("exact", "static", "staged", "hybrid"),
    "megabatch_feature_cache_bytes": ("exact", "static", "staged", "hybrid"),
    "megabatch_neighbor_cache_lookups_total": ("exact", "static", "staged"),
    "megabatch_neighbor_cache_bytes": ("exact", "static", "staged"),
    "megabatch_trainer_cache_rows_total": ("--feature-cache",),
}
"""Series that the default (hierarchical) mode, with trainers that keep no feature cache, exports as zero or not at
all -> the modes (or trainer option) that fill them. A panel that shows one must say so in its description, or an
operator of the default mode reads "No data" as a fault."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


@dataclass
class Scraped:
    daemon: Exposition
    trainer: Exposition
    both: Exposition


@pytest.fixture(scope="module")
def scraped(dataset_3k: Path, tmp_path_factory: pytest.TempPathFactory) -> Scraped:
    """The daemon's exposition after a training epoch and its evaluation (scraped with the trainer still connected,
    so the per-client series are there) and a client that broke the protocol; the trainer's, served over HTTP."""
    from loader.offline.aggregation import build_aggregation_cache
    from proto.codec import encode
    from proto.messages import Credit, Error
    from tests.daemon_harness import daemon_config, read_message, running_daemon
    from trainer.daemon_source import DaemonSource
    from trainer.loop import TrainConfig, train
    from trainer.metrics import TrainerMetrics

    # a copy with an aggregation cache (left off): its cost model's series exist only where a dataset has one
    work = tmp_path_factory.mktemp("dashboard")
    dataset = work / "dataset"
    shutil.copytree(dataset_3k, dataset)
    build_aggregation_cache(dataset, "mean", 1 << 20)
    port = free_port()
    config = daemon_config(dataset, work / "s.sock", metrics={"port": port})
    trainer_metrics = TrainerMetrics()
    trainer_port = trainer_metrics.serve(0)
    try:
        with running_daemon(config):
            source = DaemonSource(str(config.server.socket))
            try:
                train(source, TrainConfig(hidden=8, epochs=1, seed=0, device="cpu"), metrics=trainer_metrics,
                      log=lambda line: None)
                # a client whose first message is not a Hello: megabatch_protocol_errors_total gets its series
                with socket.socket(socket.AF_UNIX) as raw:
                    raw.settimeout(30)
                    raw.connect(str(config.server.socket))
                    raw.sendall(encode(Credit(count=1)))
                    assert isinstance(read_message(raw), Error)
                daemon_text = get(f"http://127.0.0.1:{port}/metrics")
            finally:
                source.close()
        trainer_text = get(f"http://127.0.0.1:{trainer_port}/metrics")
    finally:
        trainer_metrics.close()
    daemon, trainer, both = Exposition(), Exposition(), Exposition()
    daemon.add(daemon_text)
    trainer.add(trainer_text)
    both.add(daemon_text)
    both.add(trainer_text)
    return Scraped(daemon, trainer, both)


def check_names(query: Query, exposition: Exposition, where: str) -> None:
    """Every series ``query`` names is exported (or in NOT_IN_THIS_RUN), and every label it matches on exists."""
    for selector in query.selectors:
        name = selector.name
        if name is None:
            raise AssertionError(f"{where}: a selector without a metric name: {selector}")
        if name in NOT_IN_THIS_RUN:
            continue
        if name not in exposition.series:
            raise AssertionError(f"{where}: {name!r} is in neither the daemon's nor the trainer's exposition "
                                 f"(a histogram is queried as _bucket, _sum or _count, a counter as _total)")
        labels = exposition.series[name]
        for label, op, value in selector.matchers:
            if label in ("job", "instance", "__name__"):
                continue  # Prometheus's target labels
            assert label in labels, f"{where}: {name} has no label {label!r} (it has {sorted(labels)})"
            if op == "=":
                assert value in labels[label], f"{where}: {name}{{{label}={value!r}}}: seen only {labels[label]}"


# --- the parser itself -------------------------------------------------------------------------------------------

GOOD = [
    'sum by (instance, kind) (rate(megabatch_batches_published_total{job=~"a|b", kind="train"}[5m]))',
    "histogram_quantile(0.99, sum by (le) (rate(x_bucket[1m])))",
    "a / ignoring(result) group_left sum without(result) (rate(b[1m]))",
    'megabatch_clients > 0 unless on (job, instance) sum by (job, instance) (increase(c_total[5m])) > 0',
    "process_resident_memory_bytes > megabatch_memory_budget_bytes + 384 * 1024 * 1024",
    "changes(process_start_time_seconds[30m]) > 2",
    "max_over_time(rate(x_total[1m])[10m:1m])",
    "-x offset 5m",
    "2 > bool 1",
    "topk(3, x)",
    '{__name__="x", job="y"}',
]
BAD = {
    "rate(x_total)": "must be a matrix",
    "rate(x_total[5m]": "expected ',' or ')'",
    "sum(rate(x_total[5m])))": "unexpected token",
    "sum(rate(x_total[5m])) by": "expected '('",
    "rat(x_total[5m])": "unknown function",
    "x_total[5m] / 2": "range vector",
    "rate(x_total[5])": "duration",
    "rate(sum(x)[5m])": "not a vector selector",
    'x{job="a}': "unexpected character",
    "x{job=a}": "quoted string",
    'x{job=="a"}': "expected =, !=",
    'x{job=~"("}': "bad regular expression",
    'x{"job"="a"}': "label name",
    '{job=~".*"}': "empty string",
    "x{job='a'} by (a)": "unexpected token",
    "histogram_quantile(x, 0.5)": "must be a scalar",
    "1 > 2": "needs bool",
    "x and 1": "set operator",
    "topk(x, y)": "scalar parameter",
    "sum by (le) ()": "expected an expression",
    "x + + ": "expected an expression",
}


@pytest.mark.parametrize("expr", GOOD)
def test_parser_accepts_promql(expr):
    parse(expr)


@pytest.mark.parametrize(("expr", "error"), BAD.items())
def test_parser_rejects_broken_promql(expr, error):
    with pytest.raises(PromQLError, match=re.escape(error)):
        parse(expr)


def test_parser_collects_selectors():
    query = parse('sum by (instance) (rate(a_total{job=~"j", x="1"}[5m])) / on (instance) b + {__name__="c"}')
    assert query.type == "vector"
    assert [s.name for s in query.selectors] == ["a_total", "b", "c"]
    assert query.selectors[0].matchers == [("job", "=~", "j"), ("x", "=", "1")]


def test_variables_are_substituted_and_unknown_ones_fail():
    assert substitute('rate(x{job=~"$job"}[$__rate_interval])', {"job"}) == 'rate(x{job=~"__var_job__"}[1m])'
    assert substitute("increase(x[${__range}])", set()) == "increase(x[1h])"
    with pytest.raises(PromQLError, match="unknown variable"):
        substitute('x{job=~"$jobs"}', {"job"})


def test_a_metric_nobody_exports_fails_the_check():
    exposition = Exposition()
    exposition.add('# TYPE megabatch_epoch gauge\nmegabatch_epoch 1\n# TYPE x counter\nx_total{kind="a"} 1\n')
    check_names(parse("megabatch_epoch + sum(rate(x_total[1m]))"), exposition, "t")
    with pytest.raises(AssertionError, match="neither the daemon's nor the trainer's"):
        check_names(parse("rate(megabatch_nobody_total[1m])"), exposition, "t")
    with pytest.raises(AssertionError, match="neither"):
        check_names(parse("megabatch_epoch_total"), exposition, "t")  # a gauge is not queried with _total
    with pytest.raises(AssertionError, match="no label"):
        check_names(parse('rate(x_total{kidn="a"}[1m])'), exposition, "t")
    with pytest.raises(AssertionError, match="seen only"):
        check_names(parse('rate(x_total{kind="b"}[1m])'), exposition, "t")


# --- the dashboard and the alerts against the live expositions -------------------------------------------------

def test_every_query_parses_and_names_only_exported_series(scraped, tmp_path):
    checked = 0
    for panel, target, expr in dashboard_queries():
        where = f"dashboard panel {panel['title']!r} query {target['refId']}"
        try:
            query = parse(expr)
        except PromQLError as err:
            raise AssertionError(f"{where}: {err}") from None
        assert query.type in ("vector", "scalar"), f"{where}: a query must give an instant vector or a scalar"
        check_names(query, scraped.both, where)
        checked += 1
    rules = alert_rules()
    for rule in rules:
        where = f"alert {rule['alert']}"
        assert "$" not in rule["expr"], f"{where}: a Grafana variable in an alert"
        query = parse(rule["expr"])
        assert query.type == "vector", f"{where}: an alert's expression must be an instant vector"
        check_names(query, scraped.both, where)
        checked += 1
    assert checked >= 60

    # Prometheus's own parser agrees, where it is installed (CI has no promtool; the checks above do not need it)
    promtool = shutil.which("promtool")
    if promtool is not None:
        run_promtool(promtool, tmp_path)


def run_promtool(promtool: str, tmp_path: Path) -> None:
    def check(*args: str, cwd: Path) -> None:
        result = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=cwd)
        assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"

    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    check("check", "rules", "alerts.yml", cwd=tmp_path)
    check("test", "rules", "alerts_test.yml", cwd=ALERTS.parent)
    # every dashboard query as a recording rule: promtool parses each with Prometheus's parser
    values = {name: ".+" for name in template_variables(dashboard())}
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for n, (panel, target, _) in enumerate(dashboard_queries()):
        expr = target["expr"]
        for name, interval in GRAFANA_INTERVALS.items():
            expr = expr.replace("${" + name + "}", interval).replace("$" + name, interval)
        for name, value in values.items():
            expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
        lines += [f"      - record: dashboard:panel_{panel['id']}:{target['refId']}_{n}",
                  f"        expr: {json.dumps(expr)}"]
    (tmp_path / "dashboard_rules.yml").write_text("\n".join(lines) + "\n")
    check("check", "rules", "dashboard_rules.yml", cwd=tmp_path)


def test_every_template_variable_query_is_valid_and_the_panels_use_them(scraped):
    variables = template_variables(dashboard())
    assert set(variables) == {"job", "instance"}
    for name, variable in variables.items():
        query = variable["query"] if isinstance(variable["query"], str) else variable["query"]["query"]
        match = LABEL_VALUES.match(query)
        assert match is not None and match.group("label") == name, f"${name}: {query!r}"
        parsed = parse(substitute(match.group("selector"), set(variables)))
        check_names(parsed, scraped.both, f"${name}")
        assert variable["multi"] is True and variable["includeAll"] is True, name
    # every selector of every panel is narrowed by both variables, as a regex (a multi-value variable is one)
    for panel, target, expr in dashboard_queries():
        for selector in parse(expr).selectors:
            for name in variables:
                assert (name, "=~", marker(name)) in selector.matchers, (
                    f"panel {panel['title']!r} query {target['refId']}: {selector.name} lacks {name}=~\"${name}\"")


def test_panels_of_metrics_the_default_mode_leaves_empty_say_so(scraped):
    # the list is honest: the hierarchical run exported these as zero or not at all
    for name in DEFAULT_MODE_SILENT:
        assert name not in scraped.both.nonzero, f"{name} moved in the default mode: drop it from DEFAULT_MODE_SILENT"
    for panel, _, expr in dashboard_queries():
        silent = parse(expr).metric_names & set(DEFAULT_MODE_SILENT)
        description = panel.get("description", "")
        for name in silent:
            missing = [word for word in DEFAULT_MODE_SILENT[name] if word not in description]
            assert not missing, (f"panel {panel['title']!r} shows {name}, which the default mode leaves empty: its "
                                 f"description must name {missing}")


def test_the_allow_list_is_small_current_and_names_registered_series(scraped):
    registered = registered_series()
    for name, reason in NOT_IN_THIS_RUN.items():
        assert reason
        assert name not in scraped.both.series, f"{name} is exported now: drop it from NOT_IN_THIS_RUN"
        assert name == "up" or name in registered, f"{name}: not a series of loader/daemon/metrics.py"
    assert len(NOT_IN_THIS_RUN) <= 5
    used = set()
    for _, _, expr in dashboard_queries():
        used |= parse(expr).metric_names
    for rule in alert_rules():
        used |= parse(rule["expr"]).metric_names
    assert set(NOT_IN_THIS_RUN) <= used, f"unused allow-list entries: {set(NOT_IN_THIS_RUN) - used}"


def test_the_scrapes_hold_what_the_dashboard_needs(scraped):
    # the daemon and the trainer each export their own families and the process ones; the run did a training
    # epoch and an evaluation, with a client connected at the scrape
    for name in ("megabatch_client_info", "megabatch_training_queue_position", "megabatch_protocol_errors_total",
                 "megabatch_read_amplification_ratio", "process_resident_memory_bytes"):
        assert name in scraped.daemon.series, name
    assert {"train", "val", "test"} <= scraped.daemon.series["megabatch_batches_published_total"]["kind"]
    assert "megabatch_seeds_published_total" in scraped.daemon.nonzero
    for name in ("megabatch_trainer_samples_total", "megabatch_trainer_data_wait_seconds_total",
                 "megabatch_trainer_step_seconds_sum", "process_resident_memory_bytes"):
        assert name in scraped.trainer.nonzero, name
    assert {"val", "test"} <= scraped.trainer.series["megabatch_trainer_score"]["split"]
