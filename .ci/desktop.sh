#!/usr/bin/env bash
# Source me: installs what local desktops need (cua_native/gym/desktop/local.py) and exports
# CUA_DESKTOP_PYTHON. Debian packages: Xvfb, the openbox window manager, the apps of the desktop
# tasks (xterm, mousepad, pcmanfm, galculator, LibreOffice Calc) and the tools the server and
# evaluators call (xdotool, wmctrl, xclip), and for the accessibility tree D-Bus, the AT-SPI bus
# and Debian's python3-pyatspi (/usr/bin/python3 runs gym/desktop/atspi_tree.py); needs root.
# The desktop server's own small virtual
# environment (.venv-desktop: Flask, pyautogui, python-xlib, Pillow, and OSWorld's client code
# from PyPI's desktop-env for the contract test). With CUA_OSWORLD_SERVER_MAIN set (OSWorld's own
# desktop_env/server/main.py, which cua_native does not ship): its Debian dependencies
# (python3-pyatspi, python3-tk, scrot) and .venv-osworld (Debian's Python 3.11 with its site
# packages, plus the server's PyPI dependencies); exports CUA_OSWORLD_PYTHON
# (tests/gym/desktop/test_osworld_own_server.py). Safe to source again: each step is skipped when done.
_cua_saved_flags="$-"
_cua_saved_pipefail="$(shopt -po pipefail)"
set -euo pipefail

_cua_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export DEBIAN_FRONTEND=noninteractive
_cua_missing=""
for _cua_bin in Xvfb openbox xterm mousepad pcmanfm galculator localc xdotool wmctrl xclip \
        dbus-daemon /usr/libexec/at-spi-bus-launcher; do
    command -v "$_cua_bin" >/dev/null 2>&1 || _cua_missing="$_cua_missing $_cua_bin"
done
/usr/bin/python3 -c "import pyatspi" >/dev/null 2>&1 || _cua_missing="$_cua_missing pyatspi"
if [ -n "$_cua_missing" ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends xvfb openbox xterm mousepad pcmanfm \
        galculator libreoffice-calc xdotool wmctrl xclip dbus-daemon at-spi2-core \
        python3-pyatspi >/dev/null
fi

_cua_venv="$_cua_root/.venv-desktop"
if ! "$_cua_venv/bin/python" -c "import flask, pyautogui, Xlib, PIL, desktop_env.controllers.python" >/dev/null 2>&1; then
    uv venv -q --allow-existing "$_cua_venv" --python 3.11
    uv pip install -q --python "$_cua_venv/bin/python" flask==3.0.3 pyautogui==0.9.54 \
        python-xlib==0.33 pillow==11.0.0 requests==2.32.3
    uv pip install -q --python "$_cua_venv/bin/python" --no-deps desktop-env==1.0.2
fi
export CUA_DESKTOP_PYTHON="$_cua_venv/bin/python"

if [ -n "${CUA_OSWORLD_SERVER_MAIN:-}" ]; then
    if ! dpkg -s python3-pyatspi python3-tk scrot >/dev/null 2>&1; then
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends python3-pyatspi python3-tk scrot >/dev/null
    fi
    _cua_osworld="$_cua_root/.venv-osworld"
    if ! "$_cua_osworld/bin/python" -c "import importlib.metadata as m, pyatspi; [m.version(p) for p in \
            ('flask', 'pyautogui', 'python-xlib', 'pillow', 'lxml', 'numpy', 'requests')]" >/dev/null 2>&1; then
        uv venv -q --allow-existing --system-site-packages "$_cua_osworld" --python /usr/bin/python3
        uv pip install -q --python "$_cua_osworld/bin/python" flask==3.0.3 pyautogui==0.9.54 \
            python-xlib==0.33 pillow==11.0.0 requests==2.32.3 lxml==5.3.0 numpy==2.1.3
    fi
    export CUA_OSWORLD_PYTHON="$_cua_osworld/bin/python"
fi

case "$_cua_saved_flags" in *e*) ;; *) set +e ;; esac
case "$_cua_saved_flags" in *u*) ;; *) set +u ;; esac
eval "$_cua_saved_pipefail"
unset _cua_saved_flags _cua_saved_pipefail _cua_root _cua_missing _cua_bin _cua_venv _cua_osworld
