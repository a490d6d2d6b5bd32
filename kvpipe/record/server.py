"""`make mlflow-server`: the team's tracking server over the default store, with MLflow's basic-auth
app when MLFLOW_AUTH=1.

    python -m kvpipe.record.server --host 127.0.0.1 --port 5000 --dir outputs [--auth 1]
    python -m kvpipe.record.server --ui ...     # `make ui`: the MLflow UI over the store, loopback only

A server beyond loopback without authentication is refused: anyone on that network could read,
write and delete every run. With --auth 1, users and permissions live in DIR/basic_auth.db (its
config, DIR/basic_auth.ini, is written once and then left to the admin to edit); the admin's
password comes from MLFLOW_AUTH_ADMIN_PASSWORD on the first start, and is never written down.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

from kvpipe.errors import KvpipeError, fail
from kvpipe.record.store import ARTIFACT_DIR, DB_FILE

LOOPBACK = ("127.0.0.1", "localhost", "::1")
AUTH_CONFIG = "basic_auth.ini"
AUTH_DB = "basic_auth.db"
SECRET_FILE = ".flask_secret_key"  # CSRF key of the auth app: the same across restarts, never printed
ADMIN_PASSWORD_ENV = "MLFLOW_AUTH_ADMIN_PASSWORD"
SECRET_ENV = "MLFLOW_FLASK_SERVER_SECRET_KEY"

# READ, MLflow's own default: every logged-in user reads the team's runs (compare, recommend), and
# writes only where the admin granted EDIT, or in experiments they create. Without a login nothing
# is readable at all.
AUTH_INI = """\
# Written by `make mlflow-server MLFLOW_AUTH=1` on its first start; edit freely, it is not rewritten.
[mlflow]
default_permission = READ
database_uri = sqlite:///{db}
admin_username = admin
# the admin's password: MLFLOW_AUTH_ADMIN_PASSWORD, on the first start only
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
# A login verified once per 5 minutes, not on every request: each check is a deliberately slow
# password hash (~0.1 s of the server's CPU), and one job makes dozens of requests. Permissions are
# still checked on every request, and a password change or deletion drops the cached login at once.
auth_cache_ttl_seconds = 300
"""


def auth_flag(value: str) -> bool:
    """MLFLOW_AUTH: empty or 0 is off, 1 is on."""
    if value not in ("", "0", "1"):
        raise KvpipeError(f"MLFLOW_AUTH={value!r} is not valid: expected 1 (basic-auth) or nothing")
    return value == "1"


def check_host(host: str, auth: bool) -> None:
    """Beyond loopback, only with a login: otherwise anyone on that network owns every run."""
    if host not in LOOPBACK and not auth:
        raise KvpipeError(
            f"MLFLOW_HOST={host} without authentication would let anyone on that network read, write "
            "and delete every run; add MLFLOW_AUTH=1 MLFLOW_AUTH_ADMIN_PASSWORD=... to require a login"
        )


def auth_config(store_dir: Path) -> Path:
    """DIR/basic_auth.ini, written on the first start with an absolute user database beside the store
    (MLflow's packaged default is relative to the server's working dir)."""
    path = store_dir / AUTH_CONFIG
    if not path.exists():
        path.write_text(AUTH_INI.format(db=(store_dir / AUTH_DB).resolve()))
    return path


def secret_key(store_dir: Path) -> str:
    """$MLFLOW_FLASK_SERVER_SECRET_KEY if set (several servers must share one), else a key kept in
    DIR/.flask_secret_key, made on the first start and readable by its owner only."""
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV]
    path = store_dir / SECRET_FILE
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(32))
    return path.read_text().strip()


def server_command(host: str, port: int, store_dir: Path, auth: bool) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of the MLflow server; checks the host and, with auth, the admin password."""
    check_host(host, auth)
    # Once the admin exists MLflow ignores the password settings; before, it has none to use
    if auth and not (store_dir / AUTH_DB).exists() and not os.environ.get(ADMIN_PASSWORD_ENV):
        raise KvpipeError(
            f"MLFLOW_AUTH=1 needs the admin's password on the first start: set {ADMIN_PASSWORD_ENV} "
            "(12 characters or more); there is no default"
        )
    store_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port), "--workers", "1"]
    argv += ["--backend-store-uri", f"sqlite:///{(store_dir / DB_FILE).resolve()}"]
    argv += ["--artifacts-destination", str((store_dir / ARTIFACT_DIR).resolve())]
    env = dict(os.environ)
    if auth:
        argv += ["--app-name", "basic-auth"]
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(auth_config(store_dir).resolve())
        env[SECRET_ENV] = secret_key(store_dir)
    return argv, env


def ui_command(host: str, port: int, store_dir: Path) -> list[str]:
    """`make ui`: MLflow's UI over the store, which has no login of its own here: loopback only (a team
    that shares runs beyond it runs `make mlflow-server MLFLOW_AUTH=1`)."""
    if host not in LOOPBACK:
        raise KvpipeError(
            f"MLFLOW_HOST={host}: `make ui` has no login, so it listens on loopback only; to share the runs "
            f"beyond it, run MLFLOW_AUTH_ADMIN_PASSWORD=... make mlflow-server MLFLOW_AUTH=1 MLFLOW_HOST={host}"
        )
    argv = [sys.executable, "-m", "mlflow", "ui", "--host", host, "--port", str(port), "--workers", "1"]
    return argv + ["--backend-store-uri", f"sqlite:///{(store_dir / DB_FILE).resolve()}"]


# MLflow 3.17's UI opens every experiment in its GenAI view (traces), whatever the experiment's kind tag
# says, unless the page's address asks for the runs table: kvpipe's links ask for it
RUNS_VIEW = "workflowType=machine_learning"


def runs_url(host: str, port: int, store_dir: Path, experiment: str = "kvpipe") -> str:
    """The UI's page of `experiment`'s runs table (the experiments list where the store has none yet)."""
    import sqlite3

    found = None
    if (store_dir / DB_FILE).is_file():
        try:
            with sqlite3.connect(f"file:{store_dir / DB_FILE}?mode=ro", uri=True) as db:
                found = db.execute("SELECT experiment_id FROM experiments WHERE name = ?", (experiment,)).fetchone()
        except sqlite3.Error:  # a store MLflow has not made its tables in yet
            found = None
    page = f"#/experiments/{found[0]}" if found else "#/experiments"
    return f"http://{'localhost' if host in LOOPBACK else host}:{port}/{page}?{RUNS_VIEW}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvpipe.record.server", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--dir", type=Path, default=Path("outputs"), help="the store: mlflow.db, mlartifacts/")
    parser.add_argument("--auth", default="", help="1: MLflow's basic-auth app (MLFLOW_AUTH)")
    parser.add_argument("--ui", action="store_true", help="the MLflow UI (make ui) rather than the server")
    args = parser.parse_args(argv)
    try:
        if args.ui:
            command, env = ui_command(args.host, args.port, args.dir), dict(os.environ)
        else:
            command, env = server_command(args.host, args.port, args.dir, auth_flag(args.auth))
    except KvpipeError as exc:
        fail(str(exc))
    print(f"kvpipe: the runs, once the server is up: {runs_url(args.host, args.port, args.dir)}", flush=True)
    os.execve(command[0], command, env)  # the server is this process: make's Ctrl-C and kill reach it


if __name__ == "__main__":
    main()
