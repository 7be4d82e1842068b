"""Streamlit entry script of ``driftscope dashboard``: the dashboard's own script, composed with
the store code it may not import.

``dashboard`` may import only ``analytics``, so it cannot open a ``chdb:PATH`` or
``clickhouse://`` store itself. This script, run by ``streamlit run`` in the child process, hands
it ``driftscope.clickhouse_command.open_for_reading`` (a chdb path gets driftscope's objects,
a resolve pass and a pass of the findings tables first) and then runs ``dashboard/app.py``
unchanged, on every rerun as Streamlit reruns its main script, once
``driftscope.dashboard_gate`` has let the session in (Host header; the token when one is set).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

# `streamlit run` puts this file's folder on sys.path, not the project root.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from dashboard import app_main, datasource  # noqa: E402
from driftscope.clickhouse_command import open_for_reading  # noqa: E402
from driftscope.dashboard_gate import require_access  # noqa: E402

require_access()  # the Host header and, with a token set, the token: before any page runs
datasource.set_store_opener(open_for_reading)
runpy.run_path(app_main, run_name="__main__")
