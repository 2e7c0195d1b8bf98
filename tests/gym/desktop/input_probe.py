"""A real X client that records the input it receives, run on a desktop by its server's Python
(python-xlib): one full-screen window titled ``input probe``; every button press/release (with
root coordinates) and key press (keysym name) is appended as a JSON line to ``argv[1]``."""

import json
import os
import sys

from Xlib import XK, X, display

NAMES = {getattr(XK, n): n[3:] for n in dir(XK) if n.startswith("XK_")}

d = display.Display()
screen = d.screen()
window = screen.root.create_window(
    0,
    0,
    screen.width_in_pixels,
    screen.height_in_pixels,
    0,
    screen.root_depth,
    X.InputOutput,
    X.CopyFromParent,
    background_pixel=screen.white_pixel,
    event_mask=X.ButtonPressMask | X.ButtonReleaseMask | X.KeyPressMask,
)
window.set_wm_name("input probe")
window.map()
d.flush()
with open(os.path.expanduser(sys.argv[1]), "a") as out:
    while True:
        event = d.next_event()
        if event.type in (X.ButtonPress, X.ButtonRelease):
            kind = "press" if event.type == X.ButtonPress else "release"
            record = {"event": kind, "button": event.detail, "x": event.root_x, "y": event.root_y}
        elif event.type == X.KeyPress:
            keysym = d.keycode_to_keysym(event.detail, 1 if event.state & X.ShiftMask else 0)
            record = {"event": "key", "key": NAMES.get(keysym, str(keysym))}
        else:
            continue
        out.write(json.dumps(record) + "\n")
        out.flush()
