#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu 22.04).
# Ubuntu's python3 (3.10) runs Gradescope's own harness and is left as it is: the course gets
# Python 3.11 beside it (Ubuntu's python3.11 package, or the deadsnakes PPA's where Ubuntu's
# is missing or a pre-release), a virtual environment of its own with the course's pinned
# packages (torch's CPU wheel: no CUDA), the unprivileged user the students' code runs as,
# and the assignment released once. Settings, for running it elsewhere (their defaults):
#   WORKBOOK_PYTHON        a Python 3.11 to use instead of finding or installing one
#   WORKBOOK_VENV          the virtual environment (/opt/workbook/venv; every user must read it)
#   WORKBOOK_STUDENT_USER  the students' user (workbook-student)
#   WORKBOOK_TORCH_INDEX   where torch's CPU wheel comes from (https://download.pytorch.org/whl/cpu;
#                          empty: the ordinary index, where pip's configuration points)
set -euo pipefail
SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${WORKBOOK_VENV:-/opt/workbook/venv}"
STUDENT="${WORKBOOK_STUDENT_USER:-workbook-student}"
TORCH_INDEX="${WORKBOOK_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
export DEBIAN_FRONTEND=noninteractive

# a released Python 3.11 (3.11.0 or later) that can make a virtual environment
is_311() {
  "$1" -c 'import sys, ensurepip, venv; sys.exit(not (sys.version_info[:2] == (3, 11) and sys.version_info.releaselevel == "final"))' 2>/dev/null
}

PYTHON="${WORKBOOK_PYTHON:-}"
if [ -z "$PYTHON" ]; then
  if command -v python3.11 >/dev/null 2>&1 && is_311 "$(command -v python3.11)"; then
    PYTHON="$(command -v python3.11)"
  else
    apt-get update -qq
    apt-get install -y -qq python3.11 python3.11-venv >/dev/null 2>&1 || true
    if ! is_311 /usr/bin/python3.11; then
      apt-get install -y -qq software-properties-common >/dev/null
      add-apt-repository -y ppa:deadsnakes/ppa
      apt-get update -qq
      apt-get install -y -qq python3.11 python3.11-venv >/dev/null
    fi
    PYTHON=/usr/bin/python3.11
  fi
fi
is_311 "$PYTHON" || { echo "setup.sh: $PYTHON is not a Python 3.11 that can make a virtual environment" >&2; exit 1; }
echo "setup.sh: Python $("$PYTHON" -c 'import platform; print(platform.python_version())') at $PYTHON"

# bubblewrap, used where the container lets it start (on Gradescope it usually cannot:
# the submissions then run in container mode, as $STUDENT)
if ! command -v bwrap >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null 2>&1) || true
fi

# the virtual environment: outside /autograder, readable by every user (the students' code runs on it)
umask 022
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
if [ -n "$TORCH_INDEX" ]; then
  "$VENV/bin/python" -m pip install --quiet --index-url "$TORCH_INDEX" -c "$SOURCE/constraints.txt" torch
fi
"$VENV/bin/python" -m pip install --quiet -c "$SOURCE/constraints.txt" -r "$SOURCE/requirements.txt"
chmod -R a+rX "$VENV"

# the students' user: no home, no login, no group but its own
if ! id -u "$STUDENT" >/dev/null 2>&1; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$STUDENT"
fi

# the assignment, released once into the source folder, which then becomes root's alone
PYTHONPATH="$SOURCE" PYTHONDONTWRITEBYTECODE=1 "$VENV/bin/python" -m autograder.platforms.gradescope prepare "$SOURCE"
