"""Run OSWorld's own desktop server (``desktop_env/server/main.py`` of an xlang-ai/OSWorld
checkout, unmodified) on a local desktop, where ``LocalDesktop`` expects a server: on a Unix
socket (or a free loopback port), one copy per desktop.

OSWorld's file is written for one VM: it serves its Flask ``app`` on port 5000 of every address
and writes each screenshot into ``screenshots/`` beside itself. So this launcher copies it (with
``pyxcursor.py``, which it imports) into the desktop's own ``$TMPDIR``, imports the copy and
serves its ``app`` as ``osworld_server.py`` serves its own. One shim, applied only when needed:
some revisions pass ``creationflags=subprocess.CREATE_NO_WINDOW`` on every platform, a name
Python defines only on Windows; 0 (no flags) is what POSIX accepts. Nothing in the file is
patched. Like ``osworld_server.py`` it runs in the desktop's Python and imports nothing from
cua_native::

    python osworld_launcher.py --main /path/to/OSWorld/desktop_env/server/main.py --unix-socket S

Its Python needs OSWorld's server dependencies (Flask, pyautogui, python-xlib, Pillow, lxml,
numpy, requests, and pyatspi from Debian's ``python3-pyatspi``: ``.ci/desktop.sh`` with
``CUA_OSWORLD_VENV`` makes such a venv).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType


def load_server(main: Path) -> ModuleType:
    """Import a private copy of OSWorld's ``main.py`` (and ``pyxcursor.py``) from ``$TMPDIR``."""
    home = Path(tempfile.mkdtemp(prefix="osworld_server_"))
    shutil.copy2(main, home / "main.py")
    cursor = main.with_name("pyxcursor.py")
    if cursor.is_file():
        shutil.copy2(cursor, home / "pyxcursor.py")
    if not hasattr(subprocess, "CREATE_NO_WINDOW"):
        subprocess.CREATE_NO_WINDOW = 0  # type: ignore[attr-defined]
    sys.path.insert(0, str(home))
    spec = importlib.util.spec_from_file_location("osworld_main", home / "main.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {main}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    from werkzeug.serving import make_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main", type=Path, required=True, help="OSWorld's server main.py")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000, help="0: any free port")
    parser.add_argument("--port-file", help="write the bound port here (atomically)")
    parser.add_argument("--unix-socket", help="listen on this Unix socket instead of TCP")
    args = parser.parse_args(argv)
    app = load_server(args.main.resolve()).app
    if args.unix_socket:
        server = make_server(f"unix://{args.unix_socket}", 0, app, threaded=True)
    else:
        server = make_server(args.host, args.port, app, threaded=True)
        if args.port_file:
            scratch = Path(f"{args.port_file}.part")
            scratch.write_text(str(server.server_port))
            os.replace(scratch, args.port_file)
    print(f"serving OSWorld's {args.main}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
