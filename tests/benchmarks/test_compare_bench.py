"""The compare benchmark's crew (benchmarks/compare.py): every run healthy but the newest, whose
injected failing call and unknown tool the comparison finds."""

from benchmarks.compare import run_compare_bench
from benchmarks.report import check_targets


def test_the_compare_bench_times_a_run_against_every_other_run_of_its_crew(tmp_path):
    result = run_compare_bench(tmp_path, spans=3000, calls=100, repeats=1)
    assert result["spans"] == 3000 and result["runs"] == 30 and result["baseline_runs"] == 29
    assert result["baseline_from"] == "tables" and result["tables_s"] is not None
    # The failing call is the 61st span (calls // 2 + 10), the unknown tool two spans later.
    assert result["departure"]["pos"] == 60 and result["departure"]["step"].endswith("(error)")
    assert "new writer drop_table" in result["differences"]
    assert result["median_s"] > 0 and set(result["parts_s"]) >= {"baseline_sql", "departure"}
    row = next(r for r in check_targets({"compare": result}) if r["target"].startswith("run comparison"))
    assert row["measured"] == result["median_s"] and "29 healthy runs at 3,000 spans" in row["target"]
