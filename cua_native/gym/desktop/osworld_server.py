"""A desktop server speaking OSWorld's desktop-server API (``desktop_env/server/main.py`` in
xlang-ai/OSWorld), written for cua_native from that API's routes and answer shapes.

It runs ON the desktop (its own small virtual environment with Flask, pyautogui and
python-xlib; ``.ci/desktop.sh`` makes one), never inside the trainer, and imports nothing from
cua_native so that it runs as a plain script::

    python osworld_server.py --host 0.0.0.0 --port 5000      # as on OSWorld's VMs
    python osworld_server.py --unix-socket PATH                # local desktops: owner-only

OSWorld's API has no authentication and ``/execute`` runs any command, so a local desktop's
server listens on a Unix socket inside its owner-only state directory, not on a TCP port other
local users could reach.

Routes (the subset of OSWorld's that cua_native's backend and OSWorld's own ``PythonController``
use; same methods, bodies and answers):

- ``GET /screenshot`` — PNG of the whole screen at its real resolution (Pillow's X11 grab;
  no cursor drawn).
- ``POST /execute``, ``POST /setup/execute`` — ``{"command": [...] | "...", "shell": bool}`` →
  ``{"status", "output", "error", "returncode"}``; 500 ``{"status": "error", "message"}``.
- ``POST /setup/launch`` — the same body, started without waiting.
- ``GET /accessibility`` — ``{"AT": xml}``: the AT-SPI tree in OSWorld's form
  (``atspi_tree.py``, run with ``$CUA_ATSPI_PYTHON``, a Python with Debian's pyatspi, inside
  the desktop's D-Bus session; 500 ``{"error"}`` when that fails). Without
  ``$CUA_ATSPI_PYTHON``: window-level only (one ``frame`` per top-level window with its title,
  class, position and size, in OSWorld's namespaces).
- ``POST /screen_size`` — ``{"width", "height"}``; ``GET /platform`` — ``Linux``;
  ``GET /cursor_position`` — ``[x, y]``.
- ``POST /file`` (form ``file_path``) — the file, or 404 ``{"error"}``;
  ``POST /setup/upload`` (form ``file_path``, file ``file_data``);
  ``POST /list_directory`` (``{"path"}``) — ``{"directory_tree"}``.
- ``POST /setup/activate_window`` and ``/setup/close_window`` (``{"window_name", "strict"?,
  "by_class"?}``) — ``wmctrl``; 404 when no window matches.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pyautogui
from flask import Flask, jsonify, request, send_file
from PIL import ImageGrab
from werkzeug.serving import make_server
from Xlib import X, display

COMMAND_TIMEOUT_S = 120
ATSPI_TIMEOUT_S = 60
ATSPI_SCRIPT = Path(__file__).with_name("atspi_tree.py")
NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
}

pyautogui.PAUSE = 0
pyautogui.FAILSAFE = False


def _command(data: dict[str, Any]) -> tuple[list[str] | str, bool]:
    shell = bool(data.get("shell", False))
    command = data.get("command", "" if shell else [])
    if isinstance(command, str) and not shell:
        command = shlex.split(command)
    if isinstance(command, list):
        command = [os.path.expanduser(a) if a.startswith("~/") else a for a in command]
    return command, shell


def execute() -> Any:
    command, shell = _command(request.get_json(force=True) or {})
    try:
        result = subprocess.run(
            command,
            capture_output=True,
            shell=shell,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except Exception as exc:
        return jsonify({"status": "error", "message": str(exc)}), 500
    return jsonify(
        {
            "status": "success",
            "output": result.stdout,
            "error": result.stderr,
            "returncode": result.returncode,
        }
    )


def launch() -> Any:
    command, shell = _command(request.get_json(force=True) or {})
    try:
        subprocess.Popen(command, shell=shell, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except Exception as exc:
        return jsonify({"status": "error", "message": str(exc)}), 500
    text = command if isinstance(command, str) else " ".join(command)
    return f"{text} launched successfully"


def screenshot() -> Any:
    buffer = io.BytesIO()
    ImageGrab.grab().save(buffer, format="PNG")
    buffer.seek(0)
    return send_file(buffer, mimetype="image/png")


def _windows() -> list[dict[str, Any]]:
    d = display.Display()
    try:
        root = d.screen().root
        prop = root.get_full_property(d.intern_atom("_NET_CLIENT_LIST"), X.AnyPropertyType)
        active = root.get_full_property(d.intern_atom("_NET_ACTIVE_WINDOW"), X.AnyPropertyType)
        active_id = active.value[0] if active is not None and len(active.value) else None
        utf8, net_name = d.intern_atom("UTF8_STRING"), d.intern_atom("_NET_WM_NAME")
        found = []
        for wid in prop.value if prop is not None else []:
            window = d.create_resource_object("window", wid)
            try:
                name_prop = window.get_full_property(net_name, utf8)
                name = (
                    name_prop.value.decode("utf-8", "replace")
                    if name_prop is not None
                    else str(window.get_wm_name() or "")
                )
                wm_class = window.get_wm_class() or ("", "")
                geom = window.get_geometry()
                origin = window.translate_coords(root, 0, 0)
            except Exception:  # a window that closed while being read
                continue
            found.append(
                {
                    "name": name,
                    "class": wm_class[-1],
                    "x": -origin.x,
                    "y": -origin.y,
                    "width": geom.width,
                    "height": geom.height,
                    "active": wid == active_id,
                }
            )
        return found
    finally:
        d.close()


def accessibility() -> Any:
    python = os.environ.get("CUA_ATSPI_PYTHON")
    if python:
        try:
            done = subprocess.run(
                [python, str(ATSPI_SCRIPT)],
                capture_output=True,
                timeout=ATSPI_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return jsonify({"error": f"AT-SPI tree: {exc}"}), 500
        if done.returncode != 0:
            error = done.stderr.decode(errors="replace")[-500:]
            return jsonify({"error": f"AT-SPI tree: {error}"}), 500
        return jsonify({"AT": done.stdout.decode()})
    for prefix, uri in NS.items():
        ET.register_namespace(prefix, uri)
    root = ET.Element("desktop-frame")
    for window in _windows():
        app = ET.SubElement(root, "application", {"name": window["class"]})
        ET.SubElement(
            app,
            "frame",
            {
                "name": window["name"],
                f"{{{NS['st']}}}active": "true" if window["active"] else "false",
                f"{{{NS['st']}}}showing": "true",
                f"{{{NS['cp']}}}screencoord": f"({window['x']}, {window['y']})",
                f"{{{NS['cp']}}}size": f"({window['width']}, {window['height']})",
            },
        )
    return jsonify({"AT": ET.tostring(root, encoding="unicode")})


def screen_size() -> Any:
    width, height = pyautogui.size()
    return jsonify({"width": width, "height": height})


def get_platform() -> Any:
    return platform.system()


def cursor_position() -> Any:
    position = pyautogui.position()
    return jsonify(position.x, position.y)


def get_file() -> Any:
    if "file_path" not in request.form:
        return jsonify({"error": "file_path is required"}), 400
    path = os.path.expandvars(os.path.expanduser(request.form["file_path"]))
    if not os.path.isfile(path):
        return jsonify({"error": "File not found"}), 404
    return send_file(path, as_attachment=True)


def upload() -> Any:
    if "file_path" not in request.form or "file_data" not in request.files:
        return jsonify({"error": "file_path and file_data are required"}), 400
    path = os.path.expandvars(os.path.expanduser(request.form["file_path"]))
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    request.files["file_data"].save(path)
    return f"File Uploaded: {os.path.getsize(path)} bytes"


def _tree(directory: str) -> dict[str, Any]:
    tree: dict[str, Any] = {"type": "directory", "name": os.path.basename(directory)}
    try:
        children = []
        for entry in sorted(os.listdir(directory)):
            full = os.path.join(directory, entry)
            children.append(_tree(full) if os.path.isdir(full) else {"type": "file", "name": entry})
        tree["children"] = children
    except OSError as exc:
        return {"error": str(exc)}
    return tree


def list_directory() -> Any:
    data = request.get_json(force=True) or {}
    if "path" not in data:
        return jsonify(error="Missing 'path' parameter"), 400
    path = os.path.expanduser(data["path"])
    if not os.path.isdir(path):
        return jsonify(error="The provided path is not a directory"), 400
    return jsonify(directory_tree=_tree(path))


def _wmctrl(flag: str) -> Any:
    data = request.get_json(force=True) or {}
    name = data.get("window_name")
    if not name:
        return "window_name required", 400
    argv = ["wmctrl"]
    if data.get("strict"):
        argv.append("-F")
    if data.get("by_class"):
        argv.append("-x")
    result = subprocess.run([*argv, flag, name], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return f"Window {name} not found.", 404
    return "Window activated successfully" if flag == "-a" else "Window closed successfully"


def activate_window() -> Any:
    return _wmctrl("-a")


def close_window() -> Any:
    return _wmctrl("-c")


def build_app() -> Flask:
    app = Flask(__name__)
    routes: list[tuple[str, Any, list[str]]] = [
        ("/execute", execute, ["POST"]),
        ("/setup/execute", execute, ["POST"]),
        ("/setup/launch", launch, ["POST"]),
        ("/screenshot", screenshot, ["GET"]),
        ("/accessibility", accessibility, ["GET"]),
        ("/screen_size", screen_size, ["POST"]),
        ("/platform", get_platform, ["GET"]),
        ("/cursor_position", cursor_position, ["GET"]),
        ("/file", get_file, ["POST"]),
        ("/setup/upload", upload, ["POST"]),
        ("/list_directory", list_directory, ["POST"]),
        ("/setup/activate_window", activate_window, ["POST"]),
        ("/setup/close_window", close_window, ["POST"]),
    ]
    for path, view, methods in routes:
        app.add_url_rule(path, endpoint=path, view_func=view, methods=methods)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000, help="0: any free port")
    parser.add_argument("--port-file", help="write the bound port here (atomically)")
    parser.add_argument("--unix-socket", help="listen on this Unix socket instead of TCP")
    args = parser.parse_args(argv)
    if args.unix_socket:
        server = make_server(f"unix://{args.unix_socket}", 0, build_app(), threaded=True)
        print(f"serving on unix://{args.unix_socket}", file=sys.stderr, flush=True)
        server.serve_forever()
        return 0
    server = make_server(args.host, args.port, build_app(), threaded=True)
    if args.port_file:
        scratch = Path(f"{args.port_file}.part")
        scratch.write_text(str(server.server_port))
        scratch.rename(args.port_file)
    print(f"serving on http://{args.host}:{server.server_port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
