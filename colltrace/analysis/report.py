"""The text of findings lives in colltrace.reporters.text; re-exported here for the watchdog,
the commands and the dashboard, which import it from this place."""
from colltrace.reporters.text import (  # noqa: F401
    MAX_CLASSES, PENDING_STATES, ROUTES, activity_lines, activity_text, call_site, classes, format_ranks, frame_text, group_phrase, op_phrase, paragraph,
    located, rank_word, render_report, render_stack_classes, seconds, short_ranks, stack_classes, summarize, user_frames,
    user_location, where,
)
