"""A tracking server that lets in only who it should: `make mlflow-server MLFLOW_AUTH=1`, and
credentials checked before anything is measured.

One real `mlflow server --app-name basic-auth` for the module (its start costs ~15-30 s here), with
users made once through its REST API: alice may write to experiment `kvpipe`, bob only reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from paused_at import kvpipe_paused_at, wait_until_paused

from kvpipe import cli
from kvpipe.errors import KvpipeError
from kvpipe.record import auth, server

from conftest import REPO, kvpipe_here, mlflow_server

ADMIN = ("admin", "Admin-Passw0rd-for-tests")
ALICE = ("alice", "Alice-Passw0rd-secret-4711")  # EDIT on experiment kvpipe
BOB = ("bob", "Bob-Passw0rd-for-tests")  # the server's default, READ
MAKE_SERVER = ["make", "-s", "-C", str(REPO), "mlflow-server"]
JOB = ["model=tiny_random", "workload.max_new_tokens=3", "workload.warmup=0", "quality=off", "workload.prompts=[Hi.]"]


def refused_401(url: str) -> str:
    return (
        f"kvpipe: error: tracking.uri={url}: the server refused these credentials (HTTP 401); "
        "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
    )


def refused_403(url: str, user: str, experiment: str = "kvpipe") -> str:
    return (
        f"kvpipe: error: tracking.uri={url}: user '{user}' may not write to experiment '{experiment}' "
        "(HTTP 403); ask the server's admin for EDIT on it"
    )


# --- the server's command, without starting one ------------------------------------------------------


def test_a_host_beyond_loopback_without_auth_is_refused_in_one_line(tmp_path):
    proc = subprocess.run(
        [*MAKE_SERVER, "MLFLOW_HOST=0.0.0.0", f"MLFLOW_DIR={tmp_path}/store"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("kvpipe: error: ")]
    assert "MLFLOW_HOST=0.0.0.0" in line and "MLFLOW_AUTH=1" in line
    assert not (tmp_path / "store").exists()  # refused before anything is made


def test_the_ui_beyond_loopback_is_refused_in_one_line_naming_the_authenticated_server(tmp_path):
    with pytest.raises(
        KvpipeError, match=r"^MLFLOW_HOST=0\.0\.0\.0: `make ui` has no login.*make mlflow-server MLFLOW_AUTH=1"
    ):
        server.ui_command("0.0.0.0", 5000, tmp_path)
    argv = server.ui_command("127.0.0.1", 5000, tmp_path)
    assert argv[2:4] == ["mlflow", "ui"] and argv[-1] == f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"


def test_loopback_needs_no_auth(tmp_path):
    argv, env = server.server_command("127.0.0.1", 5000, tmp_path, auth=False)
    assert "--app-name" not in argv and "MLFLOW_AUTH_CONFIG_PATH" not in env


def test_auth_needs_the_admin_password_on_the_first_start(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_PASSWORD", raising=False)
    with pytest.raises(KvpipeError, match="set MLFLOW_AUTH_ADMIN_PASSWORD.*there is no default"):
        server.server_command("0.0.0.0", 5000, tmp_path / "store", auth=True)
    assert not (tmp_path / "store").exists()


def test_auth_writes_its_config_once_beside_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_AUTH_ADMIN_PASSWORD", ADMIN[1])
    monkeypatch.delenv("MLFLOW_FLASK_SERVER_SECRET_KEY", raising=False)
    argv, env = server.server_command("0.0.0.0", 5000, tmp_path, auth=True)
    assert argv[argv.index("--app-name") + 1] == "basic-auth"
    ini = Path(env["MLFLOW_AUTH_CONFIG_PATH"])
    assert ini == (tmp_path / "basic_auth.ini").resolve()
    assert f"database_uri = sqlite:///{(tmp_path / 'basic_auth.db').resolve()}\n" in ini.read_text()
    assert "default_permission = READ\n" in ini.read_text()
    assert "auth_cache_ttl_seconds = 300\n" in ini.read_text()  # a login hashed once per 5 minutes, not per request
    assert ADMIN[1] not in ini.read_text()  # the password stays in the environment
    secret = tmp_path / ".flask_secret_key"
    assert env["MLFLOW_FLASK_SERVER_SECRET_KEY"] == secret.read_text() and secret.stat().st_mode & 0o077 == 0
    ini.write_text(ini.read_text().replace("READ", "EDIT"))  # the admin's own edit is kept
    _, again = server.server_command("0.0.0.0", 5000, tmp_path, auth=True)
    assert "default_permission = EDIT" in ini.read_text()
    assert again["MLFLOW_FLASK_SERVER_SECRET_KEY"] == env["MLFLOW_FLASK_SERVER_SECRET_KEY"]


# --- refusals as one line ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_mlflow_call_becomes_one_line(status, monkeypatch):
    from mlflow.exceptions import MlflowException, get_error_code

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    url = "http://127.0.0.1:5000"
    with pytest.raises(auth.TrackingRefused) as refused:
        with auth.refusals(f"tracking.uri={url}", "experiment 'kvpipe'"):
            raise MlflowException("Permission denied", error_code=get_error_code(status))
    expected = refused_401(url) if status == 401 else refused_403(url, "bob")
    assert f"kvpipe: error: {refused.value}" == expected
    assert refused.value.exit_code == 2


def test_other_mlflow_errors_pass_through_unchanged():
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException, match="boom"):
        with auth.refusals("tracking.uri=http://h", "experiment 'kvpipe'"):
            raise MlflowException("boom")


@pytest.mark.slow  # starts a kvpipe process
def test_credentials_in_the_uri_are_refused_before_hydra_writes_anything(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run(
        [sys.executable, "-m", "kvpipe", *JOB, "tracking=server", "tracking.uri=http://alice:s3cret@127.0.0.1:9"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "kvpipe: error: tracking.uri=http://alice:***@127.0.0.1:9: credentials in the URI would be recorded "
        "with every run; give the URI without them and set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
    )
    assert not (tmp_path / "outputs").exists()


# --- a real basic-auth server ------------------------------------------------------------------------


class Admin:
    """The server's REST API as its admin (MLflow's own admin client imports the whole server app)."""

    def __init__(self, url: str):
        self.url = url

    def call(self, method: str, endpoint: str, **body) -> dict:
        import requests

        response = requests.request(method, self.url + endpoint, json=body, auth=ADMIN, timeout=30)
        response.raise_for_status()
        return response.json()

    def experiment(self, name: str) -> str:
        return self.call("POST", "/api/2.0/mlflow/experiments/create", name=name)["experiment_id"]

    def grant(self, user: str, experiment_id: str, permission: str) -> None:
        grant = {"username": user, "resource_type": "experiment", "resource_id": experiment_id}
        self.call("POST", "/api/3.0/mlflow/users/permissions/grant", **grant, permission=permission)

    def revoke(self, user: str, experiment_id: str) -> None:
        grant = {"username": user, "resource_type": "experiment", "resource_id": experiment_id}
        self.call("POST", "/api/3.0/mlflow/users/permissions/revoke", **grant)


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """`make mlflow-server MLFLOW_AUTH=1` on loopback, its store in a temp dir; alice may write to
    experiment kvpipe, bob only reads. Stopped after the module."""
    env = {**os.environ, "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN[1]}
    with mlflow_server(tmp_path_factory.mktemp("auth_server"), "MLFLOW_AUTH=1", env=env) as url:
        admin = Admin(url)
        for user, password in (ALICE, BOB):
            admin.call("POST", "/api/2.0/mlflow/users/create", username=user, password=password)
        admin.grant(ALICE[0], admin.experiment("kvpipe"), "EDIT")
        yield SimpleNamespace(url=url, admin=admin)


def as_user(credentials: tuple[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING_", "HYDRA_FULL_ERROR"))}
    if credentials:
        env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"] = credentials
    return {**env, "PYTHONUNBUFFERED": "1"}


def kvpipe(args: list[str], cwd: Path, credentials: tuple[str, str] | None, wait: bool = True, here: bool = False,
           paused: tuple[str, int, Path] | None = None):  # fmt: skip
    """`python -m kvpipe ARGS` with these credentials in the environment, and no others; here=True: in
    this process (conftest.kvpipe_here), for a job the door refuses before it starts any worker;
    paused=(where, call, marker): stopped at that point until the marker is deleted (kill_points)."""
    if here:
        return kvpipe_here(args, cwd, env=as_user(credentials))
    command = [sys.executable, "-m", "kvpipe", *args] if paused is None else kvpipe_paused_at(*paused, args)
    if not wait:
        return subprocess.Popen(command, cwd=cwd, env=as_user(credentials), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
    return subprocess.run(command, cwd=cwd, env=as_user(credentials), capture_output=True, text=True, timeout=600)


def server_runs(url: str, experiment: str = "kvpipe") -> list:
    """The experiment's runs, read as the admin (MLflow's client reads credentials from the environment)."""
    from mlflow.tracking import MlflowClient

    names = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
    before = {name: os.environ.get(name) for name in names}
    os.environ.update(zip(names, ADMIN))
    try:
        client = MlflowClient(url)
        found = client.get_experiment_by_name(experiment)
        return client.search_runs([found.experiment_id]) if found else []
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def landed(auth_server, tmp_path_factory):
    """A joblib sweep of two jobs by alice, her password in the environment only: two worker processes
    that each pass the door and write to the server."""
    launch_dir = tmp_path_factory.mktemp("landed")
    sweep = ["-m", "hydra/launcher=parallel", "tracking=server", f"tracking.uri={auth_server.url}", *JOB,
             "cache=dynamic,static"]  # fmt: skip
    proc = kvpipe(sweep, launch_dir, ALICE)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    run_dirs = sorted(path.parent for path in launch_dir.glob("outputs/multiruns/*/*/*/result.json"))
    assert len(run_dirs) == 2
    return SimpleNamespace(proc=proc, run_dir=run_dirs[0], run_dirs=run_dirs, launch_dir=launch_dir)


@pytest.mark.slow  # a real basic-auth server and a kvpipe job
def test_right_credentials_land_a_finished_run(landed, auth_server):
    runs = {run.info.run_id: run for run in server_runs(auth_server.url)}
    orders = {}
    for run_dir in landed.run_dirs:
        run = runs[json.loads((run_dir / "result.json").read_text())["mlflow_run_id"]]
        assert run.info.status == "FINISHED" and run.data.tags["kvpipe.status"] == "FINISHED"
        orders[run.data.tags["kvpipe.cache.effective"]] = run.data.tags["kvpipe.measured_order"]
    # joblib's workers hold no Hydra app: static's copy of the dynamic cache is composed from the job's sources
    assert orders == {"dynamic": "sequential", "static": "paired_on_node"}


@pytest.mark.slow  # a real basic-auth server and a kvpipe job
def test_a_password_from_the_environment_is_found_nowhere_the_run_went(landed, auth_server):
    password = ALICE[1]
    leaks = [path for path in landed.launch_dir.rglob("*") if path.is_file() and password.encode() in path.read_bytes()]
    assert leaks == []  # result.json, kvpipe.log, .hydra/, the store's own files
    assert password not in landed.proc.stdout + landed.proc.stderr
    run_id = json.loads((landed.run_dir / "result.json").read_text())["mlflow_run_id"]
    (run,) = [run for run in server_runs(auth_server.url) if run.info.run_id == run_id]
    recorded = json.dumps([run.data.params, run.data.tags, run.info.run_name])
    assert password not in recorded and "kvpipe.command" in run.data.tags


def assert_refused_before_the_model_loads(proc: subprocess.CompletedProcess, launch_dir: Path, line: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip() == line
    assert not list(launch_dir.glob("outputs/**/result.json"))
    logs = "".join(path.read_text() for path in launch_dir.glob("outputs/runs/*/*/kvpipe.log"))
    assert "loaded tiny_random" not in logs + proc.stdout


@pytest.mark.slow  # a real basic-auth server and a kvpipe job
@pytest.mark.parametrize("sweep", [[], ["-m", "cache=dynamic,static"]], ids=["job", "sweep"])
def test_a_wrong_password_is_one_line_before_the_model_loads(sweep, auth_server, tmp_path):
    args = [*sweep, *JOB, "tracking=server", f"tracking.uri={auth_server.url}"]
    proc = kvpipe(args, tmp_path, (ALICE[0], "wrong-password"), here=True)
    assert_refused_before_the_model_loads(proc, tmp_path, refused_401(auth_server.url))


@pytest.mark.slow  # a real basic-auth server and a kvpipe job
def test_a_user_without_write_permission_is_one_line_naming_the_experiment(auth_server, tmp_path):
    proc = kvpipe([*JOB, "tracking=server", f"tracking.uri={auth_server.url}"], tmp_path, BOB, here=True)
    assert_refused_before_the_model_loads(proc, tmp_path, refused_403(auth_server.url, "bob"))


@pytest.mark.slow  # a real basic-auth server; the subcommands run in this process
@pytest.mark.parametrize("command", ["compare", "recommend --all", "sync", "advise --trials 1"])
def test_the_subcommands_refuse_a_wrong_password_in_one_line(
    command, auth_server, landed, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ALICE[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong-password")
    monkeypatch.chdir(tmp_path)
    name, *flags = command.split()
    if name == "sync":  # a result kept on disk, as after an outage
        result = json.loads((landed.run_dir / "result.json").read_text())
        result.pop("mlflow_run_id")
        (tmp_path / "job").mkdir()
        (tmp_path / "job" / "result.json").write_text(json.dumps(result))
        flags = ["job"]
    if name == "advise":
        flags += ["tracking=server", *JOB]
    assert cli.subcommand([name, *flags, f"tracking.uri={auth_server.url}"]) == 2
    assert capsys.readouterr().err.strip() == refused_401(auth_server.url)


def runs_under_one_parent(url: str, experiment: str, jobs: int) -> list:
    runs = server_runs(url, experiment)
    (parent,) = [run for run in runs if run.data.tags.get("kvpipe.sweep") == "true"]
    children = [run for run in runs if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == jobs and all(child.info.status == "FINISHED" for child in children)
    return [parent, *children]


@pytest.mark.slow  # a real basic-auth server and a joblib sweep: two worker processes
def test_a_joblib_sweep_with_credentials_lands_every_child_under_one_parent(landed, auth_server):
    parent, *_ = runs_under_one_parent(auth_server.url, "kvpipe", jobs=2)
    assert parent.info.status == "FINISHED"


@pytest.mark.slow  # a real basic-auth server and a kvpipe sweep, its permission revoked as it runs
def test_a_permission_revoked_mid_sweep_keeps_every_result_for_sync(auth_server, tmp_path, monkeypatch, capsys):
    experiment_id = auth_server.admin.experiment("revoked")
    auth_server.admin.grant(ALICE[0], experiment_id, "EDIT")
    sweep = ["-m", "tracking=server", f"tracking.uri={auth_server.url}", "tracking.experiment=revoked", *JOB,
             "cache=dynamic,static", "hydra.sweep.dir=sweep"]  # fmt: skip
    # held before its first job starts (the door passed, the parent started) until the permission is revoked
    marker = tmp_path / "paused_before_the_first_job"
    proc = kvpipe(sweep, tmp_path, ALICE, wait=False, paused=("kvpipe.orchestrate.task:run_sweep_job", 1, marker))
    try:
        wait_until_paused(proc, marker)
        assert (tmp_path / "sweep" / "kvpipe_sweep.json").exists()
        assert not list((tmp_path / "sweep").glob("*/result.json"))  # no job had finished yet
        auth_server.admin.revoke(ALICE[0], experiment_id)
        marker.unlink()
        output, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 1, output[-3000:]
    assert "2 finished, 0 skipped, 0 failed, 2 not in MLflow" in output
    assert "may not write to experiment 'revoked' (HTTP 403)" in output and "kvpipe sync" in output
    results = [json.loads(path.read_text()) for path in sorted((tmp_path / "sweep").glob("*/result.json"))]
    assert [(r["status"], "mlflow_run_id" in r) for r in results] == [("FINISHED", False)] * 2
    auth_server.admin.grant(ALICE[0], experiment_id, "EDIT")  # access back: sync uploads them, under their parent
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ALICE[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ALICE[1])
    monkeypatch.chdir(tmp_path)
    assert cli.subcommand(["sync", "sweep"]) == 0, capsys.readouterr()
    runs_under_one_parent(auth_server.url, "revoked", jobs=2)


def test_the_printed_link_opens_the_kvpipe_experiments_runs_table_not_mlflows_genai_view(tmp_path):
    import sqlite3

    from kvpipe.record.server import RUNS_VIEW, runs_url

    assert runs_url("127.0.0.1", 5000, tmp_path) == f"http://localhost:5000/#/experiments?{RUNS_VIEW}"  # no store yet
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        db.execute("CREATE TABLE experiments (experiment_id INTEGER, name TEXT)")
        db.executemany("INSERT INTO experiments VALUES (?, ?)", [(0, "Default"), (3, "kvpipe")])
    assert (
        runs_url("127.0.0.1", 5000, tmp_path) == "http://localhost:5000/#/experiments/3?workflowType=machine_learning"
    )
