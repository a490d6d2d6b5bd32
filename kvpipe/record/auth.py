"""Credentials checked at the door: a tracking server's 401 and 403 as one line, before anything is measured.

MLflow reads the credentials itself, from MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or
~/.mlflow/credentials); kvpipe never copies them into a config, a record or a log. A URI that
carries them (http://user:password@host) is refused for the same reason: the URI is recorded.

Every call to the store, the door's own look-up and each write of a run alike, goes
through `recording`: one writer at a time, a refusal as that one line, an outage as TrackingUnavailable.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from kvpipe.config import TrackingConfig
from kvpipe.errors import KvpipeError, first_line
from kvpipe.record.store import TrackingUnavailable, open_experiment, resolve_uri, writer_lock
from kvpipe.record.worker import forwarded

REFUSED = (401, 403)
MAY_WRITE = ("EDIT", "MANAGE")  # the permissions that may create runs in an experiment


class TrackingRefused(TrackingUnavailable):
    """The server refused these credentials, or this user's access to the experiment. Mid-sweep,
    like an outage, the results stay on disk for `kvpipe sync`; at the door it is exit status 2."""


def credentials_in(uri: str) -> str | None:
    """The URI with its password masked, if it carries credentials; else None."""
    if not uri.startswith(("http://", "https://")):
        return None
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return None
    return parts._replace(netloc=f"{parts.username or ''}:***@{parts.netloc.rsplit('@', 1)[1]}").geturl()


def check_uri(uri: str, said: str) -> None:
    """Credentials in the URI would be recorded with every run (result.json, the Hydra folder)."""
    masked = credentials_in(uri)
    if masked:
        spelled = said.split("=", 1)[0]
        raise KvpipeError(
            f"{spelled}={masked}: credentials in the URI would be recorded with every run; give the URI "
            "without them and set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
        )


def user() -> str | None:
    from mlflow.utils.credentials import read_mlflow_creds

    return read_mlflow_creds().username


def refusal(status: int, said: str, what: str, action: str, username: str | None = None) -> TrackingRefused:
    """The one line for a 401 or 403: what was refused and how to fix it. `what` names the experiment."""
    if status == 401:
        return TrackingRefused(
            f"{said}: the server refused these credentials (HTTP 401); "
            "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
        )
    who = f"user {username!r}" if username else "this login"
    needed = "EDIT" if action == "write to" else "READ"
    return TrackingRefused(
        f"{said}: {who} may not {action} {what} (HTTP 403); ask the server's admin for {needed} on it"
    )


def status_of(exc: BaseException) -> int | None:
    """401 or 403 when the server refused an MLflow call, else None. Their bodies are plain text, so
    MLflow raises a plain MlflowException whose error code says which; an artifact upload raises
    requests' HTTPError, with the response."""
    from mlflow.exceptions import MlflowException

    if isinstance(exc, MlflowException):
        status = exc.get_http_status_code()
    else:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if status in REFUSED else None


@contextmanager
def refusals(said: str, what: str, action: str = "write to"):
    """Around MLflow calls: a 401 or 403 becomes TrackingRefused, one line; other errors pass."""
    try:
        yield
    except Exception as exc:
        status = status_of(exc)
        if status is None:
            raise
        raise refusal(status, said, what, action, user()) from None


@contextmanager
def recording(tracking: TrackingConfig, launch_dir: Path):
    """Around every write: one writer at a time, an unreachable store as one clear error, and a
    server's refusal (401, 403) as TrackingRefused, one line naming the experiment."""
    from mlflow.exceptions import MlflowException

    uri, said = resolve_uri(tracking.uri, launch_dir, store_dir=tracking.store_dir)
    with writer_lock(tracking, launch_dir):
        try:
            with refusals(said, f"experiment {tracking.experiment!r}"):
                yield open_experiment(tracking, launch_dir)
        except MlflowException as exc:
            raise TrackingUnavailable(f"MLflow at {uri} failed: {first_line(exc)}") from exc


@forwarded  # in a sweep's tracking worker, if it has one (kvpipe.record.worker)
def check_at_door(tracking: TrackingConfig, launch_dir: Path) -> None:
    """Before the model loads: against a tracking server, one authenticated look-up of the experiment
    (made if missing, as every job makes it) and, on a server with MLflow's basic-auth app, whether
    this user may write to it. Raises TrackingRefused, or TrackingUnavailable for a server that does
    not answer (the caller decides: a job measures anyway, its result kept for `kvpipe sync`)."""
    if not tracking.enabled:
        return
    uri, said = resolve_uri(tracking.uri, launch_dir, store_dir=tracking.store_dir)
    if not uri.startswith(("http://", "https://")):
        return  # a file store has no login
    check_uri(uri, said)
    with recording(tracking, launch_dir) as experiment_id:
        username = _basic_auth_user(uri)
        permission = _permission(uri, username, experiment_id) if username else None
        if permission is not None and permission not in MAY_WRITE:
            raise refusal(403, said, f"experiment {tracking.experiment!r}", "write to", username)


def check_credentials(tracking: TrackingConfig, launch_dir: Path) -> TrackingUnavailable | None:
    """check_at_door, for a caller that goes on without the server: a refusal raises, and a server
    that does not answer is returned for the caller to mention (its results wait on disk)."""
    try:
        check_at_door(tracking, launch_dir)
    except TrackingRefused:
        raise
    except TrackingUnavailable as exc:
        return exc
    return None


def _basic_auth_user(uri: str) -> str | None:
    """The logged-in user as MLflow's basic-auth app knows them, or None for an admin (every
    permission) or a server without that app (nothing more to ask)."""
    response = _get(uri, "/api/2.0/mlflow/users/current")
    if response is None:
        return None
    found = response.get("user") or {}
    return None if found.get("is_admin") else found.get("username")


def _permission(uri: str, username: str, experiment_id: str) -> str | None:
    """The user's effective permission on the experiment: their grants, their roles', or the
    server's default_permission."""
    query = {"username": username, "resource_type": "experiment", "resource_id": experiment_id}
    response = _get(uri, "/api/3.0/mlflow/users/permissions/get", params=query)
    return response.get("permission") if response else None


def _get(uri: str, endpoint: str, **kwargs) -> dict | None:
    """GET a JSON answer with MLflow's own credentials and TLS settings; None where the server has
    no such endpoint or answers otherwise (a plain server: 404)."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    response = http_request(get_default_host_creds(uri), endpoint, "GET", max_retries=0, timeout=10, **kwargs)
    if response.status_code in REFUSED:  # as MLflow's own calls raise it: refusals() makes it one line
        from mlflow.exceptions import MlflowException, get_error_code

        raise MlflowException(response.text, error_code=get_error_code(response.status_code))
    try:
        return response.json() if response.ok else None
    except ValueError:
        return None
