"""Opening a page in the user's browser without its token on any command line (`tfrun ui --open`, `tfrun
jupyter --open`): every user's `ps` shows a browser's command line."""

from __future__ import annotations

import json
import os
from pathlib import Path

_REDIRECT = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={url}"><title>tfrun</title></head>
<body><p>Opening <a href="{url}">{url}</a>...</p><script>window.location.replace({js});</script></body></html>
"""


def open_page(url: str, keep: bool) -> None:
    """Open `url` in a browser through a redirect page, as Jupyter does: the browser's command line, which
    every user's `ps` shows, names only the page (0600, in a 0700 folder of its own), never the token in the
    URL. The page goes when this command ends, unless it returns at once (`keep`: --detach), when the browser
    may not have read it yet; it then stays, readable by this user alone."""
    import atexit
    import html
    import shutil
    import tempfile
    import webbrowser

    folder = Path(tempfile.mkdtemp(prefix="tfrun-open-"))
    page = folder / "open.html"
    with os.fdopen(os.open(page, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        js = json.dumps(url).replace("<", "\\u003c")  # "</script>" in a URL cannot end the script
        f.write(_REDIRECT.format(url=html.escape(url, quote=True), js=js))
    if not keep:
        atexit.register(shutil.rmtree, folder, True)
    webbrowser.open(page.as_uri())
