"""tfrun, the client, in folders a newcomer reads from the ground up (each imports only the ones before it;
tests/test_layers.py holds the order):

1. errors.py: the one form of an error a person reads
2. config/: the client's own files: its config (the boxes it knows, pools), private files, ~/.ssh/config's block
3. calls/: each request a client sends, as a typed function over the protocol
4. link/: reaching a daemon: this machine's on its socket, a box's over SSH (the keeper, tunnels, forwards)
5. views/: what a person sees: tables, reports, `top`, plots
6. files/: a snapshot uploaded, a pull landed
7. library/: the Python API (`Client`, `AsyncClient`) and what a submit does
8. pools/: many boxes: their members asked at once, where a job goes, a pool's `top`
9. install/: tfrun set up on a box (`hosts install`)
10. ui/: `tfrun ui`, the web view
11. cli/: the `tfrun` command and its verbs
12. __main__.py: `python -m tfrun.client`
"""
