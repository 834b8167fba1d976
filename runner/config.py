"""The daemon's settings: `$TFRUN_HOME/config.toml`, overridden by environment variables.

checkpoint_root = "/mnt/checkpoints"   # TFRUN_CHECKPOINT_ROOT; each job gets a folder under it
job_python = "/usr/bin/python3"        # TFRUN_JOB_PYTHON; runs .py scripts unless --python says
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tfrun.paths import Layout

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on the 3.9 and 3.10 the daemon supports
    import tomli as tomllib


class ConfigError(Exception):
    """The config file cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Config:
    checkpoint_root: Path
    job_python: Optional[str] = None

    @classmethod
    def load(cls, layout: Layout) -> Config:
        raw: dict[str, Any] = {}
        if layout.config_file.exists():
            try:
                raw = tomllib.loads(layout.config_file.read_text())
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"{layout.config_file}: {exc}") from None
        root = os.environ.get("TFRUN_CHECKPOINT_ROOT") or raw.get("checkpoint_root")
        python = os.environ.get("TFRUN_JOB_PYTHON") or raw.get("job_python")
        for key, value in (("checkpoint_root", root), ("job_python", python)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{layout.config_file}: {key} must be a string")
        return cls(
            checkpoint_root=Path(root).expanduser().absolute() if root else layout.default_checkpoint_root,
            job_python=python or None,
        )
