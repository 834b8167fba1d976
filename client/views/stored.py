"""`tfrun checkpoints` for a job with object storage: each checkpoint, whether it is on the box, and what its
upload came to; then where the job stores, and what keeps its uploads back, in one line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .render import Cell, print_table, when
from .render import size as shown_size
from .styled import Styled

if TYPE_CHECKING:
    from tfrun.protocol.storage import StoredReply, StoredState

    from .styled import Output

_STYLE = {"stored": "green", "waiting": "yellow", "gone": "red"}


def stored_table(reply: StoredReply, out: Output, box_known: bool = True) -> None:
    """The table, then the stored folder and any problem. Without `box_known` (the box did not answer and
    this is storage alone), ON BOX says "?"."""
    if not reply.checkpoints:
        out.write("no checkpoints", style="dim")
    else:
        body = [_row(state, box_known) for state in reply.checkpoints]
        header = ("CHECKPOINT", "STEP", "SAVED", "SIZE", "ON BOX") + (("STORAGE",) if reply.place else ())
        print_table(out, header, body, right=("STEP", "SIZE"))
    if reply.place:
        stored = sum(1 for s in reply.checkpoints if s.storage == "stored")
        out.write(Styled(f"stored in {reply.place}: {stored} of {len(reply.checkpoints)}", "dim"))
    if reply.problem:
        since = f" (failing since {when(reply.failing_since)})" if reply.failing_since else ""
        out.write(Styled(f"storage: {reply.problem}{since}; uploads are retried, none is lost", "bold red"))


def _row(state: StoredState, box_known: bool) -> list[Cell]:
    on_box = ("yes" if state.on_box else "no") if box_known else "?"
    step = "-" if state.step is None else str(state.step)
    row: list[Cell] = [state.name, step, when(state.saved_at), shown_size(state.bytes), on_box]
    if state.storage:
        text = state.storage + (f" {when(state.stored_at)[11:]}" if state.stored_at else "")
        if state.error and state.storage != "stored":
            text += f": {state.error}"
        row.append(Styled(text, _STYLE.get(state.storage, "")))
    return row
