"""`tfrun ui`: a web page of every box's jobs, their logs and loss curves, served on 127.0.0.1 to its user alone.

On top of the client library and nothing else: boxes.py asks each box through `AsyncClient` (the same
connections and keepers as every verb), feeds.py follows what the open pages show once however many tabs
there are, auth.py admits the user who started it and no one else, server.py serves the pages (static/, with
uPlot vendored) and their server-sent events. Nothing listens on a box. Only `tfrun ui` imports this
package, and with it aiohttp.
"""
