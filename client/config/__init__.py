"""The client's own files: its config (settings.py: the boxes it knows, pools, the default host), files this
user's alone (privatefiles.py) and the OpenSSH block that names a box in ~/.ssh/config (sshconfig.py).

Stands on: errors.
"""
