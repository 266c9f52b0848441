#!/bin/sh
# Install (or upgrade) echo-bot from this checkout into DIR (default /opt/echo-bot):
# copy the source without the checkout's own .venv, make DIR/.venv and pip-install the
# copy into it. The service then runs DIR/.venv/bin/echo-bot, which points only inside
# DIR: nothing of the checkout (under /home, hidden by ProtectHome=yes) is needed.
#
#   sudo systemd/install.sh [DIR]
#   sudo EXTRAS=postgres systemd/install.sh     # with the PostgreSQL driver
#
# EXTRAS names the package's extras to install too (comma-separated, e.g. postgres);
# PYTHON picks the interpreter (default python3); VENV_OPTIONS are passed to
# `python -m venv` (e.g. --system-site-packages); pip reads its own PIP_* variables.
# tests/test_systemd.py runs this very script into a temporary DIR.
set -eu

src=$(cd "$(dirname "$0")/.." && pwd -P)
dest=${1:-/opt/echo-bot}
python=${PYTHON:-python3}
extras=${EXTRAS:-}
case $extras in
*[!a-z0-9,-]*) echo "install.sh: EXTRAS is a comma-separated list of names, not $extras" >&2; exit 2 ;;
esac

case $dest in
/*) ;;
*) echo "install.sh: give an absolute directory, not $dest" >&2; exit 2 ;;
esac
dest=${dest%/}
if [ -z "$dest" ]; then
    echo "install.sh: refusing to install into /" >&2
    exit 2
fi
if [ ! -f "$src/pyproject.toml" ] || [ ! -d "$src/echo_bot" ]; then
    echo "install.sh: $src is not an echo-bot checkout" >&2
    exit 2
fi
mkdir -p "$dest"
dest=$(cd "$dest" && pwd -P)
case $dest/ in
"$src"/*) echo "install.sh: $dest is inside the checkout $src" >&2; exit 2 ;;
esac
case $src/ in
"$dest"/*) echo "install.sh: the checkout $src is inside $dest" >&2; exit 2 ;;
esac
# An upgrade replaces the old source (as rsync --delete would) but keeps the venv;
# a directory that holds something else is left alone.
if [ -n "$(ls -A "$dest")" ] && ! grep -qs '^name = "echo-bot"' "$dest/pyproject.toml"; then
    echo "install.sh: $dest is not empty and holds no echo-bot; choose another directory" >&2
    exit 2
fi
find "$dest" -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf {} +

# In a git checkout only the files git tracks are copied: your own files beside them (a
# config, a payload, notes) stay behind. Elsewhere the checkout's .venv (its scripts
# point back into the checkout), git data and build leftovers stay behind.
# safe.directory: root installing a user's checkout must not fall back to copying all.
git_src() { git -c safe.directory="$src" -C "$src" "$@"; }
if git_src rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # A tracked file deleted from the work tree is skipped, not a failed copy.
    (cd "$src" && git_src ls-files -z | tar --null --ignore-failed-read -T - -cf -)
else
    (cd "$src" && tar -cf - \
        --exclude=./.venv --exclude=./.git --exclude=./build --exclude=./dist \
        --exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache \
        --exclude=.ruff_cache .)
fi | (cd "$dest" && tar -xf - --no-same-owner)

venv=$dest/.venv
# A venv copied here by an earlier `cp -r` of a checkout runs another place's scripts:
# make it afresh.
if [ -e "$venv/bin/echo-bot" ] && ! head -n 2 "$venv/bin/echo-bot" | grep -qF "$venv/bin/python"; then
    echo "install.sh: $venv was made elsewhere; making it afresh" >&2
    rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
    # shellcheck disable=SC2086  # VENV_OPTIONS are separate words on purpose
    "$python" -m venv ${VENV_OPTIONS:-} "$venv"
fi
"$venv/bin/python" -m pip install --disable-pip-version-check --upgrade "$dest${extras:+[$extras]}"
echo "Installed echo-bot into $dest: the service runs $venv/bin/echo-bot"
