"""Reading the index with the standard library's sqlite3 alone (issue 28: ``conclave stats`` spent more time
importing sqlite-utils, which imports numpy, than in its SQL).

A reader needs sqlite-utils only to create the index or to apply a pending migration; :func:`open_current`
opens an index that needs neither, read-only, and says ``None`` otherwise (the caller then connects through
``sqlite_index.connect``, which migrates). ``migrations.py`` registers exactly :data:`MIGRATION_NAMES`
(tests/test_index_reader.py checks it), so a new migration is listed here too.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

#: every migration of the index, in order
MIGRATION_NAMES = (
    "m001_core_tables", "m002_search", "m003_views", "m004_stats", "m005_origin", "m006_round_status",
    "m007_eval_results", "m008_quality_claims_evidence_checks", "m010_quality_groupthink",
    "m011_store_exit_and_context", "m012_safety_checks", "m013_providers_cache_tokens",
    "m015_views_synthesis_coverage", "m016_eval_quality_protocol", "m017_running_rounds", "m018_vote_gate",
    "m019_followup_parent", "m020_calls_by_start", "m021_dashboard_covering", "m022_verification_covering",
    "m023_artifact_gist", "m024_verification_counted", "m025_dissent_and_cost_reads",
    "m026_gist_without_row_fields", "m027_groupthink_order", "m028_model_and_verification_rollups",
    "m029_child_tables_in_key_order", "m030_no_artifact_type_index", "m031_filter_rollup", "m032_page_counts",
    "m033_early_termination_decisions", "m034_dissent_rollup",
)

#: migrations that only add an index for speed or drop what no reader reads: a reader of an index it may not
#: write (a read-only home) reads the same rows without them
READ_OPTIONAL = ("m017_running_rounds", "m020_calls_by_start", "m021_dashboard_covering",
                 "m022_verification_covering", "m024_verification_counted", "m025_dissent_and_cost_reads",
                 "m027_groupthink_order", "m029_child_tables_in_key_order", "m030_no_artifact_type_index",
                 "m031_filter_rollup", "m032_page_counts", "m033_early_termination_decisions",
                 "m034_dissent_rollup")

#: the migration set sqlite-utils records the index's migrations under (``Migrations("conclave.index")``)
MIGRATION_SET = "conclave.index"
BUSY_TIMEOUT_S = 30.0


def open_current(path: Path, timeout: float = BUSY_TIMEOUT_S) -> sqlite3.Connection | None:
    """A read-only sqlite3 connection to the index at ``path`` when it exists and every migration a reader needs
    is applied; ``None`` when it is missing, needs migrating, or cannot be opened so (the caller's full connect
    then says why, or migrates)."""
    if not path.is_file():
        return None
    conn = None
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout,
                               isolation_level=None)
        applied = {name for (name,) in conn.execute(
            "select name from _sqlite_migrations where migration_set = ?", [MIGRATION_SET])}
    except sqlite3.Error:
        if conn is not None:
            conn.close()
        return None
    if set(MIGRATION_NAMES) - set(READ_OPTIONAL) - applied:
        conn.close()
        return None
    return conn
