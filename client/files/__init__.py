"""Files that cross the link: a project's snapshot (snapshot.py) uploaded by content (transfer.py), and where a
pull writes (landing.py: only under the folder asked, through handles that follow no link).

Stands on: views (a progress bar), link, errors.
"""
