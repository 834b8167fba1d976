"""A job's alerts and checkpoints, which its page shows beside its record (client/ui/feeds.py's JobFeed asks
for them), and an alert as every page shows one: in `tfrun alerts`' and `tfrun checkpoints`' words."""

from __future__ import annotations

from typing import Any

from tfrun.protocol.channel import Channel, RemoteError
from tfrun.protocol.watching import Alert, Delivery

from ..calls import files as file_calls
from ..calls import watching as watch_calls
from ..views import reports
from ..views.render import size, when
from .boxes import Box

JOB_ALERTS = 100  # a job's alerts its page shows


def delivery_shown(delivery: Delivery) -> dict[str, Any]:
    """A delivery as the page says it: its state and target, and `tfrun alerts`' words after them."""
    note, error = reports.delivery_note(delivery)
    return {"state": delivery.state, "target": delivery.target, "note": note, "error": error}


def alert_shown(box: str, alert: Alert) -> dict[str, Any]:
    """An alert as the pages show it: when, which rule, its job (None: the box's own), what it said, its
    deliveries (none: `tfrun alerts`' words for that), and its whole message for who opens it."""
    return {
        "box": box,
        "id": alert.id,
        "at": alert.at,
        "when": when(alert.at),
        "rule": alert.rule,
        "job": alert.job_id,
        "summary": alert.summary,
        "body": alert.body,
        "deliveries": [delivery_shown(delivery) for delivery in alert.deliveries],
        "undelivered": None if alert.deliveries else reports.NO_NOTIFY,
    }


async def job_extras(box: Box, job: int, channel: Channel) -> dict[str, Any]:
    """A job's alerts with their deliveries, and its checkpoints as `tfrun checkpoints` lists them (or why there
    are none to list), on the job feed's connection."""

    async def asking(channel: Channel) -> dict[str, Any]:
        alerts = await watch_calls.alerts(str(job), JOB_ALERTS).on(channel)
        try:
            points, why = reports.checkpoints(await file_calls.files(str(job)).on(channel)), None
        except RemoteError as exc:  # no checkpoint folder (yet): the daemon's words, and the rest of the page
            points, why = [], exc.message
        return {
            "alerts": [alert_shown(box.name, alert) for alert in alerts],
            "checkpoints": [_checkpoint_shown(point) for point in reversed(points)],  # newest first
            "checkpoints_why": why,
        }

    return await box.ask_on(channel, asking)


def _checkpoint_shown(point: reports.Checkpoint) -> dict[str, Any]:
    return {"name": point.name, "step": point.step, "saved": when(point.saved), "size": size(point.size)}
