"""The credentials, region and endpoint for a bucket, read where AWS's own tools read them, in their order:
the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL_S3,
AWS_ENDPOINT_URL), then the profile (AWS_PROFILE, else `default`) in the shared credentials file
(AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials) and the config file (AWS_CONFIG_FILE, else ~/.aws/config,
whose `endpoint_url` names a server that speaks S3); with no keys in either, the library's own chain (a web
identity token, the container's or the instance's role).

They stay in this process: never on a command line, in a job's environment or in a message. A file they come
from is checked before it is believed (`_read_checked`): on a shared box, a credentials file that others may
write could name their server as the endpoint and receive every checkpoint, and one they may read gives them
the keys. Google Cloud Storage and Azure read their own variables (GOOGLE_APPLICATION_CREDENTIALS, AZURE_*) in
the library.
"""

from __future__ import annotations

import configparser
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .place import Place

DEFAULT_REGION = "us-east-1"
_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


class CredentialsError(Exception):
    """Credentials that cannot be used, in one line that names the file or variable and the fix."""


@dataclass
class Settings:
    """What opens the bucket: the library's settings (secret), and what may be shown of them."""

    config: dict[str, str] = field(default_factory=dict)  # obstore's S3Config keys; holds the keys: never shown
    endpoint: Optional[str] = None  # None: the provider's own
    source: str = "no keys in AWS_* or ~/.aws, so the machine's role"  # where the keys came from, for messages
    secrets: tuple[str, ...] = ()  # texts to mask in any message (the key id and the secret)


def settings_for(place: Place) -> Settings:
    """The settings that open `place`'s bucket; CredentialsError when a file they must come from is unsafe,
    unreadable or lacks the profile asked for."""
    if place.scheme != "s3":
        return Settings(source="the provider's own variables")
    env = os.environ
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    named = "AWS_PROFILE" in env or "AWS_DEFAULT_PROFILE" in env
    creds_path = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials").expanduser()
    config_path = Path(env.get("AWS_CONFIG_FILE") or "~/.aws/config").expanduser()
    creds = _section(creds_path, profile, secret=True)
    config = _section(config_path, profile if profile == "default" else f"profile {profile}", secret=False)
    if named and creds is None and config is None:
        raise CredentialsError(
            f"AWS profile {profile!r} is in neither {creds_path} nor {config_path}: add it, or unset AWS_PROFILE"
        )
    creds, config = creds or {}, config or {}
    out = Settings()
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or config.get("region")
    out.config["region"] = region or DEFAULT_REGION
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or config.get("endpoint_url")
    if endpoint:
        out.endpoint = out.config["endpoint"] = endpoint
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        found = {k: env.get(k.upper(), "") for k in _KEYS}
        out.source = "AWS_ACCESS_KEY_ID in the environment"
    elif creds.get("aws_access_key_id"):
        found, out.source = creds, f"profile {profile} in {creds_path}"
    elif config.get("aws_access_key_id"):
        found, out.source = config, f"profile {profile} in {config_path}"
    else:
        return out
    out.config["access_key_id"] = found.get("aws_access_key_id", "")
    out.config["secret_access_key"] = found.get("aws_secret_access_key", "")
    if found.get("aws_session_token"):
        out.config["session_token"] = found["aws_session_token"]
    out.secrets = tuple(v for k, v in found.items() if k in _KEYS and v)
    return out


def _section(path: Path, name: str, secret: bool) -> Optional[dict[str, str]]:
    """Section `name` of the INI file at `path`, or None where the file or the section is missing."""
    text = _read_checked(path, secret)
    if text is None:
        return None
    parser = configparser.RawConfigParser(default_section="tfrun-no-defaults", strict=False)
    try:
        parser.read_string(text, str(path))
    except configparser.Error as exc:
        raise CredentialsError(f"{path} cannot be read as an AWS file: {str(exc).splitlines()[0]}") from None
    return dict(parser.items(name)) if parser.has_section(name) else None


def _read_checked(path: Path, secret: bool) -> Optional[str]:
    """The file's text if it exists, is a regular file of this user's (or root's) and no one else may write it,
    nor, for the credentials file (`secret`), read it; None where it does not exist. Checked on the opened file
    (fstat), so that nothing can be swapped in between."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CredentialsError(f"{path} cannot be read: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode):
            raise CredentialsError(f"{path} is not a regular file: tfrun reads AWS credentials from a file only")
        if st.st_uid not in (os.getuid(), 0):
            raise CredentialsError(f"{path} belongs to another user (uid {st.st_uid}): tfrun uses only your own")
        if mode & 0o022:
            raise CredentialsError(f"{path} may be written by others (mode {mode:04o}): chmod go-w {path}")
        if secret and mode & 0o044:
            raise CredentialsError(f"{path} may be read by others (mode {mode:04o}): chmod 600 {path}")
        data = f.read(1 << 20)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise CredentialsError(f"{path} is not text") from None
