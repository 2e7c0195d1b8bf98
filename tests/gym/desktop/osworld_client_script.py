"""Run by the desktop server's Python (``.venv-desktop``): OSWorld's own client,
``desktop_env.controllers.python.PythonController`` from PyPI's desktop-env, against a desktop
server at ``HOST PORT``. Prints one JSON object of what it saw."""

import io
import json
import sys
import time
import xml.etree.ElementTree as ET

from desktop_env.controllers.python import PythonController
from PIL import Image

controller = PythonController(vm_ip=sys.argv[1], server_port=int(sys.argv[2]))
controller.retry_interval = 0.2
seen = {}
png = controller.get_screenshot()
seen["screenshot_size"] = list(Image.open(io.BytesIO(png)).size) if png else None
seen["screen_size"] = controller.get_vm_screen_size()
seen["platform"] = controller.get_vm_platform()
tree_xml = controller.get_accessibility_tree()
seen["tree_root"] = ET.fromstring(tree_xml).tag if tree_xml else None
controller.execute_action(
    {"action_type": "TYPING", "parameters": {"text": "echo osworld client > ~/osworld.txt\n"}}
)
content = None
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    content = controller.get_file("~/osworld.txt")
    if content:
        break
    time.sleep(0.1)
seen["file"] = content.decode() if content else None
tree = controller.get_vm_directory_tree("~")
seen["listed"] = sorted(c["name"] for c in (tree or {}).get("children", []))
print(json.dumps(seen))
