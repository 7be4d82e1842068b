"""The Streamlit dashboard, its Plotly figures, the data-source client and report rendering.

``app_main`` is the path of the Streamlit entry script (``streamlit run`` takes a file path).
"""

from pathlib import Path

app_main = str(Path(__file__).with_name("app.py"))

__all__ = ["app_main"]
