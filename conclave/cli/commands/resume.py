"""``conclave resume [ID]``: continue a consultation that was killed or interrupted (default: the latest one).

Completed rounds are restored from the journal, neither re-run nor re-billed; the recorded configuration is
reused as is. Exit codes as for a consultation: 0 complete, 1 partial/aborted, 130 interrupted.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from conclave.cli.commands.arguments import CommandParser
from conclave.cli.commands.logs import resolve_id
from conclave.config.settings import check_against_plugins
from conclave.engine.entry import run_from_cli
from conclave.errors import UsageError
from conclave.plugin_manager import get_plugins
from conclave.store.paths import StoreLayout, default_home
from conclave.store.recorder import Recorder
from conclave.store.resume_points import latest_interrupted, load_resume_point

if TYPE_CHECKING:
    from conclave.store.resume_points import ResumePoint


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave resume", description=__doc__)
    parser.add_argument("id", nargs="?", help="consultation id or unique prefix (default: the latest interrupted)")
    args = parser.parse_args(argv)


    layout = StoreLayout(default_home())
    cid = resolve_id(layout, args.id) if args.id else latest_interrupted(layout)
    if cid is None:
        raise UsageError(f"no interrupted consultation to resume in {layout.journal_dir}")
    point = load_resume_point(layout, cid)
    print(f"conclave: resuming {cid} ({restored_summary(point)})", file=sys.stderr)
    return _continue(layout, point)


def restored_summary(point: ResumePoint) -> str:
    """What the resumed run does not ask again: whole rounds, and the answers an interrupted round already got."""
    summary = f"restored rounds: {', '.join(map(str, point.restored_rounds)) or 'none'}"
    interrupted = point.resume_from.get("interrupted") or {}
    agents = [a["agent"] for a in interrupted.get("artifacts") or [] if a.get("agent")]
    if agents:
        summary += f"; answers reused from round {interrupted.get('round_number')}: {', '.join(agents)}"
    return summary


def _continue(layout: StoreLayout, point: ResumePoint) -> int:
    check_against_plugins(point.settings, get_plugins())
    recorder = Recorder(layout.home)
    try:
        recorder.resume(point.consultation_id, {
            "restored_rounds": point.restored_rounds, "spent": point.resume_from["spent"],
            "from_seq": point.next_seq,
        })
        recorder.flush()
        return run_from_cli(
            point.settings, recorder=recorder, verb="resumed", resume_from=point.resume_from,
            consultation_id=point.consultation_id, first_seq=point.next_seq + 1,
        )
    finally:
        recorder.close()
