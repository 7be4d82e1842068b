"""docs/security.md lists every limit in the settings table's terms (flag, env var, default)."""

from pathlib import Path

from driftscope.settings import BY_NAME, parse_size

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"

LIMITS = (
    "host",
    "token",
    "allowed_hosts",
    "insecure",
    "max_body_bytes",
    "queue_max_bytes",
    "max_attribute_bytes",
    "max_spans_per_request",
    "max_attributes_per_span",
    "max_items_per_request",
    "header_timeout",
    "body_timeout",
    "max_pending_bytes",
    "decode_workers",
    "retention",
)


def _row(line_start: str) -> str:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith(line_start)]
    assert len(rows) == 1, f"docs/security.md needs exactly one table row starting {line_start!r}"
    return rows[0]


def test_every_limit_is_in_the_security_doc_with_its_env_var_and_default():
    for name in LIMITS:
        setting = BY_NAME[name]
        row = _row(f"| `{setting.flag}` ")
        assert f"`{setting.env}`" in row, (name, row)
        default = "none" if setting.default in (None, False) else str(setting.default)
        parsed = (
            setting.parse(setting.flag, setting.default) if setting.default not in (None, False) else None
        )
        shown = row.split("|")[3]
        assert default in shown or (parsed is not None and _human(setting, parsed) in shown), (name, shown)


def _human(setting, value) -> str:
    """How the doc writes a size default (64 MiB) or a count (100,000)."""
    if setting.parse is parse_size:
        for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if value % size == 0:
                return f"{value // size} {unit}"
    return f"{value:,}" if isinstance(value, int) else str(value)
