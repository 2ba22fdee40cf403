"""The operator image, reproduced without a container engine.

The test reads the ``Dockerfile`` and replays its build stage on this machine: it copies the
files the stage ``COPY``s into a scratch ``/src``, runs the stage's install ``RUN`` command
(``hack/image/install.sh``, the one place the install is written) with ``/opt/venv`` and
``/src`` mapped into a temporary directory, then deletes the copied sources, as the final
stage carries only the virtualenv.

In that virtualenv, under the final stage's ``ENV`` (``HOME`` and matplotlib's cache under a
stand-in ``/tmp``; ``PATH`` holding only the virtualenv, so no compiler or ``make``; ``CC``,
``CXX`` and ``CMDSTAN`` unset), it runs the image's own smoke check
``hack/image/smoke.py``: ``prescaler --help``, a Prophet fit and forecast on its bundled
Stan model, and ``prescaler forecast --model prophet``. The virtualenv must come out of it
unchanged, as it would on a read-only root filesystem.

pip's cache (``~/.cache/pip`` unless configured otherwise) is used: a cold run downloads the
dependencies' wheels, a warm one only unpacks them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

# What .dockerignore keeps out of the copied folders (it also keeps out everything the
# Dockerfile does not COPY, which this test never reads).
IGNORED = ("__pycache__", "*.pyc", "*.pyo", "*.egg-info")


@dataclass
class Stage:
    """One ``FROM`` stage of the Dockerfile, with the instructions this test replays."""

    name: str | None
    workdir: str = "/"
    copies: list[tuple[list[str], str]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def parse_dockerfile(text: str) -> list[Stage]:
    """The stages, with WORKDIR, COPY (from the context), RUN (``--`` flags dropped) and ENV."""
    joined = text.replace("\\\n", " ")
    stages: list[Stage] = []
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(name=name))
            continue
        if not stages:
            continue
        stage = stages[-1]
        words = shlex.split(rest)
        flags = [w for w in words if w.startswith("--")]
        args = [w for w in words if not w.startswith("--")]
        if keyword == "WORKDIR":
            stage.workdir = os.path.join(stage.workdir, args[0])
        elif keyword == "COPY" and not any(f.startswith("--from") for f in flags):
            stage.copies.append((args[:-1], args[-1]))
        elif keyword == "RUN":
            stage.runs.append(shlex.join(args))
        elif keyword == "ENV":
            for pair in args:
                key, _, value = pair.partition("=")
                stage.env[key] = value
    return stages


def test_dockerfile_parses_as_the_test_expects() -> None:
    """The replay below relies on this shape; a change to the Dockerfile must show here."""
    build, final = parse_dockerfile(DOCKERFILE.read_text())
    assert build.name == "build"
    assert final.name is None
    assert build.workdir == "/src"
    assert [r for r in build.runs if "install.sh" in r] == [
        "sh hack/image/install.sh /opt/venv /src"
    ]
    assert not final.copies  # the final stage takes only /opt/venv from the build stage
    assert [r for r in final.runs if "smoke.py" in r], "the image build runs the smoke check"
    assert "COPY --from=build /opt/venv /opt/venv" in DOCKERFILE.read_text()
    assert final.env["PATH"] == "/opt/venv/bin:$PATH"
    assert final.env["HOME"].startswith("/tmp")
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    for pattern in ("**/__pycache__", "**/*.py[co]", "**/*.egg-info"):
        assert pattern in ignored


def _copy_context(stage: Stage, root: Path) -> None:
    """Replay the stage's COPY instructions from the repository into ``root`` (its ``/``)."""
    for sources, dest in stage.copies:
        target = root / os.path.normpath(os.path.join(stage.workdir, dest)).lstrip("/")
        for source in sources:
            origin = ROOT / source
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=shutil.ignore_patterns(*IGNORED))
            else:
                into = target / origin.name if dest.endswith("/") else target
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, into)


def _snapshot(tree: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(tree)): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in tree.rglob("*")
    }


def test_image_install_fits_prophet_without_a_compiler(tmp_path: Path) -> None:
    build, final = parse_dockerfile(DOCKERFILE.read_text())
    root = tmp_path / "root"  # stands in for the image's /
    src, venv, tmp = root / "src", root / "opt" / "venv", root / "tmp"
    tmp.mkdir(parents=True)  # the final stage's /tmp: an emptyDir in the chart

    def mapped(value: str) -> str:
        return str(root) + value if value.startswith("/") else value

    # Build stage: the COPYs, then the install RUN, with the build stage's ENV.
    _copy_context(build, root)
    (install,) = [r for r in build.runs if "install.sh" in r]
    command = [mapped(word) for word in shlex.split(install)]
    env = {**os.environ, **build.env, "PYTHON": sys.executable}
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_NO_CACHE_DIR"):
        env.pop(name, None)
    done = subprocess.run(
        command,
        cwd=mapped(build.workdir),
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert done.returncode == 0, f"install failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    shutil.rmtree(src)  # the final stage has no source tree

    # Final stage: its ENV, with PATH reduced to the virtualenv (the host's /usr/bin has
    # compilers; the slim base has none).
    run_env = {key: mapped(value) for key, value in final.env.items()}
    run_env["PATH"] = str(venv / "bin")
    run_env["TMPDIR"] = str(tmp)
    run_env["LANG"] = "C.UTF-8"  # set by the python base image
    assert not ({"CC", "CXX", "CMDSTAN"} & run_env.keys())
    python = venv / "bin" / "python"
    assert not (venv / "bin" / "gcc").exists()

    where = subprocess.run(
        [
            str(python),
            "-c",
            "import prescaler, prescaler_forecast, prophet; "
            "print(prescaler.__file__, prescaler_forecast.__file__, prophet.__file__)",
        ],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert where.returncode == 0, where.stderr
    for module_file in where.stdout.split():
        assert Path(module_file).is_relative_to(venv), f"{module_file} is outside the venv"

    before = _snapshot(venv)
    smoke = subprocess.run(
        [str(python), str(ROOT / "hack" / "image" / "smoke.py")],
        cwd=tmp,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert smoke.returncode == 0, f"smoke check failed:\n{smoke.stdout}\n{smoke.stderr[-5000:]}"
    assert "smoke: ok" in smoke.stdout
    after = _snapshot(venv)
    changed = sorted(set(before.items()) ^ set(after.items()))
    assert not changed, f"the run wrote into the virtualenv (read-only in the image): {changed}"
    assert not (Path(run_env["HOME"]) / ".cmdstan").exists(), "cmdstanpy tried to install CmdStan"
