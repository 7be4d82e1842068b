"""Loops and budgets: repeated calls, ping-pong delegation, budget exhaustion, duplicate side effects."""

import streamlit as st

from dashboard import ui

ctx = ui.page_context()
st.title("Loops & budgets")
st.caption("Agents that repeat themselves, bounce work back and forth, run out of steps, or act twice.")

SECTIONS = [
    ("repeated_calls", "Repeated call signatures", "repeated tool calls"),
    ("ping_pong", "Ping-pong cycles", "ping-pong delegation cycles"),
    ("budget_exhaustion", "Budget exhaustions", "step-budget exhaustions"),
    ("duplicate_side_effects", "Duplicate side effects", "duplicate side effects"),
    ("no_progress", "No progress: the same result again and again", "calls without progress"),
]
for name, title, what in SECTIONS:
    st.subheader(title)
    ui.findings_table(ui.load_listed(ctx, name), what, ui.described(ctx, name))
