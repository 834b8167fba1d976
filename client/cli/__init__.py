"""The `tfrun` command: its group, shared options and errors (main.py), the verbs (verbs/), and what several verbs
share (hostoptions.py: `--host`, pools, job addresses; completion.py; logprint.py; poolviews.py; browser.py;
attach.py; daemonconfig.py; diskspace.py; timespec.py). No verb imports another.

Stands on: every other folder of client/.
"""
