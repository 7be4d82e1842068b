"""The convention table applied to a decoded batch, by plans specialised on which keys a span has.

``map_columns`` is what both decoders call. ``collector.conventions.map_coordination``'s mapper
asks every source of the table for its key (~45 dict lookups and their conditions per span) and
is the reference; this module gives the same columns for a batch at a fraction of the cost:

- spans are grouped by their attribute keys (one tuple per span, cheap: the compiled decoder
  shares one str per key within a request);
- a group's *plan* is the table specialised on which of the keys the table reads are present
  (its *signature*): a source whose key is absent is dropped when the plan is generated, a
  present one reads the value at its position, so a span costs the sources it can match, not
  the table. Plans are generated from ``RULES`` like the reference mapper (no key is spelled
  here) and shared by every key tuple with the same signature, positions passed in;
- a signature is compiled once it has been seen on ``MIN_PLAN_SPANS`` spans, and at most
  ``MAX_PLANS`` signatures are ever compiled (a sender cycling through key combinations costs
  its compile once per signature, then the reference mapper); spans without a plan go through
  the reference mapper.

tests/collector/test_mapping_plans.py holds every column equal to the reference on the
framework captures, the generator's payloads and edge cases (duplicate keys, empty values,
resource fallbacks, events). Pure functions apart from the plan caches (code, not data).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from collector import conventions as conv
from collector.fastdecode import _otlpfast

# The compiled loops (collector/_otlpfast.c); a build without them maps in Python alone.
_group_rows_c = getattr(_otlpfast, "group_rows", None)
_copy_columns_c = getattr(_otlpfast, "copy_columns", None)

MIN_PLAN_SPANS = 8
MAX_PLANS = 256
_MAX_SIGNATURES_SEEN = 4096
_MAX_KEY_TUPLES = 1024
_MAX_TUPLE_CHARS = 4096

AttributeTriple = tuple[Sequence[int], Sequence[str], Sequence[str]]

_COLUMNS = conv.COORDINATION_COLUMNS
_INDEX = conv._INDEX
_RUN = _INDEX["run_id"]
_GET_CONSTANT = re.compile(r"get\(([A-Z_]+)\)")
_COLUMN_REF = re.compile(r"out\[COLUMN\['(\w+)'\]\]")
_BARE_GET = re.compile(r"(?<![.\w])get\b")


def _condition_keys(condition: str) -> list[str]:
    return [conv._ENV[name] for name in _GET_CONSTANT.findall(condition)]


def read_keys(rules: Sequence[conv.Rule] = conv.RULES) -> frozenset[str]:
    """Every span attribute key the table reads: the plain keys of its sources and the keys its
    conditions look at (a reader's own look-ups, like smolagents' task text, read the span's
    attributes through a dict built when that reader runs)."""
    keys: set[str] = set()
    for rule in rules:
        for source in rule.sources:
            if ":" not in source.key:
                keys.add(source.key)
            if source.when:
                keys.update(_condition_keys(conv.CONDITIONS[source.when]))
    return frozenset(keys)


READ_KEYS = read_keys()
# Rules that copy one attribute as it is into a text column: key -> column index. Copied for
# every span before the plans run, which then leave them alone.
DIRECT_TEXT = {
    rule.sources[0].key: _INDEX[rule.column]
    for rule in conv.RULES
    if conv.is_direct(rule) and rule.kind == "text"
}


class ResourceSlice:
    """One span's resource attributes inside a batch's triple, read only when a rule needs one
    (rarely: the run when a span names none), so no dict is built per span."""

    __slots__ = ("keys", "values", "start", "stop")

    def __init__(self, keys: Sequence[str], values: Sequence[str]) -> None:
        self.keys, self.values, self.start, self.stop = keys, values, 0, 0

    def get(self, key: str) -> Any:
        found = None
        keys = self.keys
        for index in range(self.start, self.stop):
            if keys[index] == key:
                found = self.values[index]  # the last duplicate wins, as in a dict
        return found


# Names a plan's expressions bind per span; anything else in a condition is fixed by the plan.
_PER_SPAN = frozenset({"s_vals", "s_keys", "s_off", "o", "i", "name", "events", "ev", "v", "resource_value"})
_LOCAL = re.compile(r"x\d+")


def _scopes_compared(conditions: Mapping[str, str]) -> frozenset[str]:
    """The scope names the conditions compare with. A plan is generated for one of them or for
    "any other scope", which is exact only while conditions compare ``scope`` with ``==`` / ``!=``
    against named scope constants: anything else raises here, at import."""
    known: set[str] = set()
    for when, text in conditions.items():
        tree = ast.parse(text, mode="eval")
        compared = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "scope":
                names = [c.id for c in node.comparators if isinstance(c, ast.Name)]
                if len(names) != len(node.comparators) or not all(
                    isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops
                ):
                    raise ValueError(f"condition {when!r}: compare scope only with == / != to a named scope")
                known.update(conv._ENV[n] for n in names)
                compared.add(id(node.left))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "scope" and id(node) not in compared:
                raise ValueError(f"condition {when!r}: compare scope only with == / != to a named scope")
    return frozenset(known)


KNOWN_SCOPES = _scopes_compared(conv.CONDITIONS)
_OTHER_SCOPE = "\x00any other scope"


def _fold(node: ast.expr) -> ast.expr | bool:
    """``node`` with every part that reads nothing per span evaluated (and/or short-cut)."""
    if isinstance(node, ast.BoolOp):
        is_and = isinstance(node.op, ast.And)
        kept = []
        for value in node.values:
            folded = _fold(value)
            if isinstance(folded, bool):
                if folded != is_and:
                    return folded  # a False in an and, a True in an or
                continue
            kept.append(folded)
        if not kept:
            return is_and
        return kept[0] if len(kept) == 1 else ast.BoolOp(node.op, kept)
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    if names & _PER_SPAN or any(_LOCAL.fullmatch(n) for n in names):
        return node
    expression = ast.fix_missing_locations(ast.Expression(node))
    return bool(eval(compile(expression, "<fold>", "eval"), dict(conv._ENV)))  # noqa: S307 (our own table)


class _Plan:
    """Generates one plan's source: ``present`` maps each present read key to its slot in the
    positions tuple ``P`` (span ``i``'s value of that key is ``s_vals[s_off[i] + P[slot]]``);
    ``scope`` is the spans' scope (one of ``KNOWN_SCOPES`` or ``_OTHER_SCOPE``)."""

    def __init__(self, present: Mapping[str, int], scope: str) -> None:
        self.present = present
        self.scope = scope
        self.constant: dict[int, Any] = {}  # columns no source of which can apply: their value
        self.lines: list[str] = []

    def get(self, key: str) -> str:
        slot = self.present.get(key)
        return "None" if slot is None else f"s_vals[o + p{slot}]"

    def column(self, name: str) -> str:
        index = _INDEX[name]
        return repr(self.constant[index]) if index in self.constant else f"x{index}"

    def condition(self, when: str) -> str | bool:
        text = conv.CONDITIONS[when]
        text = _COLUMN_REF.sub(lambda m: self.column(m.group(1)), text)
        text = _GET_CONSTANT.sub(lambda m: self.get(conv._ENV[m.group(1)]), text)
        tree = ast.parse(text, mode="eval").body
        for node in ast.walk(tree):  # the plan's one scope, as a constant (_scopes_compared)
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "scope":
                node.left = ast.Constant(self.scope)
        folded = _fold(tree)
        return folded if isinstance(folded, bool) else ast.unparse(folded)

    def raw(self, source: conv.Source) -> str | None:
        """The expression of a source's raw value (None: the key is absent from these spans)."""
        key = source.key
        if key.startswith("resource:"):
            return f"resource_value(i, {key[len('resource:') :]!r})"
        if key == "span:name":
            return "name"
        if key.startswith("column:"):
            index = _INDEX[key[len("column:") :]]
            if index in self.constant:  # a column no source of which applies to these spans
                return None if self.constant[index] in (None, "") else repr(self.constant[index])
            if index in DIRECT_TEXT.values():
                return f"c{index}[i]"
            return f"x{index}"
        if key.startswith("event:"):
            event, attribute = conv.event_key(source)
            # event_values answers None at once for a JSON text that does not name the event
            return (
                f"(((ev := events[i]).__class__ is not str or {event!r} in ev) "
                f"and event_values(ev, {event!r}, {attribute!r}))"
            )
        return self.get(key) if key in self.present else None

    def chain(self, rule: conv.Rule) -> list[str]:
        """Each applicable source as an expression that is its value, or falsy to give way."""
        parts = []
        for source in rule.sources:
            raw = self.raw(source)
            if raw is None:
                continue
            test = self.condition(source.when) if source.when else True
            if test is False:
                continue
            if source.read:
                reader = _BARE_GET.sub(
                    "dict(zip(s_keys[o : s_off[i + 1]], s_vals[o : s_off[i + 1]])).get",
                    conv.READERS[source.read],
                )
                raw = f"((v := {raw}) and ({reader}))"
            parts.append(raw if test is True else f"({test} and {raw})")
        return parts

    def rule(self, rule: conv.Rule) -> None:
        index, emit = _INDEX[rule.column], self.lines.append
        if conv.is_direct(rule):
            key = rule.sources[0].key
            if rule.kind == "text":  # copied before the plans run (copy_columns), for every span
                if key not in self.present:
                    self.constant[index] = None
                return
            if key in self.present:  # kept as it is, even ''
                emit(f"        c{index}[i] = {_DIRECT[rule.kind].format(self.get(key))}")
            else:
                self.constant[index] = None
            return
        parts = self.chain(rule)
        if rule.column == "run_id":  # a span with no run takes its trace id
            emit(f"        c{index}[i] = {' or '.join([*parts, 'trace_ids[i]'])}")
            return
        if not parts:
            self.constant[index] = rule.default
            if rule.default is not None:
                emit(f"        c{index}[i] = {rule.default!r}")
            return
        if rule.kind == "text":
            value = " or ".join([*parts, repr(rule.default)])
        else:
            chain = " or ".join([*parts, "None"])
            value = f"{_COERCER[rule.kind]}(v) if (v := ({chain})) is not None else {rule.default!r}"
        emit(f"        x{index} = c{index}[i] = {value}")


# A present direct key's value (a str: the decoders' string map) -> the column's, as the
# reference coerces it (for ints the common case, a short run of ASCII digits, first).
_DIRECT = {
    "text": "{}",
    "int": "(int(v) if (v := {}).isdigit() and v.isascii() and len(v) < 10 else int_(v))",
    "bool": "bool_({})",
    # a batch repeats few lists (constraint ids): each text is read once, each row gets a copy
    "list": "(list(t) if (t := lists.get(v := {})) is not None else list_once(v, lists))",
}
_COERCER = {"int": "int_", "bool": "bool_", "list": "str_list"}


def generate_plan(
    present: Mapping[str, int], scope: str = _OTHER_SCOPE, rules: Sequence[conv.Rule] = conv.RULES
) -> str:
    """Python source of ``plan(G, s_off, s_keys, s_vals, names, events, trace_ids,
    resource_value, lists, cols, P)``, which writes the coordination columns of the spans ``G`` (row
    indices, all with the read keys ``present`` and the scope ``scope``) into ``cols`` (one list
    per column, preset to None)."""
    plan = _Plan(present, scope)
    for rule in rules:
        plan.rule(rule)
    lines = plan.lines
    for n, line in enumerate(lines):  # a local only for columns later rules read
        local = re.match(r"        (x\d+) = ", line)
        if local and not any(re.search(rf"\b{local.group(1)}\b", later) for later in lines[n + 1 :]):
            lines[n] = "        " + line[len(local.group(0)) :]
    body = "\n".join(lines)
    used = sorted({int(c) for c in re.findall(r"\bc(\d+)\[i\]", body)})
    head = ["def plan(G, s_off, s_keys, s_vals, names, events, trace_ids, resource_value, lists, cols, P):"]
    if present:
        head.append(f"    {', '.join(f'p{n}' for n in range(len(present)))}, = P")
    head += [f"    c{c} = cols[{c}]" for c in used]
    head += ["    for i in G:", "        o = s_off[i]"]
    if re.search(r"\bname\b", body):
        head.append("        name = names[i]")
    return "\n".join(head) + "\n" + body + "\n"


_compiled: dict[tuple[str, tuple[str, ...]], Callable[..., None]] = {}
_seen: dict[tuple[str, tuple[str, ...]], int] = {}
_by_keys: dict[tuple[str, tuple[str, ...]], tuple[Callable[..., None], tuple[int, ...]]] = {}


def _signature(keys: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The read keys present (sorted) and each one's position, the last of duplicates (as a dict
    of the pairs keeps the last value)."""
    where = {key: n for n, key in enumerate(keys) if key in READ_KEYS}
    signature = tuple(sorted(where))
    return signature, tuple(where[key] for key in signature)


def list_once(text: str, seen: dict[str, tuple[str, ...]]) -> list[str] | None:
    """``str_list(text)``, remembered in ``seen`` (as a tuple, so no two rows share a list)."""
    out = conv._str_list(text)
    if out is not None:
        seen[text] = tuple(out)
    return out


def _compile(scope: str, signature: tuple[str, ...]) -> Callable[..., None]:
    source = generate_plan({key: n for n, key in enumerate(signature)}, scope)
    namespace = dict(conv._ENV, list_once=list_once)
    exec(compile(source, "<collector.mapping_plans plan>", "exec"), namespace)  # noqa: S102 (our own table)
    return namespace["plan"]


def _plan_for(
    scope: str, keys: tuple[str, ...], spans: int
) -> tuple[Callable[..., None], tuple[int, ...]] | None:
    """The plan for ``spans`` spans with these keys and scope, and the positions to give it; None
    while their signature has no plan."""
    found = _by_keys.get((scope, keys))
    if found is not None:
        return found
    signature, positions = _signature(keys)
    plan_key = (scope if scope in KNOWN_SCOPES else _OTHER_SCOPE, signature)
    plan = _compiled.get(plan_key)
    if plan is None:
        seen = _seen.get(plan_key, 0) + spans
        if seen < MIN_PLAN_SPANS or len(_compiled) >= MAX_PLANS:
            if len(_seen) < _MAX_SIGNATURES_SEEN:
                _seen[plan_key] = seen
            return None
        plan = _compiled[plan_key] = _compile(*plan_key)
        _seen.pop(plan_key, None)
    # Remembered per key tuple only while small, so what senders invent cannot fill memory:
    # at most _MAX_KEY_TUPLES tuples of at most _MAX_TUPLE_CHARS characters of keys.
    if sum(map(len, keys)) + len(scope) <= _MAX_TUPLE_CHARS:
        if len(_by_keys) >= _MAX_KEY_TUPLES:
            _by_keys.clear()
        _by_keys[(scope, keys)] = (plan, positions)
    return plan, positions


def map_columns(
    span_attributes: AttributeTriple,
    resource_attributes: AttributeTriple,
    names: Sequence[str],
    scopes: Sequence[str],
    trace_ids: Sequence[str],
    events: Sequence[str] | None = None,
) -> dict[str, list]:
    """The coordination columns of a decoded batch, column-wise: the same values as
    ``map_columns_per_span`` (the reference).

    The attribute arguments are ``(offsets, keys, values)`` triples (span i's pairs at
    ``offsets[i]:offsets[i + 1]``), as both decoders build them; ``events`` each span's ``Events``
    JSON text. A span with no run takes its trace id as run id.
    """
    n = len(names)
    s_off, s_keys, s_vals = span_attributes
    if events is None:
        events = ["[]"] * n
    # one scope for the whole batch (the usual request): grouped by the keys alone
    scope = scopes[0] if n and scopes.count(scopes[0]) == n else None
    cols: list[list[Any]] = [[None] * n for _ in _COLUMNS]
    if _copy_columns_c is not None and type(s_off) is list and type(s_keys) is list and type(s_vals) is list:
        groups = _group_rows_c(s_off, s_keys, None if scope is not None or not n else list(scopes))
        _copy_columns_c(s_off, s_keys, s_vals, DIRECT_TEXT, cols)
    else:
        groups = _group_rows(s_off, s_keys, None if scope is not None else scopes, n)
        _copy_columns(s_off, s_keys, s_vals, cols, n)
    resource = ResourceSlice(resource_attributes[1], resource_attributes[2])
    r_off = resource_attributes[0]

    def resource_value(i: int, key: str) -> Any:
        resource.start, resource.stop = r_off[i], r_off[i + 1]
        return resource.get(key)

    lists: dict[str, tuple[str, ...]] = {}
    rest: list[int] = []
    for keys, group in groups.items():
        found = _plan_for(scope, keys, len(group)) if scope is not None else _plan_for(*keys, len(group))
        if found is None:
            rest.extend(group)
            continue
        plan, positions = found
        plan(group, s_off, s_keys, s_vals, names, events, trace_ids, resource_value, lists, cols, positions)
    if rest:
        rest.sort()
        _map_per_span(rest, span_attributes, resource, r_off, names, scopes, trace_ids, events, cols)
    return dict(zip(_COLUMNS, cols, strict=True))


def _group_rows(
    s_off: Sequence[int], s_keys: Sequence[str], scopes: Sequence[str] | None, n: int
) -> dict[Any, list[int]]:
    """``_otlpfast.group_rows`` in Python: rows by their key tuple, or by (scope, key tuple)."""
    groups: dict[Any, list[int]] = {}
    for i in range(n):
        keys = tuple(s_keys[s_off[i] : s_off[i + 1]])
        if scopes is not None:
            keys = (scopes[i], keys)
        group = groups.get(keys)
        if group is None:
            groups[keys] = [i]
        else:
            group.append(i)
    return groups


def _copy_columns(
    s_off: Sequence[int], s_keys: Sequence[str], s_vals: Sequence[str], cols: list[list[Any]], n: int
) -> None:
    """``_otlpfast.copy_columns`` in Python: the direct text columns, the last of repeated keys
    winning."""
    for i in range(n):
        for j in range(s_off[i], s_off[i + 1]):
            index = DIRECT_TEXT.get(s_keys[j])
            if index is not None:
                cols[index][i] = s_vals[j]


def _map_per_span(
    rows: Sequence[int],
    span_attributes: AttributeTriple,
    resource: Any,
    r_off: Sequence[int],
    names: Sequence[str],
    scopes: Sequence[str],
    trace_ids: Sequence[str],
    events: Sequence[str],
    cols: list[list[Any]],
) -> None:
    s_off, s_keys, s_vals = span_attributes
    map_span = conv._map_span
    for i in rows:
        resource.start, resource.stop = r_off[i], r_off[i + 1]
        s0, s1 = s_off[i], s_off[i + 1]
        out = map_span(
            dict(zip(s_keys[s0:s1], s_vals[s0:s1], strict=True)), resource, names[i], scopes[i], events[i]
        )
        if out[_RUN] is None:
            out[_RUN] = trace_ids[i]
        for column, value in zip(cols, out, strict=True):
            column[i] = value


def map_columns_per_span(
    span_attributes: AttributeTriple,
    resource_attributes: AttributeTriple,
    names: Sequence[str],
    scopes: Sequence[str],
    trace_ids: Sequence[str],
    events: Sequence[str] | None = None,
) -> dict[str, list]:
    """The reference: ``map_columns``' answer by the per-span mapper alone (each span's
    attributes as a dict, every source of the table asked)."""
    n = len(names)
    cols: list[list[Any]] = [[None] * n for _ in _COLUMNS]
    resource = ResourceSlice(resource_attributes[1], resource_attributes[2])
    _map_per_span(
        range(n),
        span_attributes,
        resource,
        resource_attributes[0],
        names,
        scopes,
        trace_ids,
        events if events is not None else ["[]"] * n,
        cols,
    )
    return dict(zip(_COLUMNS, cols, strict=True))
