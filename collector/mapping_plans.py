"""The convention table applied to a decoded batch, by plans specialised on which keys a span has.

``map_columns`` is what both decoders call. ``collector.conventions.map_coordination``'s mapper
asks every source of the table for its key (~45 dict lookups and their conditions per span) and
is the reference; this module gives the same columns for a batch at a fraction of the cost:

- spans are grouped by their attribute keys (one tuple per span, cheap: the compiled decoder
  shares one str per key within a request);
- a group's *plan* is the table specialised on which of the keys the table reads are present
  (its *signature*; ``collector.plan_source`` writes it): a source whose key is absent is
  dropped, a present one reads the value at its position, so a span costs the sources it can
  match, not the table. A plan is shared by every key tuple with the same signature (and scope
  class), positions passed in;
- a signature is compiled once it has been seen on ``MIN_PLAN_SPANS`` spans, and at most
  ``MAX_PLANS`` signatures are ever compiled (a sender cycling through key combinations costs
  its compile once per signature, then the reference mapper); spans without a plan go through
  the reference mapper.

tests/collector/test_mapping_plans.py holds every column equal to the reference on the
framework captures, the generator's payloads and edge cases (duplicate keys, empty values,
resource fallbacks, events). Pure functions apart from the plan caches (code, not data).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from collector import conventions as conv
from collector.fastdecode import _otlpfast
from collector.plan_source import DIRECT_TEXT, KNOWN_SCOPES, OTHER_SCOPE, READ_KEYS, generate_plan

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
    plan_key = (scope if scope in KNOWN_SCOPES else OTHER_SCOPE, signature)
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
    ``offsets[i]:offsets[i + 1]``), as both decoders build them: values are str (OTLP's string
    map; plans read "" and None as the reference does only for str values, and
    test_decoders_hand_the_mapping_strings holds the decoders to it). ``events`` is each span's
    ``Events`` JSON text. A span with no run takes its trace id as run id.
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
