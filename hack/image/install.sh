#!/bin/sh
# Install prescaler into a fresh virtualenv: the operator image's install step.
#
#   hack/image/install.sh VENV SRC
#
# VENV must not exist yet; SRC is a copy of the project (pyproject.toml, README.md,
# operator/, forecasting/). The interpreter is $PYTHON (default: python3).
#
# The Dockerfile's build stage RUNs this script and tests/image/test_image_install.py runs
# it too, so the image and its test install the same way. Change the install here, never
# in one of them.
#
# - The project is built into a wheel first, so the venv holds no source tree.
# - Every package is installed from a wheel (--only-binary=:all:): nothing is compiled,
#   neither here nor at run time. Prophet's wheel carries its compiled Stan model and
#   the libtbb it links to; the venv needs only the C++ runtime (libstdc++) of the base.
# - pip is pinned so that the image and the test resolve with the same pip, whichever the
#   base image or the interpreter bundles.
set -eu

if [ "$#" -ne 2 ]; then
    echo "usage: $0 VENV SRC" >&2
    exit 2
fi
venv=$1
src=$2
python=${PYTHON:-python3}
pip_version=26.3

if [ -e "$venv" ]; then
    echo "$0: $venv exists; give a fresh path" >&2
    exit 2
fi

dist=$(mktemp -d)
trap 'rm -rf "$dist"' EXIT

"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --only-binary=:all: "pip==$pip_version"
"$venv/bin/python" -m pip wheel --quiet --no-deps --wheel-dir "$dist" "$src"
"$venv/bin/python" -m pip install --quiet --only-binary=:all: "$dist"/prescaler-*.whl
"$venv/bin/python" -m pip check
