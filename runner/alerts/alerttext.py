"""An alert's message in the form each receiver reads best: the plain text that is stored and shown by
`tfrun alerts -v` (and posted to JSON receivers), HTML for mail, CommonMark for Slack and the like.

The stored text is the one source; the other forms are read back from it, so an alert waiting in the outbox
across a restart is sent exactly as it was written. Its layout is small and fixed (runner/alerts/watch.py writes it):

    summary line                         the first line: what happened
    <blank line>                         between blocks
    Label:       value                   a field (a capitalised label, a colon, the value)
    Caption:                             a line ending with a colon introduces what follows
        indented line                    four spaces: a line of a job's output or of numbers, shown verbatim

HTML joins the lines of a text into one unless told otherwise, and apprise derives a mail's text/plain part
from its HTML part; so the HTML is built line for line (a block per line, <pre> for the verbatim lines, a
<br> for each blank line), and both parts keep the text's lines.
"""

from __future__ import annotations

import html
import re

INDENT = "    "
HTML, MARKDOWN = "html", "markdown"  # apprise's names of the formats

_FIELD = re.compile(r"([A-Z][A-Za-z ]{0,23}:)[ ]+(\S.*)")
_FONT = "font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;font-size:14px;line-height:1.45;color:#1f2328"
_PRE = (
    "margin:0;padding:6px 8px;background:#f6f8fa;border-radius:4px;font-family:ui-monospace,Menlo,Consolas,monospace;"
    "font-size:12px;line-height:1.4;white-space:pre-wrap;word-break:break-all"
)
# What would format a line in Markdown or Slack's mrkdwn: `_` and `~` only where they can open or close
# (a path's my_run_3 stays as it is).
_MARKDOWN_SPECIAL = re.compile(r"[\\`*\[\]<>]|(?<!\w)[_~]|[_~](?!\w)")


def render(text: str, form: str) -> str:
    """`text` (an alert's stored message) in `form`, the format its receiver reads: HTML, MARKDOWN, or
    anything else (apprise's "text") for the text as it is."""
    if form == HTML:
        return to_html(text)
    if form == MARKDOWN:
        return to_markdown(text)
    return text


def _blocks(text: str) -> list[list[tuple[bool, list[str]]]]:
    """The text's blocks, each a list of runs: (verbatim, lines), verbatim lines without their indent."""
    blocks = []
    for block in text.strip("\n").split("\n\n"):
        runs: list[tuple[bool, list[str]]] = []
        for line in block.split("\n"):
            verbatim = line.startswith(INDENT)
            if verbatim:
                line = line[len(INDENT) :]
            if runs and runs[-1][0] == verbatim:
                runs[-1][1].append(line)
            else:
                runs.append((verbatim, [line]))
        if runs != [(False, [""])]:
            blocks.append(runs)
    return blocks


def to_html(text: str) -> str:
    """The message as an HTML fragment (styled inline: mail clients drop style sheets), escaped."""
    parts = []
    for number, runs in enumerate(_blocks(text)):
        if number:
            parts.append("<br>")
        for verbatim, lines in runs:
            if verbatim:
                parts.append(f'<pre style="{_PRE}">{html.escape(chr(10).join(lines))}</pre>')
                continue
            for line in lines:
                if not parts:  # the summary
                    parts.append(f'<p style="margin:0;font-size:16px"><strong>{html.escape(line)}</strong></p>')
                    continue
                field = _FIELD.fullmatch(line)
                if field:
                    shown = f"<b>{html.escape(field[1])}</b> {html.escape(field[2])}"
                elif line.endswith(":"):
                    shown = f"<b>{html.escape(line)}</b>"
                else:
                    shown = html.escape(line)
                parts.append(f'<p style="margin:0">{shown}</p>')
    return f'<div style="{_FONT}">{"".join(parts)}</div>'


def to_markdown(text: str) -> str:
    """The message as CommonMark: bold labels, verbatim lines in fenced blocks (Slack shows them as code)."""
    out = []
    for number, runs in enumerate(_blocks(text)):
        lines = []
        for verbatim, run in runs:
            if verbatim:
                longest = max((len(tick) for tick in re.findall(r"`+", "\n".join(run))), default=0)
                fence = "`" * max(3, longest + 1)
                lines += [fence, *run, fence]
                continue
            for line in run:
                field = _FIELD.fullmatch(line)
                if number == 0 and not lines:
                    lines.append(f"**{_markdown_escape(line)}**")
                elif field:
                    lines.append(f"**{_markdown_escape(field[1])}** {_markdown_escape(field[2])}")
                elif line.endswith(":"):
                    lines.append(f"**{_markdown_escape(line)}**")
                else:
                    lines.append(_markdown_escape(line))
        out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def _markdown_escape(text: str) -> str:
    """`text` with the characters that would format it (or start a Slack link) escaped."""
    return _MARKDOWN_SPECIAL.sub(lambda found: "\\" + found[0], text)
