"""The ClickHouse form of analytics' DuckDB SQL: generated with SQLGlot, plus documented rewrites.

Every statement in ``analytics/sql`` is written once, for DuckDB. ``to_clickhouse`` parses it with
SQLGlot (DuckDB dialect), rewrites the nodes whose generic ClickHouse output is wrong or missing,
and generates ClickHouse SQL; ``tests/analytics/test_clickhouse_detectors.py`` holds every
detector's findings on ClickHouse (chdb) equal to DuckDB's. The rewrites, each a difference of
the two engines:

- parameters: ``$name::TYPE`` becomes a ClickHouse query parameter ``{name:Type}`` (values are
  still bound, never inlined); a ``$name`` without a cast takes its type from the value;
- aggregates: ``list(x ORDER BY k)`` sorts ``groupArray((k, x))`` by ``k`` (ClickHouse has no
  ORDER BY inside an aggregate); ``list(x) FILTER (WHERE c)`` is ``groupArrayIf``; like
  DuckDB's ``list_distinct`` the ClickHouse lists hold no NULL (``groupArray`` skips them);
  ``bool_or``/``bool_and`` are ``max``/``min``; ``regr_slope(y, x)`` is ``covarPopStable / varPopStable`` (the plain sums lose digits on epoch seconds);
- functions named differently: ``hash(a, b)`` -> ``cityHash64(tuple(a, b))`` (a tuple, so a NULL
  argument hashes to a value, as in DuckDB), ``sha256`` -> hex of ``SHA256``, ``round_even`` ->
  ``roundBankers`` (+ 0: a rounded -0.0 is 0.0, one group with 0.0 as in DuckDB), ``suffix`` -> ``endsWith``, ``regexp_extract_all(s, re, g)`` -> the g-th group
  of ``extractAllGroups``, ``regexp_replace(..., 'g')`` -> ``replaceRegexpAll``, list functions
  -> their ``array*`` names, ``len`` (lists) -> ``length``, ``length`` (text) -> characters,
  ``x // y`` -> ``intDiv`` (exact on nanosecond integers), ``epoch_us`` -> ``toUnixTimestamp64Micro``,
  ``json_extract_string`` -> NULL when the key is absent (ClickHouse returns '');
- struct literals ``{'k': v}`` are named tuples (``tuple(v AS k)``);
- ``row_number() OVER ()`` is ordered by a hash of the row (ClickHouse inlines a CTE per
  reference, and each copy must number a row the same);
- ``lag``/``lead`` of a non-Nullable column return NULL past the partition's edge (ClickHouse
  returns the type's default, '' or 0, otherwise);
- several ``unnest`` in one SELECT are zipped (``arrayJoin(arrayZip(...))``: ClickHouse would
  multiply them);
- ``x IN (col, col)`` is an OR of equalities (ClickHouse wants a constant set); ``x = ANY($list)``
  is ``x IN {list}`` (one set; SQLGlot's ``has(list, x)`` searched the list per row);
- ``SEMI``/``ANTI JOIN`` are ``LEFT SEMI``/``LEFT ANTI``; ``UNION ALL BY NAME`` is ``UNION ALL``
  (refused unless both sides name the same columns in the same order);
  ``AS NOT MATERIALIZED`` hints are dropped, ``AS MATERIALIZED`` CTEs are materialized;
- ``rowid`` (DuckDB's row number, used to find a row again) is ``cityHash64(TraceId, SpanId)``;
- list columns of ``spans``: ClickHouse arrays cannot be NULL, so ``spans`` carries
  ``<column>_null`` flags (``collector.clickhouse_schema.LIST_NULL_COLUMNS``); ``c IS NULL`` and
  ``coalesce(c, ...)`` on such a column of ``spans`` read the flag;
- ``SpanAttributes`` (DuckDB: a list of key/value structs; ClickHouse: a Map) is read as a list
  of ``(key, value)`` named tuples;
- predicates selected as columns are ``Bool`` (ClickHouse returns UInt8);
- a CTE mentioned more than once is computed once, into a temporary table, by a stage that runs
  before the statement (``to_clickhouse_staged``): ClickHouse inlines a CTE at every mention, and
  a CTE read by CTEs that are themselves read twice is copied once per path, which took 20-90
  CPU-seconds of query analysis for context_drift_holders and repeated_calls on 265 spans;
- every statement runs with the settings in ``SETTINGS``: NULLs from outer joins and grouping
  sets (``join_use_nulls``, ``group_by_use_nulls``), NULL from an aggregate over no rows, named
  tuples, UTC, without the query condition cache (wrong answers from a second run), and with its
  query tree bounded to ``MAX_QUERY_TREE`` nodes, so that planning a statement stays short (a
  statement ClickHouse would expand past it fails at once instead of planning for minutes).
"""

from __future__ import annotations

import functools
import logging
import re
from datetime import date, datetime
from typing import Any, NamedTuple

import sqlglot
from sqlglot import exp

# SQLGlot logs every DuckDB -> ClickHouse list index shift at INFO: noise in a report's log.
logging.getLogger("sqlglot").setLevel(logging.WARNING)

# The most query-tree nodes ClickHouse's analyzer may build for one statement (its
# ``max_expanded_ast_elements``, default 500,000), so that no statement takes long to plan: a
# statement over it fails at once ("Query tree is too big") instead of planning for minutes.
# Every detector statement, staged, is at most ~1,300 nodes (EXPLAIN QUERY TREE rows on the
# sample traces; tests/analytics/test_clickhouse_planning.py); context_drift_holders as one
# statement, its CTEs inlined at every mention, was 137,026 nodes and 23.6 s of planning. A
# synthetic chain of CTEs read twice each planned 0.6 CPU-s at 3,246 nodes, 1.1 at 6,510.
MAX_QUERY_TREE = 5_000

# Settings every translated statement runs with (appended as its SETTINGS clause).
SETTINGS = {
    "join_use_nulls": 1,
    "group_by_use_nulls": 1,
    "aggregate_functions_null_for_empty": 1,
    "enable_named_columns_in_function_tuple": 1,
    "session_timezone": "'UTC'",
    "allow_experimental_analyzer": 1,
    # A column, not a SELECT alias of the same name, inside expressions (DuckDB's scoping).
    "prefer_column_name_to_alias": 1,
    # CTEs DuckDB materializes (AS MATERIALIZED) are computed once (else inlined per reference)
    "enable_materialized_cte": 1,
    # a stage's temporary table keeps the types of its SELECT (constants are LowCardinality)
    "allow_suspicious_low_cardinality_types": 1,
    # ClickHouse 26.9's query condition cache (on by default) gave wrong answers from the second
    # run of a statement on: constraint_ledger on a random span set found 16 rows, then 0 (with
    # join runtime filters: enable_join_runtime_filters = 0 also avoided it)
    "use_query_condition_cache": 0,
    # planning bounded (see MAX_QUERY_TREE); analytics.engine names the statement that hits it
    "max_expanded_ast_elements": MAX_QUERY_TREE,
}

# DuckDB list columns of ``spans`` -> their NULL flag in ClickHouse's ``spans``.
LIST_NULL_COLUMNS = {
    name: f"{name}_null"
    for name in (
        "constraints_ledger",
        "constraints_carried",
        "constraints_waived",
        "waiver_reasons",
        "acceptance_constraint_ids",
    )
}

_CH_TYPES = {
    "TEXT": "String",
    "VARCHAR": "String",
    "TIMESTAMP": "DateTime64(6)",
    "DATETIME": "DateTime64(6)",
    "BIGINT": "Int64",
    "INT": "Int32",
    "INTEGER": "Int32",
    "DOUBLE": "Float64",
    "BOOLEAN": "Bool",
    "UBIGINT": "UInt64",
}
_ARRAY_FUNCTIONS = {
    exp.ArraySort: "arraySort",
    exp.Flatten: "arrayFlatten",
    exp.ArrayToString: "arrayStringConcat",
}
_RENAMED = {
    "list_intersect": "arrayIntersect",
    "list_position": "indexOf",
    "suffix": "endsWith",
    "json_valid": "isValidJSON",
    "epoch_us": "toUnixTimestamp64Micro",
    "contains": "position",
}


class TranslationError(ValueError):
    """A DuckDB construct this module cannot express in ClickHouse."""


def ch_type_of(value: Any) -> str:
    """The ClickHouse type of a parameter given without a cast, from its Python value."""
    if isinstance(value, bool):
        return "Bool"
    if isinstance(value, int):
        return "Int64"
    if isinstance(value, float):
        return "Float64"
    if isinstance(value, datetime | date):
        return "DateTime64(6)"
    if isinstance(value, list | tuple):
        inner = [item for item in value if item is not None]
        return f"Array({ch_type_of(inner[0]) if inner else 'String'})"
    return "String"


def _ch_type(data_type: exp.DataType) -> str:
    name = data_type.this.name if hasattr(data_type.this, "name") else str(data_type.this)
    if data_type.is_type(exp.DataType.Type.ARRAY):
        return f"Array({_ch_type(data_type.expressions[0])})"
    sql = data_type.sql("duckdb").upper()
    for key, value in _CH_TYPES.items():
        if sql == key or name == key:
            return value
    raise TranslationError(f"no ClickHouse type for parameter cast {sql}")


def _nullable(ch_type: str) -> str:
    return ch_type if ch_type.startswith(("Array(", "Nullable(")) else f"Nullable({ch_type})"


def _code_only(sql: str) -> str:
    """``sql`` without comments (SQLGlot would carry them into odd places)."""
    out, i, n = [], 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch == "'":
            j = i + 1
            while j < n and not (sql[j] == "'" and (j + 1 >= n or sql[j + 1] != "'")):
                j += 2 if sql[j] == "'" else 1
            out.append(sql[i : j + 1])
            i = j + 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _fn(name: str, *args: exp.Expression) -> exp.Anonymous:
    return exp.Anonymous(this=name, expressions=list(args))


def _raw(text: str) -> exp.Var:
    return exp.var(text)


def _lambda(body: exp.Expression, *names: str) -> exp.Lambda:
    return exp.Lambda(this=body, expressions=[exp.to_identifier(name) for name in names])


def _sorted_list(value: exp.Expression, keys: list[exp.Expression], condition: exp.Expression | None):
    """``list(value ORDER BY keys)``: groupArray of (keys, value) tuples sorted by the keys."""
    pair = _fn("tuple", _fn("tuple", *keys), value)
    gathered = _fn("groupArrayIf", pair, condition) if condition is not None else _fn("groupArray", pair)
    by_key = _fn("arraySort", _lambda(_raw("__p.1"), "__p"), gathered)
    return _fn("arrayMap", _lambda(_raw("__p.2"), "__p"), by_key)


def _list_agg(node: exp.ArrayAgg, condition: exp.Expression | None = None) -> exp.Expression:
    inner = node.this
    if isinstance(inner, exp.Order):
        keys = []
        for ordered in inner.expressions:
            if ordered.args.get("desc"):
                raise TranslationError("list(... ORDER BY ... DESC) is not translated")
            keys.append(ordered.this)
        return _sorted_list(inner.this, keys, condition)
    if isinstance(inner, exp.Distinct):
        value = inner.expressions[0]
        return (
            _fn("groupUniqArrayIf", value, condition)
            if condition is not None
            else _fn("groupUniqArray", value)
        )
    return _fn("groupArrayIf", inner, condition) if condition is not None else _fn("groupArray", inner)


def _is_predicate(node: exp.Expression) -> bool:
    if isinstance(node, exp.Paren):
        return _is_predicate(node.this)
    if isinstance(node, exp.Coalesce):
        return any(_is_predicate(arg) for arg in [node.this, *node.expressions])
    return isinstance(
        node,
        exp.EQ | exp.NEQ | exp.GT | exp.GTE | exp.LT | exp.LTE | exp.Is | exp.Not | exp.And | exp.Or
        | exp.In | exp.Like | exp.ILike | exp.NullSafeEQ | exp.NullSafeNEQ | exp.Exists,
    )  # fmt: skip


def _spans_aliases(select: exp.Select) -> set[str] | None:
    """Names under which ``spans`` is read directly by ``select`` ('' when it is the only source)."""
    sources = []
    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is not None:
        sources.append(from_.this)
    sources += [join.this for join in select.args.get("joins") or []]
    names: set[str] = set()
    for source in sources:
        if isinstance(source, exp.Table) and source.name == "spans":
            names.add(source.alias_or_name)
            if len(sources) == 1:
                names.add("")
    return names or None


def _list_flag(column: exp.Expression) -> exp.Expression | None:
    """The ``<column>_null`` flag of a list column read straight from ``spans``, else None."""
    if not isinstance(column, exp.Column) or column.name not in LIST_NULL_COLUMNS:
        return None
    select = column.find_ancestor(exp.Select)
    aliases = _spans_aliases(select) if select is not None else None
    if not aliases or column.table not in aliases:
        return None
    return exp.column(LIST_NULL_COLUMNS[column.name], table=column.table or None)


def _rewrite(node: exp.Expression, params: dict[str, str]) -> exp.Expression:  # noqa: C901
    """One node's ClickHouse form (see the module docstring); ``params``: parameter -> type."""
    if isinstance(node, exp.Cast) and isinstance(node.this, exp.Placeholder):
        name = node.this.name
        ch_type = _nullable(_ch_type(node.args["to"]))
        params[name] = ch_type
        return _raw("{" + name + ":" + ch_type + "}")
    if isinstance(node, exp.Placeholder) and node.name:
        return _raw("{" + node.name + ":" + params.setdefault(node.name, "String") + "}")
    if isinstance(node, exp.Filter) and isinstance(node.this, exp.ArrayAgg):
        return _list_agg(node.this, node.expression.this)
    if isinstance(node, exp.ArrayAgg):
        return _list_agg(node)
    if isinstance(node, exp.Anonymous):
        name = node.name.lower()
        if name == "hash":
            return _fn("cityHash64", _fn("tuple", *node.expressions))
        if name == "round_even":
            # + 0 turns a rounded -0.0 into 0.0: DuckDB groups 0.0 and -0.0 as one value,
            # ClickHouse as two (goal divergences of 1 - cos just below 0 round to -0.0)
            rounded = _fn("roundBankers", *node.expressions)
            return exp.Paren(this=exp.Add(this=rounded, expression=exp.Literal.number(0)))
        if name == "contains":
            return exp.GT(this=_fn("position", *node.expressions), expression=exp.Literal.number(0))
        if name in _RENAMED:
            return _fn(_RENAMED[name], *node.expressions)
    if isinstance(node, exp.SHA2):
        return _fn("lower", _fn("hex", _fn("SHA256", node.this)))
    if isinstance(node, exp.TimeToUnix):
        return exp.Div(this=_fn("toUnixTimestamp64Micro", node.this), expression=_raw("1e6"))
    if isinstance(node, exp.UnixToTime):
        return _fn("fromUnixTimestamp64Micro", _fn("toInt64", node.this), exp.Literal.string("UTC"))
    if isinstance(node, exp.IntDiv):
        return _fn("intDiv", node.this, node.expression)
    if isinstance(node, exp.LogicalOr):
        return _fn("max", node.this)
    if isinstance(node, exp.LogicalAnd):
        return _fn("min", node.this)
    if isinstance(node, exp.Window) and isinstance(node.this, exp.RegrSlope):
        # covariance / variance with ClickHouse's stable (Welford) forms: x is often epoch
        # seconds, where the plain sums lose digits (DuckDB's regr_slope does not)
        slope = node.this
        covariance, variance = node.copy(), node.copy()
        covariance.set("this", _fn("covarPopStable", slope.expression.copy(), slope.this.copy()))
        variance.set("this", _fn("varPopStable", slope.expression.copy()))
        return exp.Div(this=covariance, expression=_fn("nullIf", variance, exp.Literal.number(0)))
    if isinstance(node, exp.RegrSlope):
        covariance = _fn("covarPopStable", node.expression.copy(), node.this.copy())
        return exp.Div(
            this=covariance,
            expression=_fn("nullIf", _fn("varPopStable", node.expression), exp.Literal.number(0)),
        )
    if isinstance(node, exp.RegexpExtractAll):
        group = node.args.get("group")
        index = int(group.this) if group is not None else 0
        if index == 0:
            return _fn("extractAll", node.this, node.expression)
        groups = _fn("extractAllGroups", node.this, node.expression)
        return _fn("arrayMap", _lambda(_raw(f"__m[{index}]"), "__m"), groups)
    if isinstance(node, exp.RegexpReplace):
        modifiers = node.args.get("modifiers")
        every = modifiers is not None and "g" in modifiers.name
        name = "replaceRegexpAll" if every else "replaceRegexpOne"
        return _fn(name, node.this, node.expression, node.args["replacement"])
    if isinstance(node, exp.JSONExtractScalar):
        path = node.expression
        parts = path.expressions if isinstance(path, exp.JSONPath) else []
        if len(parts) != 2 or not isinstance(parts[1], exp.JSONPathKey):
            raise TranslationError(f"json path {path.sql()} is not translated (only '$.key')")
        key = exp.Literal.string(parts[1].name)
        return exp.If(
            this=_fn("JSONHas", node.this, key),
            true=_fn("JSONExtractString", node.this, key),
            false=exp.Null(),
        )
    for kind, name in _ARRAY_FUNCTIONS.items():
        if isinstance(node, kind):
            args = [node.this, *([node.expression] if node.args.get("expression") else [])]
            return _fn(name, *args)
    if isinstance(node, exp.Length):  # text (lists were renamed array_length before parsing)
        return _fn("lengthUTF8", node.this)
    if isinstance(node, exp.Struct):
        items = [exp.alias_(item.expression, item.this.name) for item in node.expressions]
        return _fn("tuple", *items)
    if (
        isinstance(node, exp.Window)
        and isinstance(node.this, exp.RowNumber)
        and not node.args.get("partition_by")
        and not node.args.get("order")
    ):
        # row_number() OVER () numbers rows as they come: ClickHouse inlines a CTE once per
        # reference, so each copy would number them differently; ordered by the row's content,
        # every copy gives a row the same number (identical rows are interchangeable)
        node.set("order", exp.Order(expressions=[exp.Ordered(this=_fn("cityHash64", exp.Star()))]))
        return node
    if isinstance(node, exp.Window) and isinstance(node.this, exp.Lag | exp.Lead):
        inner = node.this
        inner.set("this", _fn("toNullable", inner.this))
        return node
    if (
        isinstance(node, exp.Window)
        and isinstance(node.this, exp.Anonymous)
        and node.this.name.lower() in ("lag", "lead")
    ):
        args = list(node.this.expressions)
        args[0] = _fn("toNullable", args[0])
        node.this.set("expressions", args)
        return node
    if isinstance(node, exp.EQ) and isinstance(node.expression, exp.Any):
        values = node.expression.this.unnest()
        if isinstance(values, exp.Cast) and isinstance(values.this, exp.Placeholder):
            # ``x = ANY($list)`` -> ``x IN {list}``: SQLGlot's ``has(list, x)`` searches the list
            # per row and skips no granule by an index (docs/scale-out.md section 9); IN builds
            # one set and, like DuckDB, leaves a NULL x out
            return exp.In(this=node.this, field=values)
    if (
        isinstance(node, exp.In)
        and node.expressions
        and not all(isinstance(item, exp.Literal | exp.Null) for item in node.expressions)
    ):
        equal = [exp.EQ(this=node.this.copy(), expression=item) for item in node.expressions]
        return exp.Paren(this=functools.reduce(lambda a, b: exp.Or(this=a, expression=b), equal))
    if isinstance(node, exp.Join) and node.args.get("kind") in ("SEMI", "ANTI") and not node.args.get("side"):
        node.set("side", "LEFT")
        return node
    if isinstance(node, exp.Escape) and isinstance(node.this, exp.Like | exp.ILike):
        if node.expression.name != "\\":
            raise TranslationError("LIKE ... ESCAPE other than a backslash is not translated")
        return node.this
    if isinstance(node, exp.Column) and node.name == "rowid":
        table = node.table or None
        return _fn("cityHash64", exp.column("TraceId", table=table), exp.column("SpanId", table=table))
    if (
        isinstance(node, exp.Column)
        and node.name == "SpanAttributes"
        and not (isinstance(node.parent, exp.Anonymous) and node.parent.name in ("mapKeys", "mapValues"))
    ):
        pair = _fn("tuple", exp.alias_(_raw("__k"), "key"), exp.alias_(_raw("__v"), "value"))
        return _fn(
            "arrayMap",
            _lambda(pair, "__k", "__v"),
            _fn("mapKeys", node.copy()),
            _fn("mapValues", node.copy()),
        )
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        flag = _list_flag(node.this)
        if flag is not None:
            return exp.EQ(this=flag, expression=exp.Literal.number(1))
    if isinstance(node, exp.Coalesce) and _is_empty_list(node.expressions[-1]):
        # A list is never NULL in ClickHouse (no Nullable(Array)): coalesce(list, []) is the list
        # (and ClickHouse would type it a Variant).
        rest = [node.this, *node.expressions[:-1]]
        node = rest[0] if len(rest) == 1 else exp.Coalesce(this=rest[0], expressions=rest[1:])
        if not isinstance(node, exp.Coalesce):
            return node
    if isinstance(node, exp.Coalesce):
        flag = _list_flag(node.this)
        if flag is not None:
            rest = node.expressions
            fallback = rest[0] if len(rest) == 1 else exp.Coalesce(this=rest[0], expressions=rest[1:])
            return exp.If(
                this=exp.EQ(this=flag, expression=exp.Literal.number(0)), true=node.this, false=fallback
            )
    if isinstance(node, exp.Case) and node.args.get("default") is None:
        if any(isinstance(branch.args.get("true"), exp.ArrayDistinct) for branch in node.args["ifs"]):
            node.set("default", exp.Array(expressions=[]))  # no NULL list: an empty one
            return node
    if isinstance(node, exp.Limit) and isinstance(node.expression, exp.Cast | exp.Placeholder):
        # LIMIT $n with n NULL is no limit in DuckDB; ClickHouse wants a number
        node.set("expression", _fn("ifNull", node.expression, _raw("toInt64(9223372036854775807)")))
        return node
    if isinstance(node, exp.Select):
        _zip_unnests(node)
        _boolean_columns(node)
    return node


def _is_empty_list(node: exp.Expression) -> bool:
    if isinstance(node, exp.Cast):
        node = node.this
    return isinstance(node, exp.Array) and not node.expressions


def _walk(node: exp.Expression, params: dict[str, str]) -> exp.Expression:
    """``_rewrite`` every node, parents before children (a rewritten node's children too)."""
    new = node
    for _ in range(16):  # a rewritten node may need a rewrite of its own (each one ends)
        node, new = new, _rewrite(new, params)
        if new is node:
            break
        if node.parent is not None:
            node.replace(new)  # attached, so rewrites below can look at its ancestors
    for key, value in list(new.args.items()):
        if isinstance(value, exp.Expression):
            new.set(key, _walk(value, params))
        elif isinstance(value, list):
            new.set(
                key, [_walk(item, params) if isinstance(item, exp.Expression) else item for item in value]
            )
    return new


def _zip_unnests(select: exp.Select) -> None:
    """Several ``unnest`` in one SELECT walk their lists side by side (DuckDB); ClickHouse's
    ``arrayJoin`` would multiply them, so they become one ``arrayJoin(arrayZip(...))``."""
    found = [(i, e) for i, e in enumerate(select.expressions) if isinstance(e.unalias(), exp.Explode)]
    if len(found) < 2:
        return
    lists = [e.unalias().this for _, e in found]
    joined = exp.alias_(_fn("arrayJoin", _fn("arrayZip", *lists)), "__z")
    for position, (_, e) in enumerate(found):
        element = _fn(
            "tupleElement", joined if position == 0 else _raw("__z"), exp.Literal.number(position + 1)
        )
        e.replace(exp.alias_(element, e.alias_or_name) if e.alias else element)


def _boolean_columns(select: exp.Select) -> None:
    """Predicates selected as columns are Bool, as in DuckDB (ClickHouse: UInt8); a qualified
    column keeps its own name (ClickHouse may name it ``x.col`` in a UNION or subquery)."""
    for item in list(select.expressions):
        inner = item.unalias()
        if isinstance(item, exp.Column) and item.table and not isinstance(item.this, exp.Star):
            item.replace(exp.alias_(item.copy(), item.name))
        elif _is_predicate(inner):
            wrapped = _fn("toBool", inner.copy())
            item.replace(exp.alias_(wrapped, item.alias) if item.alias else wrapped)


_MATERIALIZED = re.compile(r"\bAS\s+NOT\s+MATERIALIZED\s*\(", re.IGNORECASE)
_BY_NAME = re.compile(r"\bUNION\s+ALL\s+BY\s+NAME\b", re.IGNORECASE)
_LEN = re.compile(r"\blen\s*\(", re.IGNORECASE)


def _select_columns(
    select: exp.Expression, ctes: dict[str, exp.Expression], depth: int = 0
) -> list[str] | None:
    """The output column names of ``select`` when they can be known from the statement alone
    (stars of its CTEs expanded), else None."""
    if not isinstance(select, exp.Select) or depth > 16:
        return None
    sources = _sources(select)
    names: list[str] = []
    for item in select.expressions:
        star = (
            item
            if isinstance(item, exp.Star)
            else item.this
            if isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
            else None
        )
        if star is None:
            if not item.alias_or_name:
                return None
            names.append(item.alias_or_name)
            continue
        table = item.table if isinstance(item, exp.Column) else ""
        if not table and len(sources) != 1:
            return None
        source = sources.get(table) if table else next(iter(sources.values()))
        if source is None or source.name not in ctes:
            return None
        inner = _select_columns(ctes[source.name], ctes, depth + 1)
        if inner is None:
            return None
        names += inner
    return names


def _sources(select: exp.Select) -> dict[str, exp.Table]:
    from_ = select.args.get("from_") or select.args.get("from")
    items = ([from_.this] if from_ is not None else []) + [
        join.this for join in select.args.get("joins") or []
    ]
    return {item.alias_or_name: item for item in items if isinstance(item, exp.Table)}


def _expand_join_stars(tree: exp.Expression) -> None:
    """``t.*`` in a SELECT with joins, over a CTE whose columns are known, becomes the columns
    (``t.c AS c``): ClickHouse names a column of ``t.*`` that another joined table also has
    ``t.c``, so a later ``x.c`` would not resolve."""
    ctes = {cte.alias_or_name: cte.this for cte in tree.find_all(exp.CTE)}
    for select in list(tree.find_all(exp.Select)):
        if not select.args.get("joins"):
            continue
        sources = _sources(select)
        for item in list(select.expressions):
            if not (isinstance(item, exp.Column) and isinstance(item.this, exp.Star) and item.table):
                continue
            source = sources.get(item.table)
            if source is None or source.name not in ctes:
                continue
            columns = _select_columns(ctes[source.name], ctes)
            if columns is None:
                continue
            expanded = [exp.alias_(exp.column(name, table=item.table), name) for name in columns]
            position = select.expressions.index(item)
            select.set(
                "expressions", select.expressions[:position] + expanded + select.expressions[position + 1 :]
            )


def _check_by_name(tree: exp.Expression) -> None:
    for union in tree.find_all(exp.Union):
        if union.args.get("by_name"):
            left, right = union.left, union.right
            if isinstance(left, exp.Select) and isinstance(right, exp.Select):
                if left.named_selects != right.named_selects:
                    raise TranslationError("UNION ALL BY NAME of differently ordered columns")
            union.set("by_name", None)


# Tables of the store, qualified with the store's database (``spans`` of ``otel``, ...).
STORE_TABLES = ("spans", "embeddings", "thresholds", "goal_scores", "otel_traces")


def _qualify(tree: exp.Expression, database: str) -> None:
    ctes = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        if table.name in STORE_TABLES and table.name not in ctes and not table.args.get("db"):
            table.set("db", exp.to_identifier(database))


# A stage's table is ``STAGE_PREFIX + <cte>`` in the SQL of a ``StagedQuery``; who runs it replaces
# the prefix with one of its own per run (``analytics.engine``), so concurrent runs do not meet.
STAGE_PREFIX = "_driftscope_stage_"


class StagedQuery(NamedTuple):
    """A statement in steps: each stage's SELECT fills a temporary table the later steps read."""

    stages: tuple[tuple[str, str], ...]  # (temporary table, its SELECT), in order
    sql: str  # the final SELECT
    types: dict[str, str]  # parameter -> ClickHouse type


def _outer_tables(node: exp.Expression, names: set[str]) -> list[exp.Table]:
    """The tables in ``node`` that name one of the CTEs ``names`` of the statement: not qualified,
    and not a CTE of the same name declared by a WITH inside ``node`` (_constraint_cells.sql has
    its own ``cells`` inside the ``cells`` of constraint_drops.sql)."""
    found = []
    for table in node.find_all(exp.Table):
        name = table.name.lower()
        if table.args.get("db") or name not in names:
            continue
        scope: exp.Expression | None = table
        while scope is not None:
            inner = scope.args.get("with_") if isinstance(scope, exp.Query) else None
            if inner is not None and any(cte.alias_or_name.lower() == name for cte in inner.expressions):
                break  # an inner CTE of that name
            scope = None if scope is node else scope.parent
        else:
            found.append(table)
    return found


def _cte_references(node: exp.Expression, names: set[str]) -> list[str]:
    """Names of the CTEs ``node`` reads (each mention once: ClickHouse copies a CTE per mention)."""
    return [table.name.lower() for table in _outer_tables(node, names)]


def _with_ctes(ctes: list[exp.CTE], recursive: bool) -> exp.With | None:
    return exp.With(expressions=ctes, recursive=recursive or None) if ctes else None


def _split_stages(tree: exp.Expression) -> tuple[list[tuple[str, exp.Expression]], exp.Expression]:
    """``tree`` as stages and a final query: every CTE mentioned more than once (not counting a
    recursive CTE's mentions of itself) is computed once, into a temporary table (a stage), and
    read from there. ClickHouse otherwise inlines a CTE at each mention, and a CTE read by CTEs
    that are read more than once is copied once per path: the analyzer resolved ~140,000 query
    tree nodes for the 17 CTEs of context_drift_holders, 20-90 CPU-seconds before any row was read.
    With the stages, each remaining CTE is inlined once. (Marking those CTEs ``AS MATERIALIZED``
    instead, one statement under ``enable_materialized_cte``, does not help: ClickHouse 26.9's
    analyzer still built 137,026 nodes for context_drift_holders and planned for 23.6 s.)"""
    with_ = tree.args.get("with_")
    if with_ is None:
        return [], tree
    ctes = {cte.alias_or_name.lower(): cte for cte in with_.expressions}
    order = list(ctes)
    uses = {
        name: [r for r in _cte_references(cte.this, set(ctes)) if r != name] for name, cte in ctes.items()
    }
    tree.set("with_", None)
    body = tree.copy()  # the statement without its WITH
    tree.set("with_", with_)
    mentions = {name: 0 for name in ctes}
    for name in [r for refs in uses.values() for r in refs] + _cte_references(body, set(ctes)):
        mentions[name] += 1
    hoisted = {name for name in order if mentions[name] > 1}
    if not hoisted:
        return [], tree

    def self_recursive(name: str) -> bool:
        return name in _cte_references(ctes[name].this, {name})

    def inline_closure(refs: list[str]) -> list[str]:
        needed, todo = set(), [r for r in refs if r not in hoisted]
        while todo:
            name = todo.pop()
            if name not in needed:
                needed.add(name)
                todo += [r for r in uses[name] if r not in hoisted]
        return [name for name in order if name in needed]

    def read_stages(node: exp.Expression, keep: str | None = None) -> exp.Expression:
        for table in _outer_tables(node, hoisted):
            name = table.name.lower()
            if name != keep:
                alias = table.alias or table.name
                table.set("this", exp.to_identifier(STAGE_PREFIX + name))
                table.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
        return node

    def query_with(select: exp.Expression, names: list[str], keep: str | None = None) -> exp.Expression:
        parts = []
        for name in names:
            cte = ctes[name].copy()
            cte.set("materialized", None)
            parts.append(read_stages(cte, keep))
        select.set("with_", _with_ctes(parts, any(self_recursive(name) for name in names)))
        return select

    stages = []
    for name in order:
        if name in hoisted:
            names = inline_closure(uses[name]) + [name]
            select = exp.select("*").from_(exp.to_identifier(name))
            stages.append((STAGE_PREFIX + name, query_with(select, names, keep=name)))
    final = query_with(read_stages(body), inline_closure(_cte_references(body, set(ctes))))
    return stages, final


def _settings_clause() -> str:
    return "SETTINGS " + ", ".join(f"{key} = {value}" for key, value in SETTINGS.items())


# The cached translations name the store's database so; each call puts in its own (one
# translation serves every database: the tests use one per test).
_DATABASE = "__driftscope_database__"


def _in_database(text: str, database: str | None) -> str:
    prefix = exp.to_identifier(database).sql(dialect="clickhouse") + "." if database else ""
    return text.replace(_DATABASE + ".", prefix)


@functools.lru_cache(maxsize=1024)
def _translate_staged(
    sql: str, typed: tuple[tuple[str, str], ...]
) -> tuple[tuple[tuple[str, str], ...], str, tuple[tuple[str, str], ...]]:
    if STAGE_PREFIX in sql:
        raise TranslationError(f"{STAGE_PREFIX!r} is reserved for stage tables")
    tree, params = _translated_tree(sql, typed)
    stages, final = _split_stages(tree)
    settings = _settings_clause()
    return (
        tuple((name, f"{select.sql(dialect='clickhouse')}\n{settings}") for name, select in stages),
        f"{final.sql(dialect='clickhouse')}\n{settings}",
        params,
    )


@functools.lru_cache(maxsize=1024)
def _translate(sql: str, typed: tuple[tuple[str, str], ...]) -> tuple[str, tuple[tuple[str, str], ...]]:
    tree, params = _translated_tree(sql, typed)
    return f"{tree.sql(dialect='clickhouse')}\n{_settings_clause()}", params


def _translated_tree(
    sql: str, typed: tuple[tuple[str, str], ...]
) -> tuple[exp.Expression, tuple[tuple[str, str], ...]]:
    if _DATABASE in sql:
        raise TranslationError(f"{_DATABASE!r} is reserved for the store's database")
    text = _code_only(sql)
    text = _MATERIALIZED.sub("AS (", text)
    if re.search(r"\bWITH\s+RECURSIVE\b", text, re.IGNORECASE):  # ClickHouse: not in a recursive WITH
        text = re.sub(r"\bAS\s+MATERIALIZED\s*\(", "AS (", text, flags=re.IGNORECASE)
    text = _LEN.sub("array_length(", text)
    tree = sqlglot.parse_one(text, read="duckdb")
    _check_by_name(tree)
    _expand_join_stars(tree)
    params = dict(typed)
    tree = _walk(tree, params)
    _qualify(tree, _DATABASE)
    return tree, tuple(sorted(params.items()))


def to_clickhouse(
    sql: str, values: dict[str, Any] | None = None, database: str | None = None
) -> tuple[str, dict[str, str]]:
    """ClickHouse SQL for DuckDB ``sql`` and the ClickHouse type of each parameter it binds.

    ``values`` (the parameters to bind) types the ``$name`` placeholders written without a cast.
    The store's tables are qualified with ``database`` when given. Raises ``TranslationError``
    for a construct without a ClickHouse form. One statement, every CTE inlined at each mention:
    analytics runs ``to_clickhouse_staged`` (a detector of many CTEs is slow to plan as one).
    """
    out, params = _translate(sql, _typed(values))
    return _in_database(out, database), dict(params)


def to_clickhouse_staged(
    sql: str, values: dict[str, Any] | None = None, database: str | None = None
) -> StagedQuery:
    """``to_clickhouse`` in stages: each CTE the statement mentions more than once is a stage, a
    SELECT whose rows go into a temporary table (named ``STAGE_PREFIX + <cte>``) that the later
    stages and the final SELECT read instead of the CTE. Same rows as ``to_clickhouse``'s single
    statement, without ClickHouse copying those CTEs at every mention (see ``_split_stages``)."""
    stages, out, params = _translate_staged(sql, _typed(values))
    return StagedQuery(
        tuple((name, _in_database(select, database)) for name, select in stages),
        _in_database(out, database),
        dict(params),
    )


def _typed(values: dict[str, Any] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((key, _nullable(ch_type_of(value))) for key, value in (values or {}).items()))


def _text(value: Any) -> str:
    """A value inside a ClickHouse array or tuple literal (text format, strings quoted)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(_text(item) for item in value) + "]"
    if isinstance(value, datetime):
        value = value.strftime("%Y-%m-%d %H:%M:%S.%f")
    return "'" + _escape(str(value)).replace("'", "\\'") + "'"


def _escape(text: str) -> str:
    """``text`` in ClickHouse's escaped text format (backslash, tab, line breaks, NUL)."""
    return text.translate(_ESCAPES)


_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"})


def format_param(value: Any) -> str:
    """``value`` in ClickHouse's text format for a query parameter (``param_<name>`` of the HTTP
    interface, chdb's ``params``): NULL is ``\\N``, a string is itself, a list an array literal."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, list | tuple):
        return _text(list(value))
    return _escape(str(value))
